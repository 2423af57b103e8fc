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

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field

from localspec.control.config import DEFAULT, ControlConfig
from localspec.control.costs import CostCurve
from localspec.core.protocol import Decision, DraftPrices
from localspec.core.stats import Step


def support_level(support: int, config: ControlConfig = DEFAULT) -> int:
    """The support level of a guessed token backed by `support` tokens (0: unknown)."""
    return bisect_right(config.support_edges, support)  # the edges ascend: how many are <= support


def support_priors(sampled: bool, config: ControlConfig = DEFAULT) -> tuple[float, ...]:
    return config.sampled_support_priors if sampled else config.support_priors


@dataclass
class FixedDraftLength:
    gamma: int

    def begin(self, sampled: bool) -> None:
        pass

    def would_draft(self, depth: int = 0) -> bool:
        return self.gamma > 0

    def would_guess(self, guessed: int, support: int, depth: int = 0) -> bool:
        return self.gamma > 0 and guessed > 0

    def choose(self, limit: int, support: int = 0, backlog: int = 0, depth: int = 0) -> int:
        return min(self.gamma, limit)

    def choose_source(
        self, guessed: int, support: int, limit: int, backlog: int = 0, depth: int = 0
    ) -> tuple[int, bool]:
        return min(self.gamma, limit), False  # a fixed length drafts with the model it was given

    def observe(self, step: Step) -> None:
        pass

    def explain(self) -> Decision | None:
        return Decision("fixed", (), self.gamma, self.gamma, "a fixed draft length, cut at the step's limit")

    def prices(self) -> DraftPrices | None:
        return None

    def observe_shadow(self, drafted: int, accepted: int, support: int = 0, start: int = 0) -> None:
        pass


@dataclass
class AdaptiveDraftLength:
    costs: CostCurve
    draft_seconds_per_token: float
    # The role's settings below are what factory.priced_policy fills in from the config; a
    # bare policy (tests, `doctor`) takes these defaults.
    max_gamma: int = DEFAULT.max_draft
    prior: float = DEFAULT.unknown_prior  # for drafts of unknown support
    # What a draft model pays per token to catch up after sitting out steps (a batched pass),
    # charged spread over config.catch_up_horizon steps.
    catch_up_seconds_per_token: float = 0.0
    # Draft only when the predicted rate beats plain decoding by this share: near break-even
    # a wrong prediction (a drafter's cost drifts; llama.cpp rebuilds its graph when the block
    # size changes, and back) loses more than a right one wins (calibrate._curve).
    margin: float = DEFAULT.bare_margin
    # A free lookup beside a draft model (choose_source): what its guessed tokens cost, and
    # its own margin (no drafter cost to mispredict, only the graph rebuild).
    lookup_seconds_per_token: float = DEFAULT.ngram_seconds_per_token
    lookup_margin: float = DEFAULT.bare_margin
    # How many observations the prior is worth for drafts of unknown support (model
    # drafters). A good draft model's misses come in clusters where the text turns: counting
    # hits and trials, with the measured agreement as the prior, keeps one cluster from
    # switching it off for good.
    prior_weight: float = DEFAULT.prior_weight
    # A block drafter (DFlash) pays one pass for its block whatever part of it is verified:
    # that pass's seconds, charged once for any γ > 0 and learnt in place of the per-token
    # cost (0: a drafter priced per token).
    draft_seconds_per_pass: float = 0.0
    # A hybrid target (Capabilities.replays_beyond): rejecting more than this many tokens
    # replays the kept ones, priced as a pass over them plus replay_overhead (restoring the
    # state copy), learnt from the steps that replayed. None: every rollback is free.
    replays_beyond: int | None = None
    replay_overhead: float = 0.0
    config: ControlConfig = field(default=DEFAULT, repr=False)
    alpha: list[float] = field(default_factory=list)  # per position, drafts of unknown support
    # by_support[level - 1]: the same per support level of a free drafter's guessed tokens.
    by_support: list[float] = field(default_factory=list)
    sampled: bool = False  # the kind of request the estimates are for (see begin)
    # The evidence behind alpha: discounted hits and trials per position.
    hits: list[float] = field(default_factory=list)
    trials: list[float] = field(default_factory=list)
    _other_kind: _Estimates | None = field(default=None, repr=False)
    _declined: int = field(default=0, repr=False)  # proven guesses passed over in a row (probe_after)
    # What the last choice weighed, for explain(): the candidates _best priced, and the
    # source, chosen γ and adjustment (kept raw: a Decision is built only when asked for).
    _weighed: list[tuple[int, float]] = field(default_factory=list, repr=False)
    _last: tuple[str, int, str] = field(default=("model", 0, ""), repr=False)
    _cut: str = field(default="", repr=False)  # why _best priced no draft at all
    _model_drafting: bool = field(default=False, repr=False)  # the last step drafted with the model

    def __post_init__(self) -> None:
        if not self.alpha:
            self.alpha = [self.prior] * self.max_gamma
        if not self.by_support:
            self.by_support = list(support_priors(self.sampled, self.config))
        self.hits = self.hits or [0.0] * len(self.alpha)
        self.trials = self.trials or [0.0] * len(self.alpha)

    def begin(self, sampled: bool) -> None:
        # A sampled token matches a guess with the target's probability of it, a greedy one
        # whenever the guess is the argmax, so the same guesses come true less often under
        # sampling (config.sampled_support_priors). Each kind of request keeps its own estimates: a
        # session that switches temperature does not carry one kind's evidence into the other.
        self.costs.begin()
        if sampled == self.sampled:
            return
        current = _Estimates(self.alpha, self.by_support, self.hits, self.trials)
        if self._other_kind is None:
            n = len(self.alpha)
            fresh = _Estimates([self.prior] * n, list(support_priors(sampled, self.config)), [0.0] * n, [0.0] * n)
        else:
            fresh = self._other_kind
        self.alpha, self.by_support, self.hits, self.trials = fresh.alpha, fresh.by_support, fresh.hits, fresh.trials
        self._other_kind = current
        self.sampled = sampled

    def chain(self, gamma: int, support: int = 0) -> list[float]:
        """α_i for the positions of a draft of γ tokens whose first token has this support."""
        if support <= 0:
            return self.alpha[:gamma]
        return [self.by_support[support_level(support + i, self.config) - 1] for i in range(gamma)]

    def expected_tokens(self, gamma: int, support: int = 0) -> float:
        total, run = 1.0, 1.0
        for a in self.chain(gamma, support):
            run *= a
            total += run
        return total

    def rate(self, gamma: int, support: int = 0, depth: int = 0) -> float:
        drafting = gamma * self.draft_seconds_per_token + (self.draft_seconds_per_pass if gamma else 0.0)
        replay = self.replay_seconds(self.chain(gamma, support), depth)
        cost = drafting * self.costs.scale + self.costs.verify(gamma + 1, depth) + replay
        return self.expected_tokens(gamma, support) / cost

    def replay_seconds(self, chain: Sequence[float], depth: int = 0) -> float:
        """What taking back a draft with acceptance chain `chain` costs on average: on a hybrid,
        a replay of the k+1 kept tokens whenever more than replays_beyond of the γ are rejected
        (k accepted with probability α_1..α_k·(1 - α_k+1)); nothing elsewhere."""
        if self.replays_beyond is None:
            return 0.0
        total, run, gamma = 0.0, 1.0, len(chain)
        overhead = self.replay_overhead * self.costs.scale
        for k in range(gamma - self.replays_beyond):  # k accepted leaves γ - k > replays_beyond rejected
            total += run * (1.0 - chain[k]) * (overhead + self.costs.verify(k + 1, depth))
            run *= chain[k]
        return total

    def would_draft(self, depth: int = 0) -> bool:
        """Whether a model draft would pay at this depth; reads the estimates, changes nothing."""
        return self._best(self.max_gamma, 0, 0, depth, self.draft_seconds_per_token, self.margin)[0] > 0

    def would_guess(self, guessed: int, support: int, depth: int = 0) -> bool:
        """What choose(guessed, support) would make of a free guess: a draft or not; what the
        choice weighed (explain) and the probe's count stay as they were."""
        if guessed <= 0:
            return False
        weighed = self._weighed, self._cut
        best = self._best(guessed, support, 0, depth, self.draft_seconds_per_token, self.margin)[0]
        self._weighed, self._cut = weighed
        return self._probe(best, guessed, support)[0] > 0

    def choose(self, limit: int, support: int = 0, backlog: int = 0, depth: int = 0) -> int:
        best = self._best(limit, support, backlog, depth, self.draft_seconds_per_token, self.margin)[0]
        gamma, self._declined = self._probe(best, limit, support)
        self._note("draft", best, gamma, self.margin)
        return gamma

    def prices(self) -> DraftPrices:
        step = self.costs.verify(1)
        return DraftPrices(step, self.costs.verify(2) / step, self.draft_seconds_per_token * self.costs.scale / step)

    def explain(self) -> Decision | None:
        if not self._weighed:
            return None
        source, chosen, adjustment = self._last
        best = max(self._weighed, key=lambda c: c[1])[0]
        return Decision(source, tuple(self._weighed), best, chosen, adjustment)

    def _note(self, source: str, best: int, chosen: int, margin: float) -> None:
        """Remember what turned the fastest candidate into the chosen γ (explain)."""
        top = max(self._weighed, key=lambda c: c[1])[0] if self._weighed else best
        if self._cut:
            why = self._cut
        elif chosen > best:
            why = f"probed further after {self.config.probe_after} proven guesses were stopped short"
        elif top != best and source == "model":
            why = f"a model drafter starts only with its own time priced {margin:.0%} dearer"
        elif top != best:
            why = f"a draft must beat plain decoding by {margin:.0%}"
        else:
            why = ""
        self._last = (source, chosen, why)

    def _probe(self, gamma: int, guessed: int, support: int) -> tuple[int, int]:
        """gamma, or a longer probe once config.probe_after proven guesses were stopped short;
        and the count of proven guesses stopped short after this step (the caller keeps it)."""
        declined = self._declined
        longest = min(guessed, self.max_gamma) if support > 0 else 0
        if gamma >= longest:
            return gamma, 0 if gamma > 0 else declined
        # A probe is there to time a longer pass: beside other lanes the curve learns nothing
        # from it (SharedPassCurve), so it would run a 16-row pass every few dozen steps, each
        # priced a loss for the whole batch even when every token is kept.
        if not self.costs.learns():
            return gamma, declined
        # Per step only the next token's estimate is read; the whole chain only for a probe.
        if self.by_support[support_level(support + gamma, self.config) - 1] < self.config.probe_alpha:
            return gamma, declined
        if declined + 1 < self.config.probe_after:
            return gamma, declined + 1
        likely, run = gamma + 1, 1.0
        for n, a in enumerate(self.chain(longest, support), 1):  # while more likely right than wrong
            run *= a
            if run < self.config.probe_likely:
                break
            likely = max(likely, n)
        return likely, 0

    def choose_source(
        self, guessed: int, support: int, limit: int, backlog: int = 0, depth: int = 0
    ) -> tuple[int, bool]:
        # Each source's best γ and predicted rate. The lookup reads the text directly and
        # costs next to nothing per token; the model pays its drafting time and its catch-up
        # on what the lookup copied meanwhile, charged as in choose(). Charging less of the
        # catch-up lets the model back in after every copy, which loses on answers whose short
        # copies alternate with new values (benchmarks/hybrid_sources.py).
        gamma, rate = self._best(limit, 0, backlog, depth, self.draft_seconds_per_token, self.margin)
        model_table = self._weighed
        if guessed > 0 and support > 0:
            lookup = self._best(
                min(guessed, limit), support, 0, depth, self.lookup_seconds_per_token, self.lookup_margin
            )
            if lookup[0] > 0 and (gamma == 0 or lookup[1] > rate):
                chosen, self._declined = self._probe(lookup[0], min(guessed, limit), support)
                self._note("lookup", lookup[0], chosen, self.lookup_margin)
                return chosen, True
            if gamma == 0:
                probe, self._declined = self._probe(0, min(guessed, limit), support)
                self._note("lookup" if probe > 0 else "model", 0, probe, self.lookup_margin)
                return (probe, True) if probe > 0 else (0, False)
            self._weighed = model_table
        self._note("model", gamma, gamma, self.margin)
        return gamma, False

    def _best(
        self, limit: int, support: int, backlog: int, depth: int, per_token: float, margin: float
    ) -> tuple[int, float]:
        """The γ ≤ limit with the highest predicted rate, and that rate (tokens per second);
        a draft must beat plain decoding's rate by `margin` to be chosen. Beside other lanes
        the rate is the shared pass's, their plain steps included (CostCurve.beside), and the
        margin is this lane's share of it."""
        # One pass: E[tokens](γ) grows by Π α_i at each step, so no γ is recomputed from scratch.
        alpha = self.chain(min(limit, self.max_gamma), support)
        others, base = self.costs.beside(depth)
        plain = (others + 1.0) / (base + self.costs.verify(1, depth))
        self._weighed, self._cut = [(0, plain)], ""
        if support > 0 and alpha[0] < self.config.first_block_alpha and not self.costs.timed_a_block():
            # A curve that never timed a block waits for a likely guess to time one.
            self._cut = f"no block timed yet: a guess's first token must come true {self.config.first_block_alpha:.0%}"
            return 0, plain
        # A lookup's risk is the graph rebuild around its block: it must beat plain by the
        # margin. A model draft's risk is its own time drifting, so the margin is charged on
        # that time alone, and only to start drafting: a drafter cheap next to the target's
        # step (a GPU's small model) is not held off gains of a few per cent, and one drafting
        # near break-even is not stopped by noise in its estimate that it could not start back from.
        per_pass = self.draft_seconds_per_pass * self.costs.scale if support <= 0 else 0.0
        model = support <= 0 and (per_token > 0.0 or per_pass > 0.0)
        bar = plain if model else plain * (1.0 + margin / (1.0 + others))  # the lane's share of the pass
        charged = 1.0 + (margin if model and not self._model_drafting else 0.0)
        best, best_rate, best_charged = 0, plain, plain
        expected, run, top = 1.0, 1.0, plain
        # The drafter runs on the same cores over the same text: the target's drift is its too.
        draft_cost = per_token * self.costs.scale
        catch_up = backlog * self.catch_up_seconds_per_token * self.costs.scale / self.config.catch_up_horizon
        longest = min(limit, self.max_gamma)
        # Where no longer pass costs less, a longer draft adds at most `run` tokens a position
        # for no less time (a hybrid's replay too: each position adds a term to replay_seconds):
        # once even that bound wins nothing, the longer ones are not priced (the choice and what
        # explain() ranks first stay the same).
        bounded = self.costs.rises(depth)
        for g in range(1, longest + 1):
            run *= alpha[g - 1]
            expected += run
            price = catch_up + self.costs.verify(g + 1, depth)
            if self.replays_beyond is not None:
                price += self.replay_seconds(alpha[:g], depth)
            drafting = g * draft_cost + per_pass
            r = (others + expected) / (base + price + drafting)
            self._weighed.append((g, r))
            charged_rate = (others + expected) / (base + price + drafting * charged)
            if charged_rate > bar and charged_rate > best_charged:
                best, best_rate, best_charged = g, r, charged_rate
            if bounded:
                top = r if r > top else top
                most = others + expected + run * (longest - g)
                fastest, charged_most = most / (base + price + drafting), most / (base + price + drafting * charged)
                if fastest <= top and charged_most <= max(bar, best_charged):
                    break
        return best, best_rate

    def observe(self, step: Step) -> None:
        # A tree's pass is priced by all its nodes; its chain's tokens teach the estimates.
        drafted, accepted = (step.chain, step.chain_kept) if step.chain else (step.drafted, step.accepted)
        # The pass alone teaches the cost curve; what a hybrid's replay took is learnt apart.
        self.costs.update(step.drafted + 1, step.verify_seconds - step.rollback_seconds, step.depth)
        if self.replays_beyond is not None and drafted - accepted > self.replays_beyond:
            beyond = step.rollback_seconds - self.costs.verify(accepted + 1, step.depth)
            # A replay from the state copy re-evaluates at most the verified block; one that took
            # longer replayed from the start (before the first copy was taken), which does not recur.
            beyond = min(max(0.0, beyond), self.costs.verify(drafted + 1, step.depth)) / self.costs.scale
            self.replay_overhead += self.config.weight_hit * (beyond - self.replay_overhead)
        if not step.lookup and step.support <= 0:
            self._model_drafting = drafted > 0
        if drafted == 0:
            self._relax(step.support, 0)
            return
        # The catch-up is not a cost of each drafted token: take it out before learning that.
        # Costs are kept in the units of the load-time measurement (divided by the drift).
        if not step.lookup and self.draft_seconds_per_pass > 0.0:
            per_pass = step.draft_seconds / self.costs.scale
            self.draft_seconds_per_pass += self.config.weight_hit * (per_pass - self.draft_seconds_per_pass)
        elif not step.lookup:
            scale = self.costs.scale
            per_token = max(0.0, step.draft_seconds / scale - step.backlog * self.catch_up_seconds_per_token) / drafted
            self.draft_seconds_per_token += self.config.weight_hit * (per_token - self.draft_seconds_per_token)
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
            keep = 1.0 - 1.0 / self.config.memory
            self.hits[i] = self.hits[i] * keep + outcome
            self.trials[i] = self.trials[i] * keep + 1.0
            self._estimate(i)
            return
        slot = support_level(support + i, self.config) - 1
        weight = self.config.weight_hit if outcome else self.config.weight_miss
        self.by_support[slot] += weight * (outcome - self.by_support[slot])

    def _estimate(self, i: int) -> None:
        self.alpha[i] = (self.prior * self.prior_weight + self.hits[i]) / (self.prior_weight + self.trials[i])

    def _relax(self, support: int, start: int) -> None:
        relax = self.config.relax
        # Estimates nothing observed in a while drift back toward their priors: the positions
        # a model drafter did not reach (their evidence ages), or the support levels a step
        # did not touch.
        if support <= 0:
            for i in range(start, len(self.alpha)):
                if self.trials[i] > 0:
                    self.hits[i] *= 1.0 - relax
                    self.trials[i] *= 1.0 - relax
                    self._estimate(i)
            return
        touched = {support_level(support + i, self.config) for i in range(start)}
        for level, prior in enumerate(support_priors(self.sampled, self.config), 1):
            if level not in touched:
                self.by_support[level - 1] += relax * (prior - self.by_support[level - 1])


@dataclass
class _Estimates:
    """One kind of request's acceptance estimates (AdaptiveDraftLength.begin swaps them)."""

    alpha: list[float]
    by_support: list[float]
    hits: list[float]
    trials: list[float]


def choose_static(costs: Sequence[float], alpha: float, draft_cost: float, max_gamma: int) -> int:
    """γ for a constant acceptance rate: used by the bench and `doctor` to explain a choice."""
    return decide_static(costs, alpha, draft_cost, max_gamma).chosen


def decide_static(costs: Sequence[float], alpha: float, draft_cost: float, max_gamma: int) -> Decision:
    """The policy's whole decision for a constant acceptance rate (`doctor` prints it)."""
    policy = AdaptiveDraftLength(CostCurve(list(costs)), draft_cost, max_gamma=max_gamma, prior=alpha)
    policy.choose(max_gamma)
    decision = policy.explain()
    assert decision is not None  # choose always prices plain decoding
    return decision
