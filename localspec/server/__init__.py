"""`localspec serve`: an OpenAI-compatible HTTP server over one Runtime.

server = LocalServer(runtime, "smollm2-135m", loader, host="127.0.0.1", port=0)
server.start()            # in a background thread (tests, benchmarks); serve() blocks (the CLI)
print(server.url)         # http://127.0.0.1:PORT/v1
server.stop()

A runtime given is the app's own: the server serves it and leaves it open at stop(), for the
app to keep using and to close. Request lines go to the logger "localspec.server" (nothing on
stdout or stderr) unless Settings(log=...) says otherwise.

Given None for the runtime, the server listens at once and loads loader(model_id) behind it:
requests wait in the queue, GET /health answers 503 "loading" until the model is there, and
wait_ready() blocks until then. A load that fails is answered to every waiting request, stops
the server, and is raised again by serve() and wait_ready().
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any, TypedDict, Unpack

import uvicorn

from localspec.api import Runtime
from localspec.server.app import Catalog, Settings, create_app
from localspec.server.hosts import host_name, is_loopback
from localspec.server.worker import Loader, Worker

__all__ = ["Catalog", "LocalServer", "Settings"]


class _Uvicorn(uvicorn.Server):
    """uvicorn, ending the generation in flight as soon as Ctrl+C or SIGTERM arrives (uvicorn
    would otherwise wait for every open stream to finish)."""

    def __init__(self, config: uvicorn.Config, worker: Worker) -> None:
        super().__init__(config)
        self.worker = worker

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # As uvicorn's, without raising the signal again once stopped: a stop on request is
        # a clean exit, and the CLI says so.
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        # Off the signal handler: stopping takes the worker's lock.
        threading.Thread(target=self.worker.stop, name="localspec-stop").start()


class ServerOptions(TypedDict, total=False):
    """LocalServer's options: where it listens (127.0.0.1:8000), how many requests may wait
    beside the running ones (64), the models it answers for (the loaded one) and its settings."""

    host: str
    port: int
    max_queue: int
    catalog: Catalog | None
    settings: Settings | None


class LocalServer:
    def __init__(
        self, runtime: Runtime | None, model_id: str, loader: Loader, **options: Unpack[ServerOptions]
    ) -> None:
        host, port = options.get("host", "127.0.0.1"), options.get("port", 8000)
        self.settings = options.get("settings") or Settings()
        self.worker = Worker(runtime, model_id, loader, options.get("max_queue", 64), self._loaded)
        catalog = options.get("catalog") or Catalog(model_id)
        self.app = create_app(self.worker, catalog, self.settings, bound_host=host)
        try:
            self.socket = _bind(host, port)
        except BaseException:
            self.worker.close()
            raise
        config = uvicorn.Config(
            self.app, log_config=None, log_level=logging.WARNING, access_log=False, timeout_graceful_shutdown=5
        )
        self._server = _Uvicorn(config, self.worker)
        self._thread: threading.Thread | None = None
        self.worker.begin()  # only now: the port is taken, so a busy one is said before any load

    def _loaded(self, error: BaseException | None) -> None:
        # Called only after a load this server began (a runtime given at the start is ready).
        if error is not None:
            self._server.should_exit = True  # nothing to serve: stop, and serve() says why
        elif (runtime := self.worker.runtime) is not None:
            self.settings.log(f"localspec serve: {self.worker.model_id} ({runtime.label}) is ready")

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until the model is loaded (True), or timeout seconds (False); raises the
        error a failed load raised."""
        ready = self.worker.loaded.wait(timeout)
        if self.worker.load_error is not None:
            raise self.worker.load_error
        return ready

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.socket.getsockname()[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}/v1"

    def serve(self) -> None:
        """Serve until Ctrl+C or SIGTERM (in the main thread) or stop(); then free everything."""
        try:
            self._server.run(sockets=[self.socket])
        finally:
            self.worker.close()
            self.socket.close()
        if self.worker.load_error is not None:
            raise self.worker.load_error

    def start(self) -> None:
        """Serve from a background thread; returns once the server accepts connections."""
        self._thread = threading.Thread(target=self._serve_in_background, name="localspec-server", daemon=True)
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                if self.worker.load_error is not None:
                    raise self.worker.load_error
                raise RuntimeError("the server stopped while starting")
            self._thread.join(0.01)

    def _serve_in_background(self) -> None:
        # A failed load reaches the caller through wait_ready(), not as a thread's traceback.
        with contextlib.suppress(Exception):
            self.serve()

    def stop(self) -> None:
        """End the request in flight, stop serving and free what the server loaded (a runtime
        it was given stays open)."""
        self.worker.stop()
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> LocalServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _bind(host: str, port: int) -> socket.socket:
    """Bound here rather than by uvicorn, so that the address (port 0 included) is known
    before serving starts."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
    sock.listen(128)
    return sock


def local_only(host: str) -> bool:
    """Whether --host reaches this machine only: a loopback name or address, however spelled
    (`0:0:0:0:0:0:0:1` is ::1)."""
    name = host_name(host)
    return name is not None and is_loopback(name)
