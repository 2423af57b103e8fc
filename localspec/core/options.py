"""What a runtime is loaded with, in one value: the CLI options, the chat's settings and the
server build it, and `localspec.load()` consumes it. Changing any of it means loading again."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from localspec.core.backend_loader import kind_of
from localspec.core.choices import DraftTokens, TreeAsk, Trees, parse_trees
from localspec.core.errors import InvalidRequestError
from localspec.core.validate import check_ctx, check_threads


@dataclass(frozen=True)
class LoadOptions:
    # A GGUF path, a pair id from models.toml (pulled with `localspec pull`), or None for the
    # embedded default.
    model: str | None = None
    # A drafter file with the target's tokenizer (a model of its own or a Gemma 4 assistant).
    draft_model: str | None = None
    backend: str = "llamacpp"
    # "auto": the model's MTP head if it has one, else n-gram lookup; a pair's own otherwise.
    strategy: str = "auto"
    draft_tokens: DraftTokens = "auto"
    n_ctx: int = 4096
    threads: int | None = None  # None: one per physical core other programs leave free (contention.py)
    # llama.cpp rpc-servers ("HOST:PORT,...") the target is split over; the drafter stays here.
    rpc: str | Sequence[str] | None = None
    # n-gram lookup also searches this runtime's earlier requests (kept in this process only).
    memory: bool = True
    # Layers a llama.cpp build with a GPU backend puts there (None: all that fit).
    gpu_layers: int | None = None
    # Measure this machine's step costs once (cached); False for tests and fixed-γ benchmarks.
    calibrate: bool = True
    # llama.cpp on the CPU with batch-invariant kernels: a verify block's logits are those of
    # one-token passes, so greedy output is plain decoding's bit for bit at any length.
    exact: bool = False
    # "auto": a tree beside the chain where the cost curve says it pays; "off": chains only; a
    # TreeAsk (or its spelling, "2,1"): that tree at every step, for experiments and tests.
    trees: Trees = "auto"
    # A projector GGUF (mmproj) beside the model: its chats may hold images (llama.cpp only).
    mmproj: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.trees, TreeAsk):
            object.__setattr__(self, "trees", parse_trees(str(self.trees)))
        object.__setattr__(self, "n_ctx", check_ctx(self.n_ctx))
        object.__setattr__(self, "threads", check_threads(self.threads))
        if self.gpu_layers is not None and not kind_of(self.backend).gpu_layers:
            raise InvalidRequestError(
                f"gpu_layers is for the llama.cpp backend, not {self.backend}",
                "drop --gpu-layers, or use --backend llamacpp",
            )
        if self.mmproj is not None and not kind_of(self.backend).images:
            raise InvalidRequestError(
                f"images (mmproj) are read by the llama.cpp backend only; the {self.backend} backend reads text",
                "drop --mmproj, or use --backend llamacpp",
            )
        if self.exact and (not kind_of(self.backend).exact or self.rpc or self.gpu_layers):
            raise InvalidRequestError(
                "exact is for the llama.cpp backend on this machine's CPU (its kernels are the ones made exact)",
                "drop --exact, or drop --backend/--rpc/--gpu-layers",
            )

    @classmethod
    def of(cls, **given: Any) -> LoadOptions:
        """From keywords, an unknown one refused with the known ones named."""
        unknown = set(given) - {f.name for f in fields(cls)}
        if unknown:
            known = ", ".join(f.name for f in fields(cls))
            raise InvalidRequestError(f"unknown load option(s): {', '.join(sorted(unknown))}", f"use one of: {known}")
        return cls(**given)

    def changed(self, **changes: Any) -> LoadOptions:
        return replace(self, **changes)

    def backend_options(self) -> dict[str, Any]:
        """The keywords a backend's load() takes from these (the drafter's too, without rpc)."""
        options: dict[str, Any] = {"n_ctx": self.n_ctx}
        if self.threads is not None:
            options["threads"] = self.threads
        if self.gpu_layers is not None:
            options["gpu_layers"] = self.gpu_layers
        if self.exact:
            options["exact"] = True
        return options


LOAD_FIELDS = tuple(f.name for f in fields(LoadOptions))
