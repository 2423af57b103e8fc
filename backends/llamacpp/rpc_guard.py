"""The guard in front of llama.cpp's rpc-server: one client at a time through to the server,
the others queued, and a client that keeps them waiting or crashes the server shut out."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TextIO

from localspec.backends.llamacpp.rpc_server import HELLO_REQUEST_BYTES, RpcServerError

# llama.cpp's server serves one connection at a time, so a client that connects and then says
# nothing would hold every other client off for as long as it likes. The guard listens in
# its place, lets one connection at a time through to the server (which listens on a private
# loopback port), holds the others in a queue, and closes the one that keeps them waiting.
HELLO_BYTES = 1 + 8 + HELLO_REQUEST_BYTES  # a real client sends its hello at once
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


@dataclass(frozen=True)
class GuardLimits:
    """How long and how many clients the guard lets wait, and how long it shuts a crasher out."""

    idle_s: float = IDLE_TIMEOUT_S  # a session silent this long while others wait is closed
    handshake_s: float = HANDSHAKE_TIMEOUT_S  # a new connection must say hello within this
    max_clients: int = MAX_CLIENTS  # connections held at once, the one being served included
    crash_ban_s: float = CRASH_BAN_S  # the first shut-out of a host whose session crashed the server
    message_floor: float = MESSAGE_FLOOR_BYTES_S  # bytes/s a message must keep coming at


class Guard:
    """Accepts clients on `listener` and lets one at a time through to the server at
    127.0.0.1:`upstream_port`. A client that has not finished its hello and sent its first
    request within `handshake_s` is closed; a session silent for `idle_s` is closed once
    another client waits behind it; beyond `max_clients` new connections are refused; a host
    whose session crashed the server is refused for a while (`crash_ban_s`, doubling); a
    message that comes slower than `message_floor` bytes/s once `handshake_s` into it is
    closed, so a message takes at most handshake_s + its size / message_floor."""

    def __init__(
        self, listener: socket.socket, upstream_port: int, log: TextIO, limits: GuardLimits | None = None
    ) -> None:
        limits = limits or GuardLimits()
        self.listener, self.upstream_port, self.log = listener, upstream_port, log
        self.idle_s, self.handshake_s = limits.idle_s, min(limits.handshake_s, limits.idle_s)
        self.max_clients, self.crash_ban_s, self.message_floor = (
            limits.max_clients,
            limits.crash_ban_s,
            limits.message_floor,
        )
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
