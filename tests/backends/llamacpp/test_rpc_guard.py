"""`localspec rpc-server` listens in front of llama.cpp's server, which serves one connection at
a time: a client that connects and says nothing, or sends only its hello, is closed and does
not hold off a real client; a quiet session is closed only once another client waits; too
many connections are refused; a message that aborts llama.cpp's server ends only that
server, which is started again behind the same port."""

from __future__ import annotations

import contextlib
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from localspec.backends.llamacpp.rpc_server import MAX_RESTARTS, rpc_available
from localspec.testing.rpc_faults import (
    HELLO,
    START_S,
    answers,
    closed_by_server,
    connect,
    crash,
    free_port,
    hello_only,
    refused,
    reply,
    session,
    start,
    still_served,
)

pytestmark = pytest.mark.skipif(not rpc_available(), reason="the installed llama-cpp-python has no RPC backend")


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "rpc-server.txt"


@contextlib.contextmanager
def server(log: Path, *options: str) -> Iterator[tuple[int, psutil.Process]]:
    """A `localspec rpc-server` on a free port: the port and the supervising process."""
    port = free_port()
    proc = start(port, log, *options)
    try:
        yield port, psutil.Process(proc.pid)
    finally:
        proc.terminate()
        assert proc.wait(timeout=START_S) == 130


@pytest.fixture
def port(log: Path) -> Iterator[int]:
    with server(log) as (port, _):
        yield port


@pytest.mark.model
def logged(log: Path, *lines: str, within_s: float = 10.0) -> bool:
    """Whether the server's log holds every line within the time: another process writes it."""
    deadline = time.monotonic() + within_s
    while True:
        text = log.read_text()
        if all(line in text for line in lines) or time.monotonic() > deadline:
            return all(line in text for line in lines)
        time.sleep(0.05)


def test_silent_clients_do_not_hold_off_a_split_model(smollm2_q4_1: Path, port: int, log: Path) -> None:
    from test_rpc import _greedy_split

    idle = hello_only(port)  # llama.cpp's server is now inside this connection
    silent = connect(port)  # queued behind it, and never sends its hello
    assert len(_greedy_split(smollm2_q4_1, [f"127.0.0.1:{port}"], 8)) == 8
    assert closed_by_server(idle) and closed_by_server(silent)
    assert logged(log, "no request within 3 s of connecting", "no hello within 3 s while waiting")


def test_a_quiet_session_is_closed_only_once_another_client_waits(log: Path) -> None:
    with server(log, "--idle-timeout", "1") as (port, _):
        quiet = session(port)
        time.sleep(2.5)  # past the idle timeout with nobody waiting: a chat between two questions
        assert still_served(quiet)
        assert "closed" not in log.read_text()
        assert answers(port, within_s=START_S)  # a second client gets through...
        assert closed_by_server(quiet)  # ...because the quiet one was closed
        assert logged(log, "while 1 other client(s) waited (--idle-timeout)")


def test_connections_beyond_the_limit_are_refused(log: Path) -> None:
    with server(log, "--max-clients", "2") as (port, _):
        served = session(port)
        waiting = connect(port)
        waiting.sendall(HELLO)
        refused = connect(port)
        assert closed_by_server(refused)
        assert logged(log, "refused 127.0.0.1:", "2 clients connected or waiting already")
        served.close()
        assert reply(waiting)  # the waiting client's hello is answered once the first one leaves


def test_a_message_that_aborts_llama_cpp_restarts_it_behind_the_same_port(log: Path) -> None:
    with server(log, "--crash-ban", "60") as (port, supervisor):
        before = supervisor.children()[0].pid
        crash(port, "127.0.0.2")
        assert answers(port, within_s=START_S)
        assert supervisor.children()[0].pid != before
        assert still_served(session(port))
        assert logged(log, "GGML_ASSERT", "rpc-server crashed")
        assert logged(log, "refusing 127.0.0.2 for 60 s")
        assert refused(port, "127.0.0.2") and not refused(port, "127.0.0.1")  # only the host that crashed it


def test_a_client_that_keeps_crashing_the_server_cannot_stop_the_service(log: Path) -> None:
    # Bans of 0.01 s, 0.02 s, 0.04 s ...: the doubling is seen in the log, not waited out.
    with server(log, "--crash-ban", "0.01") as (port, supervisor):
        for n in range(MAX_RESTARTS + 2):  # once gave up after MAX_RESTARTS crashes in a minute
            while refused(port, "127.0.0.3"):
                time.sleep(0.01)
            crash(port, "127.0.0.3")
            assert answers(port, within_s=START_S), f"not served after crash {n + 1}"
        assert supervisor.is_running() and still_served(session(port))
        assert logged(log, f"refusing 127.0.0.3 for {0.01 * 2 ** (MAX_RESTARTS + 1):g} s")
        assert "giving up" not in log.read_text()


TRICKLE_INTERVAL_S = 0.5  # a byte every half second: far under the guard's floor


def test_a_client_trickling_into_a_huge_message_does_not_hold_off_another(log: Path) -> None:
    with server(log) as (port, _):
        trickler = hello_only(port)
        trickler.sendall(bytes([6]) + struct.pack("<Q", 1 << 30))  # a 1 GB set_tensor, declared
        started = time.monotonic()
        while not logged(log, "under 65536", within_s=TRICKLE_INTERVAL_S):
            trickler.sendall(b"\0")  # ...then a byte at a time
            assert time.monotonic() - started < START_S, "the trickling client was never closed"
        assert answers(port, within_s=START_S)
        assert closed_by_server(trickler)
        assert logged(log, "its message (1,073,741,833 bytes) came at")


def test_a_message_sent_whole_is_never_cut(log: Path) -> None:
    with server(log, "--idle-timeout", "1") as (port, _):
        served = session(port)
        for _ in range(3):
            assert still_served(served)
        assert "closed" not in log.read_text()


def test_rpc_server_says_a_build_lacks_rpc_before_it_says_listening(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import localspec.backends.llamacpp.rpc_server as rpc
    from localspec.cli.main import main

    monkeypatch.setattr(rpc, "_library", lambda: None)
    assert main(["rpc-server", "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert "built without llama.cpp's RPC backend" in err and "listening" not in err
