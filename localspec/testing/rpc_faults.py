"""Raw RPC clients that misbehave, for the guard's tests and benchmarks/fault_injection.py: one
that connects and says nothing, one that sends only its hello, one that opens a session and
goes quiet, one that sends a message that aborts llama.cpp's server, and a `localspec
rpc-server` whose log is kept. Messages follow ggml-rpc.cpp of llama-cpp-python 0.3.36
(protocol 7): a command byte, its payload size (u64), the payload; answers are a size and a
payload."""

from __future__ import annotations

import contextlib
import io
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from localspec.backends.llamacpp.rpc_server import RpcServerError, probe

START_S = 60.0
HELLO = bytes([14]) + struct.pack("<Q", 24) + bytes(24)
DEVICE_COUNT = bytes([15]) + struct.pack("<Q", 0)
_ALLOC_BUFFER, _BUFFER_GET_BASE, _GET_TENSOR = 0, 3, 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(port: int, log: Path, *options: str) -> subprocess.Popen[bytes]:
    """`localspec rpc-server` on 127.0.0.1:port (stderr to log), once it answers a hello."""
    with log.open("ab") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "localspec", "rpc-server", "--port", str(port), "--threads", "1", *options],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    if not answers(port, START_S):
        proc.kill()
        raise RuntimeError(f"the rpc-server on port {port} did not start: {log.read_text()}")
    return proc


def answers(port: int, within_s: float) -> bool:
    """Whether a probe (hello, 5 s limit) gets through within within_s."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            probe(f"127.0.0.1:{port}")
            return True
        except RpcServerError:
            time.sleep(0.2)
    return False


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    """A connection from `source`: any 127.x.y.z address, so a test can play several hosts."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=START_S, source_address=(source, 0))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def reply(sock: socket.socket) -> bytes:
    """One answer's payload; b'' once the other end has closed the connection."""
    try:
        head = _exactly(sock, 8)
        return _exactly(sock, struct.unpack("<Q", head)[0]) if head else b""
    except ConnectionResetError:
        return b""


def _exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return b""
        data += chunk
    return data


def hello_only(port: int, source: str = "127.0.0.1") -> socket.socket:
    """A client that sends its hello, reads the answer, then says nothing more."""
    sock = connect(port, source)
    sock.sendall(HELLO)
    assert reply(sock), "the server did not answer the hello"
    return sock


def session(port: int) -> socket.socket:
    """A client past its handshake (hello and one request answered), then quiet."""
    sock = hello_only(port)
    sock.sendall(DEVICE_COUNT)
    assert reply(sock) == struct.pack("<I", 1)
    return sock


def still_served(sock: socket.socket) -> bool:
    """Whether a session's connection still gets answers."""
    try:
        sock.sendall(DEVICE_COUNT)
    except OSError:
        return False
    return reply(sock) == struct.pack("<I", 1)


def refused(port: int, source: str) -> bool:
    """Whether the guard turns a client from `source` away: its hello gets no answer."""
    try:
        with connect(port, source) as sock:
            sock.sendall(HELLO)
            return reply(sock) == b""
    except (BrokenPipeError, ConnectionResetError):
        return True


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the other end has closed this connection (waits up to the socket's timeout)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _tensor(buffer: int, data: int, floats: int) -> bytes:
    """An rpc_tensor of `floats` F32 values at address `data` in the server's buffer."""
    tensor = struct.pack("<QIQ", 1, 0, buffer)  # id, F32, buffer
    tensor += struct.pack("<4I", floats, 1, 1, 1) + struct.pack("<4I", 4, 4 * floats, 4 * floats, 4 * floats)
    tensor += struct.pack("<I", 0) + bytes(64) + struct.pack("<i", 0)  # op, op_params, flags
    tensor += bytes(8 * 10) + struct.pack("<QQQ", 0, 0, data)  # src, view_src, view_offs, data
    return tensor + bytes(64) + struct.pack("<i", 0)  # name, use_count


def _buffer(sock: socket.socket, size: int) -> tuple[int, int]:
    """A buffer of `size` bytes allocated on the server: its handle and base address."""
    sock.sendall(bytes([_ALLOC_BUFFER]) + struct.pack("<Q", 12) + struct.pack("<IQ", 0, size))
    buffer, _ = struct.unpack("<QQ", reply(sock))
    sock.sendall(bytes([_BUFFER_GET_BASE]) + struct.pack("<Q", 8) + struct.pack("<Q", buffer))
    return buffer, struct.unpack("<Q", reply(sock))[0]


def get_tensor_request(sock: socket.socket, floats: int) -> bytes:
    """A GET_TENSOR of `floats` F32 values (a decode step's logits, say) that the server on
    this session answers with that many bytes, to send as often as wanted."""
    buffer, base = _buffer(sock, 4 * floats)
    request = _tensor(buffer, base, floats) + struct.pack("<QQ", 0, 4 * floats)  # offset, size
    return bytes([_GET_TENSOR]) + struct.pack("<Q", len(request)) + request


def crash(port: int, source: str = "127.0.0.2") -> None:
    """Send, from `source`, what aborts llama.cpp's server inside its own check (a GGML_ASSERT):
    a tensor in a real buffer whose data address is 2^64-1, so its end overflows."""
    sock = hello_only(port, source)
    with sock:
        buffer, _ = _buffer(sock, 4096)
        request = _tensor(buffer, 2**64 - 1, 1) + struct.pack("<QQ", 0, 4)  # offset, size
        sock.sendall(bytes([_GET_TENSOR]) + struct.pack("<Q", len(request)) + request)
        assert reply(sock) == b"", "the crafted message was answered instead of ending the server"


# -- counted cases for benchmarks/fault_injection.py ----------------------------------------------


def counted_cases(crashes: int, idle: int, folder: Path) -> list[tuple[str, int, list[str]]]:
    """rpc-server's three faults as (name, tried, failures): a crafted message that aborts
    llama.cpp's server (from a new host each time, all on one `localspec rpc-server`: each host
    is refused for a while after its crash, and the service never gives up), a silent or
    hello-only client ahead of a real one, and addresses other machines can reach."""
    from localspec.cli.main import main

    rows = []
    failures: list[str] = []
    log = folder / "crash.txt"
    port = free_port()
    proc = start(port, log, "--crash-ban", "600")  # outlasts a restart on a busy host
    try:
        for case in range(crashes):
            attacker = f"127.0.{2 + case // 250}.{1 + case % 250}"
            crash(port, attacker)
            if not answers(port, START_S) or not still_served(session(port)):
                failures.append(f"crash {case}: not served again ({log})")
            if not refused(port, attacker):
                failures.append(f"crash {case}: {attacker} was let in again at once ({log})")
    finally:
        proc.terminate()
        proc.wait(START_S)
    if log.read_text().count("rpc-server crashed") != crashes:
        failures.append(f"the log does not say each restart ({log})")
    rows.append(("rpc-server: a crafted message aborts llama.cpp's server, restarted", crashes, failures))
    failures = []
    log = folder / "idle.txt"
    port = free_port()
    proc = start(port, log, "--idle-timeout", "2")
    try:
        for case in range(idle):
            kind = ("silent", "hello only", "quiet session")[case % 3]
            blocker = connect(port) if kind == "silent" else hello_only(port) if kind == "hello only" else session(port)
            with blocker:
                if not answers(port, START_S) or not closed_by_server(blocker):
                    failures.append(f"idle {case} ({kind}): the next client did not get through")
    finally:
        proc.terminate()
        proc.wait(START_S)
    if log.read_text().count("localspec: rpc-server: closed") < idle - idle // 3:
        failures.append(f"idle clients were closed without a log line each ({log})")
    rows.append(("rpc-server: an idle client ahead of a real one is closed", idle, failures))
    failures = []
    reachable = ["0.0.0.0", "::", "192.0.2.7", "example.com"]
    for host in reachable:
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = main(["rpc-server", "--host", host, "--port", str(free_port())])
        if code != 2 or "--allow-remote" not in err.getvalue():
            failures.append(f"--host {host}: exit {code}: {err.getvalue()[-200:]}")
    rows.append(("rpc-server: a reachable bind without --allow-remote is refused", len(reachable), failures))
    return rows
