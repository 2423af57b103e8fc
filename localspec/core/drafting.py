"""The contracts of drafting the engine works through: a Drafter proposes a Draft, and a
DraftLengthPolicy (with its TreeShaper) decides how many tokens it proposes each step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from localspec.core.sampling import Distribution, SamplingConfig
    from localspec.core.stats import Step

# The longest draft a step verifies (ControlConfig.max_draft's default): the one place it is
# set, so the calibration's longest pass and the engine's free guess follow it.
MAX_DRAFT = 15


@dataclass
class Draft:
    tokens: list[int] = field(default_factory=list)
    # One distribution per drafted token, or None for drafters that only guess (n-gram).
    dists: list[Distribution] | None = None
    # How much the context vouches for the guess: for n-gram lookup, how many tokens before
    # the draft match the text that preceded its earlier occurrence; 0 when unknown. The
    # draft-length policy keeps separate acceptance statistics per support level, because a
    # guess backed by a 20-token match is right far more often than one backed by 2 tokens.
    support: int = 0
    # Other guesses beside the chain, for a tree (localspec.core.tree): (depth, tokens), a
    # branch whose first token is another candidate for tokens[depth]. None: a chain only.
    branches: list[tuple[int, list[int]]] | None = None


class Drafter(Protocol):
    name: str
    # Why the drafter switched itself off for the rest of the request (a token beyond its
    # vocabulary), for the user; None while it drafts. The engine records it once.
    off_notice: str | None

    def start(self, context: Sequence[int], warm: bool = True) -> None:
        """A new request begins with this committed context (its last token not yet evaluated).
        warm=False: no draft is expected, so a draft model need not take the context in yet
        (its backlog says what it would have to catch up on if a draft comes after all)."""
        ...

    def propose(self, context: Sequence[int], n: int, cfg: SamplingConfig, rng: np.random.Generator) -> Draft:
        """Up to n tokens that might follow context."""
        ...

    def backlog(self, context: Sequence[int]) -> int:
        """Tokens the drafter must take in before its first guess: a draft model that sat
        out some steps (γ = 0) has to catch up on what the target produced meanwhile."""
        ...

    def commit(self, context: Sequence[int], n_accepted: int) -> None:
        """The target kept n_accepted of the last draft; context now ends with its own token."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class Branching(Protocol):
    """A drafter that can offer branches beside its chain for a tree (Draft.branches)."""

    # The first positions that also offer another candidate token; 0: a chain only.
    branching: int


@runtime_checkable
class NeverGuesses(Protocol):
    """A drafter that guesses nothing, ever (plain decoding's): the engine then puts the
    prompt's last token in with the prompt, as no draft can ride along with it."""

    never_guesses: Literal[True]


@runtime_checkable
class StopsUnsure(Protocol):
    """A drafter that ends a draft where its own top token is unlikely (a draft model, an
    EAGLE-3 head: localspec.drafters.model), whose floor a request may set (llama-server's
    speculative.p_min, Speculation.min_confidence)."""

    min_confidence: float  # its own floor; 0: it drafts on however unsure

    def propose(
        self,
        context: Sequence[int],
        n: int,
        cfg: SamplingConfig,
        rng: np.random.Generator,
        min_confidence: float | None = None,
    ) -> Draft:
        """Drafter.propose with this draft's floor in place of the drafter's own (None: its own)."""
        ...


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass(frozen=True)
class Decision:
    """What a draft-length policy weighed for its last choice: each candidate γ with its
    predicted tokens per second (γ = 0, plain decoding, always among them), the γ that
    predicted best, the γ chosen, and the adjustment that turned one into the other."""

    source: str  # "draft" (the runtime's drafter), "model" or "lookup" (chosen between), "fixed"
    candidates: tuple[tuple[int, float], ...]
    best: int
    chosen: int
    adjustment: str = ""  # empty where the best candidate was taken as it was

    def table(self) -> str:
        """The candidates as lines for a terminal, the chosen one marked."""
        lines = [
            f"γ={g:<2} {rate:8.1f} tok/s{'  <- chosen' if g == self.chosen else ''}" for g, rate in self.candidates
        ]
        why = f"best γ={self.best}, {self.adjustment} -> γ={self.chosen}" if self.adjustment else f"γ={self.chosen}"
        return "\n".join([f"draft length ({self.source}): {why}", *lines])


@dataclass(frozen=True)
class DraftPrices:
    """What a policy prices a step with now (its cost curve as learnt so far), for saying why a
    drafter drafts or sits idle."""

    step: float  # seconds of a plain step: a verify pass over one token
    pair: float  # a verify pass over two tokens, in plain steps
    draft: float  # the draft model guessing one token, in plain steps


class TreeShaper(Protocol):
    """Which of a drafter's branches a step verifies beside its chain (localspec.control.trees)."""

    def shape(
        self, chain: int, support: int, offered: Sequence[tuple[int, Sequence[int]]], depth: int
    ) -> list[tuple[int, list[int]]]:
        """The branches worth their nodes for a chain of `chain` tokens (none: verify the chain)."""
        ...

    def observe_tree(self, chain: int, heads: Sequence[tuple[int, int]], path: Sequence[int]) -> None:
        """A tree step's outcome: the chain's length, each branch's (depth, first node) in node
        order, and the accepted path's nodes (the chain's are 0..chain-1)."""
        ...


class DraftLengthPolicy(Protocol):
    def begin(self, sampled: bool) -> None:
        """A request starts; sampled: its tokens are drawn from the target's distribution
        (temperature > 0) rather than taken as its argmax."""
        ...

    def would_draft(self, depth: int = 0) -> bool:
        """Whether a draft could come at all, were the drafter caught up: a request that will
        not draft spares a draft model its prefill."""
        ...

    def would_guess(self, guessed: int, support: int, depth: int = 0) -> bool:
        """Whether choose() would draft a free drafter's guess of `guessed` tokens backed by
        `support` now; reads the estimates, changes nothing. A request whose first guess would
        be declined takes its first token from the prompt's pass (Engine.generate)."""
        ...

    def choose(self, limit: int, support: int = 0, backlog: int = 0, depth: int = 0) -> int:
        """γ for the next step, at most limit; support: how well the context backs a draft
        already made (0: unknown, or not drafted yet); backlog: tokens a draft model must
        catch up on before it can guess (Drafter.backlog); depth: the context length the
        verify pass will run behind (0: unknown)."""
        ...

    def choose_source(
        self, guessed: int, support: int, limit: int, backlog: int = 0, depth: int = 0
    ) -> tuple[int, bool]:
        """A draft model with a free lookup beside it: γ for the next step, and whether the
        lookup's guess (True: `guessed` tokens backed by `support`) or the draft model (False)
        should supply it."""
        ...

    def observe(self, step: Step) -> None: ...

    def explain(self) -> Decision | None:
        """The candidates weighed for the last choice and what decided it (None: none yet)."""
        ...

    def prices(self) -> DraftPrices | None:
        """The prices the policy weighs a draft with now (None: a fixed length prices nothing)."""
        ...

    def observe_shadow(self, drafted: int, accepted: int, support: int = 0, start: int = 0) -> None:
        """A free drafter's guess (or the part of it from position `start` on, which no step
        verified), checked against what the target then produced: acceptance evidence at no
        cost. `accepted` counts the guess's leading tokens that came true."""
        ...
