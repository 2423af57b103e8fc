"""Measures what verifying k tokens costs on this machine, once per model and machine, and
how often a drafter's top token is the target's, once per pair.

The curve t_verify(k) is what the adaptive draft length is built on; it is cached in the
user directory keyed by the model file, its backend options and the CPU, so only the first
load of a model pays the second or so it takes. The pair's agreement is where the controller
starts its acceptance estimates for a model drafter: a drafter that costs real time is only
tried when it is expected to pay, so a prior far below its true acceptance would never be
corrected (a quantized copy of the target agrees ~90 % of the time, a fixed 50 % guess
would keep it switched off)."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from localspec.paths import calibration_file
from localspec.protocol import Backend

CALIBRATION_TEXT = (
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"
    "The quick brown fox jumps over the lazy dog while the sun sets behind the hills."
)
# Text for the pair agreement: code, prose and structure, as the bench suite has.
AGREEMENT_TEXT = (
    CALIBRATION_TEXT
    + "\nSummary: the Rhine begins in the Swiss Alps and flows about 1,230 kilometres to the North Sea.\n"
    + '{"name": "France", "capital": "Paris", "population": 68000000}\n'
    + "To find the average speed, divide the total distance by the total time taken."
)


@dataclass(frozen=True)
class Calibration:
    verify_seconds: list[float]  # k = 1..K
    decode_seconds: float  # one token, logits of the last position only

    def to_json(self) -> dict[str, object]:
        return {"verify_seconds": self.verify_seconds, "decode_seconds": self.decode_seconds}


def _key(backend: Backend) -> str:
    info = backend.info
    try:
        stamp = os.stat(info.path)
        file_id = f"{info.path}|{stamp.st_size}|{stamp.st_mtime_ns}"
    except OSError:
        file_id = info.path
    extras = ",".join(f"{k}={v}" for k, v in sorted(backend.capabilities.extra.items()))
    return (
        f"{info.backend}|{file_id}|{info.n_ctx}|{extras}|{platform.machine()}|{platform.processor()}|{os.cpu_count()}"
    )


def _load_cache() -> dict[str, dict[str, object]]:
    try:
        data = json.loads(calibration_file().read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}  # a missing or damaged cache only costs a re-measure


def measure(backend: Backend, max_k: int = 16, repeats: int = 3) -> Calibration:
    """Time one pass over k tokens for k = 1..max_k on an empty cache; leaves it empty."""
    base = backend.tokenize(CALIBRATION_TEXT, add_special=True, parse_special=False)
    while len(base) < 32 + max_k:
        base = base + base
    prefix, probe = base[:32], base[32 : 32 + max_k]
    backend.rollback(0)
    backend.eval_block(prefix, "none")
    backend.eval_block(probe[:4], "all")  # warm up: page in the weights, size the buffers
    backend.rollback(len(prefix))
    verify: list[float] = []
    for k in range(1, max_k + 1):
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            backend.eval_block(probe[:k], "all")
            samples.append(time.perf_counter() - t0)
            backend.rollback(len(prefix))
        verify.append(statistics.median(samples))
    decode = []
    for _ in range(repeats * 2):
        t0 = time.perf_counter()
        backend.eval_block(probe[:1], "last")
        decode.append(time.perf_counter() - t0)
        backend.rollback(len(prefix))
    backend.rollback(0)
    # A pass over more tokens never costs less; smooth out timer noise that says it does.
    for i in range(1, len(verify)):
        verify[i] = max(verify[i], verify[i - 1])
    return Calibration(verify, statistics.median(decode))


def agreement(target: Backend, draft: Backend, tokens: Sequence[int]) -> float:
    """Share of positions where both models' top-1 next token agree, teacher-forced."""
    picks = []
    for backend in (target, draft):
        backend.rollback(0)
        rows = []
        for start in range(0, len(tokens), backend.capabilities.max_block):
            rows.append(np.argmax(backend.eval_block(tokens[start : start + backend.capabilities.max_block]), axis=1))
        backend.rollback(0)
        picks.append(np.concatenate(rows))
    return float(np.mean(picks[0] == picks[1]))


def pair_agreement(target: Backend, draft: Backend) -> float:
    """agreement() on AGREEMENT_TEXT, measured once per pair and machine."""
    key = f"agreement|{_key(target)}||{_key(draft)}"
    hit = remembered(key)
    if hit is not None and isinstance(hit.get("agreement"), float):
        return float(hit["agreement"])  # type: ignore[arg-type]
    tokens = target.tokenize(AGREEMENT_TEXT, add_special=True, parse_special=False)
    # A small context (a chat opened with a short --n-ctx) measures on what fits.
    value = agreement(target, draft, tokens[: min(target.info.n_ctx, draft.info.n_ctx)])
    remember(key, {"agreement": value})
    return value


def remembered(key: str) -> dict[str, object] | None:
    """A figure or choice stored under key by remember(), if any."""
    hit = _load_cache().get(key)
    return hit if isinstance(hit, dict) else None


def remember(key: str, value: dict[str, object]) -> None:
    cache = _load_cache()
    cache[key] = value
    _store(cache)


def backend_key(backend: Backend) -> str:
    """What identifies a loaded model for cached measurements: file, options, machine."""
    return _key(backend)


def _store(cache: dict[str, dict[str, object]]) -> None:
    path = calibration_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(cache, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home only means measuring again next time


def calibrated(backend: Backend, max_k: int = 16) -> Calibration:
    key = _key(backend)
    cache = _load_cache()
    hit = cache.get(key)
    if isinstance(hit, dict):
        curve = hit.get("verify_seconds")
        decode = hit.get("decode_seconds")
        if isinstance(curve, list) and len(curve) >= max_k and isinstance(decode, float):
            return Calibration([float(t) for t in curve], decode)
    result = measure(backend, max_k)
    cache[key] = result.to_json()
    _store(cache)
    return result
