"""The backend and strategy names localspec knows, the draft-length and tree choices, and what a
request chooses beside its sampling (PerRequest), named here once for the CLI, the chat, the
API, the engine, the backend loader and the models.toml check."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from localspec.core.errors import InvalidRequestError

BACKENDS = ("llamacpp", "torch", "mlx", "reference")
DEFAULT_BACKEND = "llamacpp"  # what --backend is when not given
# Backends a models.toml model can give files for (the reference model is a spec, not a file).
PULLABLE_BACKENDS = ("llamacpp", "mlx", "torch")

# dflash, dspark: a DFlash or DSpark drafter file, as --draft-model
STRATEGIES = ("auto", "none", "ngram", "draft", "dflash", "dspark")
# Drafters derived from the target itself, and what may follow the colon.
SELF_DRAFTING = {"qspec": "TYPE", "layerskip": "L", "mtp": ""}  # mtp: the model's own MTP head
SELF_DRAFTING_STRATEGY = re.compile(rf"^({'|'.join(SELF_DRAFTING)})(:[\w.]+)?$")

# Drafters that read their target's hidden layers, in a file of their own (--draft-model),
# by strategy name: what they are called in messages.
FEATURE_DRAFTERS = {"eagle3": "EAGLE-3 head"}

_SPELLED = [
    *STRATEGIES,
    *FEATURE_DRAFTERS,
    *(f"{kind}[:{option}]" if option else kind for kind, option in SELF_DRAFTING.items()),
]
EVERY_STRATEGY = ", ".join(_SPELLED)  # auto, none, ngram, draft, dflash, dspark, eagle3, qspec[:TYPE], ...
STRATEGY_HELP = ", ".join(_SPELLED[1:-1]) + f" or {_SPELLED[-1]}"  # for a --strategy whose default is auto

# A fixed number of drafted tokens per step, or "auto": the controller picks it every step.
DraftTokens = int | Literal["auto"]


_DRAFT_HINT = "give auto (the controller picks it every step) or a number such as 4 (0 drafts nothing)"


def parse_draft_tokens(text: str) -> DraftTokens:
    """A draft length as a user types it: "auto" (or nothing) or a whole number >= 0."""
    value = text.strip().lower()
    if value in ("", "auto"):
        return "auto"
    try:
        n = int(value)
    except ValueError:
        raise InvalidRequestError(f"draft length must be 'auto' or a whole number, got {text!r}", _DRAFT_HINT) from None
    if n < 0:
        raise InvalidRequestError(f"draft length must be 'auto' or a whole number >= 0, got {n}", _DRAFT_HINT)
    return n


@dataclass(frozen=True)
class TreeAsk:
    """A tree asked for, whatever the cost curve says (experiments and tests; by default the
    controller decides, localspec.control.trees.priced_trees): the drafters offer their
    runner-ups at the first `positions` draft positions, `alternatives` each where a drafter
    offers several (a DFlash block's top-k; a draft model or an EAGLE-3 head offers one, an
    n-gram lookup its second continuation). Usage: runtime_for(target, draft, trees=TreeAsk(2))."""

    positions: int = 2
    alternatives: int = 1


# What a runtime verifies beside its chains: "auto", trees where the cost curve says they pay
# (the default); "off", chains only; a TreeAsk, that tree at every step.
Trees = TreeAsk | Literal["auto", "off"]

_TREE_HINT = "give auto (trees where they pay), off (chains only), or P[,A] such as 2,1 (P positions, A alternatives)"


def parse_trees(text: str) -> Trees:
    """A tree choice as a user types it: auto, off, or P[,A] with whole numbers of 1 or more."""
    value = text.strip().lower()
    if value in ("", "auto"):
        return "auto"
    if value == "off":
        return "off"
    try:
        numbers = [int(part) for part in value.split(",")]
    except ValueError:
        raise InvalidRequestError(f"a tree is auto, off or P[,A], got {text!r}", _TREE_HINT) from None
    if len(numbers) > 2 or min(numbers) < 1:
        raise InvalidRequestError(f"a tree's positions and alternatives are 1 or more, got {text!r}", _TREE_HINT)
    return TreeAsk(*numbers)


# How much of what the target cached for earlier requests a request may reuse: "any" matching
# prefix (fastest), only what a fresh evaluation of its prompt would have computed in the same
# blocks ("exact": the answer does not depend on what came before), or nothing ("none").
ReusePrefix = Literal["any", "exact", "none"]
REUSE_PREFIX: tuple[ReusePrefix, ...] = ("any", "exact", "none")


@dataclass(frozen=True)
class PerRequest:
    """What one request chooses beside its sampling, held by that request alone."""

    # A backend's logits depend on the size of the block each position was evaluated in
    # (llama.cpp's CPU kernels change at 64 rows), so a prefix cached by an earlier request
    # (its answer evaluated a few tokens at a time) can tip a near-tie another way than a
    # fresh evaluation: "exact" reuses only what the fresh evaluation's own blocks computed.
    reuse_prefix: ReusePrefix = "any"
    guess: bool = True  # False: plain decoding, no drafter asked (a free one neither)
    max_draft: int | None = None  # the longest draft a step may verify; None: the backend's block
    # The floor under which a drafter that stops unsure ends a draft (StopsUnsure: a draft
    # model, a head); None: the drafter's own. Other drafters draft as they do.
    min_confidence: float | None = None
