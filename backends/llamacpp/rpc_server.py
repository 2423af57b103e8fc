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
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
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
_HELLO_REQUEST_BYTES = 24


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


# -- the guard in front of the server -------------------------------------------------------

# llama.cpp's server serves one connection at a time, so a client that connects and then says
# nothing would hold every other client off for as long as it likes. The guard listens in
# its place, lets one connection at a time through to the server (which listens on a private
# loopback port), holds the others in a queue, and closes the one that keeps them waiting.
HELLO_BYTES = 1 + 8 + _HELLO_REQUEST_BYTES  # a real client sends its hello at once
HANDSHAKE_TIMEOUT_S = 3.0  # under probe()'s 5 s, so a client queued behind a silent one gets in
# The host whose session was running when the server died is refused for CRASH_BAN_S, twice as
# long each time it happens again (up to CRASH_BAN_MAX_S): a client that keeps sending what
# aborts the server gets a few crashes an hour through, and everyone else is served between.
CRASH_BAN_S = 10.0
CRASH_BAN_MAX_S = 900.0
# The session the server last answered is the one it died in if it ended this shortly before the
# crash was seen (llama.cpp prints a backtrace before it exits).
_BLAME_WINDOW_S = 10.0
IDLE_TIMEOUT_S = 30.0
# A message must keep coming at this rate once HANDSHAKE_TIMEOUT_S into it, so the time one may
# take is bounded by its size: a client trickling a byte at a time into a message it declared
# huge cannot hold the server. Far under any network a split model is usable over.
MESSAGE_FLOOR_BYTES_S = 64 * 1024
_MESSAGE_HEAD = 1 + 8  # a command byte and the payload's size (u64), ggml-rpc.cpp's framing
MAX_CLIENTS = 16
_CHUNK = 1 << 20
_TICK_S = 0.1  # how often the guard looks at its timers (never on the forwarding path)


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, IPv6 where the host is an IPv6 address."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    try:
        return socket.create_server((host.strip("[]"), port), family=family, backlog=64)
    except OSError as exc:
        raise RpcServerError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            "choose another port with --port, or stop what listens there",
        ) from None


@dataclass
class _Connection:
    client: socket.socket
    host: str
    peer: str
    arrived: float = field(default_factory=time.monotonic)
    upstream: socket.socket | None = None
    last: float = 0.0  # the last byte either way, once let through
    sent: int = 0  # bytes from the client
    open_pumps: int = 0
    ended: float | None = None  # when its session ended (once let through)
    ended_by: str | None = None  # "client", "server" or "guard": who closed it first
    message: _Message | None = None  # the client's message under way, until its last byte


@dataclass
class _Message:
    """Where a client's message stands: its start, bytes come so far, and its whole size
    once its head is in."""

    started: float
    got: int = 0
    head: bytearray = field(default_factory=bytearray)
    size: int | None = None

    def feed(self, data: memoryview) -> int:
        """Take what of data belongs to this message; returns how many bytes that was."""
        taken = 0
        if self.size is None:
            taken = min(_MESSAGE_HEAD - len(self.head), len(data))
            self.head += data[:taken]
            if len(self.head) == _MESSAGE_HEAD:
                self.size = _MESSAGE_HEAD + struct.unpack("<Q", self.head[1:])[0]
        if self.size is not None:
            taken += min(self.size - self.got - taken, len(data) - taken)
        self.got += taken
        return taken

    @property
    def done(self) -> bool:
        return self.size is not None and self.got >= self.size


class Guard:
    """Accepts clients on `listener` and lets one at a time through to the server at
    127.0.0.1:`upstream_port`. A client that has not finished its hello and sent its first
    request within `handshake_s` is closed; a session silent for `idle_s` is closed once
    another client waits behind it; beyond `max_clients` new connections are refused; a host
    whose session crashed the server is refused for a while (`crash_ban_s`, doubling); a
    message that comes slower than `message_floor` bytes/s once `handshake_s` into it is
    closed, so a message takes at most handshake_s + its size / message_floor."""

    def __init__(
        self,
        listener: socket.socket,
        upstream_port: int,
        log: TextIO,
        idle_s: float = IDLE_TIMEOUT_S,
        handshake_s: float = HANDSHAKE_TIMEOUT_S,
        max_clients: int = MAX_CLIENTS,
        crash_ban_s: float = CRASH_BAN_S,
        message_floor: float = MESSAGE_FLOOR_BYTES_S,
    ) -> None:
        self.listener, self.upstream_port, self.log = listener, upstream_port, log
        self.idle_s, self.handshake_s, self.max_clients = idle_s, min(handshake_s, idle_s), max_clients
        self.crash_ban_s, self.message_floor = crash_ban_s, message_floor
        self.waiting: deque[_Connection] = deque()
        self.active: _Connection | None = None
        self.last: _Connection | None = None  # the newest client the server answered
        self.crashes: dict[str, int] = {}  # by host: sessions during which the server died
        self.banned: dict[str, float] = {}  # host: refused until this time
        self.changed = threading.Condition()

    def start(self) -> None:
        threading.Thread(target=self._accept, name="rpc-guard-accept", daemon=True).start()
        threading.Thread(target=self._schedule, name="rpc-guard", daemon=True).start()

    def _say(self, line: str) -> None:
        self.log.write(f"localspec: rpc-server: {line}\n")
        self.log.flush()

    def _accept(self) -> None:
        while True:
            try:
                client, address = self.listener.accept()
            except OSError:
                return  # the listener was closed: the process is ending
            host, peer = address[0], f"{address[0]}:{address[1]}"
            with self.changed:
                if time.monotonic() < self.banned.get(host, 0.0):
                    client.close()  # said once, when the ban began
                    continue
                held = len(self.waiting) + (self.active is not None)
                if held >= self.max_clients:
                    client.close()
                    self._say(f"refused {peer}: {held} clients connected or waiting already")
                    continue
                self.waiting.append(_Connection(client, host, peer))
                self.changed.notify()

    def _schedule(self) -> None:
        while True:
            with self.changed:
                self.changed.wait(_TICK_S)
                self._drop_silent_waiters()
                if self.active is not None and self.active.open_pumps == 0:
                    self._end_session()
                if self.active is None and self.waiting:
                    self._let_through(self.waiting[0])
                elif self.active is not None:
                    self._close_if_idle(self.active)

    def _drop_silent_waiters(self) -> None:
        now = time.monotonic()
        for conn in list(self.waiting):
            if now - conn.arrived < self.handshake_s:
                continue
            try:
                hello = conn.client.recv(HELLO_BYTES, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except BlockingIOError:
                hello = None
            except OSError:
                hello = b""
            if hello is not None and len(hello) == HELLO_BYTES:
                continue
            self.waiting.remove(conn)
            conn.client.close()
            if hello != b"":  # a client that left on its own goes without a word
                self._say(f"closed {conn.peer}: no hello within {self.handshake_s:g} s while waiting")

    def _let_through(self, conn: _Connection) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=1.0)
        except OSError:
            return  # the server is starting (again); the client waits
        self.waiting.popleft()
        upstream.settimeout(None)
        for sock in (conn.client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.upstream, conn.last, conn.open_pumps = upstream, time.monotonic(), 2
        self.active = conn
        threading.Thread(target=self._pump, args=(conn, conn.client, upstream), daemon=True).start()
        threading.Thread(target=self._pump, args=(conn, upstream, conn.client), daemon=True).start()

    def _close_if_idle(self, conn: _Connection) -> None:
        now = time.monotonic()
        silent, message = now - conn.last, conn.message
        late = message is not None and message.got < (now - message.started - self.handshake_s) * self.message_floor
        if message is not None and late:
            size = "a size not yet sent" if message.size is None else f"{message.size:,} bytes"
            rate = message.got / (now - message.started)
            why = f"its message ({size}) came at {rate:.1f} bytes/s, under {self.message_floor:g}"
        elif conn.sent <= HELLO_BYTES and silent > self.handshake_s:
            why = f"no request within {self.handshake_s:g} s of connecting"
        elif self.waiting and silent > self.idle_s:
            why = f"silent for {silent:.0f} s while {len(self.waiting)} other client(s) waited (--idle-timeout)"
        else:
            return
        self._say(f"closed {conn.peer}: {why}")
        conn.ended_by = "guard"
        _shut(conn)
        self._end_session()  # its pumps end on their own; the next client need not wait for them

    def _end_session(self) -> None:
        if self.active is not None:
            self.active.ended = time.monotonic()
        self.active = None

    def blame_crash(self) -> str | None:
        """The server has died: refuse the host whose session it died in for a while, and say so.
        That is the newest session the server answered, if it was still open or the server hung
        up on it. Returns that host, or None when it died in nobody's session."""
        with self.changed:
            conn, now = self.last, time.monotonic()
            if conn is None:
                return None
            # A session its client or the guard closed had ended, whether or not the scheduler has
            # marked it yet (its pumps finish first): the server died in nobody's session.
            if conn.ended_by in ("client", "guard"):
                return None
            if conn.ended is not None and now - conn.ended > _BLAME_WINDOW_S:
                return None
            crashes = self.crashes.get(conn.host, 0) + 1
            ban = min(self.crash_ban_s * 2 ** (crashes - 1), CRASH_BAN_MAX_S)
            self.crashes[conn.host], self.last = crashes, None
            if ban > 0:
                self.banned[conn.host] = now + ban
                self._say(
                    f"refusing {conn.host} for {ban:g} s: llama.cpp's server died during its session "
                    f"({crashes} time{'s' if crashes > 1 else ''}); other clients are served meanwhile"
                )
            return conn.host

    def _pump(self, conn: _Connection, source: socket.socket, sink: socket.socket) -> None:
        """Bytes from source to sink until either end closes (then both are closed)."""
        buffer = bytearray(_CHUNK)
        view = memoryview(buffer)
        from_client = source is conn.client
        try:
            while n := source.recv_into(buffer):
                if not from_client:
                    self.last = conn  # one let through while the server was dying got no answer
                sink.sendall(view[:n])
                conn.last = time.monotonic()
                if from_client:
                    conn.sent += n
                    _follow_messages(conn, view[:n], conn.last)
        except OSError:
            pass
        with self.changed:
            conn.ended_by = conn.ended_by or ("client" if from_client else "server")
        _shut(conn)
        with self.changed:
            conn.open_pumps -= 1
            if conn.open_pumps == 0:  # closed by the last pump, so no pump reads a reused descriptor
                source.close()
                sink.close()
            self.changed.notify()


def _follow_messages(conn: _Connection, data: memoryview, now: float) -> None:
    """Track the client's messages through the bytes it sent (they may end and begin anywhere)."""
    while data:
        if conn.message is None:
            conn.message = _Message(now)
        data = data[conn.message.feed(data) :]
        if conn.message.done:
            conn.message = None


def _shut(conn: _Connection) -> None:
    """Wake both pumps of a connection (they close the sockets once both have ended)."""
    for sock in (conn.client, conn.upstream):
        try:
            if sock is not None:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
