"""Removing a pulled pair (`localspec rm`): its files go, except those of models another pulled
pair, the embedded default or another backend's pull still uses, and never a file outside
localspec's folders and the hub cache, nor the user's own (`path =` entries)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from localspec.core.errors import InvalidRequestError
from localspec.models.default_model import DEFAULT_MODEL
from localspec.models.entries import HubArtifact, LocalArtifact, Model, Pair
from localspec.models.hub import sweep_incomplete
from localspec.models.hub_settings import hub_cache_dir
from localspec.models.pull import (
    NotPulledError,
    absence_file,
    is_pulled,
    model_path,
    pair_for,
    pair_mark,
    read_record,
    record_file,
)
from localspec.models.registry import Registry, load_registry
from localspec.store import data_dir, models_dir


@dataclass(frozen=True)
class Removal:
    removed: tuple[tuple[str, int], ...]  # (model, bytes freed)
    kept: tuple[tuple[str, tuple[str, ...]], ...]  # (model, pulled pairs still using it)


def remove(pair_id: str, backend: str = "llamacpp", registry: Registry | None = None) -> Removal:
    """Delete a pair's files, keeping those of models that another pair pulled (on purpose,
    not just as a side effect of this one) still uses."""
    reg = registry or load_registry()
    pair = pair_for(reg, pair_id, backend)
    pair_mark(pair, backend).unlink(missing_ok=True)
    removed: list[tuple[str, int]] = []
    kept: list[tuple[str, tuple[str, ...]]] = []
    others = [
        p for p in reg.pairs.values() if p is not pair and pair_mark(p, backend).exists() and is_pulled(p, backend)
    ]
    for model in pair.models_for(backend):
        if model_path(model, backend) is None or isinstance(model.artifacts[backend], LocalArtifact):
            continue  # the user's own files (`path =` entries) are never deleted
        users = tuple(p.id for p in others if model.id in (m.id for m in p.models_for(backend)))
        users += _other_uses(model, backend, reg, keep_default=model is not pair.target)
        if users:
            kept.append((model.id, users))
        else:
            removed.append((model.id, _delete_model(model, backend)))
    own = [m for m in pair.models_for(backend) if isinstance(m.artifacts[backend], LocalArtifact)]
    _forget_absence(pair, backend, others)
    if not removed and not kept and own:
        files = ", ".join(str(m.artifacts[backend].path) for m in own)  # type: ignore[union-attr]
        raise InvalidRequestError(
            f"pair {pair.id!r} is made of your own files ({files}), which localspec never deletes",
            f"to take it off `localspec list`, delete its [pairs.{pair.id}] entry from {pair.origin}",
        )
    if not removed and not kept:
        raise NotPulledError(
            f"pair {pair.id!r} has no pulled files for {backend}", "`localspec list` shows what is pulled"
        )
    return Removal(tuple(removed), tuple(kept))


def _forget_absence(pair: Pair, backend: str, others: list[Pair]) -> None:
    """`rm` takes the record of a projector the hub lacked with the pair, unless another
    pulled pair with the same projector still relies on it."""
    projector = pair.mmproj
    if projector is not None and not any(p.mmproj is not None and p.mmproj.id == projector.id for p in others):
        absence_file(projector, backend).unlink(missing_ok=True)


def _other_uses(model: Model, backend: str, reg: Registry, keep_default: bool) -> tuple[str, ...]:
    """Why a model's files must stay although this pair goes: the embedded default model
    (an offline user's only model) unless its own pair goes, or the same files pulled for
    another backend."""
    record = read_record(model, backend)
    mine = {os.path.realpath(f["path"]) for f in record["files"]} if record else set()
    reasons: list[str] = []
    if keep_default and os.path.realpath(models_dir() / DEFAULT_MODEL.filename) in mine:
        reasons.append("it is the embedded default model")
    for other in sorted({b for m in reg.models.values() for b in m.artifacts if b != backend}):
        for m in reg.models.values():
            theirs = read_record(m, other) if other in m.artifacts else None
            if theirs and mine & {os.path.realpath(f["path"]) for f in theirs["files"]}:
                reasons.append(f"the {other} pull of {m.id} uses the same files")
    return tuple(dict.fromkeys(reasons))


def _inside_our_folders(path: Path) -> bool:
    roots = [data_dir().resolve(), hub_cache_dir().resolve()]
    return any(path.is_relative_to(root) for root in roots)


def _delete_model(model: Model, backend: str) -> int:
    record = read_record(model, backend)
    assert record is not None
    freed = 0
    for f in record["files"]:
        link = Path(f["path"])
        blob = link.resolve()
        # Never through a link out of localspec's folders and the hub cache: a link planted
        # (or left) there must not take a file elsewhere with it.
        if not _inside_our_folders(link.parent.resolve()):
            continue
        if not _inside_our_folders(blob):
            link.unlink(missing_ok=True)  # the link is ours; what it points to is not
            continue
        freed += blob.stat().st_size
        link.unlink()
        if blob != link and not _still_linked(blob):
            blob.unlink()
    record_file(model, backend).unlink(missing_ok=True)
    artifact = model.artifacts.get(backend)
    if isinstance(artifact, HubArtifact):  # what a killed pull of it left goes too
        sweep_incomplete(hub_cache_dir(), artifact.repo)
    return freed


def _still_linked(blob: Path) -> bool:
    """Does another snapshot (another model from the same repo) still point at this blob?"""
    snapshots = blob.parent.parent / "snapshots"
    return any(p.is_symlink() and p.resolve() == blob for p in snapshots.rglob("*"))
