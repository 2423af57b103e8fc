"""What taking back a rejected draft costs a Qwen3.5-class hybrid on MLX, both ways.

A verify block of γ+1 tokens is evaluated, then rolled back to keep 1 + n_acc of them:
- per-position: the Gated DeltaNet recurrence runs token by token inside the block and
  leaves its state after each token (rollback.stepwise_hidden); the rollback restores one.
- snapshot-replay: the block runs as mlx-lm runs it, the state before it is kept, and the
  rollback restores that and replays the 1 + n_acc kept tokens (a pass of its own).
Printed: milliseconds for block + rollback, median of the repeats, per n_acc, and the plain
single-token step beside them. Random weights at a Qwen3.5-0.8B layer shape (fewer layers
and a smaller vocabulary by default, to fit a shared CPU); only the ratios mean anything.

    python benchmarks/mlx_hybrid_rollback.py [--layers 8] [--gamma 4] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time
from importlib.metadata import version
from typing import Any

import mlx.core as mx
from mlx_lm.models import qwen3_5

from localspec.backends.mlx import Forward, MlxBackend
from localspec.backends.vocab import NORMAL, from_gguf


def build(layers: int, vocab: int) -> Any:
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
    mx.eval(model.parameters())
    model.eval()
    return model


def vocab_of(size: int) -> Any:
    tokens = [f"t{i}" for i in range(size)]
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [NORMAL] * size,
        "tokenizer.ggml.merges": [],
        "tokenizer.ggml.eos_token_id": 0,
    }
    return from_gguf(meta, "bench")


def once(backend: MlxBackend, prefix: int, block: list[int], keep: int) -> float:
    t0 = time.perf_counter()
    backend.eval_block(block, "all")
    backend.rollback(prefix + keep)
    seconds = time.perf_counter() - t0
    backend.rollback(prefix)
    return seconds * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    model = build(args.layers, args.vocab)
    vocab = vocab_of(args.vocab)
    prompt = [(13 * i) % 1000 + 1 for i in range(args.context)]
    block = [(7 * i) % 1000 + 1 for i in range(args.gamma + 1)]
    print(f"qwen3_5, {args.layers} layers at Qwen3.5-0.8B width, {args.context} tokens of context, γ={args.gamma}, "
          f"mlx {version('mlx')} on {mx.default_device()}")  # fmt: skip
    ways = {"per-position": True, "snapshot-replay": False}
    backends = {
        label: MlxBackend(Forward(model, stepwise=s), vocab, name=label, path="-", architecture="qwen3_5", n_ctx=4096)
        for label, s in ways.items()
    }
    for backend in backends.values():
        backend.eval_block(prompt, "none")
        once(backend, args.context, block, 1)  # warm up
    # Rounds over every case, so a burst of load on a shared machine spreads over all of them.
    cases = [("step", 0)] + [("block", n) for n in range(args.gamma + 1)]
    samples: dict[tuple[str, str, int], list[float]] = {}
    for _ in range(args.repeats):
        for kind, n_acc in cases:
            for label, backend in backends.items():
                tokens, keep = (block[:1], 1) if kind == "step" else (block, 1 + n_acc)
                samples.setdefault((label, kind, n_acc), []).append(once(backend, args.context, tokens, keep))
    median = {key: statistics.median(v) for key, v in samples.items()}
    print(f"{'n_acc':>16}: " + " ".join(f"{n:>8}" for n in range(args.gamma + 1)) + "   single-token step")
    for label in ways:
        row = " ".join(f"{median[(label, 'block', n)]:8.1f}" for n in range(args.gamma + 1))
        print(f"{label:>16}: {row}   {median[(label, 'step', 0)]:8.1f}  ms (block + rollback)")
    n_values = range(args.gamma + 1)
    ratio = [median[("snapshot-replay", "block", n)] / median[("per-position", "block", n)] for n in n_values]
    print(f"{'replay/per-pos':>16}: " + " ".join(f"{r:8.2f}" for r in ratio))
    replayed = {label: b._marks.replayed if b._marks else 0 for label, b in backends.items()}
    print("tokens replayed: " + ", ".join(f"{label} {n}" for label, n in replayed.items()))


if __name__ == "__main__":
    main()
