"""Why greedy speculative output drifts from plain decoding with llama.cpp's flash attention off
on the CPU (issue #30 item 5), measured with the raw llama.cpp C API only.

    python benchmarks/flash_attention_rollback.py --model SmolLM2-135M-Instruct.Q4_1.gguf [--skip-speed]

Sections: (1) the rollback reproduction, (2) the same position's logits in a block of k vs one
token per pass (no rollback at all), (3) cache reuse after llama_memory_seq_rm, (4) a sweep of
context settings, (5) teacher-forced greedy identity, (6) decode speed (--sections picks).

Finding: a single-token pass and a block take different CPU kernels. Flash attention off: the KQ
and KQV matmuls go through llamafile's tinyBLAS only when the batch has 2+ rows (sgemm.cpp,
llamafile_sgemm: `if (n < 2) return false`), through ggml_vec_dot_f16 otherwise; the two sum in
another order. Flash attention on: a single query over 512+ KV cells takes the split-KV path
with one partial per thread (ggml-cpu/ops.cpp), a block does not. Rollback itself is exact.
"""

from __future__ import annotations

import argparse
import ctypes
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from llama_cpp import llama_cpp as raw

# Natural text, so the block's tokens are ones a drafter would propose.
TEXT = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk. He carried a small tin of oil, "
    "a cloth, and a notebook in which he wrote down the weather, the ships he had seen, and anything else "
    "that seemed worth remembering. In winter the wind came off the sea so hard that the glass rattled in "
    "its frame, and he would sit beside the great lamp with his coat buttoned to the chin, listening to the "
    "waves break on the rocks below. Nobody in the village understood why he had chosen such a life. "
)
BATCH = 512  # n_batch: the most tokens one llama_decode call takes


@dataclass(frozen=True)
class Setup:
    flash: bool
    n_ubatch: int = BATCH
    kv_f32: bool = False
    unified: bool = True
    threads: int = 2

    def label(self) -> str:
        parts = [f"FA {'on' if self.flash else 'off'}"]
        if self.n_ubatch != BATCH:
            parts.append(f"n_ubatch={self.n_ubatch}")
        if self.kv_f32:
            parts.append("KV f32")
        if not self.unified:
            parts.append("kv_unified=0")
        parts.append(f"{self.threads} thr")
        return ", ".join(parts)


class Context:
    """One llama.cpp context with a single sequence; every decode returns a copy of its logits."""

    def __init__(self, model: raw.llama_model_p, setup: Setup, n_ctx: int) -> None:
        p = raw.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch = n_ctx, BATCH, setup.n_ubatch
        p.n_threads = p.n_threads_batch = setup.threads
        p.flash_attn_type = raw.LLAMA_FLASH_ATTN_TYPE_ENABLED if setup.flash else raw.LLAMA_FLASH_ATTN_TYPE_DISABLED
        p.type_k = p.type_v = raw.GGML_TYPE_F32 if setup.kv_f32 else raw.GGML_TYPE_F16
        p.kv_unified, p.swa_full = setup.unified, True
        self.ctx = raw.llama_init_from_model(model, p)
        assert self.ctx, "llama_init_from_model failed"
        self.mem = raw.llama_get_memory(self.ctx)
        self.batch = raw.llama_batch_init(BATCH, 0, 1)
        self.n_vocab = raw.llama_vocab_n_tokens(raw.llama_model_get_vocab(model))
        self.n = 0  # tokens in the cache

    def eval(self, tokens: Sequence[int], rows: str = "all") -> np.ndarray:
        """Decodes tokens as ONE llama_decode call (rows: all, last or none get logits)."""
        n = len(tokens)
        assert 0 < n <= BATCH
        b = self.batch
        for i, t in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0] = t, self.n + i, 1, 0
            b.logits[i] = rows == "all" or (rows == "last" and i == n - 1)
        b.n_tokens = n
        assert raw.llama_decode(self.ctx, b) == 0, "llama_decode failed"
        self.n += n
        count = n if rows == "all" else int(rows == "last")
        out = [
            np.ctypeslib.as_array(raw.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,)).copy()
            for i in range(n - count, n)
        ]
        return np.array(out).reshape(count, self.n_vocab)

    def prefill(self, tokens: Sequence[int]) -> None:
        for start in range(0, len(tokens), BATCH):
            self.eval(tokens[start : start + BATCH], "none")

    def one_by_one(self, tokens: Sequence[int]) -> np.ndarray:
        return np.concatenate([self.eval([t]) for t in tokens])

    def rollback(self, n: int) -> None:
        raw.llama_memory_seq_rm(self.mem, 0, n, -1)
        self.n = n

    def close(self) -> None:
        raw.llama_batch_free(self.batch)
        raw.llama_free(self.ctx)


def gap(a: np.ndarray, b: np.ndarray) -> str:
    """max |logit difference| and how many rows agree on the argmax."""
    agree = int((a.argmax(-1) == b.argmax(-1)).sum())
    return f"{float(np.abs(a - b).max()):.4f} ({agree}/{len(a)} argmax)"


def tokenize(model: raw.llama_model_p, text: str) -> list[int]:
    vocab = raw.llama_model_get_vocab(model)
    data = text.encode()
    buf = (raw.llama_token * (len(data) + 8))()
    n = raw.llama_tokenize(vocab, data, len(data), buf, len(buf), True, False)
    return list(buf[:n])


# -- (1) the rollback reproduction ---------------------------------------------------------


def rollback_repro(model: raw.llama_model_p, s: Setup, prompt: list[int], block: list[int], j: int) -> list[str]:
    """Block of k decoded, rolled back to j accepted, one token decoded; vs fresh contexts that
    (a) decoded the j accepted tokens as a block, (b) one per pass."""
    nxt = block[j]  # any token: the correction a verifier would decode
    spec = Context(model, s, len(prompt) + 64)
    spec.prefill(prompt)
    spec.eval(block)
    spec.rollback(len(prompt) + j)
    after = spec.eval([nxt])
    fresh_block, fresh_single = Context(model, s, len(prompt) + 64), Context(model, s, len(prompt) + 64)
    fresh_block.prefill(prompt)
    fresh_block.eval(block[:j])
    fresh_single.prefill(prompt)
    fresh_single.one_by_one(block[:j])
    out = [gap(after, fresh_block.eval([nxt])), gap(after, fresh_single.eval([nxt]))]
    for c in (spec, fresh_block, fresh_single):
        c.close()
    return out


# -- (2) batch shape, no rollback; (3) cache reuse after rollback --------------------------


def batch_shape(model: raw.llama_model_p, s: Setup, prompt: list[int], block: list[int]) -> list[str]:
    """Same positions in a block of k vs one per pass; last row with the lm head over k rows vs 1;
    a block of k vs a block of 2 (both batched)."""
    c = Context(model, s, len(prompt) + 64)
    c.prefill(prompt)
    base = len(prompt)
    in_block = c.eval(block)
    c.rollback(base)
    single = c.one_by_one(block)
    c.rollback(base)
    last_only = c.eval(block, "last")
    c.rollback(base + len(block) - 2)
    pair = c.eval(block[-2:])
    c.close()
    return [gap(in_block, single), gap(in_block[-1:], last_only), gap(in_block[-2:], pair)]


def cache_reuse(model: raw.llama_model_p, s: Setup, prompt: list[int], block: list[int], j: int) -> list[str]:
    """Removed cells decoded again with the same batching (stale values would show here), and the
    removed tail decoded as its own block after a rollback to j."""
    c = Context(model, s, len(prompt) + 64)
    c.prefill(prompt)
    first = c.eval(block)
    c.rollback(len(prompt))
    again = c.eval(block)
    c.rollback(len(prompt) + j)
    tail = c.eval(block[j:])
    c.close()
    return [gap(first, again), gap(first[j:], tail)]


# -- (5) teacher-forced greedy identity ------------------------------------------------------


def plain_greedy(c: Context, prompt: list[int], n: int, pad: bool) -> tuple[list[int], np.ndarray]:
    """Plain decoding, one token per pass. pad: each pass carries a throwaway second token
    (removed again), so the attention matmuls see a batch of 2 like a verify block does."""
    c.prefill(prompt[:-1])
    tokens, logits, cur = [], [], prompt[-1]
    for _ in range(n):
        if pad:
            row = c.eval([cur, cur])[0]
            c.rollback(c.n - 1)
        else:
            row = c.eval([cur])[0]
        logits.append(row)
        cur = int(row.argmax())
        tokens.append(cur)
    return tokens, np.array(logits)


def spec_greedy(c: Context, prompt: list[int], plain: list[int], k: int, seed: int = 0) -> np.ndarray:
    """Verify blocks of k (the pending token + k-1 drafts) with rollback of rejected drafts.
    Drafts are the plain run's own tokens, a quarter of them perturbed so rejections happen;
    teacher-forced on the plain tokens so every position is compared."""
    rng = np.random.default_rng(seed)
    c.prefill(prompt[:-1])
    seq = [prompt[-1], *plain]  # seq[i] is the token fed at step i; plain[i] its successor
    rows: list[np.ndarray] = []
    i = 0
    while i < len(plain):
        m = min(k, len(plain) - i)
        drafts = [t if rng.random() > 0.25 else (t + 1) % c.n_vocab for t in seq[i + 1 : i + m]]
        out = c.eval([seq[i], *drafts])
        accepted = next((a for a, d in enumerate(drafts) if d != seq[i + 1 + a]), len(drafts))
        rows.extend(out[: accepted + 1])
        c.rollback(c.n - (len(drafts) - accepted))
        i += accepted + 1
    return np.array(rows[: len(plain)])


def greedy_identity(model: raw.llama_model_p, s: Setup, prompt: list[int], n: int, pad: bool = False) -> str:
    c = Context(model, s, len(prompt) + n + 16)
    plain, plain_rows = plain_greedy(c, prompt, n, pad)
    c.close()
    c = Context(model, s, len(prompt) + n + 16)
    spec_rows = spec_greedy(c, prompt, plain, 4)
    c.close()
    flips = int((spec_rows.argmax(-1) != np.array(plain)).sum())
    return f"{flips}/{n} argmax differ, max |diff| {float(np.abs(spec_rows - plain_rows).max()):.4f}"


# -- (6) speed -------------------------------------------------------------------------------


def speed(model: raw.llama_model_p, s: Setup, depth: int, n: int, pad: bool = False) -> float:
    """Plain decode tokens/s after depth tokens of context; pad: each pass carries a throwaway 2nd token."""
    c = Context(model, s, depth + n + 16)
    c.prefill([1 + (i * 7) % 30000 for i in range(depth)])
    t0 = time.perf_counter()
    for i in range(n):
        if pad:
            c.eval([100 + i, 100 + i])
            c.rollback(c.n - 1)
        else:
            c.eval([100 + i])
    rate = n / (time.perf_counter() - t0)
    c.close()
    return rate


# -- report -----------------------------------------------------------------------------------


def table(title: str, head: list[str], rows: list[list[str]]) -> None:
    print(f"\n### {title}\n", flush=True)
    print("| " + " | ".join(head) + " |")
    print("|---" * len(head) + "|")
    for r in rows:
        print("| " + " | ".join(r) + " |", flush=True)


@dataclass
class Bench:
    model: raw.llama_model_p
    text: list[int]
    k: int
    j: int
    # Short: n_kv stays 256. Long: past 256 cells n_kv is 512, where flash attention's
    # single-query pass switches to its split-KV path (ggml-cpu/ops.cpp, nek1 >= 512).
    contexts: tuple[tuple[str, int], ...] = (("short (100)", 100), ("long (400)", 400))

    def cases(self) -> list[tuple[str, list[int], list[int]]]:
        return [(name, self.text[:n], self.text[n : n + self.k]) for name, n in self.contexts]


ON, OFF = Setup(flash=True), Setup(flash=False)


def section_rollback(b: Bench) -> None:
    rows = [
        [name, s.label(), *rollback_repro(b.model, s, prompt, block, b.j)]
        for name, prompt, block in b.cases()
        for s in (ON, OFF)
    ]
    table(
        f"(1) rollback: block of {b.k}, keep {b.j}, decode 1 token; vs fresh contexts",
        ["context", "setting", "(a) fresh, accepted as a block", "(b) fresh, accepted one per pass"],
        rows,
    )


def section_shape(b: Bench) -> None:
    rows = [
        [name, s.label(), *batch_shape(b.model, s, prompt, block), *cache_reuse(b.model, s, prompt, block, b.j)]
        for name, prompt, block in b.cases()
        for s in (ON, OFF)
    ]
    table(
        "(2) no rollback: same positions by batch shape; (3) cells reused after llama_memory_seq_rm",
        [
            "context",
            "setting",
            f"block of {b.k} vs 1 per pass",
            "lm head over k rows vs 1",
            f"block of {b.k} vs block of 2",
            "same block after rollback",
            f"tail after rollback to {b.j}",
        ],
        rows,
    )


def section_settings(b: Bench) -> None:
    variants = [
        ON,
        replace(ON, threads=1),
        OFF,
        replace(OFF, threads=1),
        replace(OFF, kv_f32=True),
        replace(OFF, unified=False),
        replace(OFF, n_ubatch=4),
        replace(OFF, n_ubatch=1),
    ]
    rows = [
        [s.label(), name, batch_shape(b.model, s, prompt, block)[0], rollback_repro(b.model, s, prompt, block, b.j)[1]]
        for s in variants
        for name, prompt, block in b.cases()
    ]
    table(
        "(4) settings", ["setting", "context", f"block of {b.k} vs 1 per pass", "rollback vs fresh one per pass"], rows
    )


def section_greedy(b: Bench, n: int) -> None:
    rows = []
    for s, pad in ((ON, False), (replace(ON, threads=1), False), (ON, True), (OFF, False), (OFF, True)):
        for name, prompt, _ in b.cases():
            label = s.label() + (", plain passes padded to 2 tokens" if pad else "")
            rows.append([label, name, greedy_identity(b.model, s, prompt, n, pad)])
    table(
        f"(5) greedy identity: plain vs blocks of 4 with rollback, {n} tokens, teacher-forced",
        ["setting", "prompt", "result"],
        rows,
    )


def section_speed(b: Bench, n: int, threads: int) -> None:
    on, off = replace(ON, threads=threads), replace(OFF, threads=threads)
    rows = []
    for depth in (1000, 3000):
        rates = [speed(b.model, on, depth, n), speed(b.model, off, depth, n), speed(b.model, off, depth, n, pad=True)]
        rows.append([str(depth), *(f"{r:.1f}" for r in rates)])
    table(
        f"(6) plain decode tok/s, {n} tokens after the context, {threads} thread(s)",
        ["context", "FA on", "FA off", "FA off, passes padded to 2 tokens"],
        rows,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--k", type=int, default=8, help="block size of the rollback tests")
    ap.add_argument("--j", type=int, default=3, help="tokens kept after the rollback")
    ap.add_argument("--greedy", type=int, default=100, help="tokens of the greedy identity test")
    ap.add_argument("--speed-tokens", type=int, default=24)
    ap.add_argument("--speed-threads", type=int, default=2)
    ap.add_argument("--no-repack", action="store_true", help="keep the weights in their GGUF layout (no extra buffers)")
    ap.add_argument("--sections", default="1,2,4,5,6", help="which of the sections to run (3 comes with 2)")
    args = ap.parse_args()

    quiet = raw.llama_log_callback(lambda level, text, data: None)
    raw.llama_log_set(quiet, ctypes.c_void_p(0))  # keep llama.cpp's log off the table
    raw.llama_backend_init()
    mparams = raw.llama_model_default_params()
    mparams.use_extra_bufts = not args.no_repack
    model = raw.llama_model_load_from_file(args.model.encode(), mparams)
    assert model, f"cannot load {args.model}"
    bench = Bench(model, tokenize(model, TEXT * 8), args.k, args.j)
    runs = {
        "1": lambda: section_rollback(bench),
        "2": lambda: section_shape(bench),
        "4": lambda: section_settings(bench),
        "5": lambda: section_greedy(bench, args.greedy),
        "6": lambda: section_speed(bench, args.speed_tokens, args.speed_threads),
    }
    for key in args.sections.split(","):
        t0 = time.perf_counter()
        runs[key]()
        print(f"\n({time.perf_counter() - t0:.0f} s)", flush=True)
    raw.llama_model_free(model)


if __name__ == "__main__":
    main()
