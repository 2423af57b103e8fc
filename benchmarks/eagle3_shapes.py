"""What an EAGLE-3 head costs beside its target on the CPU: random weights at Llama-3.1-8B's
width (hidden 4096, 32 query and 8 KV heads, FFN 14336, vocabulary 128256) with fewer layers
than its 32 (writing and quantizing the whole 8B here takes longer than the measurement; the
per-layer slope from two depths gives the full model's step), quantized with llama.cpp's own
call, and a head at the shape the Llama-3.1-8B heads have (one block reading 2 x 4096, fc
from 3 x 4096, a 32000-token draft vocabulary mapped by d2t, the target's embeddings
borrowed), in F16 as converted. Speed only: random weights accept nothing.

    python benchmarks/eagle3_shapes.py                          # 2 and 4 layers, Q4_K_M, 1 thread
    python benchmarks/eagle3_shapes.py --peers-bin DIR          # and llama-speculative-simple, pass for pass

Rows: the target's pass over k = 1..8 tokens (a verify pass that keeps one token); the head's
two passes (a drafted token read with its own state; a token the target has verified, read
through fc first); the projected speedup at acceptance 0.5-0.9, best fixed draft length
against the controller's choice; and, given llama.cpp's binaries, the same files through
llama-speculative-simple --spec-type draft-eagle3 against localspec's loop at the same fixed
draft length, per verify step. Every figure is CPU time of one thread (--threads 1, the
default): on a shared host the clock stretches with the neighbours' load, the work does not.
"""

from __future__ import annotations

import argparse
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from localspec.backends.llamacpp.backend import LlamaCppBackend
from localspec.backends.llamacpp.copies import quantize
from localspec.control.replay import projection_rows
from localspec.core.acceptance import accept_greedy
from localspec.core.sampling import SamplingConfig
from localspec.drafters.model import ModelDrafter
from localspec.testing.gguf_writer import add_bpe_vocab

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB, DRAFT_VOCAB = 4096, 32, 8, 128, 14336, 128_256, 32_000
FULL_LAYERS = 32
MAX_K = 8
ALPHAS = (0.5, 0.6, 0.7, 0.8, 0.9)
DEPTH = 256  # tokens of context behind every timed pass
GAMMA = 3  # the fixed draft length of the pass-for-pass comparison (llama.cpp's default n-max)


def noise(shape: tuple[int, ...], std: float, seed: int) -> np.ndarray:
    """Random F16 values, a tile of a small random block: the values do not matter, their cost does."""
    block = np.random.default_rng(seed).normal(0, std, 1 << 20).astype(np.float16)
    n = int(np.prod(shape))
    return np.resize(block, n).reshape(shape)


def write_target(layers: int, path: Path) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(4096)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(500_000.0)
    add_bpe_vocab(writer, VOCAB)
    s = HIDDEN**-0.5
    writer.add_tensor("token_embd.weight", noise((VOCAB, HIDDEN), 0.02, 0))
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    writer.add_tensor("output.weight", noise((VOCAB, HIDDEN), s, 1))
    for i in range(layers):
        p = f"blk.{i}."
        for name, shape in (
            ("attn_q", (HEADS * HEAD_DIM, HIDDEN)),
            ("attn_k", (KV_HEADS * HEAD_DIM, HIDDEN)),
            ("attn_v", (KV_HEADS * HEAD_DIM, HIDDEN)),
            ("attn_output", (HIDDEN, HEADS * HEAD_DIM)),
            ("ffn_gate", (FFN, HIDDEN)),
            ("ffn_up", (FFN, HIDDEN)),
            ("ffn_down", (HIDDEN, FFN)),
        ):
            writer.add_tensor(p + name + ".weight", noise(shape, s, 10 * i + len(name)))
        writer.add_tensor(p + "attn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        writer.add_tensor(p + "ffn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    return _close(writer)


def write_head(layers: int, path: Path) -> Path:
    """An EAGLE-3 head in the layout convert_hf_to_gguf.py writes for a Llama-3.1-8B head."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "eagle3")
    writer.add_context_length(4096)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(1)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(500_000.0)
    writer.add_array("eagle3.target_layers", [layers // 8, layers // 2, layers - 1])  # low, middle, high
    writer.add_uint32("eagle3.target_hidden_size", HIDDEN)
    add_bpe_vocab(writer, VOCAB)
    s = HIDDEN**-0.5
    writer.add_tensor("fc.weight", noise((HIDDEN, 3 * HIDDEN), s, 50))
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    writer.add_tensor("output.weight", noise((DRAFT_VOCAB, HIDDEN), s, 51))
    d2t = np.sort(np.random.default_rng(52).choice(VOCAB, DRAFT_VOCAB, replace=False)).astype(np.int64)
    writer.add_tensor("d2t", d2t, raw_dtype=gguf.GGMLQuantizationType.I64)
    for name, shape in (
        ("attn_q", (HEADS * HEAD_DIM, 2 * HIDDEN)),
        ("attn_k", (KV_HEADS * HEAD_DIM, 2 * HIDDEN)),
        ("attn_v", (KV_HEADS * HEAD_DIM, 2 * HIDDEN)),
        ("attn_output", (HIDDEN, HEADS * HEAD_DIM)),
        ("ffn_gate", (FFN, HIDDEN)),
        ("ffn_up", (FFN, HIDDEN)),
        ("ffn_down", (HIDDEN, FFN)),
    ):
        writer.add_tensor(f"blk.0.{name}.weight", noise(shape, s, 60 + len(name)))
    for name in ("attn_norm", "attn_norm_2", "ffn_norm"):
        writer.add_tensor(f"blk.0.{name}.weight", np.ones(HIDDEN, dtype=np.float32))
    return _close(writer)


def _close(writer: object) -> Path:
    writer.write_header_to_file()  # type: ignore[attr-defined]
    writer.write_kv_data_to_file()  # type: ignore[attr-defined]
    writer.write_tensors_to_file()  # type: ignore[attr-defined]
    writer.close()  # type: ignore[attr-defined]
    return Path(writer.path)  # type: ignore[attr-defined]


def files(layers: int, folder: Path, ftype: str) -> tuple[Path, Path]:
    """The target (quantized) and its head, written once."""
    folder.mkdir(parents=True, exist_ok=True)
    target, head = folder / f"llama-4096x{layers}.{ftype}.gguf", folder / f"eagle3-llama-4096x{layers}.F16.gguf"
    if not target.exists():
        source = folder / f"llama-4096x{layers}.F16.gguf"
        print(f"  writing {source.name} ...", file=sys.stderr, flush=True)
        write_target(layers, source)
        print(f"  quantizing to {ftype} ...", file=sys.stderr, flush=True)
        quantize(source, target, ftype)
        source.unlink()
    if not head.exists():
        print(f"  writing {head.name} ...", file=sys.stderr, flush=True)
        write_head(layers, head)
    return target, head


def timed(run: object, reps: int) -> float:
    """Median CPU seconds of run() over reps calls, after one warm-up: on one thread the work
    itself, which a busy host's other processes do not stretch as they stretch the clock."""
    times = []
    for _ in range(reps + 1):
        t0 = time.process_time()
        run()  # type: ignore[operator]
        times.append(time.process_time() - t0)
    return statistics.median(times[1:])


def pass_costs(target: LlamaCppBackend, reps: int) -> list[float]:
    """Seconds per verify pass of k = 1..MAX_K tokens that keeps its first token."""
    rng = np.random.default_rng(0)
    costs = []
    for k in range(1, MAX_K + 1):
        past = target.n_past

        def run(k: int = k, past: int = past) -> None:
            target.eval_block(rng.integers(300, 5000, k).tolist(), "all")
            target.rollback(past + 1)

        costs.append(timed(run, reps))
        target.rollback(past)
    return costs


def head_costs(head: object, reps: int) -> tuple[float, float]:
    """Seconds per head pass: a drafted token (read with the head's own state), and a token
    at the target's frontier (its state read through fc first). The head holds what the
    target decoded."""
    rng = np.random.default_rng(1)
    past = head.n_past  # type: ignore[attr-defined]

    def verified() -> None:
        head.eval_block([int(rng.integers(300, 5000))], "last")  # type: ignore[attr-defined]
        head.rollback(past)  # type: ignore[attr-defined]

    through_fc = timed(verified, reps)
    head.eval_block([int(rng.integers(300, 5000))], "last")  # type: ignore[attr-defined]

    def own() -> None:  # one token beyond the target's: the next reads the head's own state
        head.eval_block([int(rng.integers(300, 5000))], "last")  # type: ignore[attr-defined]
        head.rollback(past + 1)  # type: ignore[attr-defined]

    return timed(own, reps), through_fc


def our_steps(target_path: Path, head_path: Path, threads: int, n_predict: int) -> tuple[float, int]:
    """localspec's loop at a fixed draft length GAMMA, greedy: CPU seconds per verify step, steps."""
    target = LlamaCppBackend(str(target_path), n_ctx=1024, threads=threads)
    drafter = ModelDrafter(target.eagle3_head(str(head_path)), min_confidence=0)
    cfg, rng = SamplingConfig(temperature=0.0), np.random.default_rng(0)
    ctx = target.tokenize("The quick brown fox jumps over the lazy dog. " * 4, add_special=True, parse_special=False)
    start = len(ctx)
    ctx.append(int(np.argmax(target.eval_block(ctx, "last")[-1])))
    drafter.start(ctx)
    steps, t0 = 0, time.process_time()
    while len(ctx) - start < n_predict:
        draft = drafter.propose(ctx, GAMMA, cfg, rng).tokens
        past = target.n_past
        kept, bonus = accept_greedy(draft, target.eval_block([ctx[-1], *draft], "all"))
        ctx += [*draft[:kept], bonus]
        target.rollback(past + 1 + kept)
        drafter.commit(ctx, kept)
        steps += 1
    seconds = time.process_time() - t0
    target.close()
    return seconds / steps, steps


def their_steps(bin_dir: Path, target: Path, head: Path, threads: int, n_predict: int) -> tuple[float, int] | None:
    """llama-speculative-simple --spec-type draft-eagle3 on the same files: CPU seconds per
    verify step, from two runs (n_predict tokens and 8) so loading and the prompt cancel out."""
    if not (bin_dir / "llama-speculative-simple").exists():
        return None
    long, short = _their_run(bin_dir, target, head, threads, n_predict), _their_run(bin_dir, target, head, threads, 8)
    return (long[0] - short[0]) / (long[1] - short[1]), long[1]


def _their_run(bin_dir: Path, target: Path, head: Path, threads: int, n_predict: int) -> tuple[float, int]:
    """(the child's CPU seconds, its verify steps) for one run."""
    prompt = "The quick brown fox jumps over the lazy dog. " * 4
    cmd = [
        str(bin_dir / "llama-speculative-simple"),
        "-m",
        str(target),
        "-md",
        str(head),
        "--spec-type",
        "draft-eagle3",
    ]
    cmd += ["--spec-draft-n-max", str(GAMMA), "-p", prompt, "-n", str(n_predict), "--temp", "0", "-t", str(threads)]
    cmd += ["-td", str(threads), "-c", "1024"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    decoded = re.search(r"decoded\s+(\d+) tokens in", out)
    accepted = re.search(r"n_accept\s*=\s*(\d+)", out)
    assert decoded and accepted, out[-2000:]
    steps = int(decoded.group(1)) - int(accepted.group(1))  # every step adds its bonus token and what it accepted
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, steps


def measure(layers: int, args: argparse.Namespace) -> list[float]:
    target_path, head_path = files(layers, Path(args.folder), args.ftype)
    target = LlamaCppBackend(str(target_path), n_ctx=1024, threads=args.threads)
    head = target.eagle3_head(str(head_path))
    context = np.random.default_rng(2).integers(300, 5000, DEPTH).tolist()
    target.eval_block(context, "none")
    head.eval_block(context, "last")
    costs = pass_costs(target, args.reps)
    drafted, verified = head_costs(head, args.reps)
    print(f"\n{layers} layers: {target_path.name} ({target.info.size_bytes / 1e9:.2f} GB), head {head.info.name}")
    print("target pass over k tokens (ms): " + ", ".join(f"k={k} {c * 1e3:.1f}" for k, c in enumerate(costs, 1)))
    print(f"head pass, drafted token (own state): {drafted * 1e3:.1f} ms = {drafted / costs[0]:.3f} of a target step")
    print(
        f"head pass, verified token (through fc): {verified * 1e3:.1f} ms = {verified / costs[0]:.3f} of a target step"
    )
    target.close()
    return [*costs, drafted, verified]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 4], help="target depths (Llama-3.1-8B: 32)")
    parser.add_argument("--ftype", default="Q4_K_M")
    parser.add_argument("--folder", default="/tmp/localspec-eagle3-bench", help="where the GGUFs are kept")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--peers-bin", type=Path, help="llama.cpp's build/bin, for llama-speculative-simple")
    parser.add_argument("--n-predict", type=int, default=48)
    args = parser.parse_args()
    by_depth = {layers: measure(layers, args) for layers in args.layers}
    if len(by_depth) >= 2:  # a straight line through the two deepest: the full model's costs
        (l0, c0), (l1, c1) = sorted(by_depth.items())[-2:]
        full = [a + (b - a) * (FULL_LAYERS - l0) / (l1 - l0) for a, b in zip(c0[:MAX_K], c1[:MAX_K], strict=True)]
        drafted = c1[MAX_K]
        ratios = ", ".join(f"{c / full[0]:.2f}" for c in full)
        print(f"\nextrapolated to {FULL_LAYERS} layers: target step {full[0] * 1e3:.1f} ms, head pass")
        print(f"  {drafted * 1e3:.1f} ms = {drafted / full[0]:.3f} of a step; t(k)/t(1): {ratios}")
        print("alpha  best fixed γ  its speedup  controller's γ  its speedup")
        for alpha, best, fixed, chosen, reached in projection_rows(full, drafted, ALPHAS):
            print(f"{alpha:.1f}    {best:>2}            {fixed:.2f}x        {chosen:>2}             {reached:.2f}x")
    if args.peers_bin:
        layers = max(args.layers)
        target_path, head_path = files(layers, Path(args.folder), args.ftype)
        theirs = (args.peers_bin, target_path, head_path, args.threads, args.n_predict)
        for name, result in (  # theirs before and after ours: the host's load moves
            ("llama-speculative-simple", their_steps(*theirs)),
            ("localspec", our_steps(*theirs[1:])),
            ("llama-speculative-simple", their_steps(*theirs)),
        ):
            if result is not None:
                print(f"{name}: {result[0] * 1e3:.1f} ms CPU per verify step of {GAMMA} drafts ({result[1]} steps)")


if __name__ == "__main__":
    main()
