"""A floor on how fast the hub must send while a pull waits on it.

huggingface-hub's timeouts bound one socket read, so a hub that sends a byte every few
seconds never trips them, and its download loop resumes after every stall that brought a
byte. Here each connection's reads are measured in stretches as long as the call's read
timeout: a stretch that brings no byte ends as the plain read timeout it always was (the
download is resumed, as before); one that brings some bytes but under MIN_BYTES_PER_SECOND
ends the pull with HubTooSlowError, which nothing retries.

The guard wraps the network layer of huggingface-hub's shared HTTP client (httpcore2's
network backend, reached through the client's transports) and acts only inside
`throughput_floor()`, on the thread that entered it: other users of the client in the same
process see no change.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# 1 kB/s: a 100 MB drafter would take more than a day at it; any real link is far above.
MIN_BYTES_PER_SECOND = 1000.0

_active = threading.local()


class HubTooSlowError(Exception):
    """The hub kept the connection alive with a trickle under the floor."""

    def __init__(self, received: int, seconds: float, floor: float) -> None:
        super().__init__(f"{received} bytes in {seconds:g} s, under the floor of {floor:g} bytes/s")
        self.received, self.seconds, self.floor = received, seconds, floor


@contextmanager
def throughput_floor(floor: float = MIN_BYTES_PER_SECOND) -> Iterator[None]:
    """Hub calls made on this thread inside the block must send `floor` bytes/s, measured
    over each stretch of their read timeout."""
    _install()
    saved = getattr(_active, "floor", None)
    _active.floor = floor
    try:
        yield
    finally:
        _active.floor = saved


def _install() -> None:
    """Wrap the network backend of every connection pool of the shared client (once)."""
    from huggingface_hub import get_session

    session = get_session()
    transports = [getattr(session, "_transport", None), *getattr(session, "_mounts", {}).values()]
    for transport in transports:
        pool = getattr(transport, "_pool", None)
        backend = getattr(pool, "_network_backend", None)
        if backend is not None and not isinstance(backend, _FlooredBackend):
            pool._network_backend = _FlooredBackend(backend)  # type: ignore[union-attr]


class _FlooredBackend:
    """httpcore2's NetworkBackend, handing out streams whose reads keep the floor."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def connect_tcp(self, *args: Any, **kwargs: Any) -> _FlooredStream:
        return _FlooredStream(self.inner.connect_tcp(*args, **kwargs))

    def connect_unix_socket(self, *args: Any, **kwargs: Any) -> _FlooredStream:
        return _FlooredStream(self.inner.connect_unix_socket(*args, **kwargs))

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)


class _FlooredStream:
    """httpcore2's NetworkStream. A stretch starts with each request written and each time
    the floor's worth of a stretch has arrived."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._start = time.monotonic()
        self._received = 0

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        floor = getattr(_active, "floor", None)
        if floor is None or timeout is None:
            return bytes(self.inner.read(max_bytes, timeout))
        import httpcore2

        left = self._start + timeout - time.monotonic()
        try:
            if left <= 0:
                raise httpcore2.ReadTimeout("the stretch ended")
            data = bytes(self.inner.read(max_bytes, left))
        except httpcore2.ReadTimeout:
            if self._received == 0:
                raise  # nothing at all: the read timeout it always was
            raise HubTooSlowError(self._received, timeout, floor) from None
        self._received += len(data)
        if self._received >= floor * timeout:
            self._restart()
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.inner.write(buffer, timeout)
        self._restart()  # a new request: its answer gets a whole stretch

    def _restart(self) -> None:
        self._start, self._received = time.monotonic(), 0

    def close(self) -> None:
        self.inner.close()

    def start_tls(self, *args: Any, **kwargs: Any) -> _FlooredStream:
        return _FlooredStream(self.inner.start_tls(*args, **kwargs))

    def get_extra_info(self, info: str) -> Any:
        return self.inner.get_extra_info(info)
