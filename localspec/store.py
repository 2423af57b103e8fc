"""The user directory and everything written in it: one place owns where user data lives,
how it is written, and the one index of file fingerprints.

The directory is resolved when first needed, never at import; LOCALSPEC_HOME overrides it
(tests point it at a temporary folder).

Every file appears whole or not at all.
A write goes to a temporary file in the same folder, is flushed to the disk (fsync) and then
renamed over the old file, so a full disk, a crash or a kill leaves the old file as it was.
What fails says what to do: "disk full: free N MB in FOLDER", or a read-only folder with the
variable that moves it. Caches, which only save a measurement for next time, degrade to a
one-line notice (save_quietly); records the user asked for raise StoreError.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import platformdirs

from localspec.core.errors import LocalspecError


def data_dir() -> Path:
    override = os.environ.get("LOCALSPEC_HOME")
    root = Path(override) if override else Path(platformdirs.user_data_dir("localspec", appauthor=False))
    if str(root) not in _checked_homes:
        _check_home(root, "LOCALSPEC_HOME" if override else "the user directory")
    return root


_checked_homes: set[str] = set()


def _check_home(root: Path, what: str) -> None:
    """Refuse a user directory that cannot be a folder (LOCALSPEC_HOME=/dev/null, a file);
    warn, as ssh does, about one that any user can write. One missing is created later."""
    try:
        mode = root.stat().st_mode
    except FileNotFoundError:
        return
    except OSError as exc:  # ENOTDIR: a parent on the way is a file
        raise StoreError(
            f"{what} {root} cannot be a folder: {exc.strerror}", "set LOCALSPEC_HOME to a folder you can write"
        ) from None
    if not stat.S_ISDIR(mode):
        kind = "a file" if stat.S_ISREG(mode) else "a device or other special file"
        raise StoreError(
            f"{what} {root} is {kind}, not a folder",
            "set LOCALSPEC_HOME to a folder you can write (one that does not exist yet is created)",
        )
    _checked_homes.add(str(root))
    warn_if_others_can_write(root, "the user directory")


def warn_if_others_can_write(path: Path, what: str) -> None:
    """One notice when path is writable by any user or owned by someone else (root aside):
    whoever can write there chooses which files localspec downloads and runs."""
    if not hasattr(os, "getuid"):
        return  # Windows: the profile's ACLs protect it
    try:
        st = path.stat()
    except OSError:
        return
    if st.st_uid not in (os.getuid(), 0):
        notice(
            f"{what} {path} belongs to user {st.st_uid}, not you: they choose the models localspec runs; "
            f"take it over (chown) or set LOCALSPEC_HOME to a folder of yours"
        )
    elif st.st_mode & 0o002:  # group-writable is a umask 002 system's normal: its group is the user's own
        notice(
            f"{what} {path} can be written by any user (mode {stat.S_IMODE(st.st_mode):o}): anyone who can "
            f"write it chooses the models localspec runs; run `chmod o-w {path}`"
        )


def models_dir() -> Path:
    return data_dir() / "models"


def calibration_file() -> Path:
    return data_dir() / "calibration.json"


def private_dir(path: Path) -> Path:
    """Create path (a folder in the user directory) readable by this user only, and the
    user directory itself so: chats and models are nobody else's business."""
    root = data_dir()
    try:
        if not root.exists():
            root.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise write_error(exc, path, what=f"the folder {path.name} was not created") from exc
    return path


def owned_privately(path: Path) -> bool:
    """Whether only this user could have written path: code is loaded only from there."""
    if not hasattr(os, "getuid"):
        return True  # Windows: the user profile's ACLs are what protect it
    try:
        st = path.stat()
    except OSError:
        return False
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


DISK_FULL = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
READ_ONLY = (errno.EACCES, errno.EPERM, errno.EROFS)


class StoreError(LocalspecError):
    """A file of user data could not be written; the old one, if any, is intact."""

    def __init__(self, message: str, hint: str, errno: int | None = None) -> None:
        super().__init__(message, hint)
        self.errno = errno  # the OSError's: tells a full disk from a read-only folder


def write_atomic(path: str | os.PathLike[str], data: bytes | str, check: Callable[[Path], None] | None = None) -> None:
    """data as the whole content of path, or path as it was; check(temporary file), when
    given, runs before the rename and may refuse the new content by raising."""
    raw = data.encode("utf-8") if isinstance(data, str) else data

    def fill(fd: int, temporary: Path) -> None:
        _write_all(fd, raw)

    replace_atomic(path, fill, len(raw), check)


def replace_atomic(
    path: str | os.PathLike[str],
    fill: Callable[[int, Path], None],
    size: int = 0,
    check: Callable[[Path], None] | None = None,
) -> None:
    """What fill(fd, temporary) writes (to the descriptor, or by the temporary file's name)
    as the whole content of path; size (bytes, when known) is what a full disk message asks
    to free. An OSError raises StoreError; the old file stays as it was."""
    path = Path(path)
    try:
        fd, temporary = _temporary(path)
    except OSError as exc:
        raise write_error(exc, path, size) from exc
    try:
        try:
            fill(fd, temporary)
            os.fsync(fd)
        finally:
            os.close(fd)
        _keep_mode(path, temporary)
        if check is not None:
            check(temporary)
        os.replace(temporary, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            temporary.unlink()
        if isinstance(exc, OSError):
            raise write_error(exc, path, size) from exc
        raise
    _sync_folder(path.parent)


def write_json_atomic(path: str | os.PathLike[str], value: Any, indent: int | None = 1) -> None:
    write_atomic(path, json.dumps(value, indent=indent))


def save_quietly(path: str | os.PathLike[str], data: bytes | str, what: str) -> bool:
    """write_atomic for a cache: a failure is one notice on stderr (once per file), since
    the value is measured or computed again next time. Returns whether it was saved."""
    try:
        write_atomic(path, data)
    except StoreError as exc:
        notice(f"{what} was not saved: {exc.message}; {exc.hint}")
        return False
    return True


def save_json_quietly(path: str | os.PathLike[str], value: Any, what: str) -> bool:
    return save_quietly(path, json.dumps(value, indent=1), what)


def write_error(exc: OSError, path: Path, size: int = 0, what: str | None = None) -> StoreError:
    """An OSError from writing path, as what to do about it; what: what was not done."""
    folder = _existing(path.parent)
    what = what or f"{path.name} was not saved"
    if exc.errno in DISK_FULL:
        return StoreError(
            f"disk full: free {_megabytes(size)} MB in {folder} to save {path.name} (the old file is unchanged)",
            "delete files on that disk (`localspec rm PAIR` frees a pulled pair), then run the same command again",
            exc.errno,
        )
    if exc.errno in READ_ONLY:
        return StoreError(
            f"{folder} is read-only here: {what} ({exc.strerror})",
            "make the folder writable, or set LOCALSPEC_HOME to a folder you can write",
            exc.errno,
        )
    return StoreError(
        f"could not save {path}: {exc.strerror or exc}", "check that folder and its disk, then try again", exc.errno
    )


def disk_full_message(folder: str | os.PathLike[str], size: int = 0) -> str:
    """ "disk full: free N MB in FOLDER", for a writer that found ENOSPC itself (SQLite)."""
    return f"disk full: free {_megabytes(size)} MB in {_existing(Path(folder))}"


def why_not_writable(folder: str | os.PathLike[str], needed: int) -> str | None:
    """Why `needed` bytes could not be written into folder, if it can be seen from here: a
    folder that is read-only, or a disk with less free space than that (a requantized model
    whose writer gives only an exit code)."""
    where = _existing(Path(folder))
    if not os.access(where, os.W_OK):
        return f"{where} is read-only here; set LOCALSPEC_HOME to a folder you can write"
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        return None
    if free < needed:
        return f"disk full: free {_megabytes(needed - free)} MB in {where} (it needs {_megabytes(needed)} MB)"
    return None


_noticed: set[str] = set()


def notice(line: str) -> None:
    """One line on stderr, once per process for the same line."""
    if line in _noticed:
        return
    _noticed.add(line)
    print(f"localspec: note: {line}", file=sys.stderr, flush=True)


def _temporary(path: Path) -> tuple[int, Path]:
    """A new private file beside path, open for writing (a dot name: no tool lists it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    return fd, Path(name)


def _write_all(fd: int, raw: bytes) -> None:
    view = memoryview(raw)
    while view:
        view = view[os.write(fd, view) :]


def _keep_mode(path: Path, temporary: Path) -> None:
    """A replaced file keeps its permissions (mkstemp makes the new one private)."""
    with contextlib.suppress(OSError):
        os.chmod(temporary, path.stat().st_mode & 0o7777)


def _sync_folder(folder: Path) -> None:
    """The rename itself reaches the disk (POSIX; Windows cannot open a folder)."""
    with contextlib.suppress(OSError, AttributeError):
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _existing(folder: Path) -> Path:
    """The folder, or its nearest parent that exists (what a message can point to)."""
    while not folder.exists() and folder.parent != folder:
        folder = folder.parent
    return folder


def _megabytes(size: int) -> int:
    return max(1, math.ceil(size / 1e6))


def sha256_of(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def file_fingerprint(path: str | os.PathLike[str]) -> str:
    """sha256 of the file, computed once per (path, size, mtime) and remembered in one index
    (hashes.json), so caches keyed by a model's content never hash a gigabyte file twice."""
    stat = os.stat(path)
    key = f"{os.path.abspath(path)}|{stat.st_size}|{stat.st_mtime_ns}"
    index = data_dir() / "hashes.json"
    try:
        known = json.loads(index.read_text())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):
        known = {}
    if key not in known:
        if stat.st_size > 1 << 30:
            print(f"hashing {os.path.basename(path)} once, to key what is derived from it", file=sys.stderr)
        known[key] = sha256_of(path)
        save_json_quietly(index, known, "the hash of the model (computed again next time)")
    return str(known[key])


class JsonCache:
    """Records by key in one JSON file of the user directory, for measurements and choices
    worth keeping between runs: a missing or damaged file reads as empty (it only costs a
    measurement again), and a write that fails is one notice, never an error."""

    def __init__(self, path: Callable[[], Path], what: str) -> None:
        self.path, self.what = path, what

    def load(self) -> dict[str, dict[str, object]]:
        try:
            data = json.loads(self.path().read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def save(self, records: dict[str, dict[str, object]]) -> None:
        save_json_quietly(self.path(), records, self.what)

    def get(self, key: str) -> dict[str, object] | None:
        hit = self.load().get(key)
        return hit if isinstance(hit, dict) else None

    def put(self, key: str, value: dict[str, object]) -> None:
        records = self.load()
        records[key] = value
        self.save(records)


# Cost curves, pair agreements, drafting costs and self-drafter choices, per model and machine.
CALIBRATION = JsonCache(calibration_file, "the calibration (measured again next time)")
