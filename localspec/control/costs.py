"""The target's cost model: what a verify pass over k tokens costs, behind how much text.

Measured at load (localspec/control/calibrate.py) or started from a prior and learnt from
the passes decoding makes; the draft-length policy (policy.py) prices every candidate
draft on it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from localspec.control.config import DEFAULT, ControlConfig

# The single-token steps a block's pass is measured against: the last few, so the level is the
# one the block ran at; their low quantile, as a size's price is (cost_quantile), so a step
# that hit a spike does not set it. Only this request's steps of the last STEPS_WITHIN passes
# are the level now: a copy drafted whole after a busy request takes no steps, and that
# request's would price its blocks at half.
STEPS_SEEN = 8
STEPS_WITHIN = 16


@dataclass
class CostCurve:
    """t_verify(k) = seconds for one target pass over k tokens behind a context of some length.

    Measured at load at two context lengths (`depth` and `deep_depth`, k = 1..K each) and
    interpolated linearly between them: attention makes every pass dearer as the text grows,
    by an amount that grows with k (benchmarks/verify_costs.py), so a curve measured on a
    short text, scaled by one factor, mispredicts drafts late in a long answer. `scale` is
    the drift the machine adds on top (another process, thermal limits).

    A curve that was not measured (a prior, or one learnt in earlier sessions: `learning`)
    is also corrected per block size: `corrections[k-1]` is what the passes of k tokens
    have shown about its shape, beside the drift that `scale` tracks for all sizes alike; a
    block's as a multiple of the single-token step's (the request's recent steps), so load
    that comes and goes moves the step and the blocks alike. A
    size not drafted yet takes the correction of the nearest sizes that were, so a prior
    that priced every pass too dear is mended by the single-token steps alone, and the
    first few drafts mend its slope."""

    verify_seconds: list[float]
    scale: float = 1.0
    deep_seconds: list[float] | None = None
    depth: int = DEFAULT.shallow_depth
    deep_depth: int = DEFAULT.deep_depth
    # Passes timed since load and the sum of their ratios to the curve: the long-run drift,
    # which a burst of load that moves `scale` for a few dozen passes barely moves.
    observed: int = 0
    ratio_sum: float = 0.0
    learning: bool = False
    corrections: list[float] = field(default_factory=list)
    evidence: list[float] = field(default_factory=list)  # passes behind each correction
    config: ControlConfig = field(default=DEFAULT, repr=False, compare=False)
    _effective: list[float] | None = field(default=None, repr=False, compare=False)
    # rises() within the deep curve's depth and beyond it, while the prices hold.
    _rises: tuple[bool, bool] | None = field(default=None, repr=False, compare=False)
    _updates: int = field(default=0, repr=False, compare=False)
    # Each size's last passes this session (ratios to the base curve), for the quantile.
    _windows: dict[int, deque[float]] = field(default_factory=dict, repr=False, compare=False)
    _since_load: list[int] = field(default_factory=list, repr=False, compare=False)  # passes per size
    # The single-token step's last passes (ratios to its base): the level a block is learnt against.
    _steps: deque[tuple[int, float]] = field(
        default_factory=lambda: deque(maxlen=STEPS_SEEN), repr=False, compare=False
    )  # (the pass's number, its ratio)
    _request: int = field(default=0, repr=False, compare=False)  # passes timed before this request

    def __post_init__(self) -> None:
        for curve in (self.verify_seconds, self.deep_seconds or [1.0]):
            if not curve or any(t <= 0 for t in curve):
                raise ValueError("a cost curve needs positive timings for k = 1..K")
        if self.deep_seconds is not None and self.deep_depth <= self.depth:
            raise ValueError("the deep curve must be measured behind a longer context")
        self.corrections = self.corrections or [1.0] * len(self.verify_seconds)
        self.evidence = self.evidence or [0.0] * len(self.verify_seconds)
        self._since_load = [0] * len(self.verify_seconds)
        if self.learning:
            # A learnt curve stores every size's price, the few passes behind a seldom drafted
            # size (and the slope carried past the longest timed one) included: read back as
            # they are, a load's noise in them would price long blocks as dear as their own
            # steps. Only the sizes timed learnt_passes times are kept; the rest are drawn
            # between them again.
            trusted = [e >= self.config.learnt_passes for e in self.evidence]
            self.verify_seconds = redrawn(self.verify_seconds, trusted)
            if self.deep_seconds is not None:
                self.deep_seconds = redrawn(self.deep_seconds, trusted)

    def base(self, k: int, depth: int = 0) -> float:
        """The curve as loaded, before any correction."""
        shallow = _extend(self.verify_seconds, k)
        if self.deep_seconds is None or depth <= self.depth:
            return shallow
        deep = _extend(self.deep_seconds, k)
        w = (depth - self.depth) / (self.deep_depth - self.depth)
        return max(shallow + w * (deep - shallow), min(shallow, deep))

    def measured(self, k: int, depth: int = 0) -> float:
        return self.base(k, depth) * self.correction(k)

    def correction(self, k: int) -> float:
        """The learnt shape correction for passes of k tokens: its own where passes of k
        were timed, else interpolated between the nearest timed sizes (1.0: none yet). A
        block's is learnt as a multiple of the single-token step's (_relative), so the load
        that the step follows moves every block with it."""
        if not self.learning:
            return 1.0
        # Worked out for every size once per few passes, not at each of the dozen prices a
        # step's choice reads: the per-step work stays a small share of a step.
        if self._effective is None:
            step = self.corrections[0]
            self._effective = [step] + [step * self._relative(i) for i in range(1, len(self.corrections))]
        return self._effective[min(k, len(self.corrections)) - 1]

    def _shape(self, j: int) -> float:
        """Size j+1's learnt price as a multiple of the single-token step's (that step: 1)."""
        return self.corrections[j] if j else 1.0

    def _relative(self, i: int) -> float:
        # Only sizes timed since load are neighbours: a size timed in earlier sessions has
        # its shape in the base, not the machine's level now. Were it its own neighbour, a
        # curve learnt on a busier hour would keep its blocks at that hour's prices while the
        # single step, timed at every step, follows the quiet one, and would decline drafts
        # that pay.
        learnt, timed = self.config.learnt_passes, self._since_load
        if self.evidence[i] >= learnt and timed[i]:
            return self.corrections[i]
        below = next((j for j in range(i - 1, -1, -1) if timed[j]), None)
        above = next((j for j in range(i + 1, len(timed)) if timed[j]), None)
        if below is None:
            if above is None:
                return self.corrections[i]  # its own passes, or 1.0 before any
            near = self._shape(above)
        elif above is None:
            near = self._beyond(i, below)
        else:
            w = (i - below) / (above - below)
            near = self._shape(below) + w * (self._shape(above) - self._shape(below))
        if not timed[i]:
            return near
        # A few passes of this size: their figure, shrunk toward the neighbours'.
        own = self.evidence[i] / learnt
        return own * self.corrections[i] + (1 - own) * near

    def _beyond(self, i: int, last: int) -> float:
        """Above the largest timed size: the timed curve's last slope carried on (never
        below the last timed correction), since a prior's own slope may be the wrong part.
        A slope from the single-token step is not carried: a block takes other kernels than
        one token does (llama.cpp's CPU path), so that step says nothing about the blocks'."""
        before = next((j for j in range(last - 1, -1, -1) if self._since_load[j]), None)
        if before is None or before == 0:
            return self._shape(last)
        t_last = self.base(last + 1) * self._shape(last)
        slope = (t_last - self.base(before + 1) * self._shape(before)) / (last - before)
        return max(self._shape(last), (t_last + slope * (i - last)) / self.base(i + 1))

    def rises(self, depth: int = 0) -> bool:
        """Whether a pass over more tokens never costs less behind `depth` tokens: the shallow
        and the deep curve as corrected each nondecreasing in k (and, past the deep curve's
        depth, what the deep one adds too), the slope carried past the last timed size
        included. Then no longer draft costs less than a shorter one, which lets a choice stop
        pricing drafts that could not win (AdaptiveDraftLength._best)."""
        if self._rises is None:
            c = [self.correction(k) for k in range(1, len(self.verify_seconds) + 1)]
            shallow, deep = self.verify_seconds, self.deep_seconds
            within = _nondecreasing(shallow, c) and (deep is None or _nondecreasing(deep, c))
            gap = [d - v for v, d in zip(shallow, deep, strict=True)] if deep is not None else None
            self._rises = (within, within and (gap is None or _nondecreasing(gap, c)))
        return self._rises[depth > self.deep_depth and self.deep_seconds is not None]

    def beside(self, depth: int = 0) -> tuple[float, float]:
        """What the other lanes sharing this lane's passes bring to each: their tokens and
        their rows' seconds (SharedPassCurve); nothing for a lone request."""
        return 0.0, 0.0

    def learns(self) -> bool:
        """Whether the pass a step runs now is timed into this curve (update)."""
        return True

    def timed_a_block(self) -> bool:
        """False while a learning curve has priced no pass over 2 tokens or more on its own
        passes (a prior, whose blocks may be far too cheap); a measured curve always has."""
        return not self.learning or any(e > 0 for e in self.evidence[1:])

    def verify(self, k: int, depth: int = 0) -> float:
        return self.measured(k, depth) * self.scale

    def update(self, k: int, seconds: float, depth: int = 0) -> None:
        # Drift makes every pass slower by about the same factor: one scale for the whole
        # curve. Learning only the observed k instead would make the sizes seldom drafted look
        # cheap next to the single-token step seen at every step, and draft where it does not
        # pay. An outlier (a page fault, a scheduler hiccup) is clipped and damped.
        if self.learning:
            self._learn_shape(k, seconds / self.base(k, depth))
        i = min(k, len(self.corrections)) - 1
        if self.learning and self.evidence[i] < self.config.learnt_passes:
            return  # while a learning curve still finds a size's price, its misses are not drift
        ratio = min(seconds / self.measured(k, depth), self.config.drift_clip)
        self.scale += self.config.drift_weight * (ratio - self.scale)
        self.observed += 1
        self.ratio_sum += ratio

    def _learn_shape(self, k: int, ratio: float) -> None:
        # A running mean over the first learnt_passes passes of a size, then a low quantile
        # of its last cost_window passes: load only ever adds time, so a mean that spikes of
        # other processes inflate would price the single step, timed most often, too dear
        # against the blocks and draft where it loses. A prior can be off severalfold, so
        # only wild outliers clip.
        cfg = self.config
        i = min(k, len(self.corrections)) - 1
        self._updates += 1
        if self.evidence[i] < cfg.learnt_passes or self._updates % cfg.learnt_passes == 0:
            self._effective, self._rises = None, None
        first_step, before = not i and not self._since_load[0], self.corrections[0]
        if not i:
            self._steps.append((self._updates, ratio))
        else:
            in_steps = self._in_steps(i, k, ratio)
            if in_steps is None:
                return
            ratio = in_steps
        if not self._since_load[i]:
            # Its first pass since load moves the price the size had until now (its
            # neighbours'), not the level of an earlier session.
            self.corrections[i] = self._relative(i) if i else self.correction(1)
        self._since_load[i] += 1
        ratio = min(max(ratio, cfg.shape_clip[0]), cfg.shape_clip[1])
        if i > 0 and self._far_under(k, ratio):
            if self.evidence[i] >= cfg.learnt_passes:
                self._rebase(i, ratio)  # a price its own passes had set is wrong: all are
            else:
                # A price read off the neighbours: this pass, no slower than load allows, is it.
                self.corrections[i], self.evidence[i] = ratio, float(cfg.learnt_passes)
                self._effective, self._rises = None, None
            return
        window = self._windows.setdefault(i, deque(maxlen=cfg.cost_window))
        window.append(ratio)
        if len(window) >= cfg.learnt_passes:
            self.corrections[i] = sorted(window)[int(cfg.cost_quantile * (len(window) - 1))]
        elif self.evidence[i] == 0:
            self.corrections[i] = ratio
        else:
            step = max(1.0 / (self.evidence[i] + 1), 1.0 / cfg.learnt_passes)
            self.corrections[i] += step * (ratio - self.corrections[i])
        self.evidence[i] = min(self.evidence[i] + 1, cfg.max_evidence)
        if first_step:
            self._releveled(before)

    def _in_steps(self, i: int, k: int, ratio: float) -> float | None:
        """A block's pass (ratio: to its base) in single-token steps, as the recent steps took:
        timed under load that the steps took too, it keeps its quiet shape, and when the load
        ends the block's price falls with the step's. Learnt in seconds, such a block stayed at
        the busy hour's price and was stored so (2.5 steps read 5 after a load of 2x).

        With no step of this request to go by (a copy drafted whole), the steps before it stand
        for the level (or the step's price, before any): a size whose price is still unfound
        learns from that, one whose price is found only moves the drift (update; None here),
        which follows the level from its passes, unless no step was timed since load and the
        pass came in far under its price."""
        level, now = self._level()
        ratio /= level if level is not None else self.correction(1) * self.scale
        if now or self.evidence[i] < self.config.learnt_passes:
            return ratio
        return ratio if self._far_under(k, ratio) and not self._since_load[0] else None

    def _far_under(self, k: int, ratio: float) -> bool:
        """Whether a block of k tokens timed at `ratio` single steps (to its base) came in so
        far under its price that load cannot explain it: the curve is stale (_rebase)."""
        return ratio < self.config.stale_shape * self.correction(k) / self.correction(1)

    def _releveled(self, before: float) -> None:
        """The first single-token step since load has priced the step anew: the blocks timed
        before it were measured against its price as loaded (`before`), so they keep their
        price in seconds, not in steps (a prior off 40x had them 10 steps dear)."""
        factor = before / self.corrections[0]
        for j in range(1, len(self.corrections)):
            if self._since_load[j]:
                self.corrections[j] *= factor
        self._effective, self._rises = None, None

    def begin(self) -> None:
        """A request starts: its blocks are priced against its own steps, not the steps of the
        request before (the load may have changed in between), where it has any."""
        self._request = self._updates

    def _level(self) -> tuple[float | None, bool]:
        """The single-token step's price as a ratio to its base, a low quantile of its last
        passes, and whether those are this request's recent ones (None: no step timed yet)."""
        now = [r for n, r in self._steps if n > self._request and self._updates - n <= STEPS_WITHIN]
        seen = sorted(now or [r for _, r in self._steps])
        return (seen[int(self.config.cost_quantile * (len(seen) - 1))] if seen else None), bool(now)

    def _rebase(self, i: int, ratio: float) -> None:
        """A pass of i+1 tokens at `ratio` times the curve's base (in single steps) shows the curve was learnt
        on a busier machine: its block sizes are no guide any more. This pass, no slower than
        load allows, is that size's cost, and every other block size is priced at it too, or
        at its own price where that is less, until its own passes say more: an optimistic
        start, so the next proven guess is drafted long and that pass times the far end of
        the curve (the single-token step, timed at every step, keeps what it learnt). A pass
        under its price lowers prices only: priced at a long pass, a short block looked as dear
        as it, the curve drafted nothing that would time it, and later loads started so."""
        shallow = self.verify_seconds[i] * ratio
        deep = self.deep_seconds[i] * ratio if self.deep_seconds is not None else 0.0
        step = self.correction(1)
        own = [self.correction(k) / step for k in range(1, len(self.corrections) + 1)]  # before they reset
        for j in range(1, len(self.corrections)):
            self.verify_seconds[j] = min(self.verify_seconds[j] * own[j], shallow)
            if self.deep_seconds is not None:
                self.deep_seconds[j] = min(self.deep_seconds[j] * own[j], deep)
            self.corrections[j], self.evidence[j], self._since_load[j] = 1.0, 0.0, 0
            self._windows.pop(j, None)  # timed against the old base
        self.evidence[i], self._since_load[i] = float(self.config.learnt_passes), 1
        self._effective, self._rises = None, None

    def learnt(self) -> tuple[list[float], list[float] | None]:
        """The curve as the passes so far have shown it (drift included), behind a short
        and a long text: what a later load starts from."""
        n = len(self.verify_seconds)
        shallow = [self.verify(k, self.depth) for k in range(1, n + 1)]
        deep = [self.verify(k, self.deep_depth) for k in range(1, n + 1)] if self.deep_seconds else None
        return shallow, deep

    @property
    def long_run_drift(self) -> float:
        """Mean ratio of timed passes to the curve since load (1.0 before any)."""
        return self.ratio_sum / self.observed if self.observed else 1.0


def redrawn(curve: Sequence[float], trusted: Sequence[bool]) -> list[float]:
    """The curve with each block size not trusted drawn again: on the line through the trusted
    block sizes around it, and past the last one on the slope from the first trusted block to
    the last, or flat where that falls (one local slope is mostly its two ends' noise). The
    single-token step is not a point of that line (a block takes other kernels), but a size
    below the first trusted block costs no more than the line from it to that block says: a
    curve stored with its short blocks at a long block's price (an older _rebase) drafted
    nothing that would time them. Past a single trusted block, the prices stay as stored."""
    points = [i for i in range(1, len(curve)) if trusted[i]]
    if not points:
        return list(curve)
    out = list(curve)
    first, last = points[0], points[-1]
    for i in range(1, first):
        out[i] = min(curve[i], curve[0] + i / first * (curve[first] - curve[0]))
    if len(points) < 2:
        return out
    # Never falling past the last trusted size: a falling slope is its ends' noise (a first
    # pass that compiled its kernels, say), and would price a long block below a short one.
    slope = max((curve[last] - curve[first]) / (last - first), 0.0)
    for i in range(first + 1, len(curve)):
        if trusted[i]:
            continue
        if i > last:
            out[i] = curve[last] + slope * (i - last)
        else:
            below = max(j for j in points if j < i)
            above = min(j for j in points if j > i)
            out[i] = curve[below] + (i - below) / (above - below) * (curve[above] - curve[below])
    return out


def _extend(curve: Sequence[float], k: int) -> float:
    if k <= len(curve):
        return curve[k - 1]
    # Beyond the measured range, extend the last measured slope linearly.
    last = curve[-1]
    slope = last - curve[-2] if len(curve) > 1 else last
    return last + slope * (k - len(curve))


def _nondecreasing(curve: Sequence[float], corrections: Sequence[float]) -> bool:
    """Whether curve[k] * corrections[k] never falls as k grows, and the slope _extend carries
    past the end (under the last correction) does not either."""
    priced = [t * c for t, c in zip(curve, corrections, strict=True)]
    beyond = len(curve) < 2 or curve[-1] >= curve[-2]
    return beyond and all(b >= a for a, b in pairwise(priced))


def _alone() -> int:
    return 1


@dataclass
class SharedPassCurve(CostCurve):
    """A lane's curve when requests share passes (backends/llamacpp/lanes.py), priced as what
    this lane's k rows add to the passes of n-1 other busy lanes taking plain steps, on the lone
    curve t. A plain step joins their pass: t(n) - t(n-1). A longer block cannot join it as it
    is, since a shared pass gives every lane the same rows (lanes.py): it either runs in a pass
    of its own, t(k), or pads the others' rows to k, t(n*k) - t(n-1); whichever costs less,
    as lanes.py shapes the passes. A plain step then looks cheap and a draft must be accepted
    more often to pay, as it must for the batch's throughput. A model with recurrent state pads
    no lane (pads False: a padded row would move its state), so there a longer block always runs
    in a pass of its own. Alone it is the lone curve. It
    learns only from steps taken alone: beside other lanes a step's time holds their passes and
    waits too, which would teach the lone curve (and the learnt curve kept on disk for later
    loads) the batch's round instead of a pass."""

    busy: Callable[[], int] = field(default=_alone, repr=False, compare=False)  # lanes in a request, this one too
    pads: bool = field(default=True, compare=False)  # False: passes share only blocks of one width

    def verify(self, k: int, depth: int = 0) -> float:
        others = self.busy() - 1
        if others <= 0:
            return super().verify(k, depth)
        joined = super().verify(others * k + k, depth) - super().verify(others, depth)
        if k == 1:
            return max(joined, 1e-6)
        return max(min(super().verify(k, depth), joined) if self.pads else super().verify(k, depth), 1e-6)

    def beside(self, depth: int = 0) -> tuple[float, float]:
        """The other busy lanes' plain steps: a token each, in a pass over their rows. A lane's
        draft is worth what it adds to the whole pass's tokens for what it adds to its time
        (AdaptiveDraftLength._best): weighed against its own plain step alone, a draft's rows
        look dear next to the one row a plain step adds, and no lane drafts even where every
        guess comes true (4 lanes, all drafts kept: 1.3 tokens a pass, where one lane alone
        took 15)."""
        others = self.busy() - 1
        if others <= 0:
            return 0.0, 0.0
        return float(others), super().verify(others, depth)

    def learns(self) -> bool:
        return self.busy() <= 1

    def update(self, k: int, seconds: float, depth: int = 0) -> None:
        if self.learns():
            super().update(k, seconds, depth)

    def learnt(self) -> tuple[list[float], list[float] | None]:
        n = len(self.verify_seconds)
        shallow = [CostCurve.verify(self, k, self.depth) for k in range(1, n + 1)]
        deep = [CostCurve.verify(self, k, self.deep_depth) for k in range(1, n + 1)] if self.deep_seconds else None
        return shallow, deep
