"""Every decoding strategy, one row each (TABLE): how its drafter is built, which draft-length
policy it runs under, what it needs of the backend and of --draft-model, and its label.

resolve() turns a load's options and its loaded target into a Plan, once; plan() does the same
from drafters a caller loaded itself. The Runtime takes the Plan and never sees the name, and
nothing outside this module compares one. Adding a drafter is its module and one row here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from localspec.common.gguf_header import read_header
from localspec.common.progress import Announce, announced
from localspec.control.factory import fixed_policy, priced_policy
from localspec.control.policy import AdaptiveDraftLength
from localspec.core.backend_loader import BACKENDS, kind_of
from localspec.core.choices import EVERY_STRATEGY, FEATURE_DRAFTERS, DraftTokens
from localspec.core.drafting import Drafter, DraftLengthPolicy
from localspec.core.errors import InvalidRequestError, ModelLoadError, PairMismatchError
from localspec.core.exactness import greedy_exact_within
from localspec.core.options import LoadOptions
from localspec.core.protocol import Backend, SelfDrafting, vocab_mismatch
from localspec.drafters import BlockDrafter
from localspec.drafters.files import (
    BLOCK_DRAFTERS,
    check_block_file,
    check_head_file,
    dflash_drafter,
    is_assistant,
    load_drafter,
)
from localspec.drafters.memory import NgramMemory
from localspec.drafters.model import ModelDrafter
from localspec.drafters.ngram import NgramDrafter
from localspec.drafters.none import NoDrafter


@dataclass(frozen=True)
class Plan:
    """A strategy resolved for one target: the drafter each step asks, what the stats call
    it, and what its draft-length policy is priced from. The Runtime is built from this."""

    strategy: str  # the row that built it ("auto" resolved), e.g. "eagle3"
    target: Backend
    drafter: Drafter
    label: str  # what stats and UIs call it, e.g. "qspec:Q4_0"
    draft: Backend | None = None  # a draft model, priced by its own step cost
    block_pass_seconds: float | None = None  # a block drafter's one pass (dflash)
    lookup: NgramDrafter | None = None  # n-gram lookup beside a model, where the policy adapts
    free: bool = False  # the drafter costs next to nothing to ask (lookup): the engine asks it freely
    drafts: bool = True  # False: plain decoding, whatever draft length was asked for
    draft_tokens: DraftTokens = "auto"
    calibrate: bool = True
    memory: NgramMemory | None = None  # earlier requests' text, which n-gram lookup searches

    def policy(self) -> tuple[DraftLengthPolicy, AdaptiveDraftLength | None]:
        """The draft-length policy, and the same when it prices lengths on a cost curve (None:
        a fixed length). Pricing may calibrate this machine, so it is built when first needed."""
        fixed = self.draft_tokens if self.drafts else 0
        block = self.block_pass_seconds
        priced = priced_policy(self.target, self.draft, fixed, self.calibrate, block_pass_seconds=block)
        return (priced if priced is not None else fixed_policy(fixed)), priced

    def close(self) -> None:
        """Free the drafter (a draft model with it); the target stays open."""
        self.drafter.close()


@dataclass(frozen=True)
class Parts:
    """What a row builds its plan from: the loaded target, a drafter the caller loaded or the
    file to load one from, and the caller's choices."""

    target: Backend
    option: str | None = None  # what followed the colon: "Q4_0" in qspec:Q4_0
    draft: Backend | None = None  # a draft model the caller loaded
    block: BlockDrafter | None = None  # a block drafter the caller loaded (dflash)
    draft_model: str | None = None  # the drafter's file, loaded by the row that uses it
    backend_options: Mapping[str, Any] = field(default_factory=dict)
    draft_tokens: DraftTokens = "auto"
    calibrate: bool = True
    memory: NgramMemory | None = None
    label: str | None = None  # the caller's name for it, else the row's
    on_progress: Announce | None = None


Source = Literal["none", "lookup", "file", "derived", "block", "chosen"]


@dataclass(frozen=True)
class Strategy:
    """One row of TABLE: what the layers around the Runtime know of a strategy, so that none of
    them compares its name."""

    name: str
    build: Callable[[Strategy, Parts], Plan]
    source: Source  # where its drafter comes from: nothing, lookup, a file, the target, or a choice
    drafter_file: Literal["never", "may", "must"] = "never"  # what it makes of --draft-model
    backend: str | None = None  # the BackendKind feature a backend needs to run it
    refusal: str = ""  # what a backend without that feature is told it cannot do
    exports_as: str = "ngram"  # the serving engines' method it is handed to them as (localspec export)
    option: str = ""  # what may follow a colon in its name: qspec:TYPE
    peer: str | None = None  # llama.cpp's program for the same strategy (bench --peers)
    # Requests can share passes (localspec.pool): its drafter is the request's own state, a
    # model of its own loaded with lanes beside the target's, or a drafter reading the target's
    # hidden states (an MTP or EAGLE-3 head, a DFlash or DSpark drafter, Gemma 4's assistant)
    # in a context per lane.
    batches: bool = False

    @property
    def label(self) -> str:
        return self.name

    @property
    def chooses(self) -> bool:
        """Whether it leaves the choice to the model or the pair (auto)."""
        return self.source == "chosen"

    def target_options(self, opts: LoadOptions, backend: str) -> dict[str, Any]:
        """The keywords loading the target on `backend` takes: opts.backend_options(), and this
        strategy's own. A hybrid's target keeps recurrent-state snapshots only for the drafters
        that need them, as llama-server asks for them: llama.cpp writes them with every pass
        (5 % of a small hybrid's plain step, benchmarks/pages/hybrid.md). Plain decoding never
        takes a draft back; n-gram lookup drafts now and then and takes a rejection back from a
        copy of the state, with the replay priced (as llama-server's checkpoints do)."""
        if not kind_of(backend).snapshots or not (self.source in ("none", "lookup") or self._looks_up(opts)):
            return opts.backend_options()
        return opts.backend_options() | {"recurrent_snapshots": 0}

    def _looks_up(self, opts: LoadOptions) -> bool:
        """Whether "auto" will draft by lookup alone (_auto): no drafter file, and a target
        without an MTP head of its own. A file that is no GGUF is the load's to refuse, in
        its own words."""
        if not self.chooses or opts.draft_model is not None or opts.model is None:
            return False
        try:
            return not read_header(opts.model).nextn_layers
        except ModelLoadError:
            return False

    def check_backend(self, backend: str) -> None:
        """Refuse a backend that cannot run it, before a load that can take minutes."""
        if self.backend is not None and not getattr(kind_of(backend), self.backend):
            runs = " or ".join(f"--backend {b}" for b in BACKENDS if getattr(kind_of(b), self.backend))
            raise InvalidRequestError(f"the {backend} backend {self.refusal}", f"use {runs} for --strategy {self.name}")

    def check(self, opts: LoadOptions) -> None:
        """Refuse options it cannot run with (the backend, the drafter's file), before a load
        that can take minutes."""
        self.check_backend(opts.backend)
        if self.name in FEATURE_DRAFTERS:
            check_head_file(self.name, opts.draft_model)
        if self.source == "block" and opts.draft_model is not None:
            check_block_file(self.name, opts.draft_model)


# -- how each row's drafter is built --------------------------------------------------------


def _plain(row: Strategy, parts: Parts) -> Plan:
    return _plan(row, parts, NoDrafter(), drafts=False)


def _lookup(row: Strategy, parts: Parts) -> Plan:
    return _plan(row, parts, _ngram(parts), free=True)


def _model(row: Strategy, parts: Parts) -> Plan:
    """A draft model: the caller's, or its file's (a model of its own, an assistant or a head)."""
    draft = parts.draft
    if draft is None and parts.draft_model is not None:
        with announced(f"loading the drafter {os.path.basename(parts.draft_model)}", parts.on_progress):
            backend, options = parts.target.info.backend, dict(parts.backend_options)
            draft = load_drafter(parts.target, parts.draft_model, backend, options)
    if draft is None:
        raise InvalidRequestError(
            f"strategy {row.name!r} needs a draft model", "pass --draft-model PATH (or draft_model=)"
        )
    reason = vocab_mismatch(parts.target.vocab_identity(), draft.vocab_identity())
    if reason:
        if parts.draft is None:  # loaded here: nobody else holds it
            draft.close()
        raise PairMismatchError(
            f"{draft.info.name} cannot draft for {parts.target.info.name}: {reason}",
            "pick a drafter from the target's own family (same tokenizer), or use --strategy ngram",
        )
    kind = draft.capabilities.self_draft
    return _drafting(row, parts, draft, kind if kind in _FILE_LABELS else row.label)  # an assistant or a head: its kind


def _derived(row: Strategy, parts: Parts) -> Plan:
    """A drafter the target's backend derives from the target itself (selfdraft)."""
    if parts.draft is not None:
        return _model(row, parts)
    if parts.draft_model is not None:
        if row.drafter_file == "may" and is_assistant(parts.draft_model):  # the model's MTP head, a file of its own
            return _model(row, parts)
        spelled = f"{row.name}:{parts.option}" if parts.option else row.name
        raise InvalidRequestError(f"strategy {spelled!r} drafts with the target itself; drop --draft-model")
    target = parts.target
    deriving = f"deriving the {row.name} drafter from {target.info.name} (once per model and machine)"
    with announced(deriving, parts.on_progress):
        draft = derive_drafter(target, row.name, parts.option)
    return _drafting(row, parts, draft, draft.capabilities.self_draft or row.label)


def _block(row: Strategy, parts: Parts) -> Plan:
    """A block drafter (DFlash, DSpark): the caller's, or its file's, checked to be of the row's kind."""
    block = parts.block
    if block is None and parts.draft_model is not None:
        check_block_file(row.name, parts.draft_model)
        block = dflash_drafter(parts.target, parts.draft_model, parts.on_progress)
    if block is None:
        raise InvalidRequestError(
            f"strategy {row.name!r} needs a {BLOCK_DRAFTERS[row.name]}",
            "pass its GGUF with --draft-model PATH (or draft_model=)",
        )
    lookup = _ngram(parts) if _adaptive(parts) else None
    return _plan(row, parts, block, block_pass_seconds=block.pass_seconds, lookup=lookup)


def _auto(row: Strategy, parts: Parts) -> Plan:
    """The model's own MTP head where it has one and no drafter is given; the drafter given;
    else n-gram lookup."""
    if parts.block is not None:  # a block drafter names its row (dflash, dspark)
        chosen = TABLE[parts.block.name if parts.block.name in BLOCK_DRAFTERS else "dflash"]
    elif parts.draft is not None or parts.draft_model is not None:
        chosen = TABLE["draft"]
    elif parts.target.capabilities.mtp_layers:
        chosen = TABLE["mtp"]
    else:
        chosen = TABLE["ngram"]
    return chosen.build(chosen, parts)


def _drafting(row: Strategy, parts: Parts, draft: Backend, label: str) -> Plan:
    """A draft model's plan: under the adaptive policy it drafts beside n-gram lookup, taking
    whichever the policy predicts faster at each step; a fixed draft length uses the model alone."""
    lookup = _ngram(parts) if _adaptive(parts) else None
    return _plan(row, parts, ModelDrafter(draft), draft=draft, label=label, lookup=lookup)


def _plan(row: Strategy, parts: Parts, drafter: Drafter, **more: Any) -> Plan:
    found = more.pop("label", None)  # an assistant's, a head's or a derived drafter's own
    label = parts.label or found or row.label
    return Plan(
        row.name,
        parts.target,
        drafter,
        label,
        draft_tokens=parts.draft_tokens,
        calibrate=parts.calibrate,
        memory=parts.memory,
        **more,
    )


def _ngram(parts: Parts) -> NgramDrafter:
    return NgramDrafter(memory=parts.memory, recall_greedy_within=greedy_exact_within(parts.target))


def _adaptive(parts: Parts) -> bool:
    return parts.draft_tokens == "auto" and parts.calibrate


_MTP_REFUSAL = "does not run MTP heads yet"
_ROWS = (
    Strategy("auto", _auto, "chosen", drafter_file="may", exports_as="auto"),
    Strategy("none", _plain, "none", batches=True),
    Strategy("ngram", _lookup, "lookup", peer="llama-lookup", batches=True),
    Strategy(
        "draft", _model, "file", drafter_file="must", exports_as="draft", peer="llama-speculative-simple", batches=True
    ),
    Strategy(
        "dflash",
        _block,
        "block",
        drafter_file="must",
        backend="dflash",
        refusal="does not run DFlash drafters",
        exports_as="dflash",
        batches=True,
    ),
    # A DFlash drafter with a Markov head (llama.cpp's draft-dspark): a block per pass, as dflash.
    Strategy(
        "dspark",
        _block,
        "block",
        drafter_file="must",
        backend="dflash",
        refusal="does not run DSpark drafters",
        exports_as="dspark",
        batches=True,
    ),
    Strategy("eagle3", _model, "file", drafter_file="must", exports_as="eagle3", batches=True),
    Strategy("qspec", _derived, "derived", option="TYPE"),
    Strategy("layerskip", _derived, "derived", option="L"),
    # The model's own MTP head, or its assistant (Gemma 4's), a file of its own.
    Strategy(
        "mtp",
        _derived,
        "derived",
        drafter_file="may",
        backend="mtp",
        refusal=_MTP_REFUSAL,
        exports_as="mtp",
        batches=True,
    ),
)
TABLE = {row.name: row for row in _ROWS}
# Drafters in files that name their own kind (capabilities.self_draft): they label the plan.
_FILE_LABELS = ("mtp", *FEATURE_DRAFTERS)


def named(strategy: str) -> tuple[Strategy, str | None]:
    """The row of a strategy as a user spells it ("qspec:Q4_0": qspec's, with "Q4_0"); an
    unknown one is refused with the choices named."""
    name, colon, option = strategy.partition(":")
    row = TABLE.get(name)
    if row is None or (colon and row.source != "derived"):
        raise InvalidRequestError(f"unknown strategy {strategy!r}", f"choose one of: {EVERY_STRATEGY}")
    return row, option or None


def check(opts: LoadOptions) -> Strategy:
    """The row of opts.strategy, with what it needs of the backend and the drafter's file
    checked before a load that can take minutes."""
    row, _ = named(opts.strategy)
    row.check(opts)
    return row


def resolve(opts: LoadOptions, target: Backend, on_progress: Announce | None = None) -> Plan:
    """The plan of a load: opts.strategy's row builds its drafter for `target`, loading
    opts.draft_model where it drafts with one."""
    row, option = named(opts.strategy)
    parts = Parts(
        target,
        option,
        draft_model=opts.draft_model,
        backend_options=opts.backend_options(),
        draft_tokens=opts.draft_tokens,
        calibrate=opts.calibrate,
        memory=NgramMemory() if opts.memory else None,
        on_progress=on_progress,
    )
    return _built(row, parts)


def plan(target: Backend, draft: Backend | None = None, strategy: str = "auto", **choices: Any) -> Plan:
    """The plan of drafters a caller loaded itself (a draft model, or a block drafter as
    block=); choices are Parts' fields: draft_tokens, calibrate, memory, label."""
    row, option = named(strategy)
    return _built(row, Parts(target, option, draft, **choices))


def _built(row: Strategy, parts: Parts) -> Plan:
    draft_tokens = parts.draft_tokens
    if draft_tokens != "auto" and (not isinstance(draft_tokens, int) or draft_tokens < 0):
        raise InvalidRequestError(f"draft_tokens must be 'auto' or a whole number >= 0, got {draft_tokens!r}")
    return row.build(row, parts)


# -- what one request asks of the plan ------------------------------------------------------


@dataclass(frozen=True)
class Speculation:
    """How one request speculates (stream(speculation=...)), within what the runtime loaded.
    strategy: "none" decodes plainly (no drafter guesses, not even n-gram lookup); "auto" or
    the runtime's own strategy drafts with its drafter (another would need another load).
    draft_tokens: a fixed draft length for this request ("auto": the runtime's policy; 0: none).
    max_draft: the longest draft a step verifies (llama-server's speculative.n_max; None: the
    backend's block). min_confidence: the probability under which a draft model or a head
    ends a draft (llama-server's speculative.p_min, localspec.drafters.model says how the two
    differ; None: the drafter's own, 0.3; 0: never). Answers are the same whatever is chosen:
    only the speed changes."""

    strategy: str = "auto"
    draft_tokens: DraftTokens = "auto"
    max_draft: int | None = None
    min_confidence: float | None = None

    @classmethod
    def of(cls, value: Speculation | Mapping[str, Any] | None) -> Speculation:
        """A Speculation from itself, a dict of its fields ({"strategy": "none"}), or None."""
        if value is None:
            return cls()
        if isinstance(value, Speculation):
            return value
        if not isinstance(value, Mapping):
            raise InvalidRequestError(
                f"speculation must be a Speculation or a dict, got {type(value).__name__}",
                'e.g. speculation={"strategy": "none"} or {"draft_tokens": 4}',
            )
        unknown = sorted(set(value) - SPECULATION_FIELDS)
        if unknown:
            raise InvalidRequestError(
                f"unknown speculation field {unknown[0]!r}",
                "speculation takes strategy, draft_tokens, max_draft and min_confidence",
            )
        return cls(**value)


SPECULATION_FIELDS = frozenset(f.name for f in fields(Speculation))


@dataclass(frozen=True)
class Drafting:
    """What the engine does for one request: whether a drafter guesses at all, a policy of its
    own (None: the runtime's), the longest draft, and what its stats call the strategy."""

    guess: bool = True
    policy: DraftLengthPolicy | None = None
    max_draft: int | None = None
    label: str | None = None  # None: the runtime's
    min_confidence: float | None = None  # Speculation's: None, the drafter's own floor


def drafting(plan: Plan, asked: Speculation) -> Drafting:
    """What `asked` means for a runtime built from `plan`; a strategy other than its own, or a
    length that is no length, is refused with the fix named."""
    if not isinstance(asked.strategy, str):
        raise InvalidRequestError(f"speculation strategy must be a name, got {asked.strategy!r}")
    row, _ = named(asked.strategy)
    if row.name not in ("auto", "none", plan.strategy):
        raise InvalidRequestError(
            f"this runtime drafts with {plan.label} ({plan.strategy}); a request cannot switch to {asked.strategy!r}",
            f'ask for "auto" (its own drafter) or "none" (plain decoding), or load with strategy={asked.strategy!r}',
        )
    tokens, longest = asked.draft_tokens, asked.max_draft
    if tokens != "auto" and (not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0):
        raise InvalidRequestError(f"speculation draft_tokens must be 'auto' or a whole number >= 0, got {tokens!r}")
    if longest is not None and (not isinstance(longest, int) or isinstance(longest, bool) or longest < 0):
        raise InvalidRequestError(f"speculation max_draft must be a whole number >= 0 or None, got {longest!r}")
    floor = asked.min_confidence
    if floor is not None and (isinstance(floor, bool) or not isinstance(floor, int | float) or not 0 <= floor <= 1):
        raise InvalidRequestError(
            f"speculation min_confidence must be a probability from 0 to 1 or None, got {floor!r}",
            "e.g. 0.5 (a draft ends after a token the drafter gives under 50 %), 0 (never), None (its own 0.3)",
        )
    if row.name == "none" or tokens == 0 or longest == 0:
        return Drafting(guess=False, policy=fixed_policy(0), label="none")  # the runtime's policy learns nothing
    policy = None if tokens == "auto" else fixed_policy(tokens)
    return Drafting(policy=policy, max_draft=longest, min_confidence=None if floor is None else float(floor))


# -- drafters derived from the target ----------------------------------------------------


def derive_drafter(target: Backend, kind: str, option: str | None) -> Backend:
    """The self-drafter of strategy f"{kind}:{option}" (see localspec.control.selfdraft), made by the
    target's own backend; its label is capabilities.self_draft."""
    if not isinstance(target, SelfDrafting):
        raise InvalidRequestError(
            f"the {target.info.backend} backend cannot derive a drafter from its model", "use --strategy ngram or draft"
        )
    row = TABLE[kind]
    if row.backend is not None and not getattr(kind_of(target.info.backend), row.backend):
        raise InvalidRequestError(
            f"the {target.info.backend} backend {row.refusal}", f"use --backend llamacpp for --strategy {kind}"
        )
    return target.make_self_drafter(kind, option)
