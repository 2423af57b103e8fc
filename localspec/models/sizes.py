"""A model's download size before the hub is asked: the byte counts models.toml pins where it
has them, else an estimate from the parameter count and the quantization the file or repo name
carries. `list`, `pull --dry-run` (offline too) and the chat's "Pull it now?" show it, so a user
knows what a pull costs without the network; `registry check` sets each estimate beside the
hub's real size."""

from __future__ import annotations

import re
from dataclasses import dataclass

from localspec.core.backend_loader import kind_of
from localspec.models.entries import Artifact, HubArtifact, LocalArtifact, Model, PyPIArtifact

# Bits per weight of llama.cpp's quantization mixes and MLX's group-wise quantization (4 bits
# plus a 16-bit scale and bias per 64 weights); embeddings and norms kept wider make a real
# file a few percent larger, which the estimate's "~" admits.
BITS_PER_WEIGHT: dict[str, float] = {
    "iq4_xs": 4.3,
    "q2_k": 3.0,
    "q3_k_m": 3.9,
    "q4_0": 4.55,
    "q4_1": 5.0,
    "q4_k_s": 4.6,
    "q4_k_m": 4.9,
    "q4_k_xl": 5.0,
    "q5_0": 5.5,
    "q5_1": 6.0,
    "q5_k_m": 5.7,
    "q6_k": 6.6,
    "q8_0": 8.5,
    "3bit": 3.5,
    "4bit": 4.5,
    "6bit": 6.5,
    "8bit": 8.5,
    "bf16": 16.0,
    "f16": 16.0,
    "fp16": 16.0,
    "f32": 32.0,
}
_QUANT = re.compile("|".join(sorted(map(re.escape, BITS_PER_WEIGHT), key=len, reverse=True)))
# "1.7B", "135M", "35B-A3B" (a mixture of experts: all its weights are downloaded). Gemma's
# "E4B" counts effective parameters, not the file's, so it gets no estimate.
_PARAMS = re.compile(r"(\d+(?:\.\d+)?)([MB])\b", re.IGNORECASE)


@dataclass(frozen=True)
class Size:
    bytes: int
    exact: bool  # every part pinned in models.toml or measured on disk; else an estimate

    def __add__(self, other: Size) -> Size:
        return Size(self.bytes + other.bytes, self.exact and other.exact)

    def human(self) -> str:
        return ("" if self.exact else "~") + human_bytes(self.bytes)


def human_bytes(n: int | None) -> str:
    """Decimal units, as the hub shows them."""
    if n is None:
        return "?"
    if n < 1000:
        return f"{n} B"
    value = n / 1000
    for unit in ("kB", "MB", "GB"):
        if value < 1000:
            return f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"


def param_count(params: str) -> float | None:
    """The parameters a registry entry's `params` names, or None where it names effective ones."""
    m = _PARAMS.match(params.strip())
    if m is None:
        return None
    return float(m.group(1)) * (1e6 if m.group(2).upper() == "M" else 1e9)


def bits_per_weight(name: str, backend: str) -> float | None:
    """The quantization a file or repo name carries; an MLX or torch repo without one is bf16."""
    m = _QUANT.search(name.lower())
    if m is not None:
        return BITS_PER_WEIGHT[m.group(0)]
    kind = kind_of(backend)
    return 16.0 if not kind.gguf and not kind.specs else None  # a safetensors repo


def estimate_bytes(params: str, name: str, backend: str) -> int | None:
    """Bytes a model of this size takes in the quantization its file or repo name carries."""
    count, bits = param_count(params), bits_per_weight(name, backend)
    return None if count is None or bits is None else int(count * bits / 8)


def estimate(model: Model, backend: str) -> int | None:
    """Bytes a model's files for this backend should take (its first named file, else its repo)."""
    artifact = model.artifacts.get(backend)
    if not isinstance(artifact, HubArtifact):
        return None
    names = [f.name for f in artifact.files if not f.is_pattern and not f.is_sidecar]
    return estimate_bytes(model.params, names[0] if names else artifact.repo, backend)


def artifact_size(model: Model, backend: str, artifact: Artifact) -> Size | None:
    """The pinned size where models.toml gives every file's, else the estimate."""
    if isinstance(artifact, PyPIArtifact) and artifact.size:
        return Size(artifact.size, True)
    if isinstance(artifact, HubArtifact) and artifact.files and all(f.size for f in artifact.files):
        return Size(sum(f.size or 0 for f in artifact.files), True)
    if isinstance(artifact, LocalArtifact):
        return None
    guess = estimate(model, backend)
    return None if guess is None else Size(guess, False)
