"""A TCP relay that adds a fixed delay in each direction: a network of a chosen round-trip
time in front of a server on 127.0.0.1 (two of them make rpc_bench.py's "two machines").

Every chunk is held for the delay from the moment it arrives and then forwarded in order,
so the delay adds to each crossing without throttling a stream that is already flowing.

    python benchmarks/latency_proxy.py --listen 127.0.0.1:50100 --upstream 127.0.0.1:50052 --delay-ms 2.5
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator

CHUNK = 1 << 16


class LatencyProxy:
    """Relays 127.0.0.1:port to upstream, delay_s one way (round trip 2 x delay_s)."""

    def __init__(self, upstream: tuple[str, int], delay_s: float, host: str = "127.0.0.1", port: int = 0) -> None:
        self.upstream = upstream
        self.delay_s = delay_s
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None
        self._relays: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._relay, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in self._relays:
            task.cancel()
        await asyncio.gather(*self._relays, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._relays.add(task)
        task.add_done_callback(self._relays.discard)
        try:
            server_r, server_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_w.close()  # the upstream is down: the client sees its connection closed
            return
        await asyncio.gather(self._one_way(client_r, server_w), self._one_way(server_r, client_w))

    async def _one_way(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    break
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                writer.write(data)
                await writer.drain()

        sender = asyncio.create_task(deliver())
        try:
            while data := await reader.read(CHUNK):
                queue.put_nowait((time.perf_counter() + self.delay_s, data))
            queue.put_nowait((0.0, b""))
            with contextlib.suppress(OSError):
                await sender
        except OSError:
            pass
        finally:
            sender.cancel()
            writer.close()


@contextlib.contextmanager
def running(upstream: tuple[str, int], delay_s: float) -> Iterator[int]:
    """A proxy on its own event loop thread for the duration of the block; yields its port."""
    loop = asyncio.new_event_loop()
    proxy = LatencyProxy(upstream, delay_s)
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield asyncio.run_coroutine_threadsafe(proxy.start(), loop).result()
    finally:
        asyncio.run_coroutine_threadsafe(proxy.close(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT to accept clients on")
    parser.add_argument("--upstream", required=True, help="HOST:PORT of the real server")
    parser.add_argument("--delay-ms", type=float, required=True, help="added delay each way (round trip: twice)")
    args = parser.parse_args()
    host, _, port = args.listen.rpartition(":")
    up_host, _, up_port = args.upstream.rpartition(":")

    async def serve() -> None:
        proxy = LatencyProxy((up_host, int(up_port)), args.delay_ms / 1e3, host, int(port))
        print(f"listening on {host}:{await proxy.start()}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
