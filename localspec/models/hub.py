"""The Hugging Face hub side of a pull: which files a registry entry means at which commit,
fetching them into the standard hub cache (shared with other tools) and checking them.

huggingface-hub reads HF_ENDPOINT, HF_HUB_CACHE, HF_HUB_OFFLINE and its timeouts once, at
import; here they are read when a pull starts (hub_settings.py) and passed explicitly, so settings made later
still count. Every call has a timeout: a hub that accepts the connection and never answers
ends the pull with what to do (hub_errors.py) instead of a wait without end."""

from __future__ import annotations

import fnmatch
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from localspec.common.progress import Announce
from localspec.models.entries import HubArtifact
from localspec.models.hub_errors import ChecksumMismatchError, PullError, hub_errors, missing_file, offline_missing
from localspec.models.hub_floor import throughput_floor
from localspec.models.hub_settings import HubSettings, waiting_for_hub
from localspec.store import sha256_of, write_atomic


@dataclass(frozen=True)
class RemoteFile:
    name: str
    size: int | None
    sha256: str | None
    sha256_from: str  # who vouches for the sha256: "models.toml", "the hub" or "--accept-hash"
    cached: bool


@dataclass(frozen=True)
class Plan:
    """The concrete files an artifact means, at one commit."""

    artifact: HubArtifact
    commit: str
    files: tuple[RemoteFile, ...]


def repo_dir(settings: HubSettings, repo: str) -> Path:
    return settings.cache_dir / ("models--" + repo.replace("/", "--"))


def plan(
    artifact: HubArtifact,
    settings: HubSettings,
    accepted: frozenset[str] = frozenset(),
    announce: Announce | None = None,
) -> Plan:
    """Ask the hub (one request) which files, sizes and sha256s the artifact means; offline,
    read the same from the cache. announce is told when the hub is slow to answer."""
    if settings.offline:
        return _plan_offline(artifact, settings)
    from huggingface_hub import HfApi

    api = HfApi(endpoint=settings.endpoint, token=settings.token)
    asking = waiting_for_hub(settings, f"asking about {artifact.repo}", announce)
    with hub_errors(artifact, None, settings), asking, throughput_floor():
        info = api.model_info(artifact.repo, revision=artifact.revision, files_metadata=True, timeout=settings.timeout)
    commit = str(info.sha)
    siblings = {s.rfilename: s for s in info.siblings or []}
    chosen: dict[str, RemoteFile] = {}
    for spec in artifact.files:
        names = sorted(fnmatch.filter(siblings, spec.name)) if spec.is_pattern else [spec.name]
        if not names or names[0] not in siblings:
            raise missing_file(artifact, spec.name, settings)
        for name in names:
            sibling = siblings[name]
            hub_sha = sibling.lfs.sha256 if sibling.lfs is not None else None
            sha: str | None
            if spec.sha256 and hub_sha in accepted - {spec.sha256}:
                sha, sha_from = hub_sha, "--accept-hash"  # the user takes the hub's file over the pin
            else:
                _check_agrees(artifact, name, "size", spec.size, sibling.size)
                _check_agrees(artifact, name, "sha256", spec.sha256, hub_sha)
                sha, sha_from = (spec.sha256, "models.toml") if spec.sha256 else (hub_sha, "the hub")
            cached = (repo_dir(settings, artifact.repo) / "snapshots" / commit / name).is_file()
            chosen[name] = RemoteFile(name, sibling.size, sha, sha_from, cached)
    return Plan(artifact, commit, tuple(chosen.values()))


def _plan_offline(artifact: HubArtifact, settings: HubSettings) -> Plan:
    folder = repo_dir(settings, artifact.repo)
    ref = folder / "refs" / artifact.revision
    commit = artifact.revision if artifact.pinned else (ref.read_text().strip() if ref.is_file() else None)
    snapshot = folder / "snapshots" / str(commit)
    if commit is None or not snapshot.is_dir():
        raise offline_missing(artifact, f"revision {artifact.revision}")
    present = sorted(p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file())
    chosen: dict[str, RemoteFile] = {}
    for spec in artifact.files:
        names = fnmatch.filter(present, spec.name) if spec.is_pattern else [spec.name]
        if not names or names[0] not in present:
            raise offline_missing(artifact, spec.name)
        for name in names:
            size = (snapshot / name).stat().st_size
            chosen[name] = RemoteFile(name, size, spec.sha256, "models.toml", True)
    return Plan(artifact, commit, tuple(chosen.values()))


def fetch(
    plan: Plan, file: RemoteFile, settings: HubSettings, bar: type[FileBar], accepted: frozenset[str] = frozenset()
) -> Path:
    """One file into the hub cache, checked. huggingface-hub writes to a temporary file and
    renames it only when complete, so an interrupted fetch leaves nothing that looks whole.
    A file kept aside by an earlier mismatch whose sha256 is now accepted is taken back."""
    from huggingface_hub import hf_hub_download

    artifact = plan.artifact
    if not settings.offline:
        sweep_incomplete(Path(settings.cache_dir), artifact.repo)
    what = f"{file.name} from {artifact.repo}@{plan.commit[:12]}"
    blobs = repo_dir(settings, artifact.repo) / "blobs"
    snapshot = repo_dir(settings, artifact.repo) / "snapshots" / plan.commit / file.name
    kept = next((k for h in sorted(accepted) if (k := blobs / kept_name(file.sha256, h)).is_file()), None)
    if kept is not None and not snapshot.exists():
        snapshot.parent.mkdir(parents=True, exist_ok=True)
        snapshot.symlink_to(os.path.relpath(kept, snapshot.parent))
        verify(snapshot, replace(file, size=None), what, accepted)  # its sha256 vouches for it
        return snapshot
    with hub_errors(artifact, file.name, settings), download_timeouts(settings), throughput_floor():
        local = Path(
            hf_hub_download(
                artifact.repo,
                file.name,
                revision=plan.commit,
                endpoint=settings.endpoint,
                cache_dir=settings.cache_dir,
                token=settings.token,
                local_files_only=settings.offline,
                tqdm_class=bar.named(file.name),
                etag_timeout=settings.timeout,
            )
        )
    verify(local, file, what, accepted)
    return local


@contextmanager
def download_timeouts(settings: HubSettings) -> Iterator[None]:
    """huggingface-hub times a file's bytes, and its retry of a metadata call that failed, by
    module values it read at import; they are set from settings for this call (no parameter
    reaches them), so a stalled transfer ends after the timeout the user set now."""
    from huggingface_hub import constants, file_download

    saved = constants.HF_HUB_DOWNLOAD_TIMEOUT, getattr(file_download, "_ETAG_RETRY_TIMEOUT", None)
    constants.HF_HUB_DOWNLOAD_TIMEOUT = settings.download_timeout  # type: ignore[assignment]
    if saved[1] is not None:
        file_download._ETAG_RETRY_TIMEOUT = max(settings.timeout, 1)  # type: ignore[assignment]
    try:
        yield
    finally:
        constants.HF_HUB_DOWNLOAD_TIMEOUT = saved[0]
        if saved[1] is not None:
            file_download._ETAG_RETRY_TIMEOUT = saved[1]


def sweep_incomplete(cache_dir: Path, repo: str) -> int:
    """Delete the partial downloads a killed pull left in a repo's blobs (huggingface-hub names
    them per process, so none is ever resumed); one whose download lock another process
    holds is still being written and stays. Returns how many went."""
    from filelock import FileLock, Timeout

    folder = "models--" + repo.replace("/", "--")
    swept = 0
    for part in (cache_dir / folder / "blobs").glob("*.incomplete"):
        lock = FileLock(str(cache_dir / ".locks" / folder / f"{part.name.split('.')[0]}.lock"))
        try:
            lock.acquire(timeout=0)
        except (Timeout, OSError):
            continue
        try:
            part.unlink(missing_ok=True)
            swept += 1
        finally:
            lock.release()
    return swept


def verify(local: Path, file: RemoteFile, what: str, accepted: frozenset[str] = frozenset()) -> None:
    """Check size and sha256. A file of the wrong size is a broken transfer and is deleted;
    a whole file with another sha256 may be the right one under a stale pin, so it is moved
    aside among the hub cache's blobs (see kept_name) and the snapshot link dropped."""
    size = local.stat().st_size
    blob = local.resolve()
    if file.size is not None and size != file.size:
        local.unlink(missing_ok=True)
        blob.unlink(missing_ok=True)
        raise ChecksumMismatchError(
            f"{what} has {size} bytes, expected {file.size}; the broken file was deleted",
            "run the same command again; if it repeats, something between you and the hub cuts the file",
            "",
            blob,
        )
    actual = sha256_of(local) if file.sha256 else None
    if actual is None or actual == file.sha256 or actual in accepted:
        return
    kept = blob.with_name(kept_name(file.sha256, actual))
    os.replace(blob, kept)
    local.unlink(missing_ok=True)
    if file.sha256_from == "models.toml":
        hint = (
            f"if the hub's file is the right one (the pin is stale), run the same command with --accept-hash {actual} "
            f'(no new download), or set sha256 = "{actual}" for it in your models.toml; else delete {kept}'
        )
    else:
        hint = (
            f"something between you and the hub (a proxy or mirror) altered the file: delete {kept} and run the same "
            f"command again; --accept-hash {actual} takes it as it is"
        )
    raise ChecksumMismatchError(
        f"{what} has sha256 {actual}, expected {file.sha256} (from {file.sha256_from}); "
        f"the file is kept aside as {kept}",
        hint,
        actual,
        kept,
    )


def kept_name(expected: str | None, actual: str) -> str:
    """A blob kept aside: named by the sha256 it was fetched as and the one it has, so that
    --accept-hash takes it back for that file only."""
    return f"{expected}.mismatch-{actual}"


def record_ref(plan: Plan, settings: HubSettings) -> None:
    """Point the branch at the commit fetched (files were fetched by commit, which records
    no ref), so offline runs of this or other tools find them."""
    if plan.artifact.pinned or settings.offline:
        return
    write_atomic(repo_dir(settings, plan.artifact.repo) / "refs" / plan.artifact.revision, plan.commit)


def _check_agrees(artifact: HubArtifact, name: str, what: str, ours: object, hubs: object) -> None:
    if ours is not None and hubs is not None and ours != hubs:
        accept = (
            f", or run the same command with --accept-hash {hubs} to take the hub's file" if what == "sha256" else ""
        )
        raise PullError(
            f"models.toml gives {name} in {artifact.repo}@{artifact.revision} {what} {ours}, the hub {hubs}",
            f"the entry is stale: fix it, or pin `revision` to the commit it was written for{accept}",
        )


class FileBar(tqdm):  # type: ignore[type-arg,misc]
    """One progress bar per file on stderr: bytes, rate, time left."""

    label = ""  # the file name; huggingface-hub would show the end of the URL

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.update(file=sys.stderr, unit="B", unit_scale=True, unit_divisor=1000, leave=True)
        if self.label:
            kwargs["desc"] = self.label
        super().__init__(*args, **kwargs)

    @classmethod
    def named(cls, label: str) -> type[FileBar]:
        return type(cls.__name__, (cls,), {"label": label})


class SilentBar(FileBar):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "disable": True})


# progress(done, total, what): bytes of the file being fetched; total None when unknown.
Progress = Callable[[float | None, float | None, str], None]


class ReportingBar(SilentBar):
    """Draws nothing; hands every byte count to a callback (an app's own progress bar)."""

    report: Progress | None = None

    def update(self, n: float | None = 1) -> bool | None:
        self.n += n or 0
        if self.report is not None:
            self.report(self.n, self.total, self.label)
        return None

    @classmethod
    def to(cls, report: Progress) -> type[FileBar]:
        return type(cls.__name__, (cls,), {"report": staticmethod(report)})
