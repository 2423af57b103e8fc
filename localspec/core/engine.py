"""The speculative loop: draft γ tokens, verify them in one target pass, keep what the
target agrees with, roll the caches back, emit. Backend-agnostic: it sees only the
Backend protocol and a Drafter."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from localspec.core.acceptance import accept_greedy, accept_rejection_sampling, accept_seeded
from localspec.core.errors import ContextFullError, InvalidRequestError
from localspec.core.protocol import (
    Backend,
    Draft,
    Drafter,
    DraftLengthPolicy,
    Logits,
    Verifier,
    common_prefix,
    eval_chunked,
)
from localspec.core.sampling import SamplingConfig, shape
from localspec.core.stats import Stats, Step

# A free drafter guesses this far ahead before γ is chosen; what no step verifies is scored
# later as free evidence (see Shadow).
FREE_GUESS_TOKENS = 16


class Engine:
    """Runs requests for one target and one drafter. The caches outlive requests, so a new
    turn only evaluates what changed since the last one."""

    def __init__(
        self, target: Backend, drafter: Drafter, free_drafter: bool = False, lookup: Drafter | None = None
    ) -> None:
        self.target = target
        self.drafter = drafter
        # A free drafter (n-gram) guesses before γ is chosen, so the policy can weigh how well
        # the guess is supported, and its unverified guesses still teach the policy.
        self.free_drafter = free_drafter
        # A free drafter beside a draft model: where the text repeats, a copied passage is
        # guessed for nothing and right more often than a small model's guess; elsewhere the
        # model drafts. The policy picks per step (choose_source).
        self.lookup = lookup
        # A backend that verifies where its logits are (a GPU) is handed the whole rule.
        verifies = getattr(target.capabilities, "verifies", False)
        self.verifier = target if verifies and isinstance(target, Verifier) else None
        # A backend's logits depend on the size of the block each position was evaluated in
        # (llama.cpp's CPU kernels change at 64 rows), so a prefix cached by an earlier request
        # (its answer evaluated a few tokens at a time) can tip a near-tie another way than a
        # fresh evaluation. exact_prefix reuses only what the fresh evaluation's own blocks
        # computed (see _exact_keep), so an answer does not depend on what came before it.
        self.exact_prefix = False
        self._canonical: list[int] = []  # the cached prompt prefix evaluated in fresh blocks

    def generate(
        self,
        prompt: Sequence[int],
        max_tokens: int,
        cfg: SamplingConfig,
        policy: DraftLengthPolicy,
        stats: Stats,
        rng: np.random.Generator,
        cancelled: Callable[[], bool] | None = None,
    ) -> Iterator[Step]:
        """cancelled: polled between prompt chunks and verify steps; once true the request
        ends with finish reason "cancelled" and the caches stay consistent."""
        if not prompt:
            raise InvalidRequestError("the prompt is empty", "give some text to continue or a chat message")
        if max_tokens < 0:
            raise InvalidRequestError(f"max_tokens must be 0 or more, got {max_tokens}")
        check_fits(prompt, self.target.info.n_ctx)
        stats.prompt_tokens = len(prompt)
        policy.begin(not cfg.greedy)
        # A draft model the policy would not use even with nothing to catch up on is spared
        # its prefill, a real share of a short answer (benchmarks/drafter_prefill.py); should
        # a draft come after all, the drafter catches up then.
        stop = cancelled or _never
        if not self._prefill(prompt, stats, self.free_drafter or policy.would_draft(len(prompt)), stop):
            stats.finish_reason = "cancelled"
            return
        if max_tokens == 0:
            stats.finish_reason = "max_tokens"
            return
        yield from self._decode(list(prompt), max_tokens, cfg, policy, stats, rng, stop)

    def _prefill(self, prompt: Sequence[int], stats: Stats, warm_drafter: bool, stop: Callable[[], bool]) -> bool:
        """False when cancelled before the prompt was all in."""
        # Everything but the last prompt token goes in now; that token opens the first
        # verify block, so even the first generated token can come with a draft.
        t0 = time.perf_counter()
        keep = min(common_prefix(self.target.cached_tokens(), prompt), len(prompt) - 1)
        exact = self._exact_keep(prompt, keep)
        keep = exact if self.exact_prefix else keep
        self.target.rollback(keep)
        todo = list(prompt[keep:-1])
        eval_chunked(self.target, todo, "none", stop)
        # From a fresh block boundary the blocks are the fresh ones; otherwise only what was
        # fresh before the reused prefix stays so.
        self._canonical = list(prompt[:-1] if keep == exact else prompt[:exact])
        if stop():
            return False
        self.drafter.start(prompt, warm_drafter)
        self._note_drafter_off(stats)
        if self.lookup is not None:
            self.lookup.start(prompt)
        stats.prefill_tokens = len(todo) + 1
        stats.prefill_seconds = time.perf_counter() - t0
        return True

    def _exact_keep(self, prompt: Sequence[int], keep: int) -> int:
        """How much of the cached prefix (keep tokens match) a fresh evaluation would have
        computed in the same blocks: eval_chunked's, max_block tokens each from position 0,
        the last one ending before the prompt's last token. That is the whole recorded prompt
        when it is this one's, else its whole blocks."""
        if keep == len(self._canonical) == len(prompt) - 1:
            return keep
        step = self.target.capabilities.max_block
        return min(keep, len(self._canonical) // step * step) // step * step

    def _note_drafter_off(self, stats: Stats) -> None:
        # A model drafter that met a token it cannot read sits out the rest of the request.
        notice = getattr(self.drafter, "off_notice", None)
        if notice and notice not in stats.notices:
            stats.notices.append(notice)

    def _decode(
        self,
        ctx: list[int],
        max_tokens: int,
        cfg: SamplingConfig,
        policy: DraftLengthPolicy,
        stats: Stats,
        rng: np.random.Generator,
        stop: Callable[[], bool],
    ) -> Iterator[Step]:
        eog = self.target.end_of_generation()
        n_vocab = self.target.info.n_vocab
        n_ctx = self.target.info.n_ctx
        max_block = self.target.capabilities.max_block
        prompt_len = len(ctx)
        before = cfg.repeat_window(ctx, prompt_len)  # the prompt's tail a repeat penalty reaches
        produced = 0
        shadow: Shadow | None = None
        t_start = time.perf_counter()
        try:
            while True:
                if stop():
                    stats.finish_reason = "cancelled"
                    return
                past = self.target.n_past
                room = n_ctx - past - 1  # positions left after the pending token
                if room < 0:
                    stats.finish_reason = "context_full"
                    return
                limit = min(room, max_tokens - produced - 1, max_block - 1)
                t0 = time.perf_counter()
                # Jump-forward: what the grammar forces is drafted for nothing, as a point-mass
                # draft verified like any other (exact whatever p is; accepted surely where the
                # mask leaves that one token).
                forced = _forced(cfg, limit)
                if forced:
                    draft, gamma, backlog, guess = Draft(forced), len(forced), 0, None
                else:
                    draft, gamma, backlog, guess = self._draft(ctx, limit, cfg, policy, rng)
                guessed = draft is guess  # a free drafter's guess, or the lookup's taken over the model's
                from_lookup = guessed and not self.free_drafter
                tokens = draft.tokens[:gamma]
                # A drafter's vocabulary may be larger (padding slack): an id the target has
                # no row for is a draft token the target rejects, never a block to evaluate.
                refused = next((i for i, t in enumerate(tokens) if not 0 <= t < n_vocab), None)
                if cfg.constraint is not None:  # so is a token outside the request's grammar
                    kept = tokens[:refused]
                    if (allowed := cfg.constraint.allowed_prefix(kept)) < len(kept):
                        refused = allowed
                if refused is not None:
                    tokens = tokens[:refused]
                t1 = time.perf_counter()
                generated = ctx[prompt_len:] if cfg.shapes_logits else ()  # penalties count them
                n_acc, nxt, rows = self._verify(ctx, tokens, draft, refused, cfg, rng, generated, before)
                self.target.rollback(past + 1 + n_acc)
                t2 = time.perf_counter()

                # The part of a free guess no step verified (all of one the model drafted
                # instead) is scored once the text is known: free evidence.
                checked = len(tokens) if guessed else 0
                reached = not guessed or n_acc == checked  # past a rejected token the guess cannot come true
                if shadow is None and guess is not None and checked < len(guess.tokens) and reached:
                    shadow = Shadow(guess.tokens, len(ctx), guess.support, checked)
                new = [*tokens[:n_acc], nxt]
                ctx.extend(new)
                self.drafter.commit(ctx, 0 if from_lookup or forced else n_acc)
                self._note_drafter_off(stats)
                if self.lookup is not None:
                    self.lookup.commit(ctx, n_acc if from_lookup else 0)

                for i, tok in enumerate(new):
                    if tok in eog:
                        new, stats.finish_reason = new[:i], "stop"
                        break
                new = new[: max_tokens - produced]
                if cfg.logprobs is not None and rows is not None:
                    cfg.logprobs.record(new, rows)
                if cfg.constraint is not None:
                    cfg.constraint.commit(new)
                step = Step(
                    drafted=len(tokens),
                    accepted=n_acc,
                    draft_seconds=t1 - t0,
                    verify_seconds=t2 - t1,
                    support=draft.support,
                    backlog=backlog if tokens else 0,
                    depth=past,
                    lookup=from_lookup,
                    gamma=gamma,
                    tokens=tuple(new),
                    forced=bool(forced),
                )
                stats.record_step(step)
                if not forced:  # a forced step says nothing about the drafter's agreement or cost
                    policy.observe(step)
                if shadow is not None and shadow.settle(ctx, policy):
                    shadow = None

                produced += len(new)
                stats.generated_tokens = produced
                stats.decode_seconds = time.perf_counter() - t_start
                if new:
                    yield step
                if stats.finish_reason:
                    return
                if produced >= max_tokens:
                    stats.finish_reason = "max_tokens"
                    return
        finally:
            stats.decode_seconds = time.perf_counter() - t_start

    def _draft(
        self, ctx: list[int], limit: int, cfg: SamplingConfig, policy: DraftLengthPolicy, rng: np.random.Generator
    ) -> tuple[Draft, int, int, Draft | None]:
        """The step's draft, its γ, the tokens a draft model caught up on first, and the free
        guess made this step (the draft itself where the guess was chosen; None: no guess)."""
        past = self.target.n_past
        if self.free_drafter:
            draft = self.drafter.propose(ctx, min(limit, FREE_GUESS_TOKENS), cfg, rng) if limit > 0 else Draft()
            return draft, policy.choose(len(draft.tokens), draft.support, depth=past), 0, draft
        guess = None
        if self.lookup is not None:
            guess = self.lookup.propose(ctx, min(limit, FREE_GUESS_TOKENS), cfg, rng) if limit > 0 else Draft()
            backlog = self.drafter.backlog(ctx)
            gamma, from_lookup = policy.choose_source(len(guess.tokens), guess.support, limit, backlog, past)
            if from_lookup:
                return guess, gamma, 0, guess
        else:
            backlog = self.drafter.backlog(ctx)
            gamma = policy.choose(limit, 0, backlog, past)
        draft = self.drafter.propose(ctx, gamma, cfg, rng) if gamma > 0 else Draft()
        return draft, gamma, backlog, guess

    def _verify(
        self,
        ctx: Sequence[int],
        tokens: list[int],
        draft: Draft,
        refused: int | None,
        cfg: SamplingConfig,
        rng: np.random.Generator,
        generated: Sequence[int],
        before: Sequence[int] = (),
    ) -> tuple[int, int, Logits | None]:
        """One target pass over the pending token (ctx's last) and the draft: how many draft tokens the
        target accepts, the token it adds after them, and the target's logits as the request
        shapes them (None where a verifying backend kept them). refused: where the draft was
        cut at an id the target has no row for. generated: this request's tokens so far; before:
        the prompt's tail a repeat penalty counts."""
        last = ctx[-1]
        wants_rows = cfg.shapes_logits or cfg.logprobs is not None
        numpy_rule = refused is not None or wants_rows or (cfg.seed is not None and not cfg.greedy)
        if self.verifier is not None and not numpy_rule:  # a refused id and a seed take the numpy rule
            return (*self.verifier.verify_block([last, *tokens], draft.dists, cfg, rng), None)
        logits = shape(self.target.eval_block([last, *tokens], "all"), cfg, generated, tokens, before)
        if cfg.greedy:
            return (*accept_greedy(tokens, logits), logits)
        if cfg.seed is not None:  # the same answer whatever was drafted (accept_seeded)
            return (*accept_seeded(tokens, logits, cfg, cfg.seed, len(ctx)), logits)
        q = draft.dists[refused] if refused is not None and draft.dists else None
        return (*accept_rejection_sampling(tokens, draft.dists, logits, cfg, rng, q), logits)


def check_fits(prompt: Sequence[int], n_ctx: int) -> None:
    if len(prompt) >= n_ctx:
        raise ContextFullError(
            f"the prompt is {len(prompt)} tokens but the context holds {n_ctx}",
            "shorten the prompt or start a new conversation, or load the model with a larger n_ctx",
        )


def _forced(cfg: SamplingConfig, limit: int) -> list[int]:
    """The tokens the request's grammar forces next, at most limit (none without a grammar
    that knows them)."""
    forced = getattr(cfg.constraint, "forced", None)
    if forced is None or limit <= 0:
        return []
    tokens: list[int] = forced()
    return tokens[:limit]


def _never() -> bool:
    return False


@dataclass
class Shadow:
    """The part of a free drafter's guess from position `start` on, which no verify step
    checked; scored as free acceptance evidence token by token as the text it guessed
    becomes known. Scored only once the whole guess was known, a copy in progress would hold
    its evidence back for up to FREE_GUESS_TOKENS steps, just while the controller decides
    whether the text is being copied (benchmarks/replay_variants.py)."""

    guess: list[int]
    at: int  # where the guess begins in the context
    support: int
    start: int  # the first position not yet scored

    def settle(self, ctx: list[int], policy: DraftLengthPolicy) -> bool:
        """Score what is known of the guess so far; True when nothing is left to score."""
        actual = ctx[self.at : self.at + len(self.guess)]
        matched = common_prefix(self.guess, actual)
        if matched < len(actual) or len(actual) == len(self.guess):
            policy.observe_shadow(len(self.guess), matched, self.support, self.start)
            return True
        if matched > self.start:  # all known so far came true: learn those hits now
            policy.observe_shadow(matched, matched, self.support, self.start)
            self.start = matched
        return False
