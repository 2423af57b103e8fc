"""Runtimes that serve requests side by side: one per lane of a model loaded for shared passes
(backends/llamacpp/lanes.py), each with its own drafter, policy, grammar and stop state; or a
single runtime. What `serve --parallel N` runs its generation threads on, one per runtime.

Strategies whose drafter is the request's own state (plain decoding, n-gram lookup) batch, and
so does a draft model of its own: it is loaded once with as many lanes, lane i drafting for
lane i, its passes shared too (backends/llamacpp/lanes.py, `beside=`). So do drafters that
read the target's hidden states: the model's own MTP head (auto on a Qwen3.5/3.6 GGUF that
ships one), an EAGLE-3 head, a DFlash or DSpark block drafter, each lane with a context of its
own reading that lane's rows (a drafter file's weights loaded once), and Gemma 4's assistant,
reading the lane's stream of the target's KV cache, the lanes' drafts in shared passes too.
The derived self-drafters (qspec, layerskip) keep a drafter's cache of their own: such a pair
is served one request at a time, and the pool says why (`note`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Protocol, Unpack, runtime_checkable

from localspec.assembly import Calibrated, assemble, calibrate
from localspec.common.progress import Announce, announced
from localspec.control.factory import shared_policy
from localspec.core.backend_loader import load_backend
from localspec.core.choices import ReusePrefix
from localspec.core.errors import InvalidRequestError, LocalspecError, NotSharedError
from localspec.core.options import LoadOptions
from localspec.core.protocol import Backend, SharesPasses
from localspec.dispatch import Dispatcher, Ticket
from localspec.drafters.files import head_kind, is_assistant
from localspec.drafters.memory import NgramMemory
from localspec.prompts import Prompt
from localspec.request import Options
from localspec.runtime import Completion, Runtime
from localspec.strategies import TABLE, Plan, named, plan, resolve

# More lanes than this gain nothing on a consumer machine (a pass's cost grows with its rows)
# and cost a context of n_ctx cells each.
MOST_LANES = 16


PromptGiven = str | Sequence[int] | Prompt | None  # a call's prompt, as Runtime.generate() takes it


class Lane(Backend, SharesPasses, Protocol):
    """A backend's sequence whose blocks share passes with the other lanes'."""


class LaneHost(Protocol):
    lanes: Sequence[Lane]

    def busy_lanes(self) -> int:
        """The lanes inside a request now."""
        ...

    def passes(self) -> int:
        """The passes it has run for its lanes (llama_decode calls), shared or not."""
        ...


@runtime_checkable
class HostsLanes(Protocol):
    """A backend loaded with lanes=N (llama.cpp's)."""

    def lane_host(self, beside: object = None) -> LaneHost:
        """Its lanes; beside: the target's host, where this model drafts for it."""
        ...


class Pool:
    """Runtimes whose requests may run at once, each from its own thread or task; close() frees
    them and what they share. Its dispatcher (localspec.dispatch) decides which request gets
    which runtime, for an app's lane()/generate()/agenerate() and a server's jobs alike: in the
    order they asked, each on the free runtime caching the most of its prompt."""

    def __init__(
        self,
        runtimes: tuple[Runtime, ...],
        release: Callable[[], None],
        note: str | None = None,
        max_waiting: int | None = None,
        passes: Callable[[], int] | None = None,
    ) -> None:
        """max_waiting: how many requests may wait for a runtime (None: any number); one more
        is refused with LineFullError. passes: how many passes the target's lanes have run."""
        self.runtimes = runtimes
        self._release = release  # frees the runtimes and the model they share
        self.note = note  # why fewer runtimes than asked for, if so
        self.dispatch = Dispatcher(len(runtimes), self._cached, max_waiting)
        self._passes = passes

    def shared_passes(self) -> int | None:
        """The target passes its lanes have run since it was loaded, each holding the blocks
        of every lane that waited (llama-server's n_decode_total); None without lanes."""
        return self._passes() if self._passes is not None else None

    @classmethod
    def single(
        cls, runtime: Runtime, owned: bool = True, note: str | None = None, max_waiting: int | None = None
    ) -> Pool:
        """One runtime: closed with the pool when owned (not an app's own, lent to a server)."""
        return cls((runtime,), runtime.close if owned else _none, note, max_waiting)

    @property
    def label(self) -> str:
        return self.runtimes[0].label

    def _cached(self, lane: int, prompt: Sequence[int]) -> tuple[int, int]:
        return self.runtimes[lane].engine.keeps(prompt)

    @contextmanager
    def lane(
        self, timeout: float | None = None, prompt: Prompt | None = None, reuse: ReusePrefix = "any"
    ) -> Iterator[Runtime]:
        """A runtime no other caller holds until the block ends, once the requests that asked
        before have theirs: the free one caching the most of prompt (a runtime.prepare()) that a
        request reusing its cache so (reuse_prefix) keeps, waiting at most timeout seconds (None:
        as long as it takes), then RuntimeBusyError."""
        ticket = self.dispatch.enter(Ticket(prompt.ids if prompt is not None else None, reuse=reuse))
        try:
            index = self.dispatch.wait(ticket, timeout)
            yield self.runtimes[index]
        finally:
            self.dispatch.leave(ticket)

    @asynccontextmanager
    async def alane(
        self, timeout: float | None = None, prompt: Prompt | None = None, reuse: ReusePrefix = "any"
    ) -> AsyncIterator[Runtime]:
        """lane() for asyncio (`async with pool.alane() as runtime:`, then its astream()): the
        event loop runs on while the request waits, and a cancelled task frees its runtime."""
        ticket = self.dispatch.enter(Ticket(prompt.ids if prompt is not None else None, reuse=reuse))
        try:
            index = await self.dispatch.await_lane(ticket, timeout)
            yield self.runtimes[index]
        finally:
            self.dispatch.leave(ticket)

    def _tokenized(self, prompt: PromptGiven, request: dict[str, Any]) -> Prompt | None:
        """The request's prompt tokenized once (its messages= taken out of request), so it runs
        on the runtime caching the most of it; None for a single runtime (nothing to choose:
        the request goes as given) and for a chat offered tools, which its runtime renders."""
        if len(self.runtimes) == 1 or request.get("tools") is not None:
            return None
        if isinstance(prompt, Prompt):
            return prompt
        return self.runtimes[0].prepare(prompt, request.pop("messages", None))

    def generate(
        self, prompt: PromptGiven = None, *, lane_timeout: float | None = None, **options: Unpack[Options]
    ) -> Completion:
        """Runtime.generate() on a runtime of the pool: several threads may call it at once."""
        request: dict[str, Any] = dict(options)
        tokenized = self._tokenized(prompt, request)
        with self.lane(lane_timeout, tokenized, request.get("reuse_prefix", "any")) as runtime:
            return runtime.generate(tokenized or prompt, **request)

    async def agenerate(
        self, prompt: PromptGiven = None, *, lane_timeout: float | None = None, **options: Unpack[Options]
    ) -> Completion:
        """Runtime.agenerate() on a runtime of the pool: several tasks may await it at once,
        and the event loop is never blocked. Cancelling the task stops its request and frees
        its runtime for the next."""
        request: dict[str, Any] = dict(options)
        tokenized = await asyncio.to_thread(self._tokenized, prompt, request)
        async with self.alane(lane_timeout, tokenized, request.get("reuse_prefix", "any")) as runtime:
            return await runtime.agenerate(tokenized or prompt, **request)

    def close(self) -> None:
        self.dispatch.close()
        self._release()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _none() -> None:
    return None


def check_parallel(parallel: object) -> int:
    if isinstance(parallel, bool) or not isinstance(parallel, int) or not 1 <= parallel <= MOST_LANES:
        raise InvalidRequestError(
            f"parallel must be a whole number from 1 to {MOST_LANES}, got {parallel!r}",
            "pass --parallel N (1: one request at a time)",
        )
    return parallel


DEFAULT_LANES = 4  # llama-server's default slots too


def default_parallel(opts: LoadOptions) -> int:
    """The lanes `serve` runs when none are asked for: DEFAULT_LANES, fewer where that many
    lanes (lane_estimate) would take more than a quarter of the memory free now."""
    import psutil

    try:
        per_lane = max(lane_estimate(opts), 1)
    except (LocalspecError, OSError):  # the load says what is wrong with the file, and how to fix it
        return 1
    return int(max(1, min(DEFAULT_LANES, psutil.virtual_memory().available // 4 // per_lane)))


def lane_estimate(opts: LoadOptions) -> int:
    """One lane's bytes (backends/llamacpp/lane_memory.py): a sequence of the target's context,
    with the lane's cache of the drafter file where the strategy loads one, or of the target's
    own MTP head where `auto` or `mtp` may draft with it."""
    from localspec.backends.llamacpp.lane_memory import lane_bytes

    assert opts.model is not None
    row = named(opts.strategy)[0]
    drafter = opts.draft_model if row.drafter_file != "never" else None
    return int(lane_bytes(opts.model, opts.n_ctx, drafter, row.source in ("chosen", "derived")))


def batches(opts: LoadOptions) -> str | None:
    """Why opts cannot run in shared passes, or None where they can (checked before a load)."""
    row, _ = named(opts.strategy)
    if opts.backend != "llamacpp":
        return f"shared passes are llama.cpp's; the {opts.backend} backend serves one request at a time"
    if opts.rpc:
        return "shared passes run on this machine (its CPU or GPU); with --rpc one request runs at a time"
    if not row.batches and not row.chooses:
        return (
            f"strategy {row.name!r} keeps a drafter's cache of its own, which shared passes do not serve yet: "
            "one request runs at a time "
            "(plain decoding, n-gram lookup, a draft model and drafters reading the target batch)"
        )
    return None


def shared_pricing(calibrated: Calibrated, target: Backend, busy: Callable[[], int]) -> Calibrated:
    """A lane's policy pricing its drafts on what they add to a pass shared with the other busy
    lanes (control.factory.shared_policy); a fixed draft length as it is."""
    if calibrated.priced is None:
        return calibrated
    shared = shared_policy(calibrated.priced, target, busy)
    return Calibrated(shared, shared)


def load_pool(
    model: str | LoadOptions | None = None,
    *,
    parallel: int | None = None,
    max_waiting: int | None = None,
    on_progress: Announce | None = None,
    **options: Any,
) -> Pool:
    """localspec.load()'s model and options in `parallel` lanes (None: default_parallel), a
    runtime each, whose passes are shared. Where the strategy cannot batch (batches()), one
    runtime and the reason in Pool.note. max_waiting: how many requests may wait for a runtime
    (None: any number); one more gets LineFullError."""
    from localspec.api import load, resolved_files

    given = dict(vars(model)) | options if isinstance(model, LoadOptions) else {"model": model, **options}
    opts = resolved_files(LoadOptions.of(**given), on_progress)
    assert opts.model is not None
    why = batches(opts)
    if parallel is None:  # a pair that cannot batch is not told so: it was not asked to
        parallel = 1 if why is not None else default_parallel(opts)
        why = None
    parallel = check_parallel(parallel)
    if parallel == 1 or why is not None:
        return Pool.single(load(opts, on_progress=on_progress), True, why if parallel > 1 else None, max_waiting)
    backends = _lane_backends(opts, parallel, on_progress)
    try:
        runtimes = _lane_runtimes(opts, backends, on_progress)
    except NotSharedError as exc:  # found only once the files are open (an M-RoPE projector, what auto chose)
        _close(backends)
        return Pool.single(
            load(opts, on_progress=on_progress), True, f"{exc.message}: one request runs at a time", max_waiting
        )
    except BaseException:
        _close(backends)
        raise

    def release() -> None:
        for runtime in runtimes:
            runtime.close()
        _close(backends)

    target = backends[0]
    passes = target.lane_host().passes if isinstance(target, HostsLanes) else None
    return Pool(tuple(runtimes), release, max_waiting=max_waiting, passes=passes)


def _lane_backends(opts: LoadOptions, parallel: int, on_progress: Announce | None) -> list[Backend]:
    """The target loaded with `parallel` lanes, and the draft model beside it with as many
    (one model each, a KV stream per lane: backends/llamacpp/lanes.py)."""
    assert opts.model is not None
    with announced(f"loading {os.path.basename(opts.model)} for {parallel} requests at once", on_progress):
        sees = {"mmproj": opts.mmproj} if opts.mmproj is not None else {}  # the target's alone, not a drafter's
        row = named(opts.strategy)[0]
        loaded = [load_backend("llamacpp", opts.model, **row.target_options(opts, "llamacpp"), lanes=parallel, **sees)]
    reads_target = row.source == "block" or head_kind(opts.draft_model or "") or is_assistant(opts.draft_model or "")
    if opts.draft_model is None or row.drafter_file == "never" or reads_target:
        return loaded  # no draft model drafts, or one that reads the target does: a context of its own per lane
    try:
        with announced(f"loading the drafter {os.path.basename(opts.draft_model)} with {parallel} lanes", on_progress):
            loaded.append(load_backend("llamacpp", opts.draft_model, **opts.backend_options(), lanes=parallel))
    except BaseException:
        _close(loaded)
        raise
    return loaded


def _lane_runtimes(opts: LoadOptions, backends: list[Backend], on_progress: Announce | None) -> list[Runtime]:
    """A runtime per lane, each with its own drafter (lane i of the draft model's host where
    one drafts, or the model's MTP head for that lane) and its policy priced on shared passes;
    NotSharedError where auto chose a drafter that lanes do not serve."""
    target = backends[0]
    assert isinstance(target, HostsLanes)
    host = target.lane_host()
    drafts = _drafter_lanes(backends[1], host) if len(backends) > 1 else None
    runtimes: list[Runtime] = []
    try:
        for i, lane in enumerate(host.lanes):
            draft = drafts[i] if drafts is not None else None
            planned = _lane_plan(opts, lane, draft, on_progress)
            if not TABLE[planned.strategy].batches:
                planned.close()
                raise NotSharedError(f"{opts.strategy} chose {planned.label}, which shared passes do not serve yet")
            priced = shared_pricing(calibrate(planned, on_progress), lane, host.busy_lanes)
            for used in (lane, draft):  # calibration may have run passes: they hold the others up no more
                if used is not None:
                    used.idle()
            runtimes.append(Runtime(planned, assemble(planned, priced, opts.trees)))
    except BaseException:
        for runtime in runtimes:
            runtime.plan.close()
        raise
    return runtimes


def _drafter_lanes(draft: Backend, host: LaneHost) -> Sequence[Lane]:
    """The draft model's lanes, taking turns with the target's (lane i drafts for lane i)."""
    assert isinstance(draft, HostsLanes)
    return draft.lane_host(beside=host).lanes


def _lane_plan(opts: LoadOptions, lane: Lane, draft: Lane | None, on_progress: Announce | None) -> Plan:
    """One lane's plan: opts' strategy for the lane, drafting with the draft model's lane."""
    if draft is None:
        return resolve(opts, lane, on_progress)
    memory = NgramMemory() if opts.memory else None
    return plan(
        lane,
        draft,
        opts.strategy,
        draft_tokens=opts.draft_tokens,
        calibrate=opts.calibrate,
        memory=memory,
        on_progress=on_progress,
    )


def _close(backends: list[Backend]) -> None:
    """The drafter first: its lanes take turns with the target's."""
    for backend in reversed(backends):
        backend.close()
