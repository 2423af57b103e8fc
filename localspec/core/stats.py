"""Generation statistics: one value, produced by the engine, read by CLI, TUI, bench and API."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple


class Step(NamedTuple):
    """One verify step, recorded once by the engine: Stats adds it up, the draft-length policy
    learns acceptance and costs from it, and the stream's events carry it. A named tuple, as
    immutable as a frozen dataclass and made in a third of its time, once a step (host_time.py)."""

    drafted: int
    accepted: int
    draft_seconds: float
    verify_seconds: float
    support: int = 0  # the draft's support (n-gram match length; 0: unknown)
    backlog: int = 0  # tokens the draft model caught up on before guessing
    depth: int = 0  # context length the verify pass ran behind
    # Drafted by the free lookup that accompanies a draft model: its time says nothing about
    # what the draft model's tokens cost.
    lookup: bool = False
    gamma: int = 0  # the draft length the policy chose (drafted can fall short of it)
    tokens: tuple[int, ...] = ()  # what the step emitted (an end of generation is not emitted)
    forced: bool = False  # the draft was what the request's grammar forces (jump-forward)
    # A tree (localspec.core.tree): drafted counts all its guessed tokens, accepted the kept
    # path's; chain is its chain's length (0: the step was a chain) and chain_kept how many of
    # the chain's tokens were kept, which is what the chain's acceptance estimates learn.
    chain: int = 0
    chain_kept: int = 0
    # Of verify_seconds: taking the rejected tokens back (a hybrid's replay of the kept ones).
    rollback_seconds: float = 0.0

    @property
    def n_from_draft(self) -> int:
        """The emitted tokens that came from the drafter: the first n_from_draft."""
        return min(self.accepted, len(self.tokens))


@dataclass
class Stats:
    strategy: str = "none"
    prompt_tokens: int = 0
    prefill_tokens: int = 0  # prompt tokens actually evaluated (the rest came from the cache)
    # Reused cached tokens that a fresh evaluation would have computed in other blocks (a
    # request that asked to reuse any prefix), and the rows of the fresh evaluation's block
    # over them: what exactness.judge weighs against the backend's Exactness.prompt_rows.
    reused_tokens: int = 0
    reused_fresh_rows: int = 0
    # Greedy, with such a reuse: whether the answer is a fresh evaluation's by construction
    # (None: nothing reused beyond a fresh evaluation's blocks, or sampled), and why not.
    fresh_exact: bool | None = None
    fresh_inexact_reason: str = ""
    prefill_seconds: float = 0.0
    generated_tokens: int = 0
    decode_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    verify_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    drafted_by_position: list[int] = field(default_factory=list)
    accepted_by_position: list[int] = field(default_factory=list)
    gamma_histogram: dict[int, int] = field(default_factory=dict)
    # Of `drafted`/`accepted`: the tokens an n-gram lookup beside a draft model guessed (the
    # adaptive policy picks the source per step; see Engine).
    lookup_drafted: int = 0
    lookup_accepted: int = 0
    # Of `accepted`: tokens the request's grammar forced, drafted for nothing (jump-forward);
    # of `drafted`: those the forced steps put up (a forced token the target refuses is rare).
    forced: int = 0
    forced_drafted: int = 0
    # Steps that verified a guessed draft (forced steps not counted): llama-server's "drafts".
    drafted_steps: int = 0
    finish_reason: str = ""
    # What the user should know about this request (a drafter switched off, say).
    notices: list[str] = field(default_factory=list)
    # Greedy requests: whether the answer is plain decoding's bit for bit by construction (the
    # kernels gave every verify block one-token passes' logits); None when sampled, which
    # keeps the target's distribution instead. See localspec.core.exactness.
    bit_exact: bool | None = None
    inexact_reason: str = ""  # why bit_exact is False

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def drafter_acceptance_rate(self) -> float:
        """The acceptance of what was drafted by guessing, without what a grammar forced."""
        drafted = self.drafted - self.forced_drafted
        return (self.accepted - self.forced) / drafted if drafted else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Tokens a verify pass produced: its accepted draft and the target's own token. Counted
        by pass, as llama-bench counts every pass a token, rather than by emitted text: the pass
        that produces an end of text, or a token past a stop string, produced it all the same,
        so plain decoding reads 1.00 (the emitted count read n/(n+1) for an answer ending in an
        end of text)."""
        return (self.accepted + self.verify_steps) / self.verify_steps if self.verify_steps else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.generated_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prefill_tokens / self.prefill_seconds if self.prefill_seconds > 0 else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_by_position, self.drafted_by_position, strict=True)]

    @property
    def mean_gamma(self) -> float:
        steps = sum(self.gamma_histogram.values())
        return sum(g * c for g, c in self.gamma_histogram.items()) / steps if steps else 0.0

    @property
    def lookup_share(self) -> float:
        """Share of the drafted tokens that the lookup beside a draft model guessed."""
        return self.lookup_drafted / self.drafted if self.drafted else 0.0

    def record_step(self, step: Step) -> None:
        self.draft_seconds += step.draft_seconds
        self.verify_seconds += step.verify_seconds
        self.verify_steps += 1
        self.drafted += step.drafted
        self.accepted += step.accepted
        if step.lookup:
            self.lookup_drafted += step.drafted
            self.lookup_accepted += step.accepted
        if step.forced:
            self.forced += step.accepted
            self.forced_drafted += step.drafted
        elif step.drafted:
            self.drafted_steps += 1
        self.gamma_histogram[step.gamma] = self.gamma_histogram.get(step.gamma, 0) + 1
        for i in range(step.drafted):
            self.record_position(i, 1, 1 if i < step.accepted else 0)

    def record_position(self, i: int, drafted: int, accepted: int) -> None:
        while len(self.drafted_by_position) <= i:
            self.drafted_by_position.append(0)
            self.accepted_by_position.append(0)
        self.drafted_by_position[i] += drafted
        self.accepted_by_position[i] += accepted

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["gamma_histogram"] = {str(k): v for k, v in sorted(self.gamma_histogram.items())}
        for name in (
            "acceptance_rate",
            "tokens_per_step",
            "decode_tokens_per_s",
            "prefill_tokens_per_s",
            "acceptance_by_position",
            "mean_gamma",
            "lookup_share",
        ):
            out[name] = getattr(self, name)
        return out

    def summary(self) -> str:
        return (
            f"{self.generated_tokens} tokens, {self.decode_tokens_per_s:.1f} tok/s decode, "
            f"{self.prefill_tokens_per_s:.1f} tok/s prefill ({self.prefill_tokens}/{self.prompt_tokens} "
            f"prompt tokens evaluated) | strategy {self.strategy}: {self.accepted}/{self.drafted} drafts "
            f"accepted ({self.acceptance_rate:.0%}), {self.tokens_per_step:.2f} tokens/step, "
            f"mean draft length {self.mean_gamma:.2f}{self._lookup_note()} | draft {self.draft_seconds:.2f}s, "
            f"verify {self.verify_seconds:.2f}s | finish: {self.finish_reason}{self._exact_note()}{self._fresh_note()}"
        )

    def _exact_note(self) -> str:
        if self.bit_exact is None:
            return " | sampled: the target's distribution"
        if self.bit_exact:
            return " | bit-exact: plain decoding's greedy output by construction"
        return f" | not bit-exact by construction: {self.inexact_reason} (--exact makes it so)"

    def _fresh_note(self) -> str:
        if self.fresh_exact is False:
            return f" | may part from a fresh evaluation: {self.fresh_inexact_reason}"
        return ""

    def _lookup_note(self) -> str:
        if not self.lookup_drafted:
            return ""
        return f", {self.lookup_drafted} of the drafted tokens from n-gram lookup ({self.lookup_accepted} accepted)"
