"""Real model sizes on the CPU: random-weight GGUFs at the exact shapes of Llama-3.2-1B,
Llama-3.2-3B and Llama-3.1-8B, quantized by llama.cpp to Q4_K_M, and what one verify pass of
k tokens costs on them (t(k), k = 1..16, behind a short and a long context), beside
llama-bench's plain decoding speed. Speed does not depend on the weights' values, so no
download is needed.

    python benchmarks/real_sizes.py --out DIR [--only 1b] [--models /root/lsbench/shapes]
    python benchmarks/real_sizes.py --out DIR --table [--answers SMOLLM2.gguf]

The first form writes each missing model (F16, then Q4_K_M; the F16 is deleted) and saves
DIR/<shape>.json: t(k) as the minimum over interleaved rounds (load on a shared machine only
adds time), the 1-minute load average beside each figure, and the curve again in the form
`localspec doctor --json` prints (verify_ms, verify_ms_deep, rebuild_ms), which
`benchmarks/replay_drafters.py --curve` reads. "135m" measures the embedded SmolLM2-135M
Q4_1 the same way (the draft model of the 1B's row).

The second form prints the table of benchmarks/pages/sizes.md: on each
curve, n-gram drafting replayed over the suite's and the wide set's recorded SmolLM2 answers
(replay_drafters.py), and a draft model whose every token is right with probability 0.7
(iid, the same draws for every policy) replayed through the real engine and controller.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
PEERS_BIN = Path("/root/lsbench/peers/llama.cpp-0.3.36/build/bin")
MODELS_DIR = Path("/root/lsbench/shapes")
DATE = "2026-11-26"
VOCAB = 128_256  # Llama 3's: 128,000 BPE tokens and 256 special ones
STD = 0.02  # weights' spread: activations stay finite through every layer
POOL = 1 << 24  # normals drawn once and laid out at random offsets (see fill)
SHALLOW = 64  # the context a verify pass is timed behind
DEEP = 512
SIZES = (*range(1, 9), 10, 12, 14, 16)  # timed block sizes; the rest up to 16 interpolated
DEEP_SIZES = (1, 2, 3, 4, 6, 8, 12, 16)
MAX_K = 16
TEXT = "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n  The quick brown fox jumps. " * 40
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


@dataclass(frozen=True)
class Shape:
    """A Llama-3 model's shape, from its config.json."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    tied: bool  # the output head is the token embedding
    rope_factor: float  # rope_scaling.factor ("llama3" scaling)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


SHAPES = {
    "1b": Shape("Llama-3.2-1B", 2048, 16, 32, 8, 8192, True, 32.0),
    "3b": Shape("Llama-3.2-3B", 3072, 28, 24, 8, 8192, True, 32.0),
    "8b": Shape("Llama-3.1-8B", 4096, 32, 32, 8, 14336, False, 8.0),
}
# The draft model each target's row is priced with (its t(1) per drafted token).
DRAFT_OF = {"1b": "135m", "3b": "1b", "8b": "1b"}
SMOLLM2 = Path.home() / ".local/share/localspec/models/SmolLM2-135M-Instruct.Q4_1.gguf"


# -- writing the models -----------------------------------------------------------------------


def rope_factors(shape: Shape) -> np.ndarray:
    """Llama 3's rope_freqs tensor, as convert_hf_to_gguf writes it for "llama3" scaling."""
    dim, base, old = shape.head_dim, 500_000.0, 8192
    low, high = old / 1.0, old / 4.0  # original context over low_freq_factor, high_freq_factor
    out = []
    for freq in 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim):
        wavelen = 2 * math.pi / freq
        if wavelen < high:
            out.append(1.0)
        elif wavelen > low:
            out.append(shape.rope_factor)
        else:
            smooth = (old / wavelen - 1.0) / (4.0 - 1.0)
            out.append(1 / ((1 - smooth) / shape.rope_factor + smooth))
    return np.array(out, dtype=np.float32)


def vocab() -> tuple[list[str], list[int], list[str]]:
    """A byte-level BPE vocabulary of Llama 3's size: the 256 byte symbols, a few merges,
    filler up to 128,000 and Llama 3's special tokens (decoding speed does not depend on it)."""
    from localspec.backends.vocab import byte_decoder

    symbols = sorted(byte_decoder(), key=lambda c: byte_decoder()[c])
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s", "a n", "an d", "Ġ and"]
    tokens = symbols + [m.replace(" ", "") for m in merges]
    tokens += [f"<|filler_{i}|>" for i in range(128_000 - len(tokens))]
    named = {0: "<|begin_of_text|>", 1: "<|end_of_text|>", 6: "<|start_header_id|>", 7: "<|end_header_id|>"}
    named[9] = "<|eot_id|>"
    tokens += [named.get(i, f"<|reserved_special_token_{i}|>") for i in range(VOCAB - 128_000)]
    types = [1] * 128_000 + [3] * (VOCAB - 128_000)
    return tokens, types, merges


def tensors(shape: Shape) -> list[tuple[str, tuple[int, ...]]]:
    """llama.cpp's tensor names and numpy shapes (GGUF ne reversed), in its order."""
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    out: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (VOCAB, h))]
    for i in range(shape.layers):
        p = f"blk.{i}."
        out += [(p + "attn_norm.weight", (h,)), (p + "attn_q.weight", (q, h)), (p + "attn_k.weight", (kv, h))]
        out += [(p + "attn_v.weight", (kv, h)), (p + "attn_output.weight", (h, q)), (p + "ffn_norm.weight", (h,))]
        out += [(p + "ffn_gate.weight", (shape.ffn, h)), (p + "ffn_up.weight", (shape.ffn, h))]
        out += [(p + "ffn_down.weight", (h, shape.ffn))]
    out.append(("output_norm.weight", (h,)))
    if not shape.tied:
        out.append(("output.weight", (VOCAB, h)))
    out.append(("rope_freqs.weight", (shape.head_dim // 2,)))
    return out


def fill(out: np.ndarray, pool: np.ndarray, rng: np.random.Generator) -> None:
    """out (F16) filled with N(0, STD) values: the pool at random offsets and signs, since
    drawing 8 billion fresh normals takes a quarter of an hour on two cores."""
    flat = out.reshape(-1)
    at = 0
    while at < flat.size:
        start = int(rng.integers(0, pool.size // 2))
        n = min(flat.size - at, pool.size - start)
        flat[at : at + n] = pool[start : start + n] if rng.random() < 0.5 else -pool[start : start + n]
        at += n


def header(writer: Any, shape: Shape, file_type: int) -> None:
    """The metadata of a Llama 3 model of this shape, as convert_hf_to_gguf writes it."""
    writer.add_name(f"{shape.name} shape, random weights")
    writer.add_context_length(131_072)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(500_000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(VOCAB)
    writer.add_file_type(file_type)
    tokens, types, merges = vocab()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("llama-bpe")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(128_000)
    writer.add_eos_token_id(128_009)
    writer.add_add_bos_token(True)
    writer.add_chat_template(LLAMA3_TEMPLATE)


def write_f16(shape: Shape, path: Path) -> None:
    """The random-weight model at F16 (norms and rope factors F32), one tensor in memory at a time."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    header(writer, shape, gguf.LlamaFileType.MOSTLY_F16)
    layout = tensors(shape)
    for name, dims in layout:
        dtype = np.float16 if len(dims) == 2 else np.float32
        writer.add_tensor_info(name, dims, np.dtype(dtype), int(np.prod(dims)) * np.dtype(dtype).itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(0)
    pool = (rng.standard_normal(POOL, dtype=np.float32) * STD).astype(np.float16)
    for name, dims in layout:
        if name == "rope_freqs.weight":
            data = rope_factors(shape)
        elif len(dims) == 1:
            data = np.ones(dims, dtype=np.float32)
        else:
            data = np.empty(dims, dtype=np.float16)
            fill(data, pool, rng)
        writer.write_tensor_data(data)
    writer.close()


def more_bits(i: int, n: int) -> bool:
    """llama.cpp's use_more_bits: the layers whose attn_v and ffn_down Q4_K_M keeps at Q6_K."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def q4_k_m_type(name: str, shape: Shape) -> str:
    """The type llama-quantize gives each tensor of this shape at Q4_K_M."""
    if name.endswith("norm.weight") or name == "rope_freqs.weight":
        return "F32"
    if name == "output.weight" or (name == "token_embd.weight" and shape.tied):
        return "Q6_K"
    if name.endswith(("attn_v.weight", "ffn_down.weight")) and more_bits(int(name.split(".")[1]), shape.layers):
        return "Q6_K"
    return "Q4_K"


def random_blocks(rows: int, width: int, kind: str, pool: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """rows of random K-quant blocks: random quants and sub-block scales (any byte is valid),
    the f16 block scales set so that values stay near N(0, 0.02)'s range."""
    block = 144 if kind == "Q4_K" else 210
    out = np.empty((rows, width // 256, block), dtype=np.uint8)
    fill(out, pool, rng)
    if kind == "Q4_K":  # d, dmin
        out[:, :, 0:4] = np.frombuffer(np.array([6e-5, 1e-3], dtype=np.float16).tobytes(), dtype=np.uint8)
    else:  # d, the last two bytes
        out[:, :, 208:210] = np.frombuffer(np.array([1e-4], dtype=np.float16).tobytes(), dtype=np.uint8)
    return out.reshape(rows, -1)


def write_q4_k_m(shape: Shape, path: Path) -> None:
    """The model written directly at Q4_K_M with llama-quantize's tensor types and random
    blocks: the 8B's F16 (16 GB) and its quantization took over an hour on the loaded 2-core
    host; the 1B written both ways has the same size and types (see README.txt)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    header(writer, shape, gguf.LlamaFileType.MOSTLY_Q4_K_M)
    layout = [(name, dims, q4_k_m_type(name, shape)) for name, dims in tensors(shape)]
    for name, dims, kind in layout:
        if kind == "F32":
            writer.add_tensor_info(name, dims, np.dtype(np.float32), int(np.prod(dims)) * 4)
        else:
            size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
            row = dims[1] // size[0] * size[1]
            kind_type = gguf.GGMLQuantizationType[kind]
            writer.add_tensor_info(name, (dims[0], row), np.dtype(np.uint8), dims[0] * row, raw_dtype=kind_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(0)
    pool = rng.integers(0, 256, POOL * 4, dtype=np.uint8)
    for name, dims, kind in layout:
        if name == "rope_freqs.weight":
            writer.write_tensor_data(rope_factors(shape))
        elif kind == "F32":
            writer.write_tensor_data(np.ones(dims, dtype=np.float32))
        else:
            writer.write_tensor_data(random_blocks(dims[0], dims[1], kind, pool, rng))
    writer.close()


def quantize(source: Path, dest: Path) -> None:
    binary = PEERS_BIN / "llama-quantize"
    if binary.exists():
        partial = dest.with_name(dest.name + ".partial")
        with open(dest.with_suffix(".quantize.log"), "w") as log:  # llama.cpp lists every tensor
            cmd = [str(binary), str(source), str(partial), "Q4_K_M", str(os.cpu_count() or 2)]
            subprocess.run(cmd, check=True, stdout=log, stderr=log)
        partial.replace(dest)
    else:
        from localspec.backends.llamacpp.copies import quantize as quantize_copy

        quantize_copy(source, dest, "Q4_K_M")


def model_path(key: str, models: Path) -> Path:
    return SMOLLM2 if key == "135m" else models / f"{SHAPES[key].name}-random.Q4_K_M.gguf"


def ensure_model(key: str, models: Path, direct: bool = False) -> Path:
    dest = model_path(key, models)
    if dest.exists():
        return dest
    if key == "135m":
        raise SystemExit(f"{dest} is missing: `localspec doctor` fetches the embedded model")
    models.mkdir(parents=True, exist_ok=True)
    if direct:
        partial = dest.with_name(dest.name + ".partial")
        write_q4_k_m(SHAPES[key], partial)
        partial.replace(dest)
        return dest
    f16 = models / f"{SHAPES[key].name}-random.F16.gguf"
    t0 = time.perf_counter()
    write_f16(SHAPES[key], f16)
    t1 = time.perf_counter()
    quantize(f16, dest)
    f16.unlink()
    print(f"{key}: wrote F16 in {t1 - t0:.0f} s, quantized in {time.perf_counter() - t1:.0f} s", flush=True)
    return dest


# -- measuring --------------------------------------------------------------------------------


def load1() -> float:
    return os.getloadavg()[0]


def host() -> str:
    cpu = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    flags = Path("/proc/cpuinfo").read_text()
    simd = "AVX-512" if "avx512f" in flags else ("AVX2" if "avx2" in flags else "no AVX2")
    return f"{os.cpu_count()}-core {cpu} {simd}"


def llama_bench(path: Path, threads: int) -> dict[str, object] | None:
    """llama-bench's plain decoding: with one thread in CPU seconds (the difference of a
    -n 192 and a -n 64 run's CPU time, which cancels loading and warm-up), so that other
    processes on the shared machine do not count; with more, its own wall-clock tok/s."""
    from localspec.tooling.peers import bench_flags

    binary = PEERS_BIN / "llama-bench"
    if not binary.exists():
        return None
    runs = []
    for n in (64, 192) if threads == 1 else (64,):
        cmd = [str(binary), "-m", str(path), "-n", str(n), "-p", "0", "-t", str(threads), "-r", "1", "-o", "json"]
        cmd += bench_flags(str(path))  # on an AMX VM llama-bench's default repacking faults (llama.cpp#20824)
        before, cpu0 = load1(), resource.getrusage(resource.RUSAGE_CHILDREN)
        row = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)[0]
        cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime
        runs.append(
            {
                "command": " ".join(["llama-bench", *cmd[1:]]),
                "wall_tok_s": row["avg_ts"],
                "cpu_s": cpu,
                "loadavg": [before, load1()],
            }
        )
    tok_s = 128 / (runs[1]["cpu_s"] - runs[0]["cpu_s"]) if threads == 1 else runs[0]["wall_tok_s"]
    return {"tok_s": tok_s, "clock": "CPU time" if threads == 1 else "wall", "runs": runs}


def timed_curve(
    backend: object, probe: Sequence[int], sizes: Sequence[int], rounds: int, seed: int, clock: Callable[[], float]
) -> tuple[dict[int, float], dict[int, float], dict[int, float]]:
    """Least seconds of a pass over probe[:k] behind the cache as it is (the second of two
    passes of that size in a row), the least excess of the first (llama.cpp's graph rebuild
    after a pass of another size), and the load average when each least figure was timed.
    Sizes run in a fresh order each round: a burst of load spreads over all of them. clock:
    with one thread llama.cpp computes in this thread, whose CPU time other processes do not
    inflate."""
    from localspec.backends.llamacpp.backend import LlamaCppBackend

    assert isinstance(backend, LlamaCppBackend)
    past = backend.n_past
    rng = np.random.default_rng(seed)
    best: dict[int, float] = {}
    first: dict[int, float] = {}
    load: dict[int, float] = {}
    for _ in range(rounds):
        for k in rng.permutation(list(sizes)).tolist():
            seconds = []
            for _ in range(2):
                t0 = clock()
                backend.eval_block(probe[:k], "all")
                seconds.append(clock() - t0)
                backend.rollback(past)
            if seconds[1] < best.get(k, math.inf):
                best[k], load[k] = seconds[1], load1()
            first[k] = min(first.get(k, math.inf), seconds[0])
    return best, first, load


def interpolated(best: dict[int, float]) -> list[float]:
    sizes = sorted(best)
    return [float(t) for t in np.interp(range(1, MAX_K + 1), sizes, [best[k] for k in sizes])]


def measure(key: str, path: Path, rounds: int, deep_rounds: int, threads: int) -> dict[str, object]:
    from localspec.backends.llamacpp.backend import LlamaCppBackend
    from localspec.core.protocol import eval_chunked

    bench = llama_bench(path, threads)
    start = load1()
    backend = LlamaCppBackend(str(path), n_ctx=1024, threads=threads)
    clock = time.thread_time if threads == 1 else time.perf_counter
    tokens = backend.tokenize(TEXT, add_special=True, parse_special=False)
    assert len(tokens) >= DEEP + MAX_K, "the timing text is too short for this vocabulary"
    eval_chunked(backend, tokens[:SHALLOW], "none")
    probe = tokens[SHALLOW : SHALLOW + MAX_K]
    backend.eval_block(probe[:4], "all")  # warm up: page the weights in
    backend.rollback(SHALLOW)
    best, first, at = timed_curve(backend, probe, SIZES, rounds, 0, clock)
    eval_chunked(backend, tokens[SHALLOW:DEEP], "none")
    deep, _, deep_at = timed_curve(backend, tokens[DEEP : DEEP + MAX_K], DEEP_SIZES, deep_rounds, 1, clock)
    threads = backend.capabilities.extra.get("threads")
    backend.close()
    shallow = interpolated(best)
    behind = [max(d, s) for d, s in zip(interpolated(deep), shallow, strict=True)]  # more context never costs less
    rebuild_block = statistics.median([max(0.0, first[k] - best[k]) for k in SIZES if k > 1])
    t1 = best[1]
    shape = asdict(SHAPES[key]) if key in SHAPES else {"name": "SmolLM2-135M-Instruct Q4_1 (the embedded model)"}
    return {
        "model": f"{shape['name']} random weights, Q4_K_M" if key in SHAPES else str(shape["name"]),
        "shape": shape,
        "file": str(path),
        "file_size": path.stat().st_size,
        "llama_bench_tok_s": bench["tok_s"] if bench else None,
        "llama_bench": bench,
        "t": {str(k): best[k] for k in range(1, 9)},
        "ratios": {str(k): best[k] / t1 for k in range(1, 9)},
        "depth": SHALLOW,
        "rounds": rounds,
        "threads": threads,
        "clock": "thread CPU time (1 thread)" if threads == 1 else "wall clock",
        "host": host(),
        "date": DATE,
        "loadavg": {"start": start, "end": load1(), "at_each_t": {str(k): at[k] for k in sorted(at)}},
        "loadavg_deep": {str(k): deep_at[k] for k in sorted(deep_at)},
        # What `localspec doctor --json` prints, read by replay_drafters.py --curve:
        "verify_ms": [t * 1e3 for t in shallow],
        "verify_ms_deep": [t * 1e3 for t in behind],
        "deep_depth": DEEP,
        "rebuild_ms": {"into_block": rebuild_block * 1e3, "into_one": max(0.0, first[1] - best[1]) * 1e3},
    }


# -- the table --------------------------------------------------------------------------------


class ModelGuesses:
    """A draft model whose guess at each position is right with probability alpha, drawn once
    per position so every policy meets the same luck; it costs its measured seconds per token
    on the simulated clock, and catching up on tokens it sat out costs a batched pass's share."""

    name = "draft-model"
    off_notice: str | None = None

    def __init__(self, text: Sequence[int], alpha: float, per_token: float, catch_up: float, clock: Any) -> None:
        self.text, self.per_token, self.catch_up, self.clock = list(text), per_token, catch_up, clock
        self.right = np.random.default_rng(len(text)).random(len(text)) < alpha
        self.seen = 0
        self.drafted = False

    def start(self, context: Sequence[int], warm: bool = True) -> None:
        self.seen = len(context) - 1 if warm else 0

    def backlog(self, context: Sequence[int]) -> int:
        return max(0, len(context) - 1 - self.seen)

    def propose(self, context: Sequence[int], n: int, cfg: Any, rng: Any) -> Any:
        from localspec.core.drafting import Draft

        self.clock.simulated += self.backlog(context) * self.catch_up + n * self.per_token
        at = len(context)
        guess = [
            self.text[p] if p < len(self.text) and self.right[p] else (self.text[p] + 1 if p < len(self.text) else 0)
            for p in range(at, at + n)
        ]
        self.drafted = True
        return Draft(guess)

    def commit(self, context: Sequence[int], n_accepted: int) -> None:
        if self.drafted:
            self.seen = len(context) - 1
        self.drafted = False

    def close(self) -> None:
        pass


def replay_model(
    prompt: list[int], answer: list[int], truth: Any, n_vocab: int, policy: Any, guesses: ModelGuesses
) -> float:
    """Simulated seconds of the answer with the draft model, through the real engine."""
    from localspec.control.replay import ReplayTarget
    from localspec.core.engine import Engine
    from localspec.core.sampling import SamplingConfig
    from localspec.core.stats import Stats

    clock = guesses.clock
    target: Any = ReplayTarget(prompt + answer, truth, clock, n_vocab)
    engine = Engine(target, guesses, clock=clock)  # the simulated clock times the steps
    stats, produced = Stats(), list[int]()
    cfg, rng = SamplingConfig(temperature=0.0), np.random.default_rng(0)
    for step in engine.generate(prompt, len(answer), cfg, policy, stats, rng):
        produced.extend(step.tokens)
    assert produced == answer, "the replay diverged from the recorded answer"
    return float(stats.decode_seconds)


def draft_model_row(curve_file: Path, draft_file: Path, answers: Path, alpha: float) -> dict[str, float]:
    """Speedups over plain decoding (total time over all answers) of a draft model at
    acceptance alpha: the controller, fixed γ = 1..15, and the best of those."""
    from localspec.control.factory import model_policy
    from localspec.control.policy import FixedDraftLength
    from localspec.control.replay import Clock, Truth, calibration_from_doctor

    calibration = calibration_from_doctor(json.loads(curve_file.read_text()))
    draft = json.loads(draft_file.read_text())
    per_token = draft["t"]["1"]
    catch_up = draft["verify_ms"][-1] / 1e3 / len(draft["verify_ms"])  # as the runtime charges it
    data = json.loads(answers.read_text())
    plain, totals = 0.0, {"localspec": 0.0, **{f"fixed {g}": 0.0 for g in range(1, 16)}}
    for rec in data["answers"].values():
        prompt, answer = rec["prompt"], rec["answer"]
        truth = Truth.of(calibration)
        plain += truth.plain(prompt, answer)
        for name in totals:
            clock = Clock()
            guesses = ModelGuesses(prompt + answer, alpha, per_token, catch_up, clock)
            policy: Any = (
                model_policy(calibration.cost_curve(), per_token, alpha, catch_up)
                if name == "localspec"
                else FixedDraftLength(int(name.split()[1]))
            )
            totals[name] += replay_model(prompt, answer, truth, data["n_vocab"], policy, guesses)
    out = {name: plain / t for name, t in totals.items()}
    best = max(range(1, 16), key=lambda g: out[f"fixed {g}"])
    out["best fixed"], out["best fixed γ"] = out[f"fixed {best}"], float(best)
    return out


def ngram_row(curve_file: Path, answers_model: Path, prompts: str) -> dict[str, float]:
    """replay_drafters.py's summary row on this curve: the controller, fixed γ = 1..8,
    llama-lookup 4 and 8, the ceilings."""
    cmd = [sys.executable, str(BENCH_DIR / "replay_drafters.py"), str(answers_model), "--curve", str(curve_file)]
    cmd += [arg for g in range(1, 9) for arg in ("--fixed", str(g))] + ["--prompts", prompts]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    header = next(line for line in out.splitlines() if line.startswith("| prompt |"))
    total = next(line for line in out.splitlines() if line.startswith("| all (total time) |"))
    below = next(line for line in out.splitlines() if line.startswith("| answers below"))
    names = [c.strip() for c in header.strip("|").split("|")][1:]
    values = [float(c.strip().rstrip("x")) for c in total.strip("|").split("|")[1:]]
    losses = [int(c.strip()) for c in below.strip("|").split("|")[1:]]
    row = dict(zip(names, values, strict=True))
    row["below 0.98x (localspec)"] = float(losses[0])
    best = max(range(1, 9), key=lambda g: row[f"fixed {g}"])
    row["best fixed"], row["best fixed γ"] = row[f"fixed {best}"], float(best)
    return row


def answers_file(model: Path, prompts: str) -> Path:
    from localspec.store import data_dir

    return data_dir() / f"replay-{model.name}-{Path(prompts).stem}-160.json"


def record(model: Path, prompts: str, tokens: int = 160) -> Path:
    """The model's greedy answers to a prompt set, in replay_drafters.py's cache, decoded at
    one thread: at two, llama.cpp's threads spin against other processes on the shared host
    and the recording crawls. The curve stored beside them is never used (--curve is given)."""
    from localspec.api import load
    from localspec.control.calibrate import Calibration
    from localspec.control.prompts import load_prompt_sets

    path = answers_file(model, prompts)
    if path.exists():
        return path
    runtime = load(model=str(model), strategy="none", threads=1)
    answers = {}
    for prompt in load_prompt_sets([prompts]):
        ids = runtime.prompt_tokens(messages=prompt.messages)
        out = runtime.generate(messages=prompt.messages, max_tokens=tokens, temperature=0.0)
        answers[prompt.id] = {"prompt": ids, "answer": list(out.tokens)}
    placeholder = Calibration([0.01] * 16, 0.01, None, 512, 0.0, 0.0)
    data = {"calibration": placeholder.to_json(), "n_vocab": runtime.target.info.n_vocab, "answers": answers}
    runtime.close()
    path.write_text(json.dumps(data))
    return path


def table(out: Path, answers_model: Path, alpha: float) -> None:
    keys = [k for k in SHAPES if (out / f"{k}.json").exists()]
    wide = str(BENCH_DIR / "prompts_wide.jsonl")
    record(answers_model, "suite")
    record(answers_model, wide)
    rows: dict[str, dict[str, object]] = {}
    for key in keys:
        curve = out / f"{key}.json"
        rec = json.loads(curve.read_text())
        suite, wide_row = ngram_row(curve, answers_model, "suite"), ngram_row(curve, answers_model, wide)
        model = draft_model_row(curve, out / f"{DRAFT_OF[key]}.json", answers_file(answers_model, "suite"), alpha)
        rows[key] = {"curve": rec, "ngram_suite": suite, "ngram_wide": wide_row, "draft_model": model}
        print(json.dumps({key: {k: v for k, v in rows[key].items() if k != "curve"}}), flush=True)
    (out / "replay_table.json").write_text(json.dumps(rows, indent=1))
    print("\n| shape | file | llama-bench tok/s | t(k)/t(1), k = 1..8 |")
    print("|---|---|---|---|")
    for row in rows.values():
        rec = row["curve"]
        assert isinstance(rec, dict)
        ratios = " ".join(f"{rec['ratios'][str(k)]:.2f}" for k in range(1, 9))
        size = rec["file_size"] / 2**20
        print(f"| {rec['shape']['name']} | {size:.0f} MiB | {rec['llama_bench_tok_s']:.1f} | {ratios} |")
    print("\n| shape | drafter | localspec | lookup γ=4 | lookup γ=8 | best fixed γ (γ) | ceiling ≤15 |")
    print("|---|---|---|---|---|---|---|")
    for row in rows.values():
        name = row["curve"]["shape"]["name"]  # type: ignore[index]
        for label, r in (("n-gram, suite", row["ngram_suite"]), ("n-gram, wide", row["ngram_wide"])):
            assert isinstance(r, dict)
            print(
                f"| {name} | {label} | {r['localspec']:.2f}x | {r['lookup 4']:.2f}x | {r['lookup 8']:.2f}x "
                f"| {r['best fixed']:.2f}x ({r['best fixed γ']:.0f}) | {r['ceiling ≤15']:.2f}x |"
            )
        m = row["draft_model"]
        assert isinstance(m, dict)
        print(
            f"| {name} | draft model α={alpha} | {m['localspec']:.2f}x | {m['fixed 4']:.2f}x (fixed 4) "
            f"| {m['fixed 8']:.2f}x (fixed 8) | {m['best fixed']:.2f}x ({m['best fixed γ']:.0f}) | - |"
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder of the JSON results")
    parser.add_argument("--only", action="append", choices=[*SHAPES, "135m"], help="these shapes (repeatable)")
    parser.add_argument("--models", type=Path, default=MODELS_DIR, help="where the GGUFs are written")
    parser.add_argument("--rounds", type=int, default=0, help="timing rounds (default: 7, 6 for 3b, 5 for 8b)")
    parser.add_argument("--threads", type=int, default=1, help="1: CPU-time figures, unmoved by other processes")
    parser.add_argument("--direct", action="store_true", help="write Q4_K_M directly (no F16, no llama-quantize)")
    parser.add_argument("--record", action="store_true", help="record the answers the table replays, only")
    parser.add_argument("--write-only", action="store_true", help="write the models, measure nothing")
    parser.add_argument("--table", action="store_true", help="print the replay table from saved results")
    parser.add_argument("--answers", type=Path, default=SMOLLM2, help="the model whose recorded answers replay")
    parser.add_argument("--alpha", type=float, default=0.7, help="the draft model's acceptance")
    args = parser.parse_args(argv)
    if args.record:
        for prompts in ("suite", str(BENCH_DIR / "prompts_wide.jsonl")):
            print(record(args.answers, prompts))
        return
    if args.table:
        table(args.out, args.answers, args.alpha)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    for key in args.only or [*SHAPES, "135m"]:
        path = ensure_model(key, args.models, args.direct)
        if args.write_only:
            continue
        rounds = args.rounds or {"3b": 5, "8b": 4}.get(key, 6)
        result = measure(key, path, rounds, max(3, rounds // 2), args.threads)
        print(f"{key}: measured", flush=True)
        (args.out / f"{key}.json").write_text(json.dumps(result, indent=1) + "\n")
        ratios = " ".join(f"{result['ratios'][str(k)]:.2f}" for k in range(1, 9))  # type: ignore[index]
        print(
            f"{key}: llama-bench {result['llama_bench_tok_s']} tok/s; t(1) {result['t']['1'] * 1e3:.1f} ms; "  # type: ignore[index]
            f"t(k)/t(1) {ratios}; load {result['loadavg']}",
            flush=True,
        )


if __name__ == "__main__":
    main()
