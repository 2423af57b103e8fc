"""A fake Hugging Face hub: a real HTTP server on 127.0.0.1 (port 0) in the test process,
answering the routes huggingface-hub uses for a pull, with the headers its client reads
(huggingface_hub/file_download.py: get_hf_file_metadata, http_get; utils/_http.py:
hf_raise_for_status):

- GET  /api/models/{repo}/revision/{rev}[?blobs=true]  model info: sha, siblings (size, blobId, lfs)
- GET  /api/models/{repo}/tree/{rev}[/{path}]          the file tree
- HEAD /{repo}/resolve/{rev}/{file}                    X-Repo-Commit, ETag, X-Linked-Etag, X-Linked-Size
- GET  /{repo}/resolve/{rev}/{file}                    the bytes; `Range: bytes=N-[M]` answers 206

Errors carry X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo) as the
hub's do. Files are served by the hub itself (as mirrors do), not redirected to a CDN.
Knobs for failures: tamper() serves other bytes under the same metadata, cut_after() drops
the connection mid-file, trickle() sends a file a byte at a time, `down` answers 503 to
everything; rename() moves a file (a registry entry gone stale), and split_gguf() writes a
GGUF as llama.cpp's shards. trickling_endpoint() is a hub that answers every request a byte
at a time from its first byte on."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import socket
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".gguf", ".safetensors")


@dataclass
class FakeRepo:
    files: dict[str, bytes]
    commit: str
    token: str | None = None  # gated: only this bearer token gets in
    served: dict[str, bytes] = field(default_factory=dict)  # tampered bytes, by file name

    def sibling(self, name: str, blobs: bool) -> dict[str, Any]:
        data = self.files[name]
        entry: dict[str, Any] = {"rfilename": name}
        if blobs:
            entry.update(size=len(data), blobId=git_oid(data))
            if name.endswith(LFS_SUFFIXES):
                entry["lfs"] = {"size": len(data), "sha256": sha256(data), "pointerSize": 134}
        return entry


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self.down = False
        self._cuts: dict[str, tuple[int, bool]] = {}
        self._stalls: dict[str, tuple[int, threading.Event]] = {}
        self._trickles: dict[str, float] = {}
        self.closing = threading.Event()
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        # a short poll interval: shutdown() waits for the loop to notice
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def add(self, repo: str, files: dict[str, bytes], token: str | None = None) -> FakeRepo:
        commit = hashlib.sha1(repo.encode() + b"".join(sorted(files.values()))).hexdigest()
        self.repos[repo] = FakeRepo(dict(files), commit, token)
        return self.repos[repo]

    def tamper(self, repo: str, name: str) -> None:
        """Serve the file with one byte changed, under its true size and sha256."""
        data = bytearray(self.repos[repo].files[name])
        data[-1] ^= 0xFF
        self.repos[repo].served[name] = bytes(data)

    def rename(self, repo: str, old: str, new: str) -> None:
        self.repos[repo].files[new] = self.repos[repo].files.pop(old)

    def cut_after(self, name: str, n_bytes: int, then_down: bool = False) -> None:
        """The next GET of `name` sends n_bytes, then the connection drops; with then_down the
        hub answers 503 to everything after, until `down` is set back to False."""
        self._cuts[name] = (n_bytes, then_down)

    def stall_after(self, name: str, n_bytes: int) -> threading.Event:
        """The next GET of `name` sends n_bytes, then holds the connection open until the
        client goes; the returned event is set once those bytes are sent (a client to kill
        mid-file)."""
        reached = threading.Event()
        self._stalls[name] = (n_bytes, reached)
        return reached

    def trickle(self, name: str, interval: float) -> None:
        """The next GET of `name` sends its headers, then one byte of the file every `interval`
        seconds, until the client goes or the hub closes."""
        self._trickles[name] = interval

    def resolve_gets(self) -> list[str]:
        return [p.rsplit("/", 1)[-1] for m, p, _ in self.requests if m == "GET" and "/resolve/" in p]

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet test output
            pass

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def do_GET(self) -> None:
            self._serve(body=True)

        def _serve(self, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            with hub._lock:
                hub.requests.append((self.command, path, self.headers.get("Range")))
            if hub.down:
                return self._error(503, None, "the hub is down")
            if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/(revision|tree)/([^/]+)(?:/(.*))?", path):
                return self._api(m[1], m[2], m[3], m[4] or "")
            if m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
                return self._resolve(m[1], m[2], m[3], body)
            self._error(404, None, "no such route")

        def _repo(self, repo_id: str, revision: str) -> FakeRepo | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._error(404, "RepoNotFound", "Repository not found")
            elif repo.token and self.headers.get("Authorization") != f"Bearer {repo.token}":
                self._error(403, "GatedRepo", "Access to this model is restricted")
            elif revision not in ("main", repo.commit):
                self._error(404, "RevisionNotFound", "Invalid rev id")
            else:
                return repo
            return None

        def _api(self, repo_id: str, route: str, revision: str, prefix: str) -> None:
            repo = self._repo(repo_id, revision)
            if repo is None:
                return
            if route == "revision":
                blobs = "blobs=true" in (urlsplit(self.path).query or "")
                siblings = [repo.sibling(n, blobs) for n in sorted(repo.files)]
                return self._json({"id": repo_id, "sha": repo.commit, "siblings": siblings})
            entries = []
            for name in sorted(n for n in repo.files if n.startswith(prefix)):
                info = repo.sibling(name, blobs=True)
                entry = {"type": "file", "oid": info["blobId"], "size": info["size"], "path": name}
                if "lfs" in info:
                    entry["lfs"] = {"oid": info["lfs"]["sha256"], "size": info["size"], "pointerSize": 134}
                entries.append(entry)
            self._json(entries)

        def _resolve(self, repo_id: str, revision: str, name: str, body: bool) -> None:
            repo = self._repo(repo_id, revision)
            if repo is None:
                return
            if name not in repo.files:
                return self._error(404, "EntryNotFound", "Entry not found", commit=repo.commit)
            data = repo.served.get(name, repo.files[name])
            lfs = name.endswith(LFS_SUFFIXES)
            etag = sha256(repo.files[name]) if lfs else git_oid(repo.files[name])
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
            start = int(m[1]) if m else 0
            end = min(int(m[2]) + 1, len(data)) if m and m[2] else len(data)
            self.send_response(206 if m else 200)
            self.send_header("X-Repo-Commit", repo.commit)
            self.send_header("ETag", f'"{etag}"')
            if lfs:
                self.send_header("X-Linked-Etag", f'"{etag}"')
                self.send_header("X-Linked-Size", str(len(data)))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(end - start))
            if m:
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
            self.end_headers()
            if not body:
                return
            interval = hub._trickles.pop(name, None)
            if interval is not None:
                self.close_connection = True
                _trickle(self.wfile, data[start:end], interval, hub.closing)
                return
            stall = hub._stalls.pop(name, None)
            if stall is not None:
                self.wfile.write(data[start : start + stall[0]])
                self.wfile.flush()
                stall[1].set()
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.rfile.read(1)  # returns when the client's end closes (it was killed)
                return
            cut = hub._cuts.pop(name, None)
            if cut is None:
                self.wfile.write(data[start:end])
                return
            n_bytes, then_down = cut
            self.wfile.write(data[start : start + n_bytes])
            self.wfile.flush()
            hub.down = then_down
            self.close_connection = True  # the rest never comes: the client sees a short body

        def _json(self, value: Any) -> None:
            raw = json.dumps(value).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _error(self, status: int, code: str | None, message: str, commit: str | None = None) -> None:
            raw = json.dumps({"error": message}).encode()
            self.send_response(status)
            if code:
                self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            if commit:
                self.send_header("X-Repo-Commit", commit)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(raw)

    return Handler


def _trickle(out: Any, data: bytes, interval: float, closing: threading.Event) -> None:
    """data one byte every interval seconds, until the client's end closes or closing is set."""
    for i in range(len(data)):
        try:
            out.write(data[i : i + 1])
            out.flush()
        except OSError:
            return
        if closing.wait(interval):
            return


@contextlib.contextmanager
def trickling_endpoint(interval: float) -> Iterator[str]:
    """A hub on 127.0.0.1 that answers every request with a 200 sent one byte every interval
    seconds: it never stops answering, and never finishes an answer."""
    server = socket.create_server(("127.0.0.1", 0))
    closing = threading.Event()
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n" + b" " * 100000

    def serve(conn: socket.socket) -> None:
        with conn, conn.makefile("wb", buffering=0) as out:
            conn.recv(65536)  # the request
            _trickle(out, answer, interval, closing)

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        closing.set()
        server.close()


def tiny_gguf(
    tokens: list[str] | None, model: str = "gpt2", padding: int = 1 << 16, arch: str = "llama", **keys: int
) -> bytes:
    """A small real GGUF file: a tokenizer (none for None), `{arch}.{key}` for each of `keys`
    and one tensor of `padding` bytes, so a download of it can be cut mid-file."""
    import numpy as np

    return _gguf_files("m", arch, tokens, model, keys, {"pad": np.zeros(padding, dtype=np.int8)})["m.gguf"]


def split_gguf(stem: str, tokens: list[str], shards: int, padding: int = 1 << 12) -> dict[str, bytes]:
    """A GGUF written as llama.cpp's split files (one tensor per shard), by name."""
    import numpy as np

    pads = {f"pad{i}": np.zeros(padding, dtype=np.int8) for i in range(shards)}
    return _gguf_files(stem, "llama", tokens, "gpt2", {}, pads, split=True)


def _gguf_files(
    stem: str,
    arch: str,
    tokens: list[str] | None,
    model: str,
    keys: dict[str, int],
    tensors: dict[str, Any],
    split: bool = False,
) -> dict[str, bytes]:
    import gguf

    from localspec.testing.gguf_writer import write_out

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{stem}.gguf"
        writer = gguf.GGUFWriter(path, arch, split_max_tensors=1 if split else 0)
        for key, value in keys.items():
            writer.add_uint32(f"{arch}.{key}", value)
        if tokens is not None:
            writer.add_tokenizer_model(model)
            writer.add_token_list(tokens)
            writer.add_bos_token_id(0)
            writer.add_eos_token_id(1)
        write_out(writer, tensors, path)
        return {p.name: p.read_bytes() for p in sorted(Path(tmp).iterdir())}


TOKENS = ["<s>", "</s>", *(f"tok{i}" for i in range(60))]
OTHER_TOKENS = ["<s>", "</s>", *(f"word{i}" for i in range(60))]


def model_toml(key: str, repo: str, files: list[str], params: str = "66K", mlx: str = "", **fields: str) -> str:
    """A registry entry [models.KEY] (named KEY in title case) for these llama.cpp files on the
    fake hub; `mlx` names a repo of MLX files; `fields` overrides family and license."""
    entry = {"name": key.title(), "family": "tiny", "license": "mit", "params": params, **fields}
    lines = [f"[models.{key}]", *(f"{k} = {json.dumps(v)}" for k, v in entry.items())]
    lines.append(f'llamacpp = {{ repo = "{repo}", revision = "main", files = {json.dumps(files)} }}')
    if mlx:
        lines.append(f'mlx = {{ repo = "{mlx}", revision = "main", files = ["*.json", "*.safetensors"] }}')
    return "\n".join(lines) + "\n\n"


def pair_toml(key: str, description: str, target: str, strategy: str, **fields: object) -> str:
    """A registry entry [pairs.KEY]; `fields`: drafter, draft_tokens, aliases."""
    entry = {"description": description, "target": target, **fields, "strategy": strategy}
    ordered = {
        k: entry[k] for k in ("aliases", "description", "target", "drafter", "strategy", "draft_tokens") if k in entry
    }
    return "\n".join([f"[pairs.{key}]", *(f"{k} = {json.dumps(v)}" for k, v in ordered.items())]) + "\n\n"


# A user models.toml of tiny pairs served by the fake hub; merged over the packaged registry.
TEST_REGISTRY = "".join(
    [
        model_toml("tiny-target", "test/tiny-target-GGUF", ["tiny-target.gguf"], mlx="test/tiny-target-mlx"),
        model_toml("tiny-drafter", "test/tiny-drafter-GGUF", ["tiny-drafter.gguf"], "17K", mlx="test/tiny-drafter-mlx"),
        model_toml(
            "foreign-drafter", "test/foreign-GGUF", ["foreign.gguf"], "17K", mlx="test/foreign-mlx", family="foreign"
        ),
        model_toml("gated-target", "test/gated-GGUF", ["gated.gguf"], license="restricted"),
        model_toml("misnamed", "test/tiny-target-GGUF", ["absent.gguf"]),
        model_toml("ghost", "test/ghost-GGUF", ["ghost.gguf"]),
        pair_toml(
            "tiny",
            "A tiny target drafted by a tiny drafter",
            "tiny-target",
            "draft",
            aliases=["tiny-pair"],
            drafter="tiny-drafter",
            draft_tokens=4,
        ),
        pair_toml("tiny-solo", "The tiny drafter alone", "tiny-drafter", "ngram", draft_tokens="auto"),
        pair_toml(
            "mismatched",
            "A drafter with another tokenizer",
            "tiny-target",
            "draft",
            drafter="foreign-drafter",
            draft_tokens=4,
        ),
        pair_toml("gated", "A gated repo", "gated-target", "ngram", draft_tokens="auto"),
        pair_toml("misnamed", "A file the repo does not have", "misnamed", "ngram", draft_tokens="auto"),
        pair_toml("ghost", "A repo the hub does not have", "ghost", "ngram", draft_tokens="auto"),
    ]
)


def serve_test_pairs(hub: FakeHub, home: Path) -> None:
    """Put the test pairs' repos on the hub and their registry in the user directory."""
    hub.add("test/tiny-target-GGUF", {"tiny-target.gguf": tiny_gguf(TOKENS), "README.md": b"# tiny\n"})
    hub.add("test/tiny-drafter-GGUF", {"tiny-drafter.gguf": tiny_gguf(TOKENS, padding=1 << 14)})
    hub.add("test/foreign-GGUF", {"foreign.gguf": tiny_gguf(OTHER_TOKENS, padding=1 << 14)})
    hub.add("test/gated-GGUF", {"gated.gguf": tiny_gguf(TOKENS)}, token="secret")
    for name, tokens in (("tiny-target", TOKENS), ("tiny-drafter", TOKENS), ("foreign", OTHER_TOKENS)):
        tokenizer = {"model": {"type": "BPE", "vocab": {t: i for i, t in enumerate(tokens)}}, "added_tokens": []}
        files = {"config.json": b'{"model_type": "llama"}', "tokenizer.json": json.dumps(tokenizer).encode()}
        files.update({"model.safetensors": b"\0" * 4096, "README.md": b"x"})
        hub.add(f"test/{name}-mlx", files)
    home.mkdir(parents=True, exist_ok=True)
    (home / "models.toml").write_text(TEST_REGISTRY)
