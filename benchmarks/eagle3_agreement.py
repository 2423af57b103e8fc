"""Whether localspec's EAGLE-3 head drafts and accepts what llama.cpp's own draft-eagle3 does:
the tests' tiny targets (localspec/testing: a near-bigram llama, and a Qwen3.5-style hybrid)
with heads written for them (localspec/testing/eagle3_support.py: g weighing nothing, little,
as much as the token, or much; one with a d2t draft vocabulary), greedy, the same prompts and
fixed draft lengths through `llama-speculative-simple --spec-type draft-eagle3` and through
localspec's loop (ModelDrafter over the head, as the engine drafts); drafted and accepted tokens
side by side. Agreement, not speed: counts are the same on any host, timings are not taken.

p_min: llama.cpp stops a draft where the head's top token has less probability (default 0);
localspec's ModelDrafter stops where it has under min_confidence (0.3 by default; a request's
speculation min_confidence or llama-server's speculative.p_min). Both are run at 0 and at 0.3.
The rules differ (localspec/drafters/model.py): llama.cpp drops the unsure token and reads its
probability among its top 10 candidates; --llama-stop runs localspec's side by llama.cpp's
rule, to tell that choice from any other difference.

    python benchmarks/eagle3_agreement.py [--peers-bin DIR]   # DIR: llama.cpp's build/bin
    (default: the folder `localspec bench --build-peers` builds, localspec.tooling.peers)
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import numpy as np

from localspec.backends.llamacpp.backend import LlamaCppBackend
from localspec.core.drafting import Draft
from localspec.core.sampling import SamplingConfig
from localspec.drafters.model import ModelDrafter
from localspec.testing.agreement import N_PREDICT, PROMPTS, Peer, side_by_side
from localspec.testing.eagle3_support import HeadSpec, write_eagle3_gguf
from localspec.testing.gguf_writer import HybridSpec, Spec, write_gguf, write_qwen35_gguf
from localspec.tooling.peers import find_or_build

LLAMA = Spec("llama", mix=0.02, head=1.0)
HYBRID = HybridSpec()
# (target, the name of its file's writer) -> the heads written for it
TARGETS: dict[str, tuple[Spec | HybridSpec, Callable[..., Path]]] = {
    "llama": (LLAMA, write_gguf),
    "hybrid": (HYBRID, write_qwen35_gguf),
}
HEADS = {
    "no g at all": HeadSpec(reads_g=False),
    "g zero (fc 0)": HeadSpec(fc=0.0),
    "g small (fc 0.05)": HeadSpec(),
    "g middle (fc 1.0)": HeadSpec(fc=1.0),
    "g large (fc 3.0)": HeadSpec(fc=3.0),
    "d2t, 200 tokens": HeadSpec(draft_vocab=200),
}
HYBRID_LAYERS = (0, 1, 3)
N_MAX = (4, 15)
P_MIN = (0.0, 0.3)


def head_drafter(head_path: Path, p_min: float, llama_stop: bool, target: LlamaCppBackend) -> ModelDrafter:
    """localspec's drafter over the head at the floor p_min (by llama.cpp's rule where llama_stop)."""
    kind = LlamaStop if llama_stop else ModelDrafter
    return kind(target.eagle3_head(str(head_path)), min_confidence=p_min)


class LlamaStop(ModelDrafter):
    """Greedy drafts ended as llama.cpp's p_min ends them: before the first token whose
    probability among the top 10 candidates is under the floor."""

    def propose(
        self,
        context: Sequence[int],
        n: int,
        cfg: SamplingConfig,
        rng: np.random.Generator,
        min_confidence: float | None = None,
    ) -> Draft:
        past = self.backend.n_past
        row = self.backend.eval_block(list(context[past:]), "last")[-1]
        self._agreed = len(context)
        tokens: list[int] = []
        while len(tokens) < n:
            tok, top = int(np.argmax(row)), np.sort(row)[-10:]
            if float(np.sum(np.exp(top - row[tok]))) > 1.0 / max(self.min_confidence, 1e-9):
                break
            tokens.append(tok)
            if len(tokens) < n:
                row = self.backend.eval_block([tok], "last")[-1]
        return Draft(tokens)


def compare(bin_dir: Path, folder: Path, target_name: str, llama_stop: bool) -> None:
    spec, write = TARGETS[target_name]
    target = write(spec, folder / f"{target_name}.gguf")
    print(f"\n{target_name} target, {len(PROMPTS)} prompts x {N_PREDICT} tokens, greedy, 1 thread")
    print(f"{'head':<20}{'n_max':<7}{'p_min':<7}{'llama.cpp accepted/drafted':<30}{'localspec accepted/drafted':<30}")
    for i, (name, head_spec) in enumerate(HEADS.items()):
        if target_name == "hybrid":
            head_spec = HeadSpec(**{**head_spec.__dict__, "layer_ids": HYBRID_LAYERS})
        head = write_eagle3_gguf(spec, head_spec, folder / f"eagle3-{target_name}-{i}.gguf")
        for n_max in N_MAX:
            for p_min in P_MIN:
                peer = Peer(bin_dir, "draft-eagle3", p_min)
                opened = partial(head_drafter, head, p_min, llama_stop)
                theirs, mine = side_by_side(peer, target, head, opened, n_max)
                print(f"{name:<20}{n_max:<7}{p_min:<7}{theirs!s:<30}{mine!s:<30}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers-bin", type=Path, help="llama.cpp's build/bin (default: localspec's peers folder)")
    parser.add_argument("--targets", nargs="+", default=list(TARGETS), choices=list(TARGETS))
    parser.add_argument("--llama-stop", action="store_true", help="localspec's side stops by llama.cpp's p_min rule")
    args = parser.parse_args()
    bin_dir = find_or_build(args.peers_bin, programs=("llama-speculative-simple",))
    with tempfile.TemporaryDirectory() as folder:
        for target_name in args.targets:
            compare(bin_dir, Path(folder), target_name, args.llama_stop)


if __name__ == "__main__":
    main()
