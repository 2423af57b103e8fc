"""Fault injection for the runtime: Ctrl+C at random points of prefill and decode, cancelled
and abandoned streams, and a check after each that the runtime answers exactly as a fresh
one does. Shared by tests/robustness/test_fault_injection.py (a few cases per backend, for CI) and
benchmarks/fault_injection.py (the full counts, printed as a table)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from localspec.api import Runtime

GREEDY: dict[str, Any] = {"temperature": 0}
LONG_PROMPT = "A river starts in the hills, gathers rain and snow, and runs to the sea. " * 12
CHECK_PROMPT = "Name three things a river carries."
CHECK_TOKENS = 12
SHORT_PROMPT = "A river starts in the hills and runs to the sea. " * 3  # for 256-token tiny models


@dataclass
class Tally:
    """Cases tried and the ones that failed, with why."""

    name: str
    tried: int = 0
    failures: list[str] = field(default_factory=list)

    def row(self) -> str:
        return f"| {self.name} | {self.tried} | {len(self.failures)} |"


# An injector patches the lowest level call that fills a cache (llama_decode, a forward
# pass) so that the k-th call raises KeyboardInterrupt after its work is done: the moment
# a Ctrl+C is most harmful, the cache filled but the backend's record not yet updated.
Injector = Callable[[Runtime, Callable[[], bool]], contextlib.AbstractContextManager[None]]


@contextlib.contextmanager
def patched(owner: Any, name: str, fire: Callable[[], bool]) -> Iterator[None]:
    real = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        if fire():
            raise KeyboardInterrupt
        return out

    setattr(owner, name, wrapper)
    try:
        yield
    finally:
        setattr(owner, name, real)


def answer(rt: Runtime) -> str:
    return rt.generate(CHECK_PROMPT, max_tokens=CHECK_TOKENS, **GREEDY).text


def count_calls(rt: Runtime, inject: Injector, prompt: str = LONG_PROMPT) -> int:
    calls = 0

    def never() -> bool:
        nonlocal calls
        calls += 1
        return False

    with inject(rt, never):
        rt.generate(prompt, max_tokens=16, **GREEDY)
    return calls


def interrupts(
    rt: Runtime, expected: str, inject: Injector, cases: int, seed: int, name: str, prompt: str = LONG_PROMPT
) -> Tally:
    """Ctrl+C at `cases` random low-level calls of a long prompt and its answer; after each,
    the runtime must give `expected` (a fresh runtime's greedy answer)."""
    tally = Tally(name)
    rng = np.random.default_rng(seed)
    total = count_calls(rt, inject, prompt)
    for _ in range(cases):
        at = int(rng.integers(1, total + 1))
        seen = [0]

        def fire(at: int = at, seen: list[int] = seen) -> bool:
            seen[0] += 1
            return seen[0] == at

        tally.tried += 1
        try:
            with inject(rt, fire):
                rt.generate(prompt, max_tokens=16, **GREEDY)
        except KeyboardInterrupt:
            pass
        try:
            got = answer(rt)
        except Exception as exc:  # the failure this suite exists to catch
            tally.failures.append(f"call {at}/{total}: {exc!r}")
            continue
        if got != expected:
            tally.failures.append(f"call {at}/{total}: answered {got!r}")
    return tally


def cancelled_streams(rt: Runtime, expected: str, cases: int, seed: int, name: str) -> Tally:
    """Streams ended early every way a caller can (break, close, cancel event, dropped),
    then the greedy answer must match a fresh runtime's."""
    tally = Tally(name)
    rng = np.random.default_rng(seed)
    for i in range(cases):
        stop_after = int(rng.integers(0, 6))
        cancel = threading.Event()
        stream = rt.stream(LONG_PROMPT if i % 2 else CHECK_PROMPT, max_tokens=24, cancel=cancel, **GREEDY)
        tally.tried += 1
        try:
            for n, _ in enumerate(stream):
                if n >= stop_after:
                    if i % 3 == 0:
                        cancel.set()
                        continue  # the stream ends itself with finish reason "cancelled"
                    if i % 3 == 1:
                        stream.close()
                    break
            del stream
        except Exception as exc:
            tally.failures.append(f"stream {i}: {exc!r}")
    got = answer(rt)
    if got != expected:
        tally.failures.append(f"after {cases} streams: answered {got!r}")
    return tally


def abandoning_threads(rt: Runtime, expected: str, cases: int, seed: int, name: str, bound: float = 120.0) -> Tally:
    """Two threads, each breaking out of `cases` streams and dropping them; neither may hang,
    and the runtime then answers as a fresh one."""
    tally = Tally(name)
    errors: list[str] = []

    def worker(offset: int) -> None:
        rng = np.random.default_rng(seed + offset)
        for i in range(cases):
            try:
                for n, _ in enumerate(rt.stream(CHECK_PROMPT, max_tokens=16, **GREEDY)):
                    if n >= int(rng.integers(0, 4)):
                        break
            except Exception as exc:
                errors.append(f"thread {offset} stream {i}: {exc!r}")

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(bound)
    tally.tried = 2 * cases
    tally.failures += errors
    if any(t.is_alive() for t in threads):
        tally.failures.append(f"a thread still waited after {bound:.0f} s")
        return tally
    got = answer(rt)
    if got != expected:
        tally.failures.append(f"after both threads: answered {got!r}")
    return tally


# -- injectors per backend ----------------------------------------------------------------


def llamacpp_injector(rt: Runtime, fire: Callable[[], bool]) -> contextlib.AbstractContextManager[None]:
    import localspec.backends.llamacpp.backend as llamacpp

    return patched(llamacpp.llama, "llama_decode", fire)


def reference_injector(rt: Runtime, fire: Callable[[], bool]) -> contextlib.AbstractContextManager[None]:
    return patched(rt.target, "eval_block", fire)


def torch_injector(rt: Runtime, fire: Callable[[], bool]) -> contextlib.AbstractContextManager[None]:
    return patched(rt.target, "_forward", fire)


def mlx_injector(rt: Runtime, fire: Callable[[], bool]) -> contextlib.AbstractContextManager[None]:
    return patched(rt.target.forward, "hidden", fire)  # type: ignore[attr-defined]


# -- pulls killed outright ----------------------------------------------------------------


def killed_pulls(cases: int, seed: int, folder: Path, bound: float = 120.0) -> Tally:
    """`localspec pull` SIGKILLed at `cases` random offsets of a file (against the fake hub),
    then a normal pull: it must finish, verified, and leave no partial download behind."""
    from localspec.testing.fakehub import FakeHub, serve_test_pairs

    tally = Tally("pull: SIGKILL mid-file, then a re-run")
    home, cache = folder / "home", folder / "hub-cache"
    rng = np.random.default_rng(seed)
    with FakeHub() as hub:
        serve_test_pairs(hub, home)
        data = hub.repos["test/tiny-drafter-GGUF"].files["tiny-drafter.gguf"]
        env = {**os.environ, "LOCALSPEC_HOME": str(home), "HF_HUB_CACHE": str(cache), "HF_ENDPOINT": hub.endpoint}
        env.pop("HF_HUB_OFFLINE", None)
        for _ in range(cases):
            reached = hub.stall_after("tiny-drafter.gguf", int(rng.integers(1, len(data))))
            child = subprocess.Popen(
                [sys.executable, "-m", "localspec", "pull", "tiny-solo"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            tally.tried += 1
            if not reached.wait(bound):
                tally.failures.append(f"the pull never reached the file (exit {child.poll()})")
            child.send_signal(signal.SIGKILL)
            child.wait()
        rerun = subprocess.run(
            [sys.executable, "-m", "localspec", "pull", "tiny-solo"], env=env, capture_output=True, text=True
        )
        if rerun.returncode != 0:
            tally.failures.append(f"the re-run failed: {rerun.stderr.strip()[-300:]}")
        blobs = cache / "models--test--tiny-drafter-GGUF" / "blobs"
        left = sorted(p.name for p in blobs.glob("*.incomplete"))
        if left:
            tally.failures.append(f"partial downloads left behind: {left}")
        kept = [p for p in blobs.iterdir() if not p.name.endswith(".incomplete")] if blobs.exists() else []
        if [p.read_bytes() for p in kept] != [data]:
            tally.failures.append("the pulled file is not the hub's")
    return tally
