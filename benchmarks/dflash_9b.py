"""A DFlash drafter beside a Qwen3.5-9B-class hybrid on llama.cpp: pass costs at the real
shape, random weights (speed only), quantized with llama.cpp's own llama-quantize.

    python benchmarks/dflash_9b.py write --quantize BIN/llama-quantize   # the GGUFs, once
    python benchmarks/dflash_9b.py measure --threads 1                   # the figures
    python benchmarks/dflash_9b.py clean                                 # delete the files

The target has Qwen3.5-9B's layout (32 blocks, every 4th attention, width 4096, FFN 12288,
16/4 heads of 256, Gated DeltaNet with 16 key and 32 value heads of 128, a 248,320-token
vocabulary, untied head); the drafter a z-lab-style DFlash model at its width (5 blocks of
32/8 heads of 128, FFN 12288, reading 5 of the target's layers, block 16), sharing the
target's embeddings and head. Both are written tensor by tensor in F16 (about 18 GB for the
target: nothing is held in memory but the tensor being written), then quantized.

Measured as dflash_shapes.py does for the 0.8B class (benchmarks/pages/drafters.md): a verify pass
over k tokens that keeps one and takes the rest back (through the snapshots, a replay past
them), the drafter's block pass and its injection against a target step, and the projected
speedup at acceptances 0.5-0.9 (the block priced as one pass), the best fixed length against
the controller's choice. A pass of the 9B on one CPU thread takes seconds, so k is measured
at a few sizes and the curve between them interpolated linearly.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from dflash_shapes import BLOCK, drafter_costs, projection

from localspec.testing.dflash_support import DFlashShape, add_dflash_header
from localspec.testing.gguf_writer import HybridSpec, add_qwen35_header

SPEC = HybridSpec(
    layers=32, interval=4, hidden=4096, heads=16, kv_heads=4, head_dim=256, ffn=12288,
    ssm_state=128, ssm_groups=16, ssm_heads=32, conv_kernel=4, vocab=248_320, half=True, n_ctx=4096,
)  # fmt: skip
DRAFTER = DFlashShape(5, 4096, 12288, 32, 8, 128, BLOCK, (2, 9, 16, 23, 30), 10_000_000.0)
MASK_ID = 248_000
SIZES = (1, 2, 3, 4, 6, 8, 12, 16)  # the k measured; the rest interpolated
DEPTH = 64  # tokens of context behind every timed pass (a prefill of the 9B at one thread is slow)
POOL = 1 << 24  # random values every tensor is cut from (the weights' values do not matter here)

Layout = list[tuple[str, tuple[int, ...], float, float]]  # name, numpy shape, std, center
Header = Callable[[Any], object]  # writes a file's keys and tokenizer


def target_layout(spec: HybridSpec) -> Layout:
    """qwen35's tensors (gguf_writer.qwen35_tensors' names and scales), without their values."""
    h, hd = spec.hidden, spec.head_dim
    key_dim, value_dim = spec.ssm_state * spec.ssm_groups, spec.ssm_state * spec.ssm_heads
    out: Layout = [
        ("token_embd.weight", (spec.vocab, h), 0.5, 0.0),
        ("output_norm.weight", (h,), 0.1, 1.0),
        ("output.weight", (spec.vocab, h), 4 * h**-0.5, 0.0),
    ]
    for i in range(spec.layers):
        p = f"blk.{i}."
        out += [
            (p + "attn_norm.weight", (h,), 0.1, 1.0),
            (p + "post_attention_norm.weight", (h,), 0.1, 1.0),
            (p + "ffn_gate.weight", (spec.ffn, h), h**-0.5, 0.0),
            (p + "ffn_up.weight", (spec.ffn, h), h**-0.5, 0.0),
            (p + "ffn_down.weight", (h, spec.ffn), 0.5 * spec.ffn**-0.5, 0.0),
        ]
        if (i + 1) % spec.interval == 0:
            q = spec.heads * hd
            out += [
                (p + "attn_q.weight", (2 * q, h), h**-0.5, 0.0),
                (p + "attn_k.weight", (spec.kv_heads * hd, h), h**-0.5, 0.0),
                (p + "attn_v.weight", (spec.kv_heads * hd, h), h**-0.5, 0.0),
                (p + "attn_output.weight", (h, q), 0.5 * q**-0.5, 0.0),
                (p + "attn_q_norm.weight", (hd,), 0.1, 1.0),
                (p + "attn_k_norm.weight", (hd,), 0.1, 1.0),
            ]
            continue
        out += [
            (p + "attn_qkv.weight", (2 * key_dim + value_dim, h), h**-0.5, 0.0),
            (p + "attn_gate.weight", (value_dim, h), h**-0.5, 0.0),
            (p + "ssm_conv1d.weight", (2 * key_dim + value_dim, spec.conv_kernel), 0.5, 0.0),
            (p + "ssm_dt.bias", (spec.ssm_heads,), 0.5, 0.0),
            (p + "ssm_a", (spec.ssm_heads,), 0.5, -1.0),  # decay rates: negative
            (p + "ssm_beta.weight", (spec.ssm_heads, h), h**-0.5, 0.0),
            (p + "ssm_alpha.weight", (spec.ssm_heads, h), h**-0.5, 0.0),
            (p + "ssm_norm.weight", (spec.ssm_state,), 0.1, 1.0),
            (p + "ssm_out.weight", (h, value_dim), 0.5 * value_dim**-0.5, 0.0),
        ]
    return out


def drafter_layout(shape: DFlashShape) -> Layout:
    """A DFlash drafter's own tensors (it borrows the target's embeddings and head)."""
    h, q, kv = shape.width, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    wide = h * len(shape.target_layers)
    out: Layout = [
        ("fc.weight", (h, wide), wide**-0.5, 0.0),
        ("enc.output_norm.weight", (h,), 0.0, 1.0),
        ("output_norm.weight", (h,), 0.0, 1.0),
    ]
    for i in range(shape.layers):
        p = f"blk.{i}."
        out += [
            (p + "attn_norm.weight", (h,), 0.0, 1.0),
            (p + "attn_q.weight", (q, h), h**-0.5, 0.0),
            (p + "attn_k.weight", (kv, h), h**-0.5, 0.0),
            (p + "attn_v.weight", (kv, h), h**-0.5, 0.0),
            (p + "attn_output.weight", (h, q), q**-0.5, 0.0),
            (p + "attn_q_norm.weight", (shape.head_dim,), 0.0, 1.0),
            (p + "attn_k_norm.weight", (shape.head_dim,), 0.0, 1.0),
            (p + "ffn_norm.weight", (h,), 0.0, 1.0),
            (p + "ffn_gate.weight", (shape.ffn, h), h**-0.5, 0.0),
            (p + "ffn_up.weight", (shape.ffn, h), h**-0.5, 0.0),
            (p + "ffn_down.weight", (h, shape.ffn), shape.ffn**-0.5, 0.0),
        ]
    return out


def values(layout: Layout) -> Iterator[np.ndarray]:
    """Each tensor's values in turn: cut from one pool of normal draws at a random offset,
    scaled; matrices F16 (what llama-quantize reads), vectors and the conv F32."""
    rng = np.random.default_rng(0)
    pool = rng.standard_normal(POOL, dtype=np.float32)
    for name, shape, std, center in layout:
        n = int(np.prod(shape))
        start = int(rng.integers(0, max(POOL - n, 0) + 1))
        flat = np.resize(pool, n) if n > POOL else pool[start : start + n].copy()
        if name.endswith("ssm_a"):
            flat = -np.exp(flat * std)
        else:
            flat = center + flat * np.float32(std)
        half = len(shape) == 2 and "ssm_conv1d" not in name  # llama.cpp never quantizes the conv
        yield flat.reshape(shape).astype(np.float16 if half else np.float32)
        del flat


def stream_gguf(path: Path, arch: str, header: Header, layout: Layout) -> Path:
    """A GGUF written tensor by tensor: the header and every tensor's info first, then each
    tensor's data as it is made."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    header(writer)
    for name, shape, _, _ in layout:
        dtype = np.dtype(np.float16 if len(shape) == 2 and "ssm_conv1d" not in name else np.float32)
        writer.add_tensor_info(name, shape, dtype, int(np.prod(shape)) * dtype.itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in values(layout):
        writer.write_tensor_data(tensor)
    writer.close()
    return path


TEMPLATE_ROWS = 256  # rows of each matrix in the template that llama-quantize sees


def quantized_template(tool: Path, folder: Path, arch: str, header: Header, layout: Layout, ftype: str) -> Any:
    """Every tensor of `layout` quantized by llama-quantize, matrices cut to their first
    TEMPLATE_ROWS rows (llama-quantize picks each tensor's type by its name, as for the whole
    model, and quantizes row by row): the GGUFReader of the result."""
    import gguf

    cut: Layout = [(n, (min(s[0], TEMPLATE_ROWS), *s[1:]) if len(s) == 2 else s, sd, c) for n, s, sd, c in layout]
    source = stream_gguf(folder / f"template-{arch}.F16.gguf", arch, header, cut)
    final = folder / f"template-{arch}.{ftype}.gguf"
    cmd = ["nice", "-n", "10", str(tool), str(source), str(final), ftype]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    source.unlink()
    return gguf.GGUFReader(str(final))


def write_tiled(path: Path, arch: str, header: Header, layout: Layout, template: Any) -> Path:
    """The model at its full shape, each matrix its template's quantized rows repeated (a
    matrix quantizes row by row, so this is a file llama-quantize could have written for
    weights that repeat): written tensor by tensor, never more than one in memory."""
    import gguf

    quantized = {t.name: t for t in template.tensors}
    writer = gguf.GGUFWriter(str(path), arch)
    header(writer)
    plan = []
    for name, shape, _, _ in layout:
        t = quantized[name]
        data = np.asarray(t.data)
        rows = shape[0] if len(shape) == 2 else 1
        full = (rows, *data.shape[1:]) if len(shape) == 2 else data.shape
        raw = t.tensor_type if data.dtype == np.uint8 else None
        writer.add_tensor_info(name, full, data.dtype, int(np.prod(full)) * data.itemsize, raw_dtype=raw)
        plan.append((data, rows // data.shape[0] if len(shape) == 2 else 1))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for data, repeat in plan:
        writer.write_tensor_data(np.tile(data, (repeat, *([1] * (data.ndim - 1)))) if repeat > 1 else data)
    writer.close()
    return path


def write(folder: Path, tool: Path, ftype: str) -> None:
    import gguf

    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"qwen3.5-9b.{ftype}.gguf"
    if not target.exists():
        t0 = time.perf_counter()
        header: Header = lambda w: add_qwen35_header(w, SPEC)  # noqa: E731
        template = quantized_template(tool, folder, "qwen35", header, target_layout(SPEC), ftype)
        write_tiled(target, "qwen35", header, target_layout(SPEC), template)
        print(f"target {ftype} written in {time.perf_counter() - t0:.0f} s", flush=True)
    drafter = folder / f"qwen3.5-9b-dflash.{ftype}.gguf"
    if not drafter.exists():
        t0 = time.perf_counter()
        reader = gguf.GGUFReader(str(target))
        header = lambda w: add_dflash_header(reader, w, DRAFTER, MASK_ID)  # noqa: E731
        template = quantized_template(tool, folder, "dflash", header, drafter_layout(DRAFTER), ftype)
        write_tiled(drafter, "dflash", header, drafter_layout(DRAFTER), template)
        print(f"drafter {ftype} written in {time.perf_counter() - t0:.0f} s", flush=True)


def pass_costs(model: Any, reps: int) -> dict[int, float]:
    """CPU seconds per verify pass of k tokens (SIZES) that keeps one and takes k - 1 back
    (one thread: the process's CPU time, which the neighbours' load does not stretch)."""
    rng = np.random.default_rng(0)
    model.rollback(0)
    model.eval_block(rng.integers(300, 5000, DEPTH).tolist(), "none")
    costs = {}
    for k in SIZES:
        runs = []
        for _ in range(reps + 1):  # the first is a warm-up
            past = model.n_past
            t0 = time.process_time()
            model.eval_block(rng.integers(300, 5000, k).tolist(), "all")
            model.rollback(past + 1)
            runs.append(time.process_time() - t0)
        costs[k] = statistics.median(runs[1:])
        print(f"  t({k}) = {costs[k] * 1e3:.0f} ms", file=sys.stderr, flush=True)
    return costs


def measure(folder: Path, ftype: str, threads: int, reps: int) -> None:
    from localspec.backends.llamacpp.backend import LlamaCppBackend

    os.nice(10)
    target, drafter = folder / f"qwen3.5-9b.{ftype}.gguf", folder / f"qwen3.5-9b-dflash.{ftype}.gguf"
    model = LlamaCppBackend(str(target), n_ctx=1024, threads=threads)
    block = model.dflash_drafter(str(drafter))
    print(f"# qwen3.5-9b-class {ftype} target ({model.info.size_bytes / 2**20:.0f} MiB), DFlash drafter "
          f"{DRAFTER.layers} blocks ({block.size_bytes / 2**20:.0f} MiB), {threads} threads")  # fmt: skip
    costs = pass_costs(model, reps)
    block_pass, inject_one, inject_block = drafter_costs(model, block, reps, time.process_time, DEPTH)
    beyond = model.capabilities.replays_beyond
    model.close()
    curve = list(np.interp(range(1, BLOCK + 1), list(costs), list(costs.values())))
    print(f"\n{'k':>3}{'t(k) ms':>10}{'t(k)/t(1)':>11}")
    for k, t in costs.items():
        print(f"{k:>3}{t * 1e3:10.1f}{t / costs[1]:11.2f}")
    print(
        f"\nDFlash block pass ({BLOCK} positions): {block_pass * 1e3:.1f} ms = {block_pass / costs[1]:.2f} target steps"
    )
    print(f"injecting the target's features: {inject_one * 1e3:.2f} ms for 1 position, {inject_block * 1e3:.2f} for 16")
    print(f"\n{'alpha':>6}{'best γ':>8}{'speedup':>9}{'controller γ':>14}{'speedup':>9}{'of best':>9}")
    for row in projection(curve, block_pass, beyond if beyond is not None else 0):
        print(row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=["write", "measure", "clean"])
    parser.add_argument("--folder", default="/tmp/localspec-9b", help="where the GGUFs are kept")
    parser.add_argument("--ftype", default="Q4_K_M")
    parser.add_argument("--quantize", help="llama.cpp's llama-quantize (for write)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    folder = Path(args.folder)
    if args.stage == "write":
        if not args.quantize:
            parser.error("write needs --quantize <llama.cpp's llama-quantize>")
        write(folder, Path(args.quantize), args.ftype)
    elif args.stage == "measure":
        measure(folder, args.ftype, args.threads, args.reps)
    else:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
