"""Runtimes that serve requests side by side: one per lane of a model loaded for shared passes
(backends/llamacpp/lanes.py), each with its own drafter, policy, grammar and stop state; or a
single runtime. What `serve --parallel N` runs its generation threads on, one per runtime.

Only strategies whose drafter is the request's own state (plain decoding, n-gram lookup)
batch: a draft model, a head or a block drafter keeps a cache of its own that would need lanes
too. Such a pair is served one request at a time, and the pool says why (`note`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Protocol, runtime_checkable

from localspec.assembly import Calibrated, assemble, calibrate
from localspec.control.costs import SharedPassCurve
from localspec.core.backend_loader import load_backend
from localspec.core.errors import InvalidRequestError, LocalspecError, RuntimeBusyError
from localspec.core.options import LoadOptions
from localspec.core.progress import Announce, announced
from localspec.core.protocol import Backend, SharesPasses
from localspec.runtime import Completion, Runtime
from localspec.strategies import TABLE, named, resolve

# More lanes than this gain nothing on a consumer machine (a pass's cost grows with its rows)
# and cost a context of n_ctx cells each.
MOST_LANES = 16


class Lane(Backend, SharesPasses, Protocol):
    """A backend's sequence whose blocks share passes with the other lanes'."""


class LaneHost(Protocol):
    lanes: list[Lane]

    def busy_lanes(self) -> int:
        """The lanes inside a request now."""
        ...


@runtime_checkable
class HostsLanes(Protocol):
    """A backend loaded with lanes=N (llama.cpp's)."""

    def lane_host(self) -> LaneHost: ...


class Pool:
    """Runtimes whose requests may run at once, each from its own thread; close() frees them
    and what they share. An app takes a free one with lane() (or generate() in one call); a
    server runs a generation thread per runtime (localspec.server.worker)."""

    def __init__(self, runtimes: tuple[Runtime, ...], release: Callable[[], None], note: str | None = None) -> None:
        self.runtimes = runtimes
        self._release = release  # frees the runtimes and the model they share
        self.note = note  # why fewer runtimes than asked for, if so
        self._free = list(range(len(runtimes)))
        self._cond = threading.Condition()

    @classmethod
    def single(cls, runtime: Runtime, owned: bool = True, note: str | None = None) -> Pool:
        """One runtime: closed with the pool when owned (not an app's own, lent to a server)."""
        return cls((runtime,), runtime.close if owned else _none, note)

    @property
    def label(self) -> str:
        return self.runtimes[0].label

    @contextmanager
    def lane(self, timeout: float | None = None) -> Iterator[Runtime]:
        """A runtime no other caller holds until the block ends: the first free one, waiting
        at most timeout seconds (None: as long as it takes) for one to come free."""
        with self._cond:
            if not self._cond.wait_for(lambda: bool(self._free), timeout):
                raise RuntimeBusyError(
                    f"all {len(self.runtimes)} runtimes were busy for {timeout} s",
                    "wait longer (timeout=None waits), or load the pool with a larger parallel",
                )
            index = self._free.pop(0)
        try:
            yield self.runtimes[index]
        finally:
            with self._cond:
                self._free.append(index)
                self._free.sort()  # the lowest first: lanes side by side share passes best
                self._cond.notify()

    def generate(self, prompt: Any = None, **request: Any) -> Completion:
        """Runtime.generate() on a free runtime: several threads may call it at once."""
        with self.lane(request.pop("lane_timeout", None)) as runtime:
            return runtime.generate(prompt, **request)

    def close(self) -> None:
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


def default_parallel(path: str, n_ctx: int) -> int:
    """The lanes `serve` runs when none are asked for: DEFAULT_LANES, fewer where that many
    contexts of n_ctx would take more than a quarter of the memory free now."""
    import psutil

    from localspec.core.gguf_header import read_header

    try:
        per_lane = max(n_ctx * read_header(path).kv_bytes_per_token, 1)
    except (LocalspecError, OSError):  # the load says what is wrong with the file, and how to fix it
        return 1
    return int(max(1, min(DEFAULT_LANES, psutil.virtual_memory().available // 4 // per_lane)))


def batches(opts: LoadOptions) -> str | None:
    """Why opts cannot run in shared passes, or None where they can (checked before a load)."""
    row, _ = named(opts.strategy)
    if opts.backend != "llamacpp":
        return f"shared passes are llama.cpp's; the {opts.backend} backend serves one request at a time"
    if opts.rpc or (opts.gpu_layers or 0) > 0:
        return "shared passes run on this machine's CPU; with --rpc or --gpu-layers one request runs at a time"
    if opts.mmproj is not None:
        return "a model that reads images (--mmproj) is served one request at a time: lanes read text only yet"
    if opts.draft_model is not None or (not row.batches and not row.chooses):
        return (
            f"strategy {row.name!r} keeps a drafter's cache of its own, which shared passes do not serve yet: "
            "one request runs at a time (n-gram lookup and plain decoding batch)"
        )
    return None


def shared_pricing(calibrated: Calibrated, busy: Callable[[], int]) -> Calibrated:
    """A lane's policy pricing its drafts on what they add to a pass shared with the other busy
    lanes (control.costs.SharedPassCurve); a fixed draft length as it is."""
    priced = calibrated.priced
    if priced is None:
        return calibrated
    shared = replace(priced, costs=SharedPassCurve.sharing(priced.costs, busy))
    return Calibrated(shared, shared)


def load_pool(
    model: str | LoadOptions | None = None,
    *,
    parallel: int | None = None,
    on_progress: Announce | None = None,
    **options: Any,
) -> Pool:
    """localspec.load()'s model and options in `parallel` lanes (None: default_parallel), a
    runtime each, whose passes are shared. Where the strategy cannot batch (batches()), one
    runtime and the reason in Pool.note."""
    from localspec.api import load, resolved_files

    given = dict(vars(model)) | options if isinstance(model, LoadOptions) else {"model": model, **options}
    opts = resolved_files(LoadOptions.of(**given), on_progress)
    assert opts.model is not None
    why = batches(opts)
    if parallel is None:  # a pair that cannot batch is not told so: it was not asked to
        parallel, why = (1, None) if why is not None else (default_parallel(opts.model, opts.n_ctx), None)
    parallel = check_parallel(parallel)
    if parallel == 1 or why is not None:
        return Pool.single(load(opts, on_progress=on_progress), note=why if parallel > 1 else None)
    with announced(f"loading {os.path.basename(opts.model)} for {parallel} requests at once", on_progress):
        backend = load_backend("llamacpp", opts.model, **opts.backend_options(), lanes=parallel)
    runtimes: list[Runtime] = []
    try:
        assert isinstance(backend, HostsLanes)
        host = backend.lane_host()
        for lane in host.lanes:
            plan = resolve(opts, lane, on_progress)
            if not TABLE[plan.strategy].batches:  # auto chose a drafter of the model's own (mtp)
                plan.close()
                break
            priced = shared_pricing(calibrate(plan, on_progress), host.busy_lanes)
            runtimes.append(Runtime(plan, assemble(plan, priced, opts.trees)))
    except BaseException:
        for runtime in runtimes:
            runtime.plan.close()
        backend.close()
        raise
    if len(runtimes) < parallel:
        for runtime in runtimes:
            runtime.plan.close()
        backend.close()
        why = "the model drafts for itself (its MTP head), which shared passes do not serve yet"
        return Pool.single(load(opts, on_progress=on_progress), note=f"{why}: one request runs at a time")

    def release() -> None:
        for runtime in runtimes:
            runtime.close()
        backend.close()

    return Pool(tuple(runtimes), release)
