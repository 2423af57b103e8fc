"""`localspec rpc-server` keeps serving after llama.cpp's server dies under it (one crafted
message can abort it with a GGML_ASSERT), says so, and will not listen where other machines
can reach it unless told to."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from test_rpc import SERVER_START_S, _free_port

from localspec.backends.llamacpp.rpc_server import RpcServerError, is_loopback, probe, rpc_available
from localspec.cli.main import main

pytestmark = pytest.mark.skipif(not rpc_available(), reason="the installed llama-cpp-python has no RPC backend")


def served_again(port: int) -> bool:
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        try:
            probe(f"127.0.0.1:{port}", timeout=2.0)
            return True
        except RpcServerError:
            time.sleep(0.2)
    return False


def test_a_server_that_aborts_is_started_again_and_the_crash_is_logged(tmp_path: Path) -> None:
    port, log = _free_port(), tmp_path / "stderr.txt"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "localspec", "rpc-server", "--port", str(port), "--threads", "1"], stderr=err
        )
    try:
        assert served_again(port)
        server = psutil.Process(proc.pid).children()[0]
        server.send_signal(signal.SIGABRT)  # what a GGML_ASSERT does to it
        server.wait(timeout=SERVER_START_S)
        assert served_again(port)
        assert proc.poll() is None and psutil.Process(proc.pid).children()[0].pid != server.pid
        assert "rpc-server crashed" in log.read_text() and "starting it again" in log.read_text()
        assert "refusing" not in log.read_text()  # it died in nobody's session: no client is refused
    finally:
        proc.terminate()
        assert proc.wait(timeout=SERVER_START_S) == 130


def test_a_reachable_address_needs_allow_remote(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rpc-server", "--host", "0.0.0.0", "--port", str(_free_port())]) == 2
    err = capsys.readouterr().err
    assert "--allow-remote" in err and "no authentication" in err


def test_loopback_names() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "192.168.1.5", "example.com", "::"))
