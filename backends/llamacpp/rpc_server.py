"""llama.cpp's RPC backend: a target's layers split over `rpc-server` processes on other
machines, while the drafter stays on this one.

Each decoding step crosses every server in turn, so a split target is bound by round trips
more than by bandwidth: exactly where verifying several drafted tokens in one pass pays.
The RPC protocol has no authentication; a server must only ever listen on a trusted network.

llama.cpp ends the whole process when an RPC connection fails (GGML_ABORT), so every server
is probed here first (connect, then the protocol's hello) and a lost server mid-generation
ends the process with a message that says what happened instead of a backtrace.
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TextIO

from localspec.core.backend_loader import backend_module
from localspec.core.errors import BackendUnavailableError, InvalidRequestError, LocalspecError

INSTALL_WITH_RPC = 'CMAKE_ARGS="-DGGML_RPC=on" pip install --force-reinstall --no-cache-dir llama-cpp-python==0.3.36'
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 50052  # rpc-server's own default
SECURITY_NOTE = (
    "RPC has no authentication: anyone who can reach a server can run code on it; "
    "keep servers on 127.0.0.1 or a trusted network"
)
RPC_HELP = (
    "split the target over llama.cpp rpc-servers; the drafter stays here. "
    "RPC has no authentication: only servers on 127.0.0.1 or a trusted network"
)
PROBE_TIMEOUT_S = 5.0
# The hello exchange of RPC_PROTO_MAJOR_VERSION 7 (ggml-rpc.h of llama-cpp-python 0.3.36):
# command byte, payload size, payload; the reply's first byte is the server's major version.
_PROTOCOL_MAJOR = 7
_CMD_HELLO = 14
HELLO_REQUEST_BYTES = 24


class RpcServerError(LocalspecError):
    """An RPC server that cannot be reached, is not an rpc-server, or speaks another version."""


def parse_endpoints(value: str | Iterable[str]) -> tuple[str, ...]:
    """'HOST:PORT[,HOST:PORT...]' (or a list of them) as a tuple of checked endpoints."""
    parts = value.split(",") if isinstance(value, str) else [p for v in value for p in v.split(",")]
    endpoints = []
    for part in (p.strip() for p in parts):
        host, sep, port = part.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise RpcServerError(
                f"{part!r} is not an RPC server address",
                f"write HOST:PORT, e.g. {DEFAULT_HOST}:{DEFAULT_PORT}; several are separated by commas",
            )
        endpoints.append(f"{host}:{int(port)}")
    if len(set(endpoints)) != len(endpoints):
        raise RpcServerError(f"an RPC server is listed twice in {','.join(endpoints)}", "list each server once")
    return tuple(endpoints)


def split_options(backend: str, rpc: str | Sequence[str] | None) -> dict[str, Any]:
    """The target's backend options for a split over RPC servers (none without rpc)."""
    if not rpc:
        return {}
    if backend != "llamacpp":
        raise InvalidRequestError(
            f"--rpc splits a llama.cpp target over rpc-servers; the {backend} backend cannot",
            "use --backend llamacpp with a GGUF target",
        )
    endpoints = parse_endpoints(rpc)
    require_rpc()
    wait_limit()  # a bad LOCALSPEC_RPC_TIMEOUT is refused before a model is loaded
    return {"rpc": endpoints}


# -- the library ------------------------------------------------------------------------------


def _library() -> Any | None:
    """llama.cpp's RPC library (backends/llamacpp/rpc.py), or None without llama.cpp or RPC."""
    try:
        return backend_module("llamacpp").rpc_entry_points.library()
    except BackendUnavailableError:
        return None


def rpc_available() -> bool:
    """Whether the installed llama.cpp was built with its RPC backend (GGML_RPC)."""
    return _library() is not None


def require_rpc() -> None:
    if _library() is None:
        raise BackendUnavailableError(
            "the installed llama-cpp-python was built without llama.cpp's RPC backend",
            f"rebuild it with RPC: {INSTALL_WITH_RPC}",
        )


# -- probing a server -------------------------------------------------------------------------


def probe(endpoint: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Connect and exchange the protocol's hello; RpcServerError names the server and the fix
    where llama.cpp itself would abort."""
    host, _, port = endpoint.rpartition(":")
    start = f"start one there: localspec rpc-server --host {host} --port {port} (or llama.cpp's rpc-server)"
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(bytes([_CMD_HELLO]) + struct.pack("<Q", HELLO_REQUEST_BYTES) + bytes(HELLO_REQUEST_BYTES))
            size = struct.unpack("<Q", _receive(sock, 8))[0]
            reply = _receive(sock, size) if 0 < size < 1024 else b""
    except ConnectionRefusedError:
        raise RpcServerError(f"no RPC server listens at {endpoint} (connection refused)", start) from None
    except TimeoutError:
        raise RpcServerError(
            f"the RPC server at {endpoint} did not answer within {timeout:.0f} s",
            "check the address and the network; a server serves one client at a time, so it may be busy",
        ) from None
    except (OSError, EOFError) as exc:
        raise RpcServerError(f"cannot reach an RPC server at {endpoint}: {exc}", start) from None
    if not reply:
        raise RpcServerError(
            f"{endpoint} answered, but not as a llama.cpp rpc-server", "check the port: is it the rpc-server's?"
        )
    if reply[0] != _PROTOCOL_MAJOR:
        raise RpcServerError(
            f"the RPC server at {endpoint} speaks protocol version {reply[0]}, this llama.cpp {_PROTOCOL_MAJOR}",
            "run the same llama.cpp on both ends, e.g. `localspec rpc-server` from this localspec install",
        )


def _receive(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise EOFError("the server closed the connection")
        data += chunk
    return data


# -- how long a server may keep us waiting ----------------------------------------------------

WAIT_ENV = "LOCALSPEC_RPC_TIMEOUT"
DEFAULT_WAIT_S = 120.0  # longer than any one pass of a big model's share on a CPU server


def wait_limit() -> float:
    """Seconds llama.cpp may wait on one server's answer (LOCALSPEC_RPC_TIMEOUT; 0: no limit)."""
    value = os.environ.get(WAIT_ENV, "").strip()
    try:
        seconds = float(value) if value else DEFAULT_WAIT_S
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise InvalidRequestError(
            f"{WAIT_ENV}={value!r} is not a number of seconds", f"set it to e.g. {DEFAULT_WAIT_S:g}, or 0 for no limit"
        )
    return seconds


def serve(
    host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, threads: int | None = None, cache_dir: str | None = None
) -> None:
    """Run llama.cpp's RPC server on this machine's CPU, in this process, until killed."""
    require_rpc()
    llamacpp = backend_module("llamacpp")
    llamacpp.init_library()
    llamacpp.rpc_entry_points.serve(host, port, threads, cache_dir)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# A server that keeps crashing while no client is connected (it cannot start here) is given up
# after this many restarts within RESTART_WINDOW_S; a crash during a session is blamed on its
# client instead (Guard.blame_crash), so no client can stop the service by crashing it.
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0


def _die_with_parent() -> None:
    """In the server's process, before it runs: killed with its supervisor (Linux), so a
    supervisor killed outright leaves no server behind (elsewhere watch_parent() does it)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def watch_parent() -> None:
    """End this process once the process that started it is gone."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def supervise(command: Sequence[str], log: TextIO, blame: Callable[[], str | None] | None = None) -> int:
    """Run the server `command` as a child and start it again whenever it dies of anything but
    a stop: one crafted message can abort llama.cpp's server (a GGML_ASSERT) and with it every
    client's session, but not the service. The child's last words go to `log` with the restart.
    `blame` names the client a crash is laid on (and keeps it out for a while); only crashes
    it lays on nobody count towards giving up. Returns the exit code to leave with (130 once
    stopped by a signal)."""
    stopping = False
    child: subprocess.Popen[bytes] | None = None

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.terminate()

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)
    restarts: list[float] = []
    while True:
        child = subprocess.Popen(command, stderr=subprocess.PIPE, preexec_fn=_die_with_parent)
        assert child.stderr is not None
        last, ggml = "", ""
        for line in child.stderr:  # passed on as it comes; ggml's check, else the last line, says why it died
            text = line.decode(errors="replace").strip()
            log.write(line.decode(errors="replace"))
            log.flush()
            last = text or last
            if "GGML_ASSERT" in text or "GGML_ABORT" in text:
                ggml = text[text.find("GGML_") :]  # without the source path; a backtrace follows it
        code = child.wait()
        if stopping:
            return 130
        if code == 2 and not restarts:
            return 2  # it could not start (the port is taken, say): what it printed says why
        now = time.monotonic()
        why = ggml or last or f"exit code {code}"
        if blame is not None and blame() is not None:
            log.write(f"localspec: rpc-server crashed ({why}); its client was disconnected; starting it again\n")
            log.flush()
            continue
        restarts = [t for t in restarts if now - t < RESTART_WINDOW_S] + [now]
        if len(restarts) > MAX_RESTARTS:
            log.write(
                f"localspec: rpc-server crashed {len(restarts)} times in a minute with no client connected "
                f"({why}); giving up\n"
                "  -> llama.cpp's messages above say why (memory? threads?); fix that, then start the server again\n"
            )
            return 1
        log.write(f"localspec: rpc-server crashed ({why}); its clients were disconnected; starting it again\n")
        log.flush()
