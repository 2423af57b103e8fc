"""Issue 33's hostile environments as counted cases for benchmarks/fault_injection.py (each
class also has its own regression tests, named in BENCHMARKS.md §5): a model path that is a
pipe or a device, a hub that stalls, forged Host and Origin headers against a live `serve`, a
full or read-only disk under the store's writes, a chat quit during prefill, and rpc-server's
crafted message, idle clients and reachable binds. Every case runs under a bound, so a hang
counts as a failure instead of stalling the run."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import http.client
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from localspec.testing.fault_support import Tally

BOUND_S = 60.0  # a bound, not a timing: every case here ends in seconds when it works


def bounded(call: Callable[[], Any], bound: float = BOUND_S) -> tuple[Any, BaseException | None, bool]:
    """call() in a thread: (its result, what it raised, whether it finished within bound)."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = call()
        except BaseException as exc:  # every outcome is a case's result
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(bound)
    return out.get("value"), out.get("error"), not thread.is_alive()


def expect_refusal(tally: Tally, what: str, call: Callable[[], Any], kind: type, words: str) -> None:
    """One case: call() must raise `kind` whose text has `words`, within the bound."""
    tally.tried += 1
    _, error, finished = bounded(call)
    if not finished:
        tally.failures.append(f"{what}: no answer within {BOUND_S:.0f} s")
    elif not isinstance(error, kind) or words not in str(error):
        tally.failures.append(f"{what}: {error!r} instead of {kind.__name__} saying {words!r}")


@contextlib.contextmanager
def environment(**values: str | None) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    for key, value in values.items():
        os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
    try:
        yield
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)


# -- waits without end --------------------------------------------------------------------------


def pipes_and_devices(model: str | None) -> Tally:
    """A named pipe or a device as a model: refused before it is read, in-process and by `run`."""
    from localspec.common.gguf_header import check_gguf, read_header
    from localspec.core.errors import ModelLoadError

    tally = Tally("waits: a named pipe or a device as the model")
    folder = Path(tempfile.mkdtemp())
    fifo = folder / "pipe.gguf"
    os.mkfifo(fifo)
    for name, path in (("named pipe", str(fifo)), ("character device", "/dev/zero")):
        expect_refusal(tally, f"check_gguf({path})", lambda p=path: check_gguf(p), ModelLoadError, name)  # type: ignore[misc]
        expect_refusal(tally, f"read_header({path})", lambda p=path: read_header(p), ModelLoadError, name)  # type: ignore[misc]
    runs = [["run", "-m", str(fifo), "hello"]]
    runs += [["run", "-m", model, "--draft-model", str(fifo), "hello"]] if model else []
    for argv in runs:
        tally.tried += 1
        try:
            done = subprocess.run(
                [sys.executable, "-m", "localspec", *argv], capture_output=True, text=True, timeout=BOUND_S
            )
        except subprocess.TimeoutExpired:
            tally.failures.append(f"localspec {' '.join(argv)}: no end within {BOUND_S:.0f} s")
            continue
        if done.returncode != 2 or "is a named pipe" not in done.stderr or "Traceback" in done.stderr:
            tally.failures.append(f"localspec {' '.join(argv)}: exit {done.returncode}: {done.stderr[-300:]}")
    return tally


@contextlib.contextmanager
def silent_endpoint() -> Iterator[str]:
    """127.0.0.1 that accepts every connection and never sends a byte."""
    import socket

    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.close()
        for conn in held:
            conn.close()


def stalled_hubs(cases: int, seed: int) -> Tally:
    """A hub that never answers ends a pull with what to do; a file that stalls at a random
    byte is fetched again after the download timeout and arrives whole."""
    from localspec.models.hub_errors import PullError
    from localspec.models.pull import pull, resolve_pair
    from localspec.testing.fakehub import FakeHub, serve_test_pairs

    tally = Tally("waits: a hub that stalls (silent, or mid-file)")
    rng = np.random.default_rng(seed)
    for case in range(cases):
        folder = Path(tempfile.mkdtemp())
        settings = {"LOCALSPEC_HOME": str(folder / "home"), "HF_HUB_CACHE": str(folder / "cache")}
        timeouts = {"HF_HUB_ETAG_TIMEOUT": "1", "HF_HUB_DOWNLOAD_TIMEOUT": "1", "HF_HUB_OFFLINE": None}
        with environment(**settings, **timeouts), FakeHub() as hub:
            serve_test_pairs(hub, folder / "home")
            if case % 2 == 0:
                with silent_endpoint() as silent:
                    call = functools.partial(pull, "tiny", endpoint=silent, progress=False)
                    expect_refusal(tally, "a silent hub", call, PullError, "stopped answering")
                continue
            data = hub.repos["test/tiny-drafter-GGUF"].files["tiny-drafter.gguf"]
            hub.stall_after("tiny-drafter.gguf", int(rng.integers(1, len(data))))
            tally.tried += 1
            _, error, finished = bounded(functools.partial(pull, "tiny", endpoint=hub.endpoint, progress=False))
            drafter = resolve_pair("tiny").drafter if finished and error is None else None
            if drafter is None or drafter.read_bytes() != data:
                tally.failures.append(f"a file stalled mid-transfer: {error!r}, finished={finished}")
    return tally


# -- DNS rebinding ------------------------------------------------------------------------------


def rebinding() -> Tally:
    """Forged Host headers on every route and foreign Origins on a POST get 403 from a live
    `serve`; the loopback names and an allowed one still get answers (controls)."""
    from localspec.api import Runtime, load
    from localspec.server import Catalog, LocalServer, Settings

    tally = Tally("DNS rebinding: forged Host and Origin against a live serve")
    chat = {"model": "ref", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

    def loader(model_id: str) -> Runtime:
        return load("reference:seed=0", backend="reference", calibrate=False)

    settings = Settings(allowed_hosts=["models.lan"], log=lambda line: None)
    with LocalServer(loader("ref"), "ref", loader, port=0, catalog=Catalog("ref", pairs=False), settings=settings) as s:
        s.start()
        host, port = s.address

        def status(method: str, path: str, headers: dict[str, str]) -> int:
            conn = http.client.HTTPConnection(host, port, timeout=BOUND_S)
            try:
                body = json.dumps(chat).encode() if method == "POST" else None
                conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
                for name, value in {**headers, "Content-Type": "application/json"}.items():
                    conn.putheader(name, value)
                if body is not None:
                    conn.putheader("Content-Length", str(len(body)))
                conn.endheaders(body)
                response = conn.getresponse()
                response.read()
                return response.status
            finally:
                conn.close()

        forged = ["evil.example", f"evil.example:{port}", f"127.0.0.1.evil.example:{port}", "localhost.evil.example"]
        forged += [f"EVIL.example.:{port}", "192.0.2.7", "[::1].evil.example", "models.lan.evil.example"]
        routes = [("GET", "/v1/models"), ("GET", "/health"), ("POST", "/v1/chat/completions")]
        routes += [("POST", "/v1/completions")]
        cases = [(m, p, {"Host": h}, 403) for h in forged for m, p in routes]
        loopback = f"127.0.0.1:{port}"
        origins = ["http://evil.example", "null", f"http://localhost.evil.example:{port}", "https://192.0.2.7"]
        cases += [("POST", "/v1/chat/completions", {"Host": loopback, "Origin": o}, 403) for o in origins]
        controls = [f"localhost:{port}", loopback, f"[::1]:{port}", "models.lan"]
        cases += [("GET", "/v1/models", {"Host": h}, 200) for h in controls]
        cases += [("POST", "/v1/chat/completions", {"Host": loopback, "Origin": f"http://localhost:{port}"}, 200)]
        for method, path, headers, expected in cases:
            tally.tried += 1
            try:
                got = status(method, path, headers)
            except OSError as exc:
                got = -1
                headers = {**headers, "error": repr(exc)}
            if got != expected:
                tally.failures.append(f"{method} {path} {headers}: {got}, not {expected}")
    return tally


# -- a full or read-only disk -------------------------------------------------------------------


@contextlib.contextmanager
def failing_disk(code: int) -> Iterator[None]:
    """Every write through localspec.store fails as a disk answering `code` would: part of a
    file lands on a full disk (ENOSPC), no file can be created on a read-only one (EROFS)."""
    import localspec.store as store

    real_write, real_temporary = store._write_all, store._temporary

    def write(fd: int, raw: bytes) -> None:
        os.write(fd, raw[: len(raw) // 2])
        raise OSError(code, os.strerror(code))

    def refuse(path: Path) -> tuple[int, Path]:
        raise OSError(code, os.strerror(code), str(path.parent))

    if code == errno.EROFS:
        store._temporary = refuse  # type: ignore[assignment]
    else:
        store._write_all = write  # type: ignore[assignment]
    try:
        yield
    finally:
        store._write_all, store._temporary = real_write, real_temporary  # type: ignore[assignment]


def disk_writes() -> Tally:
    """Each of the store's write paths on a full and on a read-only disk: the old file stays
    whole, no temporary is left, and the user gets a StoreError or a one-line notice, never a
    traceback."""
    from localspec.cli.main import main
    from localspec.models.registry import load_registry, user_registry_file
    from localspec.store import (
        CALIBRATION,
        StoreError,
        calibration_file,
        file_fingerprint,
        write_atomic,
        write_json_atomic,
    )
    from localspec.testing.fakehub import TOKENS, tiny_gguf

    tally = Tally("disk: full or read-only under every write of user data")
    for code, words in ((errno.ENOSPC, "disk full: free"), (errno.EROFS, "is read-only here")):
        disk = errno.errorcode[code]
        for size in (10, 70_000, 3_500_000):
            folder = Path(tempfile.mkdtemp())
            for writer, name in ((write_atomic, "data.txt"), (write_json_atomic, "data.json")):
                path = folder / name
                path.write_text("old")
                content: Any = "x" * size if writer is write_atomic else {"x": "y" * size}
                with failing_disk(code):
                    call = functools.partial(writer, path, content)
                    expect_refusal(tally, f"{disk} {name} {size} B", call, StoreError, words)
                leftovers = [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]
                if path.read_text() != "old" or leftovers:
                    tally.failures.append(f"{disk} {name} {size} B: old file {path.read_text()[:20]!r}, {leftovers}")
        folder = Path(tempfile.mkdtemp())
        with environment(LOCALSPEC_HOME=str(folder / "home")):
            model, drafter = folder / "t.gguf", folder / "d.gguf"
            model.write_bytes(tiny_gguf(TOKENS))
            drafter.write_bytes(tiny_gguf(TOKENS, padding=1 << 12))
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                main(["add", "first", "--target", str(model)])
                before = user_registry_file().read_bytes() if user_registry_file().exists() else None
                CALIBRATION.put("kept", {"seconds_per_token": 0.25})
                with failing_disk(code):
                    added = main(["add", "second", "--target", str(model), "--drafter", str(drafter)])
                    CALIBRATION.put("lost", {"seconds_per_token": 0.5})
                    fingerprint = file_fingerprint(str(model))
            tally.tried += 3
            text = err.getvalue()
            after = user_registry_file().read_bytes() if user_registry_file().exists() else None
            if added != 2 or words not in text or "Traceback" in text or after != before:
                tally.failures.append(f"{disk} add: exit {added}, registry kept={after == before}: {text[-300:]}")
            elif "second" in load_registry().pairs:
                tally.failures.append(f"{disk} add: the refused pair was registered")
            if CALIBRATION.get("kept") != {"seconds_per_token": 0.25} or CALIBRATION.get("lost") is not None:
                tally.failures.append(f"{disk} calibration cache: {calibration_file().read_text()[:200]}")
            if len(fingerprint) != 64:
                tally.failures.append(f"{disk} fingerprint index: {fingerprint!r}")
    return tally


# -- the chat -----------------------------------------------------------------------------------


def abandoned_prompts(cases: int, seed: int) -> Tally:
    """The chat quit at a random moment of a slow prefill keeps the prompt, marked unanswered
    (driven headless with Textual's Pilot, as tests/tui/test_tui_unanswered.py does)."""
    from localspec.core.sampling import SamplingConfig
    from localspec.testing.tui_support import ready, send, slow_runtime, wait_for
    from localspec.tui import ChatApp, ChatSettings
    from localspec.tui.history import History, StoredMessage

    tally = Tally("chat: quit during prefill keeps the prompt")
    rng = np.random.default_rng(seed)

    async def one(prompt: str, quit_after: float) -> None:
        app = ChatApp(slow_runtime(delay=2.0), ChatSettings(sampling=SamplingConfig(temperature=0.0)))
        async with app.run_test(size=(100, 30)) as pilot:
            await ready(app)
            await send(app, pilot, prompt)
            await wait_for(lambda: app.turn is not None, what="the prompt to be sent")
            await asyncio.sleep(quit_after)

    for case in range(cases):
        prompt = f"question {case}: {'word ' * int(rng.integers(1, 8))}".strip()
        with environment(LOCALSPEC_HOME=tempfile.mkdtemp()):
            tally.tried += 1
            quit_after = float(rng.uniform(0, 0.5))
            _, error, finished = bounded(lambda: asyncio.run(one(prompt, quit_after)))  # noqa: B023 - run here
            if not finished or error is not None:
                tally.failures.append(f"case {case}: {error!r}, finished={finished}")
                continue
            history = History()
            saved = [history.get(c.id).messages for c in history.conversations()]
            if saved != [(StoredMessage.unanswered(prompt),)]:
                tally.failures.append(f"case {case}: saved {saved!r}")
    return tally
