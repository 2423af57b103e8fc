"""The speculative loop: draft γ tokens, verify them in one target pass, keep what the
target agrees with, roll the caches back, emit. Backend-agnostic: it sees only the
Backend protocol and a Drafter."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from localspec.core.acceptance import accept_greedy, accept_rejection_sampling, accept_seeded
from localspec.core.choices import PerRequest, ReusePrefix
from localspec.core.drafting import (
    MAX_DRAFT,
    Draft,
    Drafter,
    DraftLengthPolicy,
    NeverGuesses,
    StopsUnsure,
    TreeShaper,
    common_prefix,
)
from localspec.core.errors import ContextFullError, InvalidRequestError
from localspec.core.proposal import Proposal, Source, admissible
from localspec.core.protocol import Backend, Logits, TreeBackend, Verifier, eval_chunked
from localspec.core.reuse import CachedRows
from localspec.core.sampling import SamplingConfig, shape
from localspec.core.shadow import Shadow, shadow_of
from localspec.core.stats import Stats, Step
from localspec.core.tree import accept_tree, branch_heads, grow

# A free drafter guesses this far ahead before γ is chosen: the longest draft and one token
# more; what no step verifies is scored later as free evidence (see Shadow).
FREE_GUESS_TOKENS = MAX_DRAFT + 1

Clock = Callable[[], float]  # seconds from any fixed start

# A step with no guess (γ 0, nothing to catch up on): one shared value, as nothing changes a
# proposal's lists (the engine and the backends copy what they keep).
NO_GUESS = Proposal([], None, Source.MODEL)
EVERY_DEFAULT = PerRequest()  # a request that chooses nothing of its own


class Engine:
    """Runs requests for one target and one drafter. The caches outlive requests, so a new
    turn only evaluates what changed since the last one."""

    def __init__(
        self,
        target: Backend,
        drafter: Drafter,
        free_drafter: bool = False,
        lookup: Drafter | None = None,
        clock: Clock = time.perf_counter,
        trees: TreeShaper | None = None,
    ) -> None:
        self.target = target
        self.clock = clock  # what the step times are read from (a replay passes a simulated one)
        self.drafter = drafter
        # A free drafter (n-gram) guesses before γ is chosen, so the policy can weigh how well
        # the guess is supported, and its unverified guesses still teach the policy.
        self.free_drafter = free_drafter
        # A free drafter beside a draft model: where the text repeats, a copied passage is
        # guessed for nothing and right more often than a small model's guess; elsewhere the
        # model drafts. The policy picks per step (choose_source).
        self.lookup = lookup
        # False: no step ever guesses (plain decoding), so the prompt's last token goes in with
        # the prompt, as llama-server does, and the first token needs no pass of its own.
        self.drafts = not isinstance(drafter, NeverGuesses)
        # A backend that verifies where its logits are (a GPU) is handed the whole rule.
        self.verifier = target if target.capabilities.verifies and isinstance(target, Verifier) else None
        # How the cached rows went in: which of them a new prompt may keep exactly.
        self._cached = CachedRows(target.capabilities.max_block, target.capabilities.exactness)
        # Which of a drafter's branches a step verifies beside its chain, on a target that takes
        # a tree in one pass (localspec.assembly chooses it); None: chains only.
        self.trees = trees

    def generate(
        self,
        prompt: Sequence[int],
        max_tokens: int,
        cfg: SamplingConfig,
        policy: DraftLengthPolicy,
        stats: Stats,
        rng: np.random.Generator,
        cancelled: Callable[[], bool] | None = None,
        choices: PerRequest = EVERY_DEFAULT,
    ) -> Iterator[Step]:
        """cancelled: polled between prompt chunks and verify steps; once true the request
        ends with finish reason "cancelled" and the caches stay consistent. choices: what
        this request reuses of the cache and whether (and how far) it drafts."""
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
        warm = choices.guess and (self.free_drafter or policy.would_draft(len(prompt)))
        # Where the first step will not draft, its pass would hold the prompt's last token alone:
        # that token goes in with the prompt instead. A head or a draft model reads the target's
        # passes as they come, so only plain decoding and a free lookup whose first guess the
        # policy declines (nearly always: it is backed by the prompt alone) fold it.
        fold = cfg.constraint is None and (
            not self.drafts
            or (self.free_drafter and not self._first_guess_drafted(prompt, max_tokens, cfg, policy, choices, rng))
        )
        went_in, first = self._prefill(prompt, stats, warm, stop, choices.reuse_prefix, fold)
        if not went_in:
            stats.finish_reason = "cancelled"
            return
        if max_tokens == 0:
            stats.finish_reason = "max_tokens"
            return
        before = cfg.repeat_window(prompt, len(prompt))  # the prompt's tail a repeat penalty reaches
        eog = self.target.end_of_generation()
        forced = getattr(cfg.constraint, "forced", None)
        numpy_rule = cfg.shapes_logits or cfg.logprobs is not None or (cfg.seed is not None and not cfg.greedy)
        req = _Request(cfg, policy, stats, rng, cancelled, max_tokens, len(prompt), before, eog, forced, numpy_rule)
        req.guess, req.max_draft = choices.guess, choices.max_draft  # the request's own state
        req.min_confidence = choices.min_confidence
        req.first = first
        yield from self._decode(list(prompt), req)

    def _first_guess_drafted(
        self,
        prompt: Sequence[int],
        max_tokens: int,
        cfg: SamplingConfig,
        policy: DraftLengthPolicy,
        choices: PerRequest,
        rng: np.random.Generator,
    ) -> bool:
        """Whether the free drafter's guess after the prompt would be drafted at the first step
        (what _propose will ask then, asked now without changing the policy's state)."""
        if not choices.guess:
            return False
        limit = min(self.target.info.n_ctx - len(prompt) - 1, max_tokens - 1, self._longest(choices.max_draft))
        if limit <= 0:
            return False
        self.drafter.start(prompt)
        guess = self.drafter.propose(prompt, min(limit, FREE_GUESS_TOKENS), cfg, rng)
        return policy.would_guess(len(guess.tokens), guess.support, depth=len(prompt) - 1)

    def keeps(self, prompt: Sequence[int]) -> tuple[int, int]:
        """How much of the prompt's start a request would take from the target's cache: the
        rows a fresh evaluation computes with the same bits (reuse_prefix "exact"), and every
        row the prompt shares with it ("any")."""
        shared = min(common_prefix(self.target.cached_tokens(), prompt), len(prompt) - 1)
        return self._cached.exact_keep(prompt, shared), shared

    def _prefill(
        self,
        prompt: Sequence[int],
        stats: Stats,
        warm_drafter: bool,
        stop: Callable[[], bool],
        reuse: ReusePrefix,
        fold: bool,
    ) -> tuple[bool, Logits | None]:
        """False when cancelled before the prompt was all in; with True, the row of logits
        after the prompt where its last token went in too (fold), else None."""
        # Everything but the last prompt token goes in now; that token opens the first
        # verify block, so even the first generated token can come with a draft. Folded, it
        # goes in with the last piece where that piece still sums as one-token passes, so
        # its row has the bits the first verify pass would have given it.
        t0 = self.clock()
        exact, keep = self.keeps(prompt) if reuse != "none" else (0, 0)
        keep = exact if reuse == "exact" else keep
        if keep > exact:  # the fresh evaluation's block from `exact` would have computed these
            stats.reused_tokens = keep - exact
            stats.reused_fresh_rows = min(self.target.capabilities.max_block, len(prompt) - 1 - exact)
        self.target.rollback(keep)
        todo = list(prompt[keep:-1])
        rows_limit = self.target.capabilities.exactness.prompt_rows
        tail_rows = (self.target.capabilities.max_block if rows_limit is None else rows_limit) if fold else 0
        rows = eval_chunked(self.target, todo, "none", stop, prompt[-1], tail_rows)
        # A copy: the backend's next pass writes over the rows it hands back.
        first = rows[-1].copy() if len(rows) else None
        self._cached.prompt_in(prompt, keep, exact, len(todo))
        if stop():
            return False, None
        self.drafter.start(prompt, warm_drafter)
        self._note_drafter_off(stats, self.drafter.off_notice)
        if self.lookup is not None:
            self.lookup.start(prompt)
        stats.prefill_tokens = len(todo) + 1
        stats.prefill_seconds = self.clock() - t0
        return True, first

    def _note_drafter_off(self, stats: Stats, notice: str | None) -> None:
        # A model drafter that met a token it cannot read sits out the rest of the request.
        if notice and notice not in stats.notices:
            stats.notices.append(notice)

    def _decode(self, ctx: list[int], req: _Request) -> Iterator[Step]:
        """Draft, verify, accept, roll back the rest, record; until an end of text, max_tokens,
        a full context or a cancel. A plain step (no guess) runs this same loop; its host time
        is mostly cache misses after the pass, so each call a step makes costs (host_time.py)."""
        target, clock = self.target, self.clock
        req.t_start = clock()
        try:
            # A folded prompt's last token is in the cache already: past counts it out.
            while (limit := self._limit(req, past := target.n_past - (req.first is not None))) is not None:
                t0 = clock()
                proposal, tree = self._propose(ctx, limit, req, past), (0, 0)
                if proposal.branches and self.trees is not None and req.first is None:
                    proposal = self._widen(proposal, req)
                if proposal.parents is None:
                    tokens, refused = admissible(proposal.tokens, self.target.info.n_vocab, req.cfg.constraint)
                    t1 = clock()
                    n_acc, nxt, rows = self._verify(ctx, tokens, proposal, refused, req)
                else:
                    t1 = clock()
                    tokens, nxt, rows, tree = self._verify_tree(ctx, proposal, req)
                    n_acc = len(tokens)
                t_kept = clock()
                target.rollback(past + 1 + n_acc)  # the cache keeps the accepted and the pending token
                self._cached.kept(past, 1 + n_acc, 1 + len(tokens) if proposal.parents is None else None)
                t2 = clock()
                new = [*tokens[:n_acc], nxt]
                ctx.extend(new)
                self._commit_drafters(ctx, proposal.source, tree[1] if tree[0] else n_acc, req.stats)
                emitted = self._emit(new, rows, req)
                verified = len(tokens) if proposal.parents is None else len(proposal.tokens)
                step = self._record(ctx, proposal, verified, n_acc, emitted, past, (t0, t1, t_kept, t2), req, tree)
                if step.tokens:
                    yield step
                if req.stats.finish_reason:
                    return
        finally:
            req.stats.decode_seconds = self.clock() - req.t_start

    def _limit(self, req: _Request, past: int) -> int | None:
        """The most tokens the next step may draft behind `past` cached tokens, or None (the
        finish reason set) when the request is over."""
        if req.produced >= req.max_tokens:
            req.stats.finish_reason = "max_tokens"
            return None
        if req.cancelled is not None and req.cancelled():
            req.stats.finish_reason = "cancelled"
            return None
        room = self.target.info.n_ctx - past - 1  # positions left after the pending token
        if room < 0:
            req.stats.finish_reason = "context_full"
            return None
        return min(room, req.max_tokens - req.produced - 1, self._longest(req.max_draft))

    def _longest(self, max_draft: int | None) -> int:
        """The longest draft a pass takes: it holds the pending token too, within the request's cap."""
        longest = self.target.capabilities.max_block - 1
        return longest if max_draft is None else min(longest, max_draft)

    def _propose(self, ctx: list[int], limit: int, req: _Request, past: int) -> Proposal:
        """The step's guess: what the grammar forces, else the free drafter's, the lookup's
        or the draft model's, as long as the policy chooses."""
        if req.forced is not None and limit > 0 and (forced := req.forced()[:limit]):
            return Proposal.forced(forced)
        if not req.guess:  # plain decoding asked for: no drafter guesses, not even a free one
            return NO_GUESS
        policy = req.policy
        if self.free_drafter:
            free = self._guess(self.drafter, ctx, limit, req)
            gamma = policy.choose(len(free.tokens), free.support, depth=past)
            return Proposal.of(free, gamma, Source.FREE, 0, free)
        guess = self._guess(self.lookup, ctx, limit, req) if self.lookup is not None else None
        backlog = self.drafter.backlog(ctx)
        if guess is None:
            gamma = policy.choose(limit, 0, backlog, past)
        else:
            gamma, from_lookup = policy.choose_source(len(guess.tokens), guess.support, limit, backlog, past)
            if from_lookup:
                return Proposal.of(guess, gamma, Source.LOOKUP, 0, guess)
        if gamma == 0 and guess is None and backlog == 0:
            return NO_GUESS
        draft = self._draft(ctx, gamma, req) if gamma > 0 else Draft()
        return Proposal.of(draft, gamma, Source.MODEL, backlog, guess)

    def _draft(self, ctx: list[int], gamma: int, req: _Request) -> Draft:
        """The drafter's guess of up to gamma tokens, under the request's floor where it set one."""
        if req.min_confidence is not None and isinstance(self.drafter, StopsUnsure):
            return self.drafter.propose(ctx, gamma, req.cfg, req.rng, min_confidence=req.min_confidence)
        return self.drafter.propose(ctx, gamma, req.cfg, req.rng)

    @staticmethod
    def _guess(drafter: Drafter, ctx: list[int], limit: int, req: _Request) -> Draft:
        """A free drafter guesses this far ahead before γ is chosen."""
        return drafter.propose(ctx, min(limit, FREE_GUESS_TOKENS), req.cfg, req.rng) if limit > 0 else Draft()

    def _verify(
        self, ctx: list[int], tokens: list[int], proposal: Proposal, refused: int | None, req: _Request
    ) -> tuple[int, int, Logits | None]:
        """One target pass over the pending token (ctx[-1]) and the draft: how many draft tokens
        the target accepts, the token it adds after them, and the target's logits as the request
        shapes them (None where a verifying backend kept them). refused: where the draft was
        cut at an id the target may not evaluate (admissible). After a folded prompt the
        pending token's row is the prompt pass's, and only a draft needs a pass."""
        cfg, rng, dists = req.cfg, req.rng, proposal.dists
        first, req.first = req.first, None
        req.folded = first is not None
        if first is not None:
            rows = first[None] if not tokens else np.concatenate([first[None], self.target.eval_block(tokens, "all")])
        elif self.verifier is not None and refused is None and not req.numpy_rule:  # a refused id takes it too
            return (*self.verifier.verify_block([ctx[-1], *tokens], dists, cfg, rng), None)
        else:
            rows = self.target.eval_block([ctx[-1], *tokens], "all")
        generated = ctx[req.prompt_len :] if cfg.shapes_logits else ()  # penalties count them
        logits = shape(rows, cfg, generated, tokens, req.before)
        if cfg.greedy:
            return (*accept_greedy(tokens, logits), logits)
        if cfg.seed is not None:  # the same answer whatever was drafted (accept_seeded)
            return (*accept_seeded(tokens, logits, cfg, cfg.seed, len(ctx)), logits)
        q = dists[refused] if refused is not None and dists else None
        return (*accept_rejection_sampling(tokens, dists, logits, cfg, rng, q), logits)

    def _widen(self, proposal: Proposal, req: _Request) -> Proposal:
        """The chain with the branches the tree shaper finds worth their nodes, where the target
        takes a tree and the request reads nothing but the target's law (no grammar, penalties
        or logprobs, whose rows follow one chain)."""
        cfg, target = req.cfg, self.target
        plain = not cfg.shapes_logits and cfg.logprobs is None and cfg.constraint is None
        if not plain or target.capabilities.branches < 2 or not isinstance(target, TreeBackend):
            return proposal
        if any(not 0 <= t < target.info.n_vocab for t in proposal.tokens):
            return proposal
        assert self.trees is not None
        chosen = self.trees.shape(len(proposal.tokens), proposal.support, proposal.branches, target.n_past)
        room = target.capabilities.max_block - 1 - len(proposal.tokens)
        fits = [b for b in chosen[: target.capabilities.branches - 1] if (room := room - len(b[1])) >= 0]
        return grow(proposal, [b for b in fits if all(0 <= t < target.info.n_vocab for t in b[1])])

    def _verify_tree(
        self, ctx: list[int], proposal: Proposal, req: _Request
    ) -> tuple[list[int], int, Logits, tuple[int, int]]:
        """One target pass over the pending token and a tree of guesses: the accepted path's
        tokens, the token the target adds after them, the pass's rows (localspec.core.tree) and
        the chain's length and tokens kept; the cache then holds the path, as a chain would."""
        assert proposal.parents is not None and self.trees is not None
        target = self.target
        assert isinstance(target, TreeBackend)
        parents = [-1, *(p + 1 for p in proposal.parents)]
        logits = target.eval_tree([ctx[-1], *proposal.tokens], parents)
        path, nxt = accept_tree(proposal, logits, req.cfg, req.rng, len(ctx))
        target.keep_branch([0, *(i + 1 for i in path)])
        chain, heads = branch_heads(proposal.parents)
        self.trees.observe_tree(chain, heads, path)
        kept = sum(1 for node in path if node < chain)
        return [proposal.tokens[i] for i in path], nxt, logits, (chain, kept)

    def _commit_drafters(self, ctx: list[int], source: Source, n_acc: int, stats: Stats) -> None:
        """Tell the drafters what the target kept: each counts as accepted only its own tokens."""
        self.drafter.commit(ctx, n_acc if source in (Source.MODEL, Source.FREE) else 0)
        if notice := self.drafter.off_notice:  # only a drafter that switched off has one
            self._note_drafter_off(stats, notice)
        if self.lookup is not None:
            self.lookup.commit(ctx, n_acc if source is Source.LOOKUP else 0)

    def _emit(self, new: list[int], rows: Logits | None, req: _Request) -> list[int]:
        """The step's tokens the request emits: up to an end of text and max_tokens; their
        logprobs recorded and the grammar told."""
        cfg = req.cfg
        for i, tok in enumerate(new):
            if tok in req.eog:
                new, req.stats.finish_reason = new[:i], "stop"
                break
        new = new[: req.max_tokens - req.produced]
        if cfg.logprobs is not None and rows is not None:
            cfg.logprobs.record(new, rows)
        if cfg.constraint is not None:
            cfg.constraint.commit(new)
        return new

    def _record(
        self,
        ctx: list[int],
        proposal: Proposal,
        verified: int,
        n_acc: int,
        emitted: list[int],
        past: int,
        times: tuple[float, float, float, float],
        req: _Request,
        tree: tuple[int, int] = (0, 0),
    ) -> Step:
        """The step's bookkeeping: its Step in the stats, the policy's evidence (a free guess's
        unverified part scored once the text is known) and the running totals."""
        t0, t1, t_kept, t2 = times
        step = Step(
            drafted=verified,
            accepted=n_acc,
            draft_seconds=t1 - t0,
            verify_seconds=t2 - t1,
            support=proposal.support,
            backlog=proposal.backlog if verified else 0,
            depth=past,
            lookup=proposal.source is Source.LOOKUP,
            gamma=proposal.gamma,
            tokens=tuple(emitted),
            forced=proposal.source is Source.GRAMMAR,
            chain=tree[0],
            chain_kept=tree[1],
            rollback_seconds=t2 - t_kept,
        )
        req.stats.record_step(step)
        if req.shadow is None and proposal.guess is not None and not tree[0]:  # a tree's path need not be its guess's
            req.shadow = shadow_of(proposal, verified, n_acc, len(ctx) - n_acc - 1)
        # A forced step says nothing of the drafter, and one that took the prompt pass's row
        # timed no pass of its own (the cost curve would learn a pass that cost nothing).
        folded, req.folded = req.folded, False
        if proposal.source is not Source.GRAMMAR and not folded:
            req.policy.observe(step)
        if req.shadow is not None and req.shadow.settle(ctx, req.policy):
            req.shadow = None
        req.produced += len(emitted)
        req.stats.generated_tokens = req.produced
        req.stats.decode_seconds = self.clock() - req.t_start
        return step


@dataclass
class _Request:
    """What one request's decode loop carries from step to step."""

    cfg: SamplingConfig
    policy: DraftLengthPolicy
    stats: Stats
    rng: np.random.Generator
    cancelled: Callable[[], bool] | None
    max_tokens: int
    prompt_len: int
    before: Sequence[int]  # the prompt's tail a repeat penalty reaches
    eog: frozenset[int]  # the target's ends of a turn
    # What the request's settings decide once rather than each step: the grammar's forced
    # tokens (None without a grammar that knows them), and whether the rows must reach the
    # host (penalties, bias, a grammar's mask, logprobs, a seeded sample: the numpy rule).
    forced: Callable[[], list[int]] | None = None
    numpy_rule: bool = False
    guess: bool = True  # PerRequest's
    max_draft: int | None = None
    min_confidence: float | None = None
    produced: int = 0
    shadow: Shadow | None = None
    t_start: float = 0.0
    # The row after a folded prompt (Engine.generate), until the first step takes it; folded:
    # the step that took it, which ran no pass of its own (its policy learns nothing from it).
    first: Logits | None = None
    folded: bool = False


def check_fits(prompt: Sequence[int], n_ctx: int) -> None:
    if len(prompt) >= n_ctx:
        raise ContextFullError(
            f"the prompt is {len(prompt)} tokens but the context holds {n_ctx}",
            "shorten the prompt or start a new conversation, or load the model with a larger n_ctx",
        )


def _never() -> bool:
    return False
