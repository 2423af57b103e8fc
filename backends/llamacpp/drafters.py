"""The drafters a llama.cpp target builds for itself: its own MTP head, the heads and block
drafters kept in files of their own that read its context (a Gemma 4 assistant, an EAGLE-3
head, a DFlash drafter), and the self-drafters derived from its GGUF (qspec, layerskip).

Each is made from what the target lends it (Host), so the backend keeps one job: its model,
its context and their passes. The backend's drafter methods hand over to the functions here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from localspec.common.gguf_header import check_gguf, diagnose_gguf
from localspec.control.selfdraft import best_drafter
from localspec.core.errors import InvalidRequestError, ModelLoadError
from localspec.core.protocol import Backend

from . import library
from .copies import QSPEC_SWEEP, Candidate, candidates, derived, derived_home
from .dflash import DFlashDrafter, FeatureTarget
from .dspark import load_block_drafter
from .eagle3 import Eagle3Head, load_eagle3_head
from .features import HiddenRows
from .head import SharedCache
from .mtp import MtpHead

llama = library.llama


class Target(Backend, FeatureTarget, Protocol):
    """The target a drafter is built for: a backend that gives its layers' inputs (LlamaCppBackend)."""


@dataclass(frozen=True)
class Host:
    """What a drafter built here takes from its target: the target itself (its record, info,
    capabilities and layers' inputs), its llama.cpp model and context, and its last hidden states."""

    target: Target
    model: Any  # the target's llama_model
    ctx: Any  # the target's llama_context, which a head reads (ctx_other)
    options: Mapping[str, Any]  # this machine's load options, a derived drafter's too (never the RPC split)
    mtp_layers: int  # the target's own MTP blocks (nextn layers)
    stateful: bool  # recurrent or hybrid: its blocks cannot be left out
    states: Callable[[], HiddenRows]  # the target's last hidden states, which an MTP head reads
    load: Callable[..., Backend]  # loads a derived GGUF as a backend of the target's kind


def mtp_head(host: Host) -> MtpHead:
    """The model's own MTP block as a drafter (strategy mtp)."""
    return own_mtp_head(host.target, host.model, host.ctx, host.mtp_layers, host.states)


def own_mtp_head(
    target: Backend,
    model: Any,
    ctx: Any,
    mtp_layers: int,
    states: Callable[[], HiddenRows],
    cache: SharedCache | None = None,
) -> MtpHead:
    """The MTP block of `model` drafting for `target` (the model's context, or one of its
    lanes: lanes.py), reading the hidden states `states` gives; refused where it has none.
    cache: where a lane's head sits in the lanes' one context (None: a context of its own)."""
    info = target.info
    if not mtp_layers and info.architecture == "gemma4":
        raise InvalidRequestError(
            f"{info.name} has no MTP head of its own: Gemma 4 drafts with its assistant, a GGUF beside it",
            "give the assistant with --draft-model (mtp-gemma-4-12B-it.gguf for gemma-4-12B-it; "
            "`localspec pull gemma-4-12b` fetches both), or --strategy ngram",
        )
    if not mtp_layers:
        raise InvalidRequestError(
            f"{info.name} has no MTP head: its GGUF keeps no nextn layers",
            "use a GGUF converted with its MTP layers (the *-MTP-GGUF repositories), or --strategy ngram",
        )
    return MtpHead(target, model, ctx, states(), cache)


def assistant_head(host: Host, path: str) -> MtpHead:
    """A Gemma 4 assistant GGUF (architecture gemma4-assistant) drafting for this target."""
    model = load_assistant(host.target, host.model, path, host.options["gpu_layers"])
    return own_assistant(host.target, (model, path), host.ctx, host.states(), SharedCache())


def load_assistant(target: Backend, target_model: Any, path: str, gpu_layers: int) -> Any:
    """A Gemma 4 assistant file's weights, checked against the target it drafts for."""
    check_gguf(path)
    info = target.info
    if info.architecture != "gemma4":
        raise InvalidRequestError(
            f"{os.path.basename(path)} is a Gemma 4 assistant: it drafts for a gemma4 model, "
            f"not {info.name} ({info.architecture})",
            "pair it with the Gemma 4 model it was made for, or use --strategy ngram",
        )
    mparams = library.model_params(gpu_layers)
    mparams.load_mtp = True  # its blocks are all MTP blocks
    model = llama.llama_model_load_from_file(os.fsencode(path), mparams)
    if not model:
        raise ModelLoadError(
            f"llama.cpp could not load {path}: {diagnose_gguf(path)}",
            "download the assistant again, or draft without it (--strategy ngram)",
        )
    if llama.llama_model_n_embd_out(model) != llama.llama_model_n_embd_out(target_model):
        llama.llama_model_free(model)
        raise InvalidRequestError(
            f"{os.path.basename(path)} was made for a Gemma 4 model of another width than {info.name}",
            "use the assistant of the same size (E4B with E4B, 12B with 12B, 31B with 31B)",
        )
    return model


def own_assistant(
    target: Backend, loaded: tuple[Any, str], ctx: Any, states: HiddenRows, cache: SharedCache
) -> MtpHead:
    """An assistant's weights (loaded from the path beside them) drafting for `target` (the
    model's context, or one of its lanes: lanes.py), reading its KV cache where `cache` says."""
    model, path = loaded
    head = MtpHead(target, model, ctx, states, cache)
    head.info = replace(head.info, name=os.path.basename(path), size_bytes=int(llama.llama_model_size(model)))
    return head


def eagle3_head(host: Host, path: str) -> Eagle3Head:
    """An EAGLE-3 head GGUF (architecture eagle3) drafting for this target (strategy eagle3)."""
    mparams = library.model_params(host.options["gpu_layers"])
    return load_eagle3_head(host.target, host.ctx, host.target.layer_features, mparams, path)


def block_drafter(host: Host, path: str, kind: str) -> DFlashDrafter:
    """A DFlash or DSpark (`kind`) drafter GGUF drafting blocks for this target."""
    return load_block_drafter(host.target, host.ctx, path, kind, host.options["gpu_layers"])


def make_self_drafter(host: Host, kind: str, option: str | None) -> Backend:
    """The qspec or layerskip drafter (localspec.core.protocol.SelfDrafting), derived once per
    model file and loaded beside the target; without option, the measured best candidate."""
    target = host.target
    _can_skip_layers(host, kind)
    folder, ftype = derived_home(target)
    options = {c.label: c for c in candidates(kind, option, target.info.n_layers, ftype)}

    def make(label: str) -> Backend:
        c = options[label]
        path = derived(target.info.path, c.ftype, folder, c.prune)
        try:
            drafter = host.load(str(path), **host.options)
        except ModelLoadError as exc:  # a file localspec wrote: say so, not "download it again"
            raise ModelLoadError(
                f"the {kind}:{label} drafter derived from {target.info.name} did not load: {exc.message}",
                f"use another strategy (ngram, or qspec); remove {path} to derive it again",
            ) from exc
        extra = {**drafter.capabilities.extra, "self_draft": f"{kind}:{label}"}
        drafter.capabilities = replace(drafter.capabilities, extra=extra)
        return drafter

    return best_drafter(target, kind, list(options), make)


def derived_drafters(host: Host, kind: str) -> list[tuple[str, Path]]:
    """Every candidate drafter of a kind, derived (once) for a side-by-side measurement."""
    _can_skip_layers(host, kind)
    folder, ftype = derived_home(host.target)
    if kind == "qspec":
        options = [Candidate(t, t) for t in QSPEC_SWEEP if t != ftype]
    else:
        options = candidates(kind, None, host.target.info.n_layers, ftype)
    return [(c.label, derived(host.target.info.path, c.ftype, folder, c.prune)) for c in options]


def _can_skip_layers(host: Host, kind: str) -> None:
    if kind == "layerskip" and host.stateful:
        # The blocks' kinds follow from their indices (every n-th is attention): a copy
        # with blocks left out would run recurrent weights as attention and fail to load.
        info = host.target.info
        raise InvalidRequestError(
            f"layerskip cannot draft for {info.name}: a {info.architecture} model mixes recurrent "
            "and attention blocks by position, so blocks cannot be left out",
            "use --strategy ngram (the default), qspec, or a draft model",
        )
