"""One thread runs every llama.cpp pass that uses more than one CPU thread, whichever thread
asks for it.

ggml's CPU backend (built with OpenMP here) splits a pass over a team of worker threads that
belongs to the thread calling llama_decode, and the team meets at an OpenMP barrier after
every graph node. libgomp spins at a barrier only while the process's OpenMP threads fit its
CPUs. A team lives as long as its calling thread, so once a second living thread has run a
pass, every barrier of every pass sleeps and wakes instead: a pass 30-45 % slower on 2 cores
(benchmarks/raw_loop.py threads). Apps do call from many threads: a UI thread that loads and
a worker that answers, asyncio's reader thread per stream, a server's thread per request.
Handing a pass over costs a thread's wake-up each way (31 us on the 2-core EPYC with nothing
to compute, benchmarks/api_threads.py), and a pass on one CPU thread makes no team: it runs
where it is asked.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from . import library

llama = library.llama

R = TypeVar("R")

_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_ident: int | None = None  # the compute thread's, once it has started
_in_place = False  # in_place()'s block runs


def _mark() -> None:
    global _ident
    _ident = threading.get_ident()


def _thread() -> ThreadPoolExecutor:
    global _executor
    with _lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="localspec-compute", initializer=_mark)
        return _executor


def _forget() -> None:
    """In a forked child the thread is gone: the next pass starts another."""
    global _executor, _ident, _lock
    _executor, _ident, _lock = None, None, threading.Lock()


os.register_at_fork(after_in_child=_forget)


def run(threads: int, fn: Callable[..., R], *args: Any) -> R:
    """fn(*args), a pass on `threads` CPU threads: on the compute thread where it takes more
    than one (here, where already on it), else on the caller's."""
    if threads <= 1 or _in_place or threading.get_ident() == _ident:
        return fn(*args)
    return _there(fn, *args)


@contextmanager
def in_place() -> Iterator[None]:
    """run()'s passes run on the thread that asks while the block runs, for a process whose
    threads run passes one at a time and end with their work, each team with its thread
    (`localspec run`'s main thread; `serve`'s thread a request, its models loaded on one of
    their own: localspec/cli/main.py). There a team built each request costs less than two
    wake-ups each pass: at 2 threads serving read 0.95x-0.96x llama-server handing passes over,
    0.98x in place (benchmarks/pages/threads.md). A pool's shared passes still run on the
    compute thread (run_there)."""
    global _in_place
    before, _in_place = _in_place, True
    try:
        yield
    finally:
        _in_place = before


def run_there(fn: Callable[..., R], *args: Any) -> R:
    """fn(*args) on the compute thread, whatever its passes' threads (a shared pass's
    bookkeeping with it: lanes.py)."""
    if threading.get_ident() == _ident:
        return fn(*args)
    return _there(fn, *args)


def _there(fn: Callable[..., R], *args: Any) -> R:
    try:
        future = _thread().submit(fn, *args)
    except RuntimeError:  # the interpreter is shutting down and starts no thread: a last pass runs here
        return fn(*args)
    return wait(future)


def wait(future: Future[R]) -> R:
    """The pass's result. A caller interrupted meanwhile (KeyboardInterrupt) waits the pass
    out before it raises: the context must not be touched while the pass still runs."""
    try:
        return future.result()
    except BaseException:
        futures.wait([future])
        raise


def decode(ctx: Any, batch: Any) -> int:
    """llama_decode, on the compute thread where the context's passes use several threads."""
    return run(llama.llama_n_threads_batch(ctx), _decode, ctx, batch)


def _decode(ctx: Any, batch: Any) -> int:
    return int(llama.llama_decode(ctx, batch))  # looked up now: fault injection patches it


def process(ctx: Any, kind: int, batch: Any) -> int:
    """llama_process (the staging API heads use), as decode(). A lane's heads and drafters
    (lanes.py) call it from the compute thread, where their merged passes run (head_passes.py)."""
    return run(llama.llama_n_threads_batch(ctx), _process, ctx, kind, batch)


def _process(ctx: Any, kind: int, batch: Any) -> int:
    return int(llama.llama_process(ctx, kind, batch))
