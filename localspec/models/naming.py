"""One name for a model wherever it is shown (the chat's top bar, its saved chats, doctor):
the pair's name from models.toml when the model is a pair, an alias of one, or the GGUF file
a pair's target is (the embedded default is `smollm2-135m`); else the file's own name."""

from __future__ import annotations

import os

from localspec.core.errors import LocalspecError
from localspec.models.entries import HubArtifact, PyPIArtifact
from localspec.models.registry import Registry, load_registry


def canonical_name(model: str | None, registry: Registry | None = None) -> str:
    try:
        reg = registry or load_registry()
    except LocalspecError:
        reg = None  # a broken models.toml is reported where it is used; a name is still due here
    if model is None:
        return _pair_of_file(reg, None) or "smollm2-135m"
    if reg is not None and not (os.path.exists(model) or model.endswith(".gguf")):
        try:
            return reg.pair(model).id
        except LocalspecError:
            pass
    return _pair_of_file(reg, os.path.basename(model)) or os.path.basename(model)


def _pair_of_file(reg: Registry | None, filename: str | None) -> str | None:
    """The pair whose target is this GGUF file (None: the embedded default's), drafting alone."""
    if reg is None:
        return None
    for pair in reg.pairs.values():
        if pair.drafter is not None:
            continue
        artifact = pair.target.artifacts.get("llamacpp")
        if isinstance(artifact, PyPIArtifact):
            names = {os.path.basename(artifact.source.member)}
            if filename is None:
                return pair.id
        elif isinstance(artifact, HubArtifact):
            names = {os.path.basename(f.name) for f in artifact.files}
        else:
            continue
        if filename in names:
            return pair.id
    return None
