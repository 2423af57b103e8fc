"""localspec's torch backend against Hugging Face transformers on the same model and prompts.

    pip install -e '.[torch]' transformers   # transformers only for this comparison
    python benchmarks/torch_vs_transformers.py [--model FILE.gguf] [--threads N] [--max-tokens 160]

Both sides run the same GGUF dequantized to float32 (transformers reads it with its own GGUF
loader), greedy, on the same prompt token ids, with the same torch thread count, and are
timed end to end (prefill included). Plain decoding is `generate()` against strategy "none";
prompt lookup is `generate(prompt_lookup_num_tokens=N)` against strategy "ngram" with the
adaptive draft length. Rows are interleaved per repeat so machine drift hits every column.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field

from localspec.api import Runtime
from localspec.backend_loader import load_backend
from localspec.chat import render_chat
from localspec.hardware import physical_cores
from localspec.prompts import SUITE, BenchPrompt
from localspec.protocol import Backend


@dataclass
class Tally:
    tokens: int = 0
    seconds: float = 0.0
    outputs: list[list[int]] = field(default_factory=list)

    def add(self, tokens: list[int], seconds: float) -> None:
        self.tokens += len(tokens)
        self.seconds += seconds
        self.outputs.append(tokens)

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def prompt_ids(backend: Backend, prompt: BenchPrompt) -> list[int]:
    text = render_chat(backend.chat_template(), prompt.messages, backend.special_texts())
    return backend.tokenize(text, add_special=False, parse_special=True)


def run_ours(runtime: Runtime, prompt: BenchPrompt, max_tokens: int) -> tuple[list[int], float]:
    t0 = time.perf_counter()
    out = runtime.generate(messages=prompt.messages, max_tokens=max_tokens, temperature=0)
    return out.tokens, time.perf_counter() - t0


def run_transformers(model, ids: list[int], max_tokens: int, eos: list[int], lookup: int) -> tuple[list[int], float]:  # type: ignore[no-untyped-def]
    import torch

    inputs = torch.tensor([ids])
    extra = {"prompt_lookup_num_tokens": lookup} if lookup else {}
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            inputs,
            attention_mask=torch.ones_like(inputs),
            max_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos[0],
            **extra,
        )
    seconds = time.perf_counter() - t0
    new = out[0, len(ids) :].tolist()
    while new and new[-1] in eos:  # the end token is not part of the answer (localspec drops it too)
        new.pop()
    return new, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="GGUF file (default: the embedded SmolLM2-135M-Instruct Q4_1)")
    parser.add_argument("--threads", type=int, default=physical_cores())
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--lookup", type=int, default=6, help="prompt_lookup_num_tokens for transformers")
    parser.add_argument("--prompts", default="code_edit,chat", help="comma-separated ids from localspec.prompts")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dtype", default="float32", help="localspec's weights: float32 (as transformers), float16...")
    args = parser.parse_args()
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM
    except ImportError:
        print("this comparison needs transformers: pip install transformers", file=sys.stderr)
        return 2
    if args.model is None:
        from localspec.default_model import ensure_pypi_model

        args.model = str(ensure_pypi_model())
    prompts = [p for p in SUITE if p.id in args.prompts.split(",")]

    ours = load_backend("torch", args.model, n_ctx=2048, threads=args.threads, dtype=args.dtype)
    torch.set_num_threads(args.threads)
    folder, name = os.path.split(os.path.abspath(args.model))
    hf = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32).eval()
    eos = sorted(ours.end_of_generation())
    runtimes = {s: Runtime(ours, strategy=s) for s in ("none", "ngram")}  # calibrated on first use

    print(f"model {os.path.basename(args.model)}, {args.threads} threads, torch {torch.__version__}, ", end="")
    print(f"transformers {transformers.__version__}, greedy, {args.max_tokens} new tokens, ", end="")
    print(f"localspec {args.dtype}, transformers float32")
    head = f"{'prompt':<10} {'what':<16} {'localspec t/s':>13} {'transformers t/s':>16} {'ratio':>6}  same text"
    print(head)
    print("-" * len(head))
    for prompt in prompts:
        ids = prompt_ids(ours, prompt)
        tallies = {k: Tally() for k in ("ours-plain", "ours-ngram", "hf-plain", "hf-lookup")}
        run_ours(runtimes["none"], prompt, 8)  # warm up both sides
        run_transformers(hf, ids, 8, eos, 0)
        for _ in range(args.repeats):
            tallies["ours-plain"].add(*run_ours(runtimes["none"], prompt, args.max_tokens))
            tallies["hf-plain"].add(*run_transformers(hf, ids, args.max_tokens, eos, 0))
            tallies["ours-ngram"].add(*run_ours(runtimes["ngram"], prompt, args.max_tokens))
            tallies["hf-lookup"].add(*run_transformers(hf, ids, args.max_tokens, eos, args.lookup))
        for label, mine, theirs in (
            ("plain", "ours-plain", "hf-plain"),
            (f"prompt lookup {args.lookup}", "ours-ngram", "hf-lookup"),
        ):
            a, b = tallies[mine], tallies[theirs]
            same = "yes" if a.outputs == b.outputs else "no"
            print(f"{prompt.id:<10} {label:<16} {a.rate:>13.1f} {b.rate:>16.1f} {a.rate / b.rate:>5.2f}x  {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
