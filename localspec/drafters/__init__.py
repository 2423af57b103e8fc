"""Drafters propose tokens for the target to verify, one module each (none, ngram, memory, model); the
protocol they implement (Drafter) lives with the engine's other protocols in core.protocol."""

from __future__ import annotations

import os
from typing import Protocol, runtime_checkable

from localspec.core.drafting import Draft, Drafter, common_prefix
from localspec.core.errors import InvalidRequestError
from localspec.core.protocol import Backend

__all__ = ["BlockDrafter", "Draft", "Drafter", "DrafterHost", "cannot_attach", "common_prefix"]


@runtime_checkable
class BlockDrafter(Drafter, Protocol):
    """A drafter that proposes a whole block in one pass (DFlash): the controller prices the
    pass once per draft, whatever part of the block it verifies."""

    block: int  # the most tokens one pass proposes, the anchor included
    pass_seconds: float  # one pass on this machine, measured when it was loaded


@runtime_checkable
class DrafterHost(Protocol):
    """A backend that loads drafters kept in files of their own into its context, where they read
    its hidden states: only the target's backend can run them. A kind it does not run is refused
    with cannot_attach."""

    def attach_head(self, kind: str, path: str) -> Backend:
        """The head in `path` drafting for this model: kind "assistant" (an MTP assistant,
        Gemma 4's) or "eagle3" (an EAGLE-3 head, localspec.core.choices.FEATURE_DRAFTERS)."""
        ...

    def attach_block_drafter(self, path: str) -> BlockDrafter:
        """The DFlash drafter in `path` (strategy dflash)."""
        ...


# What each kind of drafter file is called, where it drafts and what to do elsewhere.
_HOSTS = {
    "assistant": (
        "a Gemma 4 assistant",
        "the llama.cpp and MLX backends",
        "use --backend llamacpp with its GGUF, or --backend mlx with its MLX folder",
    ),
    "eagle3": ("an EAGLE-3 head", "the llama.cpp backend", "use --backend llamacpp with its target's GGUF"),
}


def cannot_attach(kind: str, path: str, backend: str) -> InvalidRequestError:
    """The refusal of a drafter file of a kind that `backend` does not run (see DrafterHost)."""
    if kind == "dflash":
        return InvalidRequestError(f"the {backend} backend does not run DFlash drafters")
    name, hosts, fix = _HOSTS[kind]
    return InvalidRequestError(f"{os.path.basename(path)} is {name}, which drafts on {hosts} only", fix)
