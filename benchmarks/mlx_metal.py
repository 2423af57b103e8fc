"""Plain decoding and MTP drafting on the MLX backend: Qwen3.6's own MTP head and Gemma 4's
assistant, as a Mac user runs them on Metal.

For each model it prints, as Markdown:
- t(k)/t(1): a verify pass over k tokens (plus its rollback) against a one-token step, the
  cost curve the controller prices drafts with;
- decode tokens/s of mlx-lm's own generate_step (the plain peer: mlx-lm's decoding loop,
  its own caches), localspec's plain decoding, MTP under the controller (draft length chosen
  per step, with n-gram lookup beside the head as the controller runs a drafter), and MTP
  at each fixed draft length; then the controller's mean γ beside the best fixed γ.

On an Apple Silicon Mac, with the models pulled (`localspec pull qwen3.6-27b --backend mlx`,
`localspec pull gemma-4-12b-assistant --backend mlx`) or any folders:

    python benchmarks/mlx_metal.py --pairs
    python benchmarks/mlx_metal.py --qwen DIR --gemma DIR --gemma-assistant DIR

Anywhere MLX runs (mlx[cpu] on Linux too), with random weights at real layer shapes (fewer
layers and a 32k vocabulary by default, to fit a small CPU). Random heads agree with their
target by chance only, so these runs measure speed and overhead, never acceptance:

    python benchmarks/mlx_metal.py --random-weights qwen3.5-0.8b --random-weights gemma4-e2b
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
from mlx.utils import tree_flatten

from localspec.api import runtime_for
from localspec.backends.mlx import Forward, MlxBackend, load
from localspec.backends.vocab import NORMAL, from_gguf
from localspec.core.protocol import Backend

SHAPES = ("qwen3.5-0.8b", "gemma4-e2b")
FIXED = (1, 2, 3, 4)


@dataclass
class Case:
    label: str
    target: MlxBackend
    head: Callable[[], Backend]  # a fresh drafter for the target


# -- random weights at real layer shapes ---------------------------------------------------------


def flat(module: Any) -> list[tuple[str, mx.array]]:
    pairs = cast(list[tuple[str, Any]], tree_flatten(module.parameters()))  # type: ignore[no-untyped-call]
    return [(k, v) for k, v in pairs if isinstance(v, mx.array)]


def byte_chars() -> list[str]:
    """GPT-2's byte-level alphabet: one token per byte, so any text tokenizes (the controller
    measures a pair's agreement on a text)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def vocab_of(size: int) -> Any:
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": [*byte_chars(), *(f"t{i}" for i in range(256, size))],
        "tokenizer.ggml.token_type": [NORMAL] * size,
        "tokenizer.ggml.merges": [],
        "tokenizer.ggml.eos_token_id": 0,
    }
    return from_gguf(meta, "bench")


def random_qwen(layers: int, vocab: int, folder: Path) -> Case:
    """Qwen3.5-0.8B's layer shape (Gated DeltaNet x3, then attention) with its MTP block."""
    from mlx_lm.models import qwen3_5

    from localspec.backends.mlx.mtp import MtpBlock

    text = {
        "model_type": "qwen3_5",
        "hidden_size": 1024,
        "intermediate_size": 3584,
        "num_hidden_layers": layers,
        "full_attention_interval": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "linear_num_value_heads": 16,
        "linear_num_key_heads": 16,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "vocab_size": vocab,
        "tie_word_embeddings": True,
        "max_position_embeddings": 4096,
    }
    mx.random.seed(0)
    model = qwen3_5.Model(qwen3_5.ModelArgs.from_dict({"model_type": "qwen3_5", "text_config": text}))  # type: ignore[no-untyped-call]
    block = MtpBlock(model.language_model.args)
    mx.eval(model.parameters(), block.parameters())
    model.eval()
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "mtp.safetensors"), {f"mtp.{k}": v for k, v in flat(block)})
    name = f"random Qwen3.5-0.8B shape, {layers} layers, vocab {vocab}"
    target = MlxBackend(
        Forward(model), vocab_of(vocab), name=name, path=str(folder), architecture="qwen3_5", n_ctx=4096
    )
    return Case(name, target, lambda: target.make_self_drafter("mtp", None))


def random_gemma(layers: int, vocab: int, folder: Path) -> Case:
    """Gemma-4-E2B's layer shape (sliding x4, then full; per-layer inputs) and an assistant
    of the E-assistants' width (256), written as a folder and loaded as one."""
    from mlx_lm.models import gemma4_text

    from localspec.backends.mlx.assistant import Gemma4Assistant

    kinds = (["sliding_attention"] * 4 + ["full_attention"]) * (layers // 5 + 1)
    text = {
        "model_type": "gemma4_text",
        "hidden_size": 1536,
        "num_hidden_layers": layers,
        "intermediate_size": 6144,
        "num_attention_heads": 8,
        "head_dim": 256,
        "global_head_dim": 512,
        "num_key_value_heads": 1,
        "num_kv_shared_layers": 0,
        "layer_types": [*kinds[: layers - 1], "full_attention"],
        "hidden_size_per_layer_input": 256,
        "vocab_size": vocab,
        "vocab_size_per_layer_input": vocab,
        "sliding_window": 512,
        "max_position_embeddings": 4096,
    }
    mx.random.seed(0)
    model = gemma4_text.Model(gemma4_text.ModelArgs.from_dict(text))  # type: ignore[no-untyped-call]
    mx.eval(model.parameters())
    model.eval()
    assistant_text = {
        **text,
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "intermediate_size": 2048,
        "num_attention_heads": 4,
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
        "hidden_size_per_layer_input": 0,
        "num_kv_shared_layers": 4,
    }
    args = gemma4_text.ModelArgs.from_dict(assistant_text)  # type: ignore[no-untyped-call]
    args.use_double_wide_mlp = False
    assistant = Gemma4Assistant(args, 1536)
    mx.eval(assistant.parameters())
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {(k if "_projection" in k else f"model.{k}"): v for k, v in flat(assistant)}
    mx.save_safetensors(str(folder / "model.safetensors"), tensors)
    config = {"model_type": "gemma4_assistant", "backbone_hidden_size": 1536, "text_config": assistant_text}
    (folder / "config.json").write_text(json.dumps(config))
    name = f"random Gemma-4-E2B shape, {layers} layers, vocab {vocab}"
    target = MlxBackend(Forward(model), vocab_of(vocab), name=name, path="-", architecture="gemma4", n_ctx=4096)
    return Case(name, target, lambda: target.assistant_head(str(folder)))


# -- pulled models ----------------------------------------------------------------------------------


def pulled(pair: str) -> tuple[str, str | None]:
    from localspec.models.pull import resolve_pair

    resolved = resolve_pair(pair, backend="mlx")
    return str(resolved.target), str(resolved.drafter) if resolved.drafter else None


def qwen_case(folder: str) -> Case:
    target = load(folder)
    return Case(target.info.name, target, lambda: target.make_self_drafter("mtp", None))


def gemma_case(folder: str, assistant: str) -> Case:
    target = load(folder)
    return Case(f"{target.info.name} + {os.path.basename(assistant)}", target, lambda: target.assistant_head(assistant))


# -- measurements ----------------------------------------------------------------------------------


def cost_ratios(target: MlxBackend, context: list[int], ks: range, repeats: int) -> dict[int, float]:
    """t(k)/t(1): a pass over k tokens with its rollback, median over rounds of every k."""
    target.rollback(0)
    target.eval_block(context, "none")
    block = context[:1] * max(ks)
    samples: dict[int, list[float]] = {k: [] for k in ks}
    for _ in range(repeats + 1):  # the first round warms up
        for k in ks:
            t0 = time.perf_counter()
            target.eval_block(block[:k], "all")
            target.rollback(len(context))
            samples[k].append(time.perf_counter() - t0)
    median = {k: statistics.median(v[1:]) for k, v in samples.items()}
    return {k: median[k] / median[1] for k in ks}


def mlx_lm_peer(target: MlxBackend, prompt: list[int], tokens: int) -> float:
    """Decode tokens/s of mlx-lm's generate_step (its own caches), after its first token."""
    from mlx_lm.generate import generate_step

    steps: Iterator[Any] = generate_step(mx.array(prompt), target.model, max_tokens=tokens)
    next(steps)
    t0 = time.perf_counter()
    n = sum(1 for _ in steps)
    return n / (time.perf_counter() - t0)


@dataclass
class Run:
    label: str
    tok_s: float
    gamma: float = 0.0
    drafted: int = 0
    accepted: int = 0
    lookup: tuple[int, int] = (0, 0)  # of drafted/accepted: n-gram lookup's, beside the head under the controller


def decode(case: Case, prompt: list[int], tokens: int, draft_tokens: Any, mtp: bool) -> Run:
    case.target.rollback(0)
    head = case.head() if mtp else None
    runtime = runtime_for(case.target, head, strategy="draft" if mtp else "none", draft_tokens=draft_tokens)
    out = runtime.generate(prompt=prompt, max_tokens=tokens, temperature=0)
    stats = out.stats
    steps = sum(stats.gamma_histogram.values())
    gamma = sum(g * n for g, n in stats.gamma_histogram.items()) / steps if steps else 0.0
    label = "plain" if not mtp else f"MTP, γ {draft_tokens}"
    if head is not None:
        head.close()
    lookup = (stats.lookup_drafted, stats.lookup_accepted)
    return Run(label, stats.decode_tokens_per_s, gamma, stats.drafted, stats.accepted, lookup)


def measure(case: Case, tokens: int, repeats: int) -> None:
    vocab = case.target.info.n_vocab
    prompt = [(97 * i + 13) % (vocab - 1) + 1 for i in range(64)]
    print(f"\n### {case.label}\n")
    ratios = cost_ratios(case.target, prompt, range(1, 9), repeats)
    print("| k | " + " | ".join(str(k) for k in ratios) + " |")
    print("|---|" + "---|" * len(ratios))
    print("| t(k)/t(1) | " + " | ".join(f"{r:.2f}" for r in ratios.values()) + " |\n")
    runs: list[Run] = [Run("mlx-lm generate_step (plain peer)", mlx_lm_peer(case.target, prompt, tokens))]
    runs.append(decode(case, prompt, tokens, 0, mtp=False))
    runs.append(decode(case, prompt, tokens, "auto", mtp=True))
    runs += [decode(case, prompt, tokens, g, mtp=True) for g in FIXED]
    print("| run | decode tok/s | mean γ asked | drafted | accepted | of which n-gram lookup's |")
    print("|---|---|---|---|---|---|")
    for run in runs:
        gamma = f"{run.gamma:.2f}" if run.label.startswith("MTP") else "-"
        lookup = f"{run.lookup[0]} / {run.lookup[1]}" if run.label.startswith("MTP") else "-"
        print(f"| {run.label} | {run.tok_s:.2f} | {gamma} | {run.drafted} | {run.accepted} | {lookup} |")
    best = max(runs[3:], key=lambda r: r.tok_s)
    auto = runs[2]
    print(
        f"\ncontroller: mean γ {auto.gamma:.2f} at {auto.tok_s:.2f} tok/s; best fixed: {best.label} at "
        f"{best.tok_s:.2f} tok/s ({auto.tok_s / best.tok_s:.2f}x of it)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--qwen", help="a Qwen3.5/3.6 MLX folder that keeps its mtp.* weights")
    parser.add_argument("--gemma", help="a Gemma 4 MLX folder")
    parser.add_argument("--gemma-assistant", help="its assistant's MLX folder")
    parser.add_argument("--pairs", action="store_true", help="the pulled pairs qwen3.6-27b and gemma-4-12b-assistant")
    parser.add_argument("--random-weights", action="append", choices=SHAPES, default=[], metavar="SHAPE")
    parser.add_argument("--layers", type=int, default=0, help="random weights: layers (default 8 qwen, 5 gemma)")
    parser.add_argument("--vocab", type=int, default=32000, help="random weights: vocabulary size")
    parser.add_argument("--tokens", type=int, default=128, help="tokens generated per run")
    parser.add_argument("--repeats", type=int, default=3, help="rounds for t(k)/t(1)")
    args = parser.parse_args()
    if args.random_weights and "LOCALSPEC_HOME" not in os.environ:
        os.environ["LOCALSPEC_HOME"] = tempfile.mkdtemp()  # random models' learnt costs stay out of the user's
    print(f"mlx {version('mlx')}, mlx-lm {version('mlx_lm')} on {mx.default_device()}, {sys.platform}")
    cases: list[Callable[[], Case]] = []
    scratch = Path(tempfile.mkdtemp())
    for shape in args.random_weights:
        if shape == "qwen3.5-0.8b":
            cases.append(lambda: random_qwen(args.layers or 8, args.vocab, scratch / "qwen"))
        else:
            cases.append(lambda: random_gemma(args.layers or 5, args.vocab, scratch / "gemma-assistant"))
    if args.pairs:
        qwen, _ = pulled("qwen3.6-27b")
        gemma, assistant = pulled("gemma-4-12b-assistant")
        assert assistant is not None
        cases += [lambda: qwen_case(qwen), lambda: gemma_case(gemma, assistant)]
    if args.qwen:
        cases.append(lambda: qwen_case(args.qwen))
    if args.gemma and args.gemma_assistant:
        cases.append(lambda: gemma_case(args.gemma, args.gemma_assistant))
    if not cases:
        parser.error("give --pairs, --qwen/--gemma with --gemma-assistant, or --random-weights SHAPE")
    for make in cases:
        case = make()
        measure(case, args.tokens, args.repeats)
        case.target.close()


if __name__ == "__main__":
    main()
