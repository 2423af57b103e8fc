"""llama.cpp's RPC entry points through ctypes: offloading a model to rpc-servers, the
message when a server is lost, a wait limit on the connections, and the server itself.
The endpoints, the probe and the options live in backends/llamacpp/rpc_server.py."""

from __future__ import annotations

import ctypes
import os
import re
import signal
import socket
import struct
import sys
import threading
from collections.abc import Sequence
from functools import cache
from typing import Any

from localspec.backends.llamacpp.rpc_server import WAIT_ENV, RpcServerError, probe, require_rpc, wait_limit

_ALL_LAYERS = 999  # n_gpu_layers: every layer goes to the listed devices
_LOST_EXIT_CODE = 2  # what the CLI returns for any LocalspecError


@cache
def library() -> ctypes.CDLL | None:
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


def require() -> ctypes.CDLL:
    require_rpc()  # without RPC in the build: the error that names the install command
    lib = library()
    assert lib is not None
    return lib


# -- splitting a model over servers -----------------------------------------------------------


@cache
def _server_devices(endpoint: str) -> tuple[int, ...]:
    """The devices one server offers, registered with ggml once per process."""
    lib = require()
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
            fd = os.dup(int(name))
        except (OSError, ValueError):
            continue  # closed meanwhile
        try:
            sock = socket.socket(fileno=fd)
        except OSError:
            os.close(fd)  # not a socket: the duplicate must not outlive the check
            continue
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
    require().ggml_set_abort_callback(_on_abort)


# -- serving ----------------------------------------------------------------------------------


def serve(host: str, port: int, threads: int | None = None, cache_dir: str | None = None) -> None:
    """Run llama.cpp's RPC server on this machine's CPU, in this process, until killed (the
    library initialised)."""
    from localspec.control.hardware import physical_cores

    lib = require()
    try:
        socket.create_server((host, port)).close()
    except OSError as exc:
        raise RpcServerError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            "choose another port with --port, or stop what listens there",
        ) from None
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
