"""Choosing the draft length γ for every step.

A draft of γ tokens costs γ drafter steps plus one target pass over γ+1 tokens and yields
E[accepted] + 1 tokens. On a CPU a pass over a few tokens costs several single-token steps
(benchmarks/verify_costs.py), so a fixed γ loses on text the drafter cannot guess. The
adaptive policy maximises

    tokens per second(γ) = (1 + Σ_{j≤γ} Π_{i≤j} α_i) / (γ·t_draft + t_verify(γ+1))

with α_i the acceptance rate at draft position i given that position i-1 was accepted,
estimated online, and t_verify the measured cost curve of the target. γ = 0 (plain
decoding) is always a candidate, which is what keeps localspec from losing to it.

A free drafter (n-gram lookup) guesses before γ is chosen and says how well the context
supports its guess (the length of the matched passage). A copied passage backs each of its
tokens with one token more than the one before: the j-th token of a guess backed by s tokens
is backed by s + j once the tokens before it are accepted. α is therefore kept per support
level, not per position, and a guess's chain of α_i reads the level of s + i: a copy that
starts on a 3-token match is a coin toss for its first token but nearly sure by its tenth.
One pooled estimate, or one per position, would waste steps on weak guesses or pass on the
strong, and ramp up slowly at the start of every copied passage.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from localspec.core.stats import Step

# Support levels (see the module doc): level i holds supports in [EDGES[i-1], EDGES[i]), level 0
# is "unknown" (model drafters). Each starts from a prior near how often an n-gram guess of
# that support came true (benchmarks/acceptance_by_support.py), made monotone and shaded down
# so that a short reply, which leaves little time to learn, does not pay for optimism; the
# online estimates take over within a few steps.
SUPPORT_EDGES = (1, 2, 3, 4, 6, 8, 12, 20, 32)
SUPPORT_PRIORS = (0.15, 0.35, 0.55, 0.6, 0.7, 0.8, 0.9, 0.93, 0.95)


# The same for sampled requests, where a guessed token comes true with the target's
# probability of it, so less often than under greedy decoding (the same benchmark), shaded
# down as the greedy priors are.
SAMPLED_SUPPORT_PRIORS = (0.15, 0.3, 0.45, 0.55, 0.6, 0.67, 0.85, 0.9, 0.92)

CATCH_UP_HORIZON = 4

# A learning cost curve (CostCurve.learning) trusts a block size's own timings once this many
# passes of it were timed, and remembers at most MAX_EVIDENCE of them across sessions, so a
# machine that changes is followed within a few dozen passes.
LEARNT_PASSES = 8
MAX_EVIDENCE = 32
# A pass timed under this share of what the learnt curve says its size costs is no jitter:
# load only ever adds time, so the curve's shape was learnt while the machine was busier.
STALE_SHAPE = 2 / 3

# A proven copy source the cost curve keeps idle or short: after PROBE_AFTER steps that
# stopped a guess where the evidence says its next token comes true (α ≥ PROBE_ALPHA), the
# guess is drafted as far as it is more likely right than wrong, so the price of a longer
# pass is timed instead of trusted for good (a curve learnt on a busy machine, or carried on
# from a few sizes, can price every longer draft too dear, and a size never drafted is never
# timed). A probe costs one longer pass on a guess likely to come true.
PROBE_AFTER = 32
PROBE_ALPHA = 0.6


def support_level(support: int) -> int:
    return sum(1 for edge in SUPPORT_EDGES if support >= edge)


def support_priors(sampled: bool) -> tuple[float, ...]:
    return SAMPLED_SUPPORT_PRIORS if sampled else SUPPORT_PRIORS


@dataclass
class FixedDraftLength:
    gamma: int

    def begin(self, sampled: bool) -> None:
        pass

    def would_draft(self, depth: int = 0) -> bool:
        return self.gamma > 0

    def choose(self, limit: int, support: int = 0, backlog: int = 0, depth: int = 0) -> int:
        return min(self.gamma, limit)

    def choose_source(
        self, guessed: int, support: int, limit: int, backlog: int = 0, depth: int = 0
    ) -> tuple[int, bool]:
        return min(self.gamma, limit), False  # a fixed length drafts with the model it was given

    def observe(self, step: Step) -> None:
        pass

    def observe_shadow(self, drafted: int, accepted: int, support: int = 0, start: int = 0) -> None:
        pass


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
    have shown about its shape, beside the drift that `scale` tracks for all sizes alike. A
    size not drafted yet takes the correction of the nearest sizes that were, so a prior
    that priced every pass too dear is mended by the single-token steps alone, and the
    first few drafts mend its slope."""

    verify_seconds: list[float]
    scale: float = 1.0
    deep_seconds: list[float] | None = None
    depth: int = 32
    deep_depth: int = 512
    # Passes timed since load and the sum of their ratios to the curve: the long-run drift,
    # which a burst of load that moves `scale` for a few dozen passes barely moves.
    observed: int = 0
    ratio_sum: float = 0.0
    learning: bool = False
    corrections: list[float] = field(default_factory=list)
    evidence: list[float] = field(default_factory=list)  # passes behind each correction
    _effective: list[float] | None = field(default=None, repr=False, compare=False)
    _updates: int = field(default=0, repr=False, compare=False)

    def __post_init__(self) -> None:
        for curve in (self.verify_seconds, self.deep_seconds or [1.0]):
            if not curve or any(t <= 0 for t in curve):
                raise ValueError("a cost curve needs positive timings for k = 1..K")
        if self.deep_seconds is not None and self.deep_depth <= self.depth:
            raise ValueError("the deep curve must be measured behind a longer context")
        self.corrections = self.corrections or [1.0] * len(self.verify_seconds)
        self.evidence = self.evidence or [0.0] * len(self.verify_seconds)

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
        were timed, else interpolated between the nearest timed sizes (1.0: none yet)."""
        if not self.learning:
            return 1.0
        # Worked out for every size once per few passes, not at each of the dozen prices a
        # step's choice reads: the per-step work stays a small share of a step.
        if self._effective is None:
            self._effective = [self._correction(i) for i in range(len(self.corrections))]
        return self._effective[min(k, len(self.corrections)) - 1]

    def _correction(self, i: int) -> float:
        if self.evidence[i] >= LEARNT_PASSES:
            return self.corrections[i]
        below = next((j for j in range(i - 1, -1, -1) if self.evidence[j] > 0), None)
        above = next((j for j in range(i + 1, len(self.evidence)) if self.evidence[j] > 0), None)
        if below is None and above is None:
            return self.corrections[i]  # its own passes, or 1.0 before any
        if above is None and below is not None:
            near = self._beyond(i, below)
        elif below is None or above is None or below == above:
            near = self.corrections[below if above is None else above]  # type: ignore[index]
        else:
            w = (i - below) / (above - below)
            near = self.corrections[below] + w * (self.corrections[above] - self.corrections[below])
        if self.evidence[i] == 0:
            return near
        # A few passes of this size: their figure, shrunk toward the neighbours'.
        own = self.evidence[i] / LEARNT_PASSES
        return own * self.corrections[i] + (1 - own) * near

    def _beyond(self, i: int, last: int) -> float:
        """Above the largest timed size: the timed curve's last slope carried on (never
        below the last timed correction), since a prior's own slope may be the wrong part.
        A slope from the single-token step is not carried: a block takes other kernels than
        one token does (llama.cpp's CPU path), so that step says nothing about the blocks'."""
        before = next((j for j in range(last - 1, -1, -1) if self.evidence[j] > 0), None)
        if before is None or before == 0:
            return self.corrections[last]
        t_last = self.base(last + 1) * self.corrections[last]
        slope = (t_last - self.base(before + 1) * self.corrections[before]) / (last - before)
        return max(self.corrections[last], (t_last + slope * (i - last)) / self.base(i + 1))

    def verify(self, k: int, depth: int = 0) -> float:
        return self.measured(k, depth) * self.scale

    def update(self, k: int, seconds: float, depth: int = 0, weight: float = 0.05) -> None:
        # Drift makes every pass slower by about the same factor: one scale for the whole
        # curve. Learning only the observed k instead would make the sizes seldom drafted look
        # cheap next to the single-token step seen at every step, and draft where it does not
        # pay. An outlier (a page fault, a scheduler hiccup) is clipped and damped.
        if self.learning:
            self._learn_shape(k, seconds / (self.base(k, depth) * self.scale))
        i = min(k, len(self.corrections)) - 1
        ratio = min(seconds / self.measured(k, depth), 3.0)
        self.scale += weight * (ratio - self.scale)
        if not self.learning or self.evidence[i] >= LEARNT_PASSES:
            # While a learning curve still finds its shape, its misses are not drift.
            self.observed += 1
            self.ratio_sum += ratio

    def _learn_shape(self, k: int, ratio: float) -> None:
        # A running mean over the first LEARNT_PASSES passes of a size, then an EMA that
        # follows the machine. A prior can be off severalfold, so only wild outliers clip.
        i = min(k, len(self.corrections)) - 1
        self._updates += 1
        if self.evidence[i] < LEARNT_PASSES or self._updates % LEARNT_PASSES == 0:
            self._effective = None
        ratio = min(max(ratio, 0.1), 10.0)
        if i > 0 and ratio < STALE_SHAPE * self.correction(k):
            if self.evidence[i] >= LEARNT_PASSES:
                self._rebase(i, ratio)  # a price its own passes had set is wrong: all are
            else:
                # A price read off the neighbours: this pass, no slower than load allows, is it.
                self.corrections[i], self.evidence[i] = ratio, float(LEARNT_PASSES)
                self._effective = None
            return
        if self.evidence[i] == 0:
            self.corrections[i] = ratio
        else:
            step = max(1.0 / (self.evidence[i] + 1), 1.0 / LEARNT_PASSES)
            self.corrections[i] += step * (ratio - self.corrections[i])
        self.evidence[i] = min(self.evidence[i] + 1, MAX_EVIDENCE)

    def _rebase(self, i: int, ratio: float) -> None:
        """A pass of i+1 tokens at `ratio` times the curve's base shows the curve was learnt
        on a busier machine: its block sizes are no guide any more. This pass, no slower than
        load allows, is that size's cost, and every other block size is priced at it too until
        its own passes say more: an optimistic start, so the next proven guess is drafted long
        and that pass times the far end of the curve (the single-token step, timed at every
        step, keeps what it learnt)."""
        shallow = self.verify_seconds[i] * ratio
        deep = self.deep_seconds[i] * ratio if self.deep_seconds is not None else 0.0
        for j in range(1, len(self.corrections)):
            self.verify_seconds[j] = shallow
            if self.deep_seconds is not None:
                self.deep_seconds[j] = deep
            self.corrections[j], self.evidence[j] = 1.0, 0.0
        self.evidence[i] = float(LEARNT_PASSES)
        self._effective = None

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


def _extend(curve: Sequence[float], k: int) -> float:
    if k <= len(curve):
        return curve[k - 1]
    # Beyond the measured range, extend the last measured slope linearly.
    last = curve[-1]
    slope = last - curve[-2] if len(curve) > 1 else last
    return last + slope * (k - len(curve))


@dataclass
class AdaptiveDraftLength:
    costs: CostCurve
    draft_seconds_per_token: float
    max_gamma: int = 12
    prior: float = 0.5  # for drafts of unknown support
    # EMA weights of a free drafter's support levels (weight_hit also smooths the drafter's
    # cost): a rejection counts more than an acceptance, because a wasted long draft costs
    # several plain steps while a missed chance costs only the gain it would have made, and
    # an n-gram guess's chance changes abruptly where the copying stops.
    weight_hit: float = 0.15
    weight_miss: float = 0.3
    relax: float = 0.003  # per step, unobserved estimates drift back toward their prior
    # What a draft model pays per token to catch up after sitting out steps (a batched pass),
    # charged spread over CATCH_UP_HORIZON steps: catching up once serves the drafts after it.
    catch_up_seconds_per_token: float = 0.0
    # Draft only when the predicted rate beats plain decoding by this share: near break-even
    # a wrong prediction (a drafter's cost drifts; llama.cpp rebuilds its graph when the block
    # size changes, and back) loses more than a right one wins (calibrate._curve).
    margin: float = 0.0
    # A free lookup beside a draft model (choose_source): what its guessed tokens cost, and
    # its own margin (no drafter cost to mispredict, only the graph rebuild).
    lookup_seconds_per_token: float = 0.0
    lookup_margin: float = 0.0
    # How many observations the prior is worth for drafts of unknown support (model
    # drafters), and how many of a position the estimate remembers. A good draft model's
    # misses come in clusters where the text turns: counting hits and trials, with the
    # measured agreement as the prior, keeps one cluster from switching it off for good.
    prior_weight: float = 2.0
    memory: float = 50.0
    alpha: list[float] = field(default_factory=list)  # per position, drafts of unknown support
    # by_support[level - 1]: the same per support level of a free drafter's guessed tokens.
    by_support: list[float] = field(default_factory=list)
    sampled: bool = False  # the kind of request the estimates are for (see begin)
    # The evidence behind alpha: discounted hits and trials per position.
    hits: list[float] = field(default_factory=list)
    trials: list[float] = field(default_factory=list)
    _other_kind: _Estimates | None = field(default=None, repr=False)
    _declined: int = field(default=0, repr=False)  # proven guesses passed over in a row (PROBE_AFTER)

    def __post_init__(self) -> None:
        if not self.alpha:
            self.alpha = [self.prior] * self.max_gamma
        if not self.by_support:
            self.by_support = list(support_priors(self.sampled))
        self.hits = self.hits or [0.0] * len(self.alpha)
        self.trials = self.trials or [0.0] * len(self.alpha)

    def begin(self, sampled: bool) -> None:
        # A sampled token matches a guess with the target's probability of it, a greedy one
        # whenever the guess is the argmax, so the same guesses come true less often under
        # sampling (SAMPLED_SUPPORT_PRIORS). Each kind of request keeps its own estimates: a
        # session that switches temperature does not carry one kind's evidence into the other.
        if sampled == self.sampled:
            return
        current = _Estimates(self.alpha, self.by_support, self.hits, self.trials)
        if self._other_kind is None:
            n = len(self.alpha)
            fresh = _Estimates([self.prior] * n, list(support_priors(sampled)), [0.0] * n, [0.0] * n)
        else:
            fresh = self._other_kind
        self.alpha, self.by_support, self.hits, self.trials = fresh.alpha, fresh.by_support, fresh.hits, fresh.trials
        self._other_kind = current
        self.sampled = sampled

    def chain(self, gamma: int, support: int = 0) -> list[float]:
        """α_i for the positions of a draft of γ tokens whose first token has this support."""
        if support <= 0:
            return self.alpha[:gamma]
        return [self.by_support[support_level(support + i) - 1] for i in range(gamma)]

    def expected_tokens(self, gamma: int, support: int = 0) -> float:
        total, run = 1.0, 1.0
        for a in self.chain(gamma, support):
            run *= a
            total += run
        return total

    def rate(self, gamma: int, support: int = 0, depth: int = 0) -> float:
        cost = gamma * self.draft_seconds_per_token * self.costs.scale + self.costs.verify(gamma + 1, depth)
        return self.expected_tokens(gamma, support) / cost

    def would_draft(self, depth: int = 0) -> bool:
        return self.choose(self.max_gamma, 0, 0, depth) > 0

    def choose(self, limit: int, support: int = 0, backlog: int = 0, depth: int = 0) -> int:
        gamma = self._best(limit, support, backlog, depth, self.draft_seconds_per_token, self.margin)[0]
        return self._probe(gamma, limit, support)

    def _probe(self, gamma: int, guessed: int, support: int) -> int:
        """gamma, or a longer probe once PROBE_AFTER proven guesses were stopped short."""
        longest = min(guessed, self.max_gamma) if support > 0 else 0
        if gamma >= longest:
            self._declined = 0 if gamma > 0 else self._declined
            return gamma
        # Per step only the next token's estimate is read; the whole chain only for a probe.
        if self.by_support[support_level(support + gamma) - 1] < PROBE_ALPHA:
            return gamma
        self._declined += 1
        if self._declined < PROBE_AFTER:
            return gamma
        self._declined = 0
        likely, run = gamma + 1, 1.0
        for n, a in enumerate(self.chain(longest, support), 1):  # while more likely right than wrong
            run *= a
            if run < 0.5:
                break
            likely = max(likely, n)
        return likely

    def choose_source(
        self, guessed: int, support: int, limit: int, backlog: int = 0, depth: int = 0
    ) -> tuple[int, bool]:
        # Each source's best γ and predicted rate. The lookup reads the text directly and
        # costs next to nothing per token; the model pays its drafting time and its catch-up
        # on what the lookup copied meanwhile, charged as in choose(). Charging less of the
        # catch-up lets the model back in after every copy, which loses on answers whose short
        # copies alternate with new values (benchmarks/hybrid_sources.py).
        gamma, rate = self._best(limit, 0, backlog, depth, self.draft_seconds_per_token, self.margin)
        if guessed > 0 and support > 0:
            lookup = self._best(
                min(guessed, limit), support, 0, depth, self.lookup_seconds_per_token, self.lookup_margin
            )
            if lookup[0] > 0 and (gamma == 0 or lookup[1] > rate):
                return self._probe(lookup[0], min(guessed, limit), support), True
            if gamma == 0:
                probe = self._probe(0, min(guessed, limit), support)
                return (probe, True) if probe > 0 else (0, False)
        return gamma, False

    def _best(
        self, limit: int, support: int, backlog: int, depth: int, per_token: float, margin: float
    ) -> tuple[int, float]:
        """The γ ≤ limit with the highest predicted rate, and that rate (tokens per second);
        a draft must beat plain decoding's rate by `margin` to be chosen."""
        # One pass: E[tokens](γ) grows by Π α_i at each step, so no γ is recomputed from scratch.
        alpha = self.chain(min(limit, self.max_gamma), support)
        plain = 1.0 / self.costs.verify(1, depth)
        best, best_rate, bar = 0, plain, plain * (1.0 + margin)
        expected, run = 1.0, 1.0
        # The drafter runs on the same cores over the same text: the target's drift is its too.
        draft_cost = per_token * self.costs.scale
        catch_up = backlog * self.catch_up_seconds_per_token * self.costs.scale / CATCH_UP_HORIZON
        for g in range(1, min(limit, self.max_gamma) + 1):
            run *= alpha[g - 1]
            expected += run
            r = expected / (catch_up + g * draft_cost + self.costs.verify(g + 1, depth))
            if r > bar and r > best_rate:
                best, best_rate = g, r
        return best, best_rate

    def observe(self, step: Step) -> None:
        drafted, accepted = step.drafted, step.accepted
        self.costs.update(drafted + 1, step.verify_seconds, step.depth)
        if drafted == 0:
            self._relax(step.support, 0)
            return
        # The catch-up is not a cost of each drafted token: take it out before learning that.
        # Costs are kept in the units of the load-time measurement (divided by the drift).
        if not step.lookup:
            scale = self.costs.scale
            per_token = max(0.0, step.draft_seconds / scale - step.backlog * self.catch_up_seconds_per_token) / drafted
            self.draft_seconds_per_token += self.weight_hit * (per_token - self.draft_seconds_per_token)
        seen = min(accepted + 1, drafted)
        for i in range(seen):
            self._learn(step.support, i, 1.0 if i < accepted else 0.0)
        self._relax(step.support, seen)

    def observe_shadow(self, drafted: int, accepted: int, support: int = 0, start: int = 0) -> None:
        if accepted < start:
            return  # the chain broke inside the verified part: nothing unverified was reached
        for i in range(start, min(accepted + 1, drafted, self.max_gamma)):
            self._learn(support, i, 1.0 if i < accepted else 0.0)

    def _learn(self, support: int, i: int, outcome: float) -> None:
        if support <= 0:
            keep = 1.0 - 1.0 / self.memory
            self.hits[i] = self.hits[i] * keep + outcome
            self.trials[i] = self.trials[i] * keep + 1.0
            self._estimate(i)
            return
        slot = support_level(support + i) - 1
        weight = self.weight_hit if outcome else self.weight_miss
        self.by_support[slot] += weight * (outcome - self.by_support[slot])

    def _estimate(self, i: int) -> None:
        self.alpha[i] = (self.prior * self.prior_weight + self.hits[i]) / (self.prior_weight + self.trials[i])

    def _relax(self, support: int, start: int) -> None:
        # Estimates nothing observed in a while drift back toward their priors: the positions
        # a model drafter did not reach (their evidence ages), or the support levels a step
        # did not touch.
        if support <= 0:
            for i in range(start, len(self.alpha)):
                if self.trials[i] > 0:
                    self.hits[i] *= 1.0 - self.relax
                    self.trials[i] *= 1.0 - self.relax
                    self._estimate(i)
            return
        touched = {support_level(support + i) for i in range(start)}
        for level, prior in enumerate(support_priors(self.sampled), 1):
            if level not in touched:
                self.by_support[level - 1] += self.relax * (prior - self.by_support[level - 1])


@dataclass
class _Estimates:
    """One kind of request's acceptance estimates (AdaptiveDraftLength.begin swaps them)."""

    alpha: list[float]
    by_support: list[float]
    hits: list[float]
    trials: list[float]


def choose_static(costs: Sequence[float], alpha: float, draft_cost: float, max_gamma: int) -> int:
    """γ for a constant acceptance rate: used by the bench and `doctor` to explain a choice."""
    policy = AdaptiveDraftLength(CostCurve(list(costs)), draft_cost, max_gamma=max_gamma, prior=alpha)
    return policy.choose(max_gamma)
