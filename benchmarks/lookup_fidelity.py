"""Does the replays' model of llama-lookup draft what llama-lookup drafts? Real `llama-lookup`
runs on recorded greedy answers, beside the replays' simulation of it
(localspec.control.replay.lookup_passes, which replay_lookup times): tokens drafted and kept,
and passes, per answer. The replays' verdicts against lookup (tests/specification/*_replays.py,
guess_signals.py) hold only as far as these agree. Counts, not seconds: load does not move them.

    python benchmarks/lookup_fidelity.py ANSWERS.json --model GGUF [--draft 4 --draft 8] [--out F.json]

ANSWERS.json: record_replay_answers.py's file for that GGUF (prompt and answer token ids). Each
prompt goes to llama-lookup as text, its special tokens written out (llama-lookup parses them);
a prompt whose text does not tokenize back to its ids, or an answer llama-lookup does not give
(another kernel's near-tie), is reported and left out of the totals. llama-lookup keeps going
past the answer by up to a pass (it stops once over -n), so its kept tokens may exceed the
simulation's on an answer cut at the token limit; its passes are the measure. --out writes
llama-lookup's counts per answer under the answers file's name (tests/data/lookup_counts.json
pins the simulation to them).
"""

from __future__ import annotations

import argparse
import ctypes
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import llama_cpp as llama

from localspec.control.replay import lookup_timed_passes
from localspec.tooling.peers import PeerRun, find_or_build, run_peer, same_answer


@dataclass
class Counts:
    """What a lookup run drafted, kept, and its passes after the first token."""

    drafted: int = 0
    accepted: int = 0
    passes: int = 0

    def add(self, other: Counts) -> None:
        self.drafted += other.drafted
        self.accepted += other.accepted
        self.passes += other.passes

    def line(self) -> str:
        rate = self.accepted / self.drafted if self.drafted else 0.0
        return f"{self.drafted:6d} {self.accepted:6d} {rate:6.1%} {self.passes:6d}"


def simulated(prompt: list[int], answer: list[int], n_draft: int, ended: bool) -> Counts:
    """The replays' llama-lookup over the answer, the passes llama-lookup counts."""
    passes = lookup_timed_passes(prompt, answer, n_draft, ended)
    return Counts(sum(d for d, _ in passes), sum(k for _, k in passes), len(passes))


class Vocab:
    """The GGUF's tokenizer, to write a prompt's ids as the text llama-lookup tokenizes."""

    def __init__(self, path: str) -> None:
        params = llama.llama_model_default_params()
        params.vocab_only = True
        self._model = llama.llama_model_load_from_file(path.encode(), params)
        self._vocab = llama.llama_model_get_vocab(self._model)

    def text(self, ids: Sequence[int]) -> str:
        """The ids' text with their special tokens written out (LlamaCppBackend.detokenize
        leaves them out, as an answer's text should)."""
        tokens = (llama.llama_token * len(ids))(*ids)
        buf = ctypes.create_string_buffer(8 * len(ids) + 64)
        n = llama.llama_detokenize(self._vocab, tokens, len(ids), buf, len(buf), False, True)
        return buf.raw[:n].decode("utf-8", errors="replace")

    def ids(self, text: str) -> list[int]:
        data = text.encode()
        buf = (llama.llama_token * (len(data) + 8))()
        n = llama.llama_tokenize(self._vocab, data, len(data), buf, len(buf), True, True)
        return list(buf[:n])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("answers", type=Path)
    parser.add_argument("--model", required=True)
    parser.add_argument("--draft", type=int, action="append")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--peers-bin")
    parser.add_argument("--out", type=Path, help="write llama-lookup's counts per answer here (JSON)")
    args = parser.parse_args()
    data = json.loads(args.answers.read_text())
    vocab, bin_dir = Vocab(args.model), find_or_build(args.peers_bin)
    recorded: dict[str, dict[str, list[int]]] = {}
    for n_draft in args.draft or [4, 8]:
        real_total, sim_total = Counts(), Counts()
        print(f"γ={n_draft}: drafted kept rate passes, per answer: llama-lookup | simulated")
        for name, rec in data["answers"].items():
            prompt, answer = list(rec["prompt"]), list(rec["answer"])
            real = run_lookup(vocab, bin_dir, args, prompt, answer, n_draft)
            if isinstance(real, str):
                print(f"{name:14s} skipped: {real}")
                continue
            sim = simulated(prompt, answer, n_draft, len(answer) < data["tokens"])
            real_total.add(real)
            sim_total.add(sim)
            recorded.setdefault(name, {})[str(n_draft)] = [real.drafted, real.accepted, real.passes]
            print(f"{name:14s} {real.line()} | {sim.line()}")
        print(f"{'all':14s} {real_total.line()} | {sim_total.line()}")
    if args.out:  # one entry per answers file, beside those already there
        out = json.loads(args.out.read_text()) if args.out.exists() else {}
        out[args.answers.name] = {"model": Path(args.model).name, "counts": recorded}
        args.out.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


def run_lookup(
    vocab: Vocab, bin_dir: Path, args: argparse.Namespace, prompt: list[int], answer: list[int], n_draft: int
) -> Counts | str:
    """llama-lookup's counts on this prompt, or why it cannot be compared."""
    text = vocab.text(prompt)
    if vocab.ids(text) != prompt:
        return "its prompt's text does not tokenize back to its ids"
    peer = run_peer(bin_dir, PeerRun("llama-lookup", args.model, text, len(answer), n_draft, threads=args.threads))
    if peer.text is None or not same_answer(vocab.text(answer), peer.text):
        return "llama-lookup answered another text"
    # Every pass gives its kept tokens and one of its own, the first token the prompt's pass;
    # llama-lookup stops once past -n or at an end of text, which it counts.
    return Counts(peer.drafted, peer.accepted, peer.decoded - 1 - peer.accepted)


if __name__ == "__main__":
    main()
