"""benchmarks/latency_proxy.py: the relay rpc_bench.py puts in front of each rpc-server."""

from __future__ import annotations

import importlib.util
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from types import ModuleType

import pytest
from repo_paths import ROOT


def _load_proxy() -> ModuleType:
    path = ROOT / "benchmarks" / "latency_proxy.py"
    spec = importlib.util.spec_from_file_location("latency_proxy", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


latency_proxy = _load_proxy()


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(1 << 16):
            self.request.sendall(data)


@pytest.fixture
def echo_server() -> Iterator[tuple[str, int]]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[0], server.server_address[1]
    server.shutdown()
    server.server_close()


def _receive(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def test_bytes_cross_unchanged_and_in_order(echo_server: tuple[str, int]) -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB, many chunks
    with latency_proxy.running(echo_server, 0.001) as port, socket.create_connection(("127.0.0.1", port)) as sock:
        sender = threading.Thread(target=sock.sendall, args=(payload,))
        sender.start()
        echoed = _receive(sock, len(payload))
        sender.join()
    assert echoed == payload


def test_a_round_trip_takes_at_least_twice_the_delay(echo_server: tuple[str, int]) -> None:
    delay = 0.05
    with latency_proxy.running(echo_server, delay) as port, socket.create_connection(("127.0.0.1", port)) as sock:
        for _ in range(3):
            start = time.perf_counter()
            sock.sendall(b"ping")
            assert _receive(sock, 4) == b"ping"
            assert time.perf_counter() - start >= 2 * delay


def test_an_upstream_that_is_down_closes_the_client() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()
    with latency_proxy.running(dead, 0.0) as port, socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(10)
        assert sock.recv(1) == b""
