"""A target split over llama.cpp rpc-servers (two `localspec rpc-server` processes on
127.0.0.1) decodes like the local target, rolls back, and fails clearly when a server is
missing, is something else, or dies mid-generation.

Near-ties: the servers run llama.cpp's plain CPU kernels while a local model may use
repacked weights, so a greedy token may flip where the target's two best logits are within
NEAR_TIE of each other; the comparison stops at such a flip instead of failing.
"""

from __future__ import annotations

import os
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from localspec.backends.llamacpp.rpc_server import RpcServerError, probe, rpc_available, split_options
from localspec.core.errors import InvalidRequestError
from localspec.core.protocol import Backend

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(
        not rpc_available(),
        reason='the installed llama-cpp-python has no RPC backend (build it with CMAKE_ARGS="-DGGML_RPC=on")',
    ),
]

N_CTX = 512
NEAR_TIE = 0.05  # logits; see the module docstring
PROMPT = "def fibonacci(n):\n    "
SERVER_START_S = 60.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(
    port: int, program: Sequence[str] = (sys.executable, "-m", "localspec", "rpc-server")
) -> subprocess.Popen[bytes]:
    """An RPC server (`localspec rpc-server` unless told) on 127.0.0.1:port, returned once it
    answers the protocol's hello."""
    proc = subprocess.Popen(
        [*program, "--host", "127.0.0.1", "--port", str(port), "--threads", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + SERVER_START_S
    while True:
        try:
            probe(f"127.0.0.1:{port}", timeout=2.0)
            return proc
        except RpcServerError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise
            time.sleep(0.1)


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[str, ...]]:
    ports = [_free_port(), _free_port()]
    procs = [start_server(p) for p in ports]
    yield tuple(f"127.0.0.1:{p}" for p in ports)
    for proc in procs:
        proc.kill()
        proc.wait()


def _load(path: Path, rpc: Sequence[str] = ()) -> Backend:
    from localspec.core.backend_loader import load_backend

    return load_backend("llamacpp", str(path), n_ctx=N_CTX, **({"rpc": tuple(rpc)} if rpc else {}))


def _greedy(backend: Backend, n: int) -> tuple[list[int], list[float]]:
    """n greedy tokens after PROMPT, with each step's gap between the two best logits."""
    backend.rollback(0)
    logits = backend.eval_block(backend.tokenize(PROMPT, add_special=True, parse_special=False), "last")[-1]
    tokens, gaps = [], []
    for _ in range(n):
        top2 = np.sort(logits)[-2:]
        tokens.append(int(np.argmax(logits)))
        gaps.append(float(top2[1] - top2[0]))
        logits = backend.eval_block(tokens[-1:], "last")[-1]
    return tokens, gaps


def _greedy_split(path: Path, servers: Sequence[str], n: int) -> list[int]:
    """n greedy tokens from the model split over servers, closed again afterwards."""
    split = _load(path, servers)
    try:
        return _greedy(split, n)[0]
    finally:
        split.close()


def _same_up_to_a_near_tie(expected: list[int], gaps: list[float], actual: list[int]) -> None:
    for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
        if e != a:
            assert gaps[i] < NEAR_TIE, f"token {i}: {a} instead of {e}, and the target's margin was {gaps[i]:.3f}"
            return


def test_split_target_decodes_like_the_local_target(smollm2_q4_1: Path, servers: tuple[str, ...]) -> None:
    local = _load(smollm2_q4_1)
    try:
        expected, gaps = _greedy(local, 24)
    finally:
        local.close()
    split = _load(smollm2_q4_1, servers)
    try:
        assert split.capabilities.device == "rpc"
        assert split.capabilities.extra["rpc"] == ",".join(servers)  # keys its own calibration
        actual, _ = _greedy(split, 24)
    finally:
        split.close()
    _same_up_to_a_near_tie(expected, gaps, actual)


def test_rollback_across_rpc_gives_the_logits_of_a_fresh_pass(smollm2_q4_1: Path, servers: tuple[str, ...]) -> None:
    split = _load(smollm2_q4_1, servers)
    try:
        prompt = split.tokenize(PROMPT, add_special=True, parse_special=False)
        split.eval_block(prompt, "none")
        wrong = split.tokenize(" the quick brown fox", add_special=False, parse_special=False)
        split.eval_block(wrong, "all")  # a rejected draft
        split.rollback(len(prompt))
        right = split.tokenize(" return n", add_special=False, parse_special=False)
        after_rollback = split.eval_block(right, "all").copy()
        split.rollback(0)
        split.eval_block(prompt, "none")
        fresh = split.eval_block(right, "all").copy()
    finally:
        split.close()
    assert split.n_past == len(prompt) + len(right)
    np.testing.assert_allclose(after_rollback, fresh, atol=1e-3)


def test_speculation_over_rpc_keeps_the_greedy_text(smollm2_q4_1: Path, servers: tuple[str, ...]) -> None:
    import localspec

    request = {"messages": [{"role": "user", "content": "Repeat exactly: a, b, c, d, e, f, g."}], "max_tokens": 40}
    with localspec.load(str(smollm2_q4_1), strategy="none", n_ctx=N_CTX, calibrate=False, rpc=servers) as plain:
        expected = plain.generate(temperature=0.0, **request).tokens  # type: ignore[arg-type]
    with localspec.load(
        str(smollm2_q4_1), strategy="ngram", draft_tokens=4, n_ctx=N_CTX, calibrate=False, rpc=servers
    ) as rt:
        out = rt.generate(temperature=0.0, **request)  # type: ignore[arg-type]
    assert out.tokens == expected
    assert out.stats.drafted > 0


def test_a_local_draft_model_over_a_split_target_keeps_the_greedy_text(
    smollm2_q4_1: Path, derived_models: Any, servers: tuple[str, ...]
) -> None:
    import localspec

    drafter = str(derived_models["Q4_0"])
    request = {"messages": [{"role": "user", "content": "Count from one to ten in words."}], "max_tokens": 32}
    with localspec.load(str(smollm2_q4_1), strategy="none", n_ctx=N_CTX, calibrate=False, rpc=servers) as plain:
        expected = plain.generate(temperature=0.0, **request).tokens  # type: ignore[arg-type]
    with localspec.load(
        str(smollm2_q4_1), draft_model=drafter, draft_tokens=3, n_ctx=N_CTX, calibrate=False, rpc=servers
    ) as rt:
        assert rt.draft is not None and rt.draft.capabilities.device == "cpu"  # the drafter stays here
        out = rt.generate(temperature=0.0, **request)  # type: ignore[arg-type]
    assert out.tokens == expected
    assert out.stats.accepted > 0


def test_an_unreachable_server_is_a_clear_error(smollm2_q4_1: Path) -> None:
    import localspec

    endpoint = f"127.0.0.1:{_free_port()}"
    with pytest.raises(RpcServerError, match=r"(?s)no RPC server listens at .*localspec rpc-server"):
        localspec.load(str(smollm2_q4_1), n_ctx=N_CTX, rpc=endpoint)


class _NotRpc(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.recv(64)
        self.request.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")


def test_a_port_of_another_service_is_a_clear_error(smollm2_q4_1: Path) -> None:
    import localspec

    server = socketserver.TCPServer(("127.0.0.1", 0), _NotRpc)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(RpcServerError, match=r"not as a llama\.cpp rpc-server|cannot reach"):
            localspec.load(str(smollm2_q4_1), n_ctx=N_CTX, rpc=f"127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()


def _long_split_run(model: Path, port: int, **env: str) -> subprocess.Popen[bytes]:
    """`localspec run` of a long answer on a target split over the server at port, returned
    once its first output has come (generation is under way)."""
    command = ["run", "-m", str(model), "--rpc", f"127.0.0.1:{port}", "--strategy", "none"]
    command += ["--temperature", "0", "--max-tokens", "400", "--ctx", str(N_CTX), "Write a long story."]
    run = subprocess.Popen(
        [sys.executable, "-m", "localspec", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
    )
    assert run.stdout is not None
    assert run.stdout.read(1)
    return run


def test_a_server_that_dies_mid_generation_ends_the_run_with_a_clear_error(smollm2_q4_1: Path) -> None:
    port = _free_port()
    server = start_server(port)
    try:
        run = _long_split_run(smollm2_q4_1, port)
    finally:
        server.kill()
        server.wait()
    _, err = run.communicate(timeout=120)
    assert run.returncode == 2
    message = err.decode()
    assert f"RPC servers 127.0.0.1:{port}" in message and "localspec rpc-server" in message
    assert "Backtrace" not in message and "gdb" not in message


def test_a_server_that_stops_answering_ends_the_run_after_the_wait_limit(smollm2_q4_1: Path) -> None:
    # A frozen server keeps its connection open: only the sockets' timeout can end the wait.
    port = _free_port()
    server = start_server(port)
    try:
        run = _long_split_run(smollm2_q4_1, port, LOCALSPEC_RPC_TIMEOUT="3")
        for serving in psutil.Process(server.pid).children():  # the server under the supervisor
            serving.send_signal(signal.SIGSTOP)
        _, err = run.communicate(timeout=120)
    finally:
        server.kill()
        server.wait()
    assert run.returncode == 2
    message = err.decode()
    assert f"RPC servers 127.0.0.1:{port}" in message and "did not answer within 3 s" in message


def test_a_bad_wait_limit_is_refused_before_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALSPEC_RPC_TIMEOUT", "soon")
    with pytest.raises(InvalidRequestError, match="LOCALSPEC_RPC_TIMEOUT='soon' is not a number"):
        split_options("llamacpp", "127.0.0.1:50052")


def test_a_server_stops_on_sigterm_while_a_client_is_connected() -> None:
    # The signal lands while llama.cpp serves a connection, the case that used to hang.
    port = _free_port()
    proc = start_server(port)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=SERVER_START_S) as client:
            client.sendall(bytes([14]) + (24).to_bytes(8, "little") + bytes(24))  # hello
            assert client.recv(8)  # the server is inside this connection now
            proc.terminate()
            assert proc.wait(timeout=SERVER_START_S) == 130
    finally:
        proc.kill()


def test_a_port_in_use_is_a_clear_error() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        run = subprocess.run(
            [sys.executable, "-m", "localspec", "rpc-server", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=SERVER_START_S,
        )
    assert run.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in run.stderr and "--port" in run.stderr
    assert "Traceback" not in run.stderr


def _llama_cpp_rpc_server() -> Path | None:
    """llama.cpp's own rpc-server: LOCALSPEC_RPC_SERVER_BIN, or localspec's peer build."""
    from localspec.tooling.peers import RPC_SERVER, peers_dir

    candidates = [os.environ.get("LOCALSPEC_RPC_SERVER_BIN", ""), str(peers_dir() / "build" / "bin" / RPC_SERVER)]
    return next((Path(c) for c in candidates if c and Path(c).is_file()), None)


def test_llama_cpps_own_rpc_server_serves_the_split_target(smollm2_q4_1: Path) -> None:
    program = _llama_cpp_rpc_server()
    if program is None:
        pytest.skip("llama.cpp's rpc-server is not built (set LOCALSPEC_RPC_SERVER_BIN or build the peers)")
    port = _free_port()
    proc = start_server(port, [str(program)])
    try:
        assert len(_greedy_split(smollm2_q4_1, [f"127.0.0.1:{port}"], 8)) == 8
    finally:
        proc.kill()
        proc.wait()
