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
import os
import re
import signal
import socket
import struct
import sys
import threading
from collections.abc import Iterable, Sequence
from functools import cache
from typing import Any

from localspec.errors import BackendUnavailableError, InvalidRequestError, LocalspecError

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
_HELLO_REQUEST_BYTES = 24
_ALL_LAYERS = 999  # n_gpu_layers: every layer goes to the listed devices
_LOST_EXIT_CODE = 2  # what the CLI returns for any LocalspecError


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


@cache
def _library() -> ctypes.CDLL | None:
    """libllama as llama-cpp-python loaded it, with the ggml functions used here, or None
    without RPC. Symbols are looked up through libllama's own handle, which reaches the
    ggml libraries it links: opening them again by path would load second copies whose
    state (the abort hook) llama.cpp never sees."""
    try:
        from llama_cpp import llama_cpp
    except ImportError:
        return None
    lib: ctypes.CDLL = llama_cpp._lib
    if not hasattr(lib, "ggml_backend_rpc_add_server"):
        return None
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    lib.ggml_backend_rpc_add_server.argtypes, lib.ggml_backend_rpc_add_server.restype = [ctypes.c_char_p], vp
    lib.ggml_backend_rpc_start_server.argtypes = [ctypes.c_char_p, ctypes.c_char_p, sz, sz, ctypes.POINTER(vp)]
    lib.ggml_backend_rpc_start_server.restype = None
    lib.ggml_backend_reg_dev_count.argtypes, lib.ggml_backend_reg_dev_count.restype = [vp], sz
    lib.ggml_backend_reg_dev_get.argtypes, lib.ggml_backend_reg_dev_get.restype = [vp, sz], vp
    lib.ggml_backend_dev_by_type.argtypes, lib.ggml_backend_dev_by_type.restype = [ctypes.c_int], vp
    lib.ggml_set_abort_callback.argtypes, lib.ggml_set_abort_callback.restype = [_ABORT_CALLBACK], vp
    return lib


def rpc_available() -> bool:
    """Whether the installed llama.cpp was built with its RPC backend (GGML_RPC)."""
    try:
        import llama_cpp
    except ImportError:
        return False
    return bool(llama_cpp.llama_supports_rpc()) and _library() is not None


def require_rpc() -> ctypes.CDLL:
    lib = _library()
    if lib is None:
        raise BackendUnavailableError(
            "the installed llama-cpp-python was built without llama.cpp's RPC backend",
            f"rebuild it with RPC: {INSTALL_WITH_RPC}",
        )
    return lib


# -- probing a server -------------------------------------------------------------------------


def probe(endpoint: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Connect and exchange the protocol's hello; RpcServerError names the server and the fix
    where llama.cpp itself would abort."""
    host, _, port = endpoint.rpartition(":")
    start = f"start one there: localspec rpc-server --host {host} --port {port} (or llama.cpp's rpc-server)"
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(bytes([_CMD_HELLO]) + struct.pack("<Q", _HELLO_REQUEST_BYTES) + bytes(_HELLO_REQUEST_BYTES))
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


# -- splitting a model over servers -----------------------------------------------------------


@cache
def _server_devices(endpoint: str) -> tuple[int, ...]:
    """The devices one server offers, registered with ggml once per process."""
    lib = require_rpc()
    probe(endpoint)
    reg = lib.ggml_backend_rpc_add_server(endpoint.encode())
    if not reg:
        raise RpcServerError(
            f"llama.cpp could not register the RPC server at {endpoint}",
            "restart that rpc-server from the same llama.cpp build as this one (`localspec rpc-server`), then retry",
        )
    return tuple(lib.ggml_backend_reg_dev_get(reg, i) for i in range(lib.ggml_backend_reg_dev_count(reg)))


def offload_to_servers(mparams: Any, endpoints: Sequence[str]) -> ctypes.Array[ctypes.c_void_p]:
    """Point llama_model_params at the servers' devices with every layer on them; returns
    the NULL-terminated device array, which must outlive the model load."""
    devices = [d for e in endpoints for d in _server_devices(e)]
    if not devices:
        raise RpcServerError(
            f"the RPC servers {','.join(endpoints)} offer no device",
            "start each rpc-server with a CPU or GPU backend (`localspec rpc-server` serves the CPU), then retry",
        )
    array = (ctypes.c_void_p * (len(devices) + 1))(*devices, None)
    mparams.devices = ctypes.cast(array, ctypes.c_void_p).value
    mparams.n_gpu_layers = _ALL_LAYERS
    _servers_in_use.update(endpoints)
    _install_abort_message()
    return array


# -- a server lost mid-generation -------------------------------------------------------------

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


def limit_waits(endpoints: Sequence[str]) -> int:
    """Give this process's sockets to the servers a receive and send timeout. llama.cpp's RPC
    client has none, so a server that stops answering without closing the connection (a
    laptop asleep, a link gone without a reset) would hold generation forever; with one, the
    wait fails and ends the run through the abort message below. Returns the sockets found."""
    seconds = wait_limit()
    if seconds <= 0:
        return 0
    peers = {(info[4][0], info[4][1]) for e in endpoints for info in _resolve(e)}
    timeval = struct.pack("@ll", int(seconds), int(seconds % 1 * 1_000_000))
    found = 0
    for name in os.listdir("/dev/fd"):
        try:
            sock = socket.socket(fileno=os.dup(int(name)))
        except (OSError, ValueError):
            continue  # not a socket (or closed meanwhile)
        with sock:
            try:
                peer = sock.getpeername()
            except OSError:
                continue
            if isinstance(peer, tuple) and (peer[0], peer[1]) in peers:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
                found += 1
    _wait_limit_in_use[0] = seconds
    return found


def _resolve(endpoint: str) -> list[Any]:
    host, _, port = endpoint.rpartition(":")
    try:
        return socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except OSError:
        return []


_ABORT_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
_servers_in_use: set[str] = set()
_wait_limit_in_use = [0.0]


@_ABORT_CALLBACK  # type: ignore[misc,untyped-decorator]
def _on_abort(message: bytes | None) -> None:
    # llama.cpp calls abort() right after this returns: say what happened and leave first.
    lines = (message or b"").decode(errors="replace").strip().splitlines() or ["no message"]
    reason = re.sub(r"^\S+:\d+: ", "", lines[-1])  # drop llama.cpp's source file and line
    servers = ", ".join(sorted(_servers_in_use))
    limit = _wait_limit_in_use[0]
    waited = f"did not answer within {limit:g} s ({WAIT_ENV}), " if limit else ""
    _restore_terminal()
    sys.stderr.write(
        f"localspec: error: llama.cpp stopped: {reason}.\n"
        f"  The target is split over the RPC servers {servers}: one of them stopped, {waited}or the "
        "network dropped, and llama.cpp cannot continue without it.\n"
        "  -> check that every server is running (localspec rpc-server ...) and run again\n"
    )
    sys.stderr.flush()
    os._exit(_LOST_EXIT_CODE)


def _restore_terminal() -> None:
    # `localspec chat` may own the screen (alternate screen, raw mode, mouse reporting).
    if sys.stdin is not None and sys.stdout is not None and sys.stdin.isatty() and sys.stdout.isatty():
        sys.stdout.write("\x1b[?1000l\x1b[?1003l\x1b[?1006l\x1b[?25h\x1b[?1049l")
        sys.stdout.flush()
        os.system("stty sane")


@cache
def _install_abort_message() -> None:
    require_rpc().ggml_set_abort_callback(_on_abort)


# -- serving ----------------------------------------------------------------------------------


def serve(
    host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, threads: int | None = None, cache_dir: str | None = None
) -> None:
    """Run llama.cpp's RPC server on this machine's CPU, in this process, until killed."""
    from localspec.backend_loader import backend_module
    from localspec.hardware import physical_cores

    lib = require_rpc()
    try:
        socket.create_server((host, port)).close()
    except OSError as exc:
        raise RpcServerError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            "choose another port with --port, or stop what listens there",
        ) from None
    backend_module("llamacpp").init_library()
    cpu = lib.ggml_backend_dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU
    devices = (ctypes.c_void_p * 1)(cpu)
    args = (
        f"{host}:{port}".encode(),
        cache_dir.encode() if cache_dir else None,
        threads or physical_cores(),
        1,
        devices,
    )

    def run() -> None:
        # A signal that lands while llama.cpp serves a client never returns control to
        # Python (its loop goes back to accept()), so only the main thread takes signals.
        signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        lib.ggml_backend_rpc_start_server(*args)

    server = threading.Thread(target=run, name="rpc-server", daemon=True)
    server.start()
    server.join()  # interruptible: Ctrl+C or SIGTERM ends the command, and the daemon thread with it
    raise RpcServerError(
        f"llama.cpp's RPC server on {host}:{port} stopped: it could not listen or accept a connection",
        "check that the port is free and that this host may listen on it, then start it again",
    )


_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
