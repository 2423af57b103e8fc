"""Every tunable of the draft-length controller, its cost model and its calibration, in one
place: what a replay (tests/specification/test_controller_replays.py) varies, and what a new rule adds to.

The figures behind the values are in BENCHMARKS.md ("which rule earns what") and the
benchmarks each field names; a field changed here must move a replay number.
"""

from __future__ import annotations

from dataclasses import dataclass

from localspec.core.protocol import MAX_DRAFT


@dataclass(frozen=True)
class ControlConfig:
    # -- the policy's acceptance estimates ------------------------------------------------
    # Support levels of an n-gram guess: level i holds supports in [edges[i-1], edges[i]),
    # since a copied passage backs each next token with one token more (policy module doc).
    support_edges: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 20, 32)
    # Each level's starting α, near how often a guess of that support came true under greedy
    # decoding (benchmarks/acceptance_by_support.py), shaded down so a short reply does not
    # pay for optimism before the online estimates take over.
    support_priors: tuple[float, ...] = (0.15, 0.35, 0.55, 0.6, 0.7, 0.8, 0.9, 0.93, 0.95)
    # The same under sampling, where a guess comes true with the target's probability of it.
    sampled_support_priors: tuple[float, ...] = (0.15, 0.3, 0.45, 0.55, 0.6, 0.67, 0.85, 0.9, 0.92)
    # α of a draft of unknown support (a model drafter) before any evidence or agreement.
    unknown_prior: float = 0.5
    # EMA weight of a hit on a support level (also smooths the drafter's cost per token).
    weight_hit: float = 0.15
    # EMA weight of a miss: larger, since a wasted long draft costs several plain steps and a
    # missed chance only the gain it would have made.
    weight_miss: float = 0.3
    # Per step, estimates nothing observed drift back toward their prior by this share, so
    # evidence from another kind of text ages out.
    relax: float = 0.003
    # How many positions a model drafter's hit/trial counts remember: long enough that one
    # cluster of misses where the text turns does not switch a good drafter off for good.
    memory: float = 50.0
    # The prior of a bare policy counts as this many observed positions.
    prior_weight: float = 2.0

    # -- the policy's choice -------------------------------------------------------------
    # The longest draft: the calibration times passes of up to max_draft + 1 tokens.
    max_draft: int = MAX_DRAFT
    # Seconds per token of an n-gram lookup: a dictionary probe, free next to any model pass.
    ngram_seconds_per_token: float = 2e-5
    # A lookup draft must beat plain decoding by this share: llama.cpp rebuilds its graph
    # when the block size changes, which the curve (timed in runs of one size) leaves out.
    ngram_margin: float = 0.05
    # A model drafter starts drafting only priced this share above its own time per token,
    # which drifts (AdaptiveDraftLength._best): a share of its time, not of the whole step.
    model_draft_margin: float = 0.1
    # The margin of a bare policy (`doctor`, ranking self-drafters by predicted rate): it
    # compares predictions and bets nothing on them, so no share is held back.
    bare_margin: float = 0.0
    # The pair's measured agreement counts as this many observed positions: two misses take
    # 0.95 to 0.86, while a drafter that misses everywhere loses half its prior in 20.
    agreement_weight: float = 20.0
    # A draft model's catch-up after sitting out steps is charged spread over this many
    # steps, since catching up once serves the drafts after it.
    catch_up_horizon: int = 4
    # The draft length of a runtime told not to calibrate (no cost curve to choose with).
    uncalibrated_draft: int = 4

    # -- the cost curve ------------------------------------------------------------------
    # Context lengths the curve is measured behind (attention makes deep passes dearer).
    shallow_depth: int = 32
    deep_depth: int = 512
    # EMA weight of the drift scale: about 20 passes, so a burst of load is followed but one
    # spike is not.
    drift_weight: float = 0.05
    # A pass's ratio to its price is clipped here before it moves the drift: an outlier (a
    # page fault, a scheduler hiccup) is damped, not trusted.
    drift_clip: float = 3.0
    # A learning curve's per-size correction is clipped to this range: a prior can be off
    # severalfold, so only wild outliers clip.
    shape_clip: tuple[float, float] = (0.1, 10.0)
    # A learning curve trusts a size's own timings once this many passes of it were timed.
    learnt_passes: int = 8
    # Passes remembered per size across sessions, so a changed machine is followed within a
    # few dozen passes.
    max_evidence: int = 32
    # A learning curve prices a size at a low quantile of its last cost_window passes, not
    # their mean: load only adds time, and spikes would price the single step too dear.
    cost_window: int = 16
    cost_quantile: float = 0.25
    # A learning curve that has timed no block yet drafts only a lookup guess whose first
    # token comes true this often: a roofline prior can price blocks near a single step where
    # a CPU pays 2-3, and a weak guess would pay for the pass that times the curve.
    first_block_alpha: float = 0.8
    # A pass under this share of its learnt price is no jitter (load only adds time): the
    # curve was learnt on a busier machine, and is re-priced from this pass.
    stale_shape: float = 2 / 3
    # A proven copy source the curve keeps short is drafted as far as it is likely right
    # after this many stopped-short steps, so a longer pass's price is timed, not trusted.
    probe_after: int = 32
    # Only a guess whose next token comes true at least this often counts as proven.
    probe_alpha: float = 0.6
    # A probe drafts as far as the guess is still this likely right (more right than wrong).
    probe_likely: float = 0.5

    # -- calibration and the cache -------------------------------------------------------
    # Rounds of timings behind the long text: fewer than behind the short one, whose shape
    # decides most drafts, since the first load of a model waits for them.
    deep_repeats: int = 3
    # Guesses of this many tokens when timing a draft model as the engine drives it.
    draft_probe: int = 4
    # A draft model's token in a request against its single-token pass, before drafting was
    # timed: its Python and catch-up make a drafted token dearer than a bare step.
    drafting_overhead: float = 1.6
    # A cached curve timed passes drifted this factor off (either way) is measured again at
    # the next load, since it misprices every draft until the drift is learnt again.
    stale_drift: float = 1.25
    # ... once at least this many passes since load say so (the mean, not the EMA).
    drift_evidence: int = 64
    # A prior's deep pass against a shallow one, and the excess per token of the block:
    # attention reads the whole cache for every token checked.
    prior_deep: float = 1.3
    prior_deep_per_token: float = 0.02
    # A learning curve is stored for the next load once a session timed this many passes.
    learnt_evidence: int = 16


DEFAULT = ControlConfig()
