"""Measures what verifying k tokens costs on this machine, once per model and machine, and
how often a drafter's top token is the target's, once per pair.

The curve t_verify(k) is what the adaptive draft length is built on; it is cached in the
user directory keyed by the model file, its backend options and build, and the CPU, so only
the first load of a model pays the second or so it takes. The pair's agreement is where the
controller starts its acceptance estimates for a model drafter: a drafter that costs real
time is only tried when it is expected to pay, so a prior far below its true acceptance
would never be corrected (a fixed 50 % guess would keep a quantized copy of the target
switched off)."""

from __future__ import annotations

import itertools
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from localspec.common.progress import report
from localspec.control.config import DEFAULT, ControlConfig
from localspec.control.costs import CostCurve, SharedPassCurve
from localspec.control.hardware import DeviceProbe, cpu_probe, machine_key, predict_verify_seconds, probe
from localspec.core.protocol import Backend, eval_chunked
from localspec.core.records import HeadOfTarget
from localspec.core.sampling import SamplingConfig
from localspec.drafters import common_prefix
from localspec.drafters.model import ModelDrafter
from localspec.store import CALIBRATION

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


# The two context lengths the cost curve is measured behind (see CostCurve; ControlConfig).
SHALLOW_DEPTH = DEFAULT.shallow_depth
DEEP_DEPTH = DEFAULT.deep_depth
# The longest pass timed: the longest draft and the pending token before it.
LONGEST_PASS = DEFAULT.max_draft + 1


@dataclass(frozen=True)
class Calibration:
    verify_seconds: list[float]  # k = 1..K, behind SHALLOW_DEPTH tokens, after a pass of k
    decode_seconds: float  # one token, logits of the last position only
    deep_verify_seconds: list[float] | None = None  # the same behind deep_depth tokens
    deep_depth: int = DEEP_DEPTH
    # What a pass costs on top when the pass before it had another size: into a block of
    # more than one token, and back into a single token (see _curve).
    rebuild_block_seconds: float = 0.0
    rebuild_one_seconds: float = 0.0
    # "measured" (measure()), "prior" (prior_calibration(): nothing timed) or "learnt" (a
    # prior the passes of earlier sessions corrected); the last two keep learning.
    source: str = "measured"
    evidence: list[float] | None = None  # learnt: passes behind each size's figure

    def to_json(self) -> dict[str, object]:
        return {
            "verify_seconds": self.verify_seconds,
            "decode_seconds": self.decode_seconds,
            "deep_verify_seconds": self.deep_verify_seconds,
            "deep_depth": self.deep_depth,
            "rebuild_seconds": [self.rebuild_block_seconds, self.rebuild_one_seconds],
            "source": self.source,
            "evidence": self.evidence,
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Calibration | None:
        """The calibration stored by to_json, or None for an entry this version cannot use
        (damaged, or measured otherwise by an older localspec)."""
        curve, decode = data.get("verify_seconds"), data.get("decode_seconds")
        deep, depth, rebuild = data.get("deep_verify_seconds"), data.get("deep_depth"), data.get("rebuild_seconds")
        if not (
            isinstance(curve, list)
            and curve
            and isinstance(decode, float)
            and (deep is None or (isinstance(deep, list) and len(deep) == len(curve)))
            and isinstance(depth, int)
            and isinstance(rebuild, list)
            and len(rebuild) == 2
        ):
            return None
        source, evidence = data.get("source", "measured"), data.get("evidence")
        if source not in ("measured", "learnt") or not (evidence is None or isinstance(evidence, list)):
            return None
        # A pass takes time: a curve with a price at or below zero (learnt from outliers by an
        # older localspec) would fail every load that starts from it.
        if not all(isinstance(t, float | int) and 0 < t < math.inf for t in [*curve, *(deep or [])]):
            return None
        return cls(
            [float(t) for t in curve],
            decode,
            [float(t) for t in deep] if deep else None,
            depth,
            float(rebuild[0]),
            float(rebuild[1]),
            str(source),
            [float(e) for e in evidence] if evidence else None,
        )

    def cost_curve(
        self, config: ControlConfig = DEFAULT, busy: Callable[[], int] | None = None, pads: bool = True
    ) -> CostCurve:
        """The curve a policy prices on; given busy (a pool's count of busy lanes), the curve
        of one lane whose passes are shared (SharedPassCurve; pads: whether a pass may pad lanes)."""
        make: Callable[..., CostCurve] = CostCurve if busy is None else partial(SharedPassCurve, busy=busy, pads=pads)
        return make(
            list(self.verify_seconds),
            deep_seconds=list(self.deep_verify_seconds) if self.deep_verify_seconds else None,
            depth=SHALLOW_DEPTH,
            deep_depth=self.deep_depth,
            learning=self.source != "measured",
            evidence=list(self.evidence) if self.evidence else [],
            config=config,
        )


def _key(backend: Backend) -> str:
    info = backend.info
    try:
        stamp = os.stat(info.path)
        file_id = f"{info.path}|{stamp.st_size}|{stamp.st_mtime_ns}"
    except OSError:
        file_id = info.path
    extras = ",".join(f"{k}={v}" for k, v in sorted(backend.capabilities.extra.items()))
    return f"{info.backend}|{file_id}|{info.n_ctx}|{extras}|{platform.machine()}|{machine_key()}"


def measure(
    backend: Backend, max_k: int = LONGEST_PASS, repeats: int = 5, config: ControlConfig = DEFAULT
) -> Calibration:
    """Time one pass over k tokens for k = 1..max_k behind a short and a long context;
    leaves the cache empty."""
    base = backend.tokenize(CALIBRATION_TEXT, add_special=True, parse_special=False)
    deep_depth = min(DEEP_DEPTH, backend.info.n_ctx - max_k - 1)
    while len(base) < max(deep_depth, SHALLOW_DEPTH) + max_k:
        base = base + base
    backend.rollback(0)
    eval_chunked(backend, base[:SHALLOW_DEPTH], "none")
    probe = base[SHALLOW_DEPTH : SHALLOW_DEPTH + max_k]
    backend.eval_block(probe[:4], "all")  # warm up: page in the weights, size the buffers
    backend.rollback(SHALLOW_DEPTH)
    deep_wanted = deep_depth >= 4 * SHALLOW_DEPTH  # a small context (a short --n-ctx) keeps one curve
    rounds, done = repeats + (config.deep_repeats if deep_wanted else 0), itertools.count(1)

    def next_round() -> None:
        report(f"timing passes of 1 to {max_k} tokens, round {next(done)} of {rounds}")

    verify, rebuild = _curve(backend, probe, repeats, next_round)
    decode = []
    for _ in range(repeats * 2):
        t0 = time.perf_counter()
        backend.eval_block(probe[:1], "last")
        decode.append(time.perf_counter() - t0)
        backend.rollback(SHALLOW_DEPTH)
    deep = None
    if deep_wanted:
        eval_chunked(backend, base[SHALLOW_DEPTH:deep_depth], "none")
        deep, _ = _curve(backend, base[deep_depth : deep_depth + max_k], config.deep_repeats, next_round)
        deep = [max(d, s) for d, s in zip(deep, verify, strict=True)]  # more context never costs less
    backend.rollback(0)
    depth = deep_depth if deep else DEEP_DEPTH
    return Calibration(verify, statistics.median(decode), deep, depth, rebuild[0], rebuild[1])


def _curve(
    backend: Backend, probe: Sequence[int], repeats: int, next_round: Callable[[], None] = lambda: None
) -> tuple[list[float], tuple[float, float]]:
    """Median seconds of a pass over probe[:k] behind the cache as it is, k = 1..len(probe),
    and what a pass costs on top after a pass of another size: (into a block, into one token).

    The sizes are timed in rounds (1, 2, 3, 4, 5, 6, 8, 9, 10, 12, ... then again), not each one
    `repeats` times in a row: a burst of noise on a shared machine then spreads over every
    size instead of making one of them look dear, and the curve's shape is what decides the
    draft length. Each size is timed twice in a row: llama.cpp reuses its compute graph
    while the block size stays the same and rebuilds it when it changes, so the second pass
    is what a run of equal blocks costs, and the first one's excess is the rebuild, which a
    draft pays going into its block and the next single-token step pays coming back. Sizes
    between the timed ones are interpolated.

    The controller is given the curve without the rebuilds and covers them with its margin
    (AdaptiveDraftLength.margin): pricing them exactly did no better on recorded answers
    replayed on a clock that charges them (benchmarks/replay_variants.py)."""
    past = backend.n_past
    # 9 beside the even sizes: llama.cpp's Vulkan backend takes blocks of up to 8 rows with its
    # matrix-vector kernels and 9+ with matrix-matrix ones (mul_mat_vec_max_cols), a cliff at 9
    # (2.5x t(8) on lavapipe, benchmarks/pages/gpu.md) that interpolating 8 and 10 would halve.
    timed_sizes = (*range(1, 7), *range(8, len(probe) + 1, 2), 9, len(probe))
    sizes = sorted({k for k in timed_sizes if k <= len(probe)})
    samples: dict[int, list[float]] = {k: [] for k in sizes}
    excess: dict[int, list[float]] = {k: [] for k in sizes}
    for _ in range(repeats):
        next_round()
        for k in sizes:
            seconds = []
            for _ in range(2):
                t0 = time.perf_counter()
                backend.eval_block(probe[:k], "all")
                seconds.append(time.perf_counter() - t0)
                backend.rollback(past)
            samples[k].append(seconds[1])
            excess[k].append(seconds[0] - seconds[1])
    timed = nondecreasing([statistics.median(samples[k]) for k in sizes])
    curve = [float(t) for t in np.interp(range(1, len(probe) + 1), sizes, timed)]
    # A backend without graphs to rebuild (torch, numpy) reads a little timer noise here,
    # either way: never a negative price.
    into_block = statistics.median([e for k in sizes if k > 1 for e in excess[k]] or [0.0])
    return curve, (max(0.0, into_block), max(0.0, statistics.median(excess[1])))


def nondecreasing(timed: Sequence[float]) -> list[float]:
    """Timings by increasing block size, made nondecreasing: a pass over more tokens never
    costs less. Noise on a shared machine only ever adds time, so a size that timed dearer
    than a larger one was disturbed, and takes the larger one's figure; lifting the larger
    sizes instead (a running maximum) would carry one disturbed figure into every size above
    it, pricing the short drafts that start a copy as dear as long ones."""
    out = list(timed)
    for i in range(len(out) - 2, -1, -1):
        out[i] = min(out[i], out[i + 1])
    return out


def agreement(target: Backend, draft: Backend, tokens: Sequence[int]) -> float:
    """Share of positions where both models' top-1 next token agree, teacher-forced. The
    target keeps the text until the drafter has read it: an MTP head reads the target's
    hidden states at the positions the target holds."""
    target_picks = _top1(target, tokens)
    if isinstance(draft, HeadOfTarget) and draft.shared:
        positions = range(len(tokens) - 1, -1, -math.ceil(len(tokens) / FRONTIER_POSITIONS))
        same = [pick == target_picks[q] for q, pick in _top1_at_frontier(target, draft, tokens, positions)]
    else:
        same = list(_top1(draft, tokens) == target_picks)
    draft.rollback(0)
    target.rollback(0)
    return float(np.mean(same))


def _top1(backend: Backend, tokens: Sequence[int]) -> np.ndarray:
    """The backend's top-1 next token after each position of `tokens`, read from empty."""
    backend.rollback(0)
    step = backend.capabilities.max_block
    rows = [np.argmax(backend.eval_block(tokens[i : i + step]), axis=1) for i in range(0, len(tokens), step)]
    return np.concatenate(rows)


# Positions a head that shares the target's cache is read at, at most: one pass each.
FRONTIER_POSITIONS = 64


def _top1_at_frontier(
    target: Backend, head: Backend, tokens: Sequence[int], positions: Sequence[int]
) -> list[tuple[int, int]]:
    """(q, top-1) of a head that shares the target's cache at the given positions, from the
    last: each token is read as it drafts, at the target's next position. The target, which
    holds the whole text, gives it back from the end (a rollback, no pass): one head pass
    per position."""
    head.rollback(0)
    head.eval_block(tokens[:-1], "none")  # below the target's frontier: only recorded
    picks = []
    for q in positions:
        target.rollback(q)
        head.rollback(q)
        picks.append((q, int(np.argmax(head.eval_block(tokens[q : q + 1], "last")[0]))))
    return picks


def pair_agreement(target: Backend, draft: Backend) -> float:
    """agreement() on AGREEMENT_TEXT, measured once per pair and machine."""
    key = f"agreement|{_key(target)}||{_key(draft)}"
    hit = CALIBRATION.get(key)
    if hit is not None and isinstance(hit.get("agreement"), float):
        return float(hit["agreement"])  # type: ignore[arg-type]
    tokens = target.tokenize(AGREEMENT_TEXT, add_special=True, parse_special=False)
    # A small context (a chat opened with a short --n-ctx) measures on what fits.
    value = agreement(target, draft, tokens[: min(target.info.n_ctx, draft.info.n_ctx)])
    CALIBRATION.put(key, {"agreement": value})
    return value


def drafting_seconds(draft: Backend, config: ControlConfig = DEFAULT) -> float:
    """Seconds per drafted token of a draft model driven as the engine drives it, measured once
    per model and machine: guesses of config.draft_probe tokens along AGREEMENT_TEXT, each after
    catching up on the token or two the target added, with the drafter's early stop and its
    Python around the passes: the calibration's single-token step prices a drafted token
    well below what it costs in a request, and the controller would try drafts that lose
    until it learnt better."""
    key = f"drafting|{_key(draft)}"
    hit = CALIBRATION.get(key)
    if hit is not None and isinstance(hit.get("seconds_per_token"), float) and not hit.get("stale"):
        return float(hit["seconds_per_token"])  # type: ignore[arg-type]
    report("timing its drafting")
    text = draft.tokenize(AGREEMENT_TEXT, add_special=True, parse_special=False)
    text = text[: draft.info.n_ctx - config.draft_probe - 1]
    drafter = ModelDrafter(draft)
    cfg, rng = SamplingConfig(temperature=0.0), np.random.default_rng(0)
    pos = min(SHALLOW_DEPTH, len(text) // 2)
    drafter.start(text[:pos])
    drafted, seconds = 0, 0.0
    while pos + config.draft_probe < len(text):
        t0 = time.perf_counter()
        guess = drafter.propose(text[:pos], config.draft_probe, cfg, rng).tokens
        seconds += time.perf_counter() - t0
        drafted += len(guess)
        kept = common_prefix(guess, text[pos:])
        pos += kept + 1  # what a target that agreed so far would keep, plus its own token
        drafter.commit(text[:pos], kept)
    draft.rollback(0)
    value = seconds / drafted if drafted else calibrated(draft).decode_seconds
    CALIBRATION.put(key, {"seconds_per_token": value})
    return value


def starting_drafting_seconds(draft: Backend, config: ControlConfig = DEFAULT) -> float:
    """drafting_seconds() where it was measured, else a guess that times nothing."""
    hit = CALIBRATION.get(f"drafting|{_key(draft)}")
    if hit is not None and isinstance(hit.get("seconds_per_token"), float) and not hit.get("stale"):
        return float(hit["seconds_per_token"])  # type: ignore[arg-type]
    return starting_calibration(draft).verify_seconds[0] * config.drafting_overhead


def backend_key(backend: Backend) -> str:
    """What identifies a loaded model for cached measurements: file, options, machine."""
    return _key(backend)


# A cached curve the machine has left behind (ControlConfig.stale_drift, drift_evidence): the
# controller's drift scale corrects the running session's choices, but a cache measured under
# other conditions (a busy neighbour then, another host under the same VM; a rebuilt library
# is keyed apart by its build) misprices every draft of the next load until it has learnt
# the drift again, so the next load measures afresh. The mean since load, not the scale (an
# EMA over ~20 passes), decides: a burst of load moves the scale for a few dozen passes and
# the mean barely.
def note_drift(curve: CostCurve, backends: Sequence[Backend]) -> bool:
    """Mark the backends' cached timings stale if `curve` has drifted this far from them for
    this long; True when it did."""
    config = curve.config
    if curve.observed < config.drift_evidence or 1.0 / config.stale_drift <= curve.long_run_drift <= config.stale_drift:
        return False
    cache = CALIBRATION.load()
    for backend in backends:
        for key in (_key(backend), f"drafting|{_key(backend)}"):
            entry = cache.get(key)
            if isinstance(entry, dict):
                entry["stale"] = True
    CALIBRATION.save(cache)
    return True


def prior_calibration(backend: Backend, max_k: int = LONGEST_PASS) -> Calibration:
    """What passes should cost before any was timed, from the model's size and the machine's
    measured bandwidth and compute (no model pass): one token streams the weights once (the
    roofline); on the CPU a block adds 2·params flops per token at the machine's float32
    matmul rate on top, which llama.cpp's batched kernels come close to. The decoding passes
    then correct it (CostCurve.learning)."""
    info, on = backend.info, backend.capabilities.device
    device = cpu_probe() if on == "cpu" else probe()
    return prior_from(device, info.size_bytes, info.n_params, on, deep=info.n_ctx >= DEEP_DEPTH + max_k + 1)


def prior_from(device: DeviceProbe, size_bytes: int, n_params: int, on: str = "cpu", deep: bool = True) -> Calibration:
    """prior_calibration() for a model of this size on this device (another machine's, say),
    passes of 1..LONGEST_PASS rows priced with the default control config."""
    max_k, config = LONGEST_PASS, DEFAULT
    single = predict_verify_seconds(size_bytes, n_params, device, 1, on)
    if on == "cpu":
        per_token = 2 * n_params / (device.gflops * 1e9)
        shallow = [single] + [single + k * per_token for k in range(2, max_k + 1)]
    else:
        shallow = [predict_verify_seconds(size_bytes, n_params, device, k, on) for k in range(1, max_k + 1)]
    shallow = [max(t, 1e-5) for t in shallow]
    behind = [t * (config.prior_deep + config.prior_deep_per_token * (k - 1)) for k, t in enumerate(shallow, 1)]
    return Calibration(shallow, shallow[0], behind if deep else None, DEEP_DEPTH, source="prior")


def _learnt_key(backend: Backend) -> str:
    return f"learnt|{_key(backend)}"


def pass_seconds(curve: Sequence[float], rows: int) -> float:
    """A pass over `rows` rows on a curve of passes over 1..len(curve) rows: past its end, the
    last step's cost per row more for each row (0 rows: nothing)."""
    if rows <= 0:
        return 0.0
    if rows <= len(curve):
        return curve[rows - 1]
    per_row = curve[-1] - curve[-2] if len(curve) > 1 else curve[-1]
    return curve[-1] + (rows - len(curve)) * max(per_row, 0.0)


def starting_calibration(backend: Backend, max_k: int = LONGEST_PASS) -> Calibration:
    """The curve a runtime starts from without timing anything first: a measured one
    (`localspec doctor`) while it still describes the machine, else what earlier sessions
    learnt, else the prior. The last two keep learning from the passes decoding makes."""
    for key in (_key(backend), _learnt_key(backend)):
        hit = CALIBRATION.get(key)
        if hit is None or hit.get("stale"):
            continue
        cal = Calibration.from_json(hit)
        if cal is not None and len(cal.verify_seconds) >= max_k:
            return cal
    return prior_calibration(backend, max_k)


def remember_learnt(backend: Backend, curve: CostCurve) -> bool:
    """Store what a learning curve has learnt, for the next load; True when stored."""
    if not curve.learning or sum(curve.evidence) < curve.config.learnt_evidence:
        return False
    shallow, deep = curve.learnt()
    cal = Calibration(shallow, shallow[0], deep, curve.deep_depth, source="learnt", evidence=list(curve.evidence))
    CALIBRATION.put(_learnt_key(backend), cal.to_json())
    return True


# A learnt curve is written at most this often, and once more when its runtime closes: a
# write after every request cost a two-token answer 5 ms, a tenth of its time.
LEARNT_SAVE_SECONDS = 30.0


class LearntCurve:
    """When a runtime's learning curve is stored for the next load (remember_learnt): after
    the first request that has learnt enough, then at most every LEARNT_SAVE_SECONDS, and at
    close if requests came since the last write."""

    def __init__(self, backend: Backend, curve: CostCurve, clock: Callable[[], float] = time.monotonic) -> None:
        self._backend, self._curve, self._clock = backend, curve, clock
        self._stored_at: float | None = None
        self._unstored = False

    def after_request(self) -> None:
        now = self._clock()
        if self._stored_at is not None and now - self._stored_at < LEARNT_SAVE_SECONDS:
            self._unstored = True
        elif remember_learnt(self._backend, self._curve):
            self._stored_at, self._unstored = now, False

    def close(self) -> None:
        if self._unstored and remember_learnt(self._backend, self._curve):
            self._unstored = False


def calibrated(backend: Backend, max_k: int = LONGEST_PASS, refresh: bool = False) -> Calibration:
    """The backend's cost curve from the cache, or measured now (and cached); refresh:
    measure now whatever the cache holds."""
    key = _key(backend)
    cache = CALIBRATION.load()
    hit = None if refresh else cache.get(key)
    # Older entries were measured otherwise (no deep curve, or each size timed after a pass
    # of another size, rebuild included); a stale one no longer describes the machine.
    if isinstance(hit, dict) and not hit.get("stale"):
        cal = Calibration.from_json(hit)
        if cal is not None and len(cal.verify_seconds) >= max_k:
            return cal
    result = measure(backend, max_k)
    cache[key] = result.to_json()
    CALIBRATION.save(cache)
    return result
