"""Drafters in files of their own: which kind a drafter file is (a draft model, an MTP
assistant, an EAGLE-3 head, a block drafter), the checks that refuse the wrong file, and loading it."""

from __future__ import annotations

import json
import os
from typing import Any

from localspec.common.gguf_header import read_header
from localspec.common.progress import Announce, announced
from localspec.core.backend_loader import load_backend
from localspec.core.choices import FEATURE_DRAFTERS
from localspec.core.errors import InvalidRequestError, ModelLoadError
from localspec.core.protocol import Backend
from localspec.drafters import BlockDrafter, DrafterHost, cannot_attach


def load_drafter(target: Backend, path: str, backend: str, options: dict[str, Any]) -> Backend:
    """A draft model from a file: a model of its own, an MTP assistant (Gemma 4's
    gemma4-assistant GGUF), which drafts from inside the target's context, or a head that
    reads the target's hidden layers (an EAGLE-3 GGUF)."""
    kind = head_kind(path) or ("assistant" if is_assistant(path) else None)
    if kind is None:
        return load_backend(backend, path, **options)
    if not isinstance(target, DrafterHost):
        raise cannot_attach(kind, path, target.info.backend)
    return target.attach_head(kind, path)


def dflash_drafter(target: Backend, path: str, on_progress: Announce | None = None) -> BlockDrafter:
    """The DFlash or DSpark drafter in `path`, reading `target`'s layers (strategy dflash, dspark)."""
    if not isinstance(target, DrafterHost):
        raise cannot_attach("dflash", path, target.info.backend)
    with announced(f"loading the block drafter {os.path.basename(path)}", on_progress):
        return target.attach_block_drafter(path)


# Block drafters (one pass drafts a block), by strategy: what they are called in messages.
BLOCK_DRAFTERS = {"dflash": "DFlash drafter", "dspark": "DSpark drafter"}


def check_block_file(strategy: str, path: str) -> None:
    """Refuse a file that is not the strategy's block drafter, naming what runs it: the other
    block kind (a DSpark file under dflash, or back), or no block drafter at all. A path that
    is no GGUF is left to the loader's refusal."""
    if not (path.endswith(".gguf") and os.path.isfile(path)):
        return
    header = read_header(path)
    found, name = header.block_kind, BLOCK_DRAFTERS[strategy]
    if found is None:
        raise InvalidRequestError(
            f"{os.path.basename(path)} is not a {name} (its architecture is {header.architecture!r})",
            f"give a {name} GGUF (architecture dflash) with --strategy {strategy}, or use it with --strategy draft",
        )
    if found != strategy:
        raise InvalidRequestError(
            f"{os.path.basename(path)} is a {BLOCK_DRAFTERS[found]}, not a {name}", f"run it with --strategy {found}"
        )


def is_assistant(path: str) -> bool:
    """Whether a drafter is an MTP assistant: Gemma 4's gemma4-assistant GGUF, or an MLX
    folder whose config.json names gemma4_assistant; any other drafter is not."""
    if os.path.isdir(path):  # read here, not through the MLX backend, which a machine may lack
        try:
            with open(os.path.join(path, "config.json"), encoding="utf-8") as file:
                config = json.load(file)
        except (OSError, ValueError):
            return False
        names = {config.get("model_type"), *(config.get("architectures") or [])} if isinstance(config, dict) else set()
        return bool(names & {"gemma4_assistant", "gemma4_unified_assistant", "Gemma4AssistantForCausalLM"})
    if not (path.endswith(".gguf") and os.path.isfile(path)):
        return False
    return read_header(path).is_assistant


def head_kind(path: str) -> str | None:
    """The strategy of a drafter GGUF that reads its target's hidden layers ("eagle3"), else None."""
    if not (path.endswith(".gguf") and os.path.isfile(path)):
        return None
    architecture = read_header(path).architecture
    return architecture if architecture in FEATURE_DRAFTERS else None


def check_head_file(strategy: str, draft_model: str | None) -> None:
    """A strategy whose drafter reads the target's layers needs that head's GGUF as draft_model."""
    name = FEATURE_DRAFTERS[strategy]
    if draft_model is None:
        raise InvalidRequestError(
            f"strategy {strategy!r} drafts with an {name}, a GGUF of its own",
            f"give it with --draft-model ({strategy}-<model>.gguf, made for the target), or load a pair that has one",
        )
    if not os.path.exists(draft_model):  # before its kind is read: a missing file is not a file of another kind
        raise ModelLoadError(
            f"no such file: {draft_model}",
            f"check the path of the {name} ({strategy}-<model>.gguf, made for the target), "
            "or draft with --strategy ngram",
        )
    if head_kind(draft_model) != strategy:
        raise InvalidRequestError(
            f"{os.path.basename(draft_model)} is not an {name} GGUF (architecture {strategy})",
            f"give the {strategy} GGUF made for the target, or --strategy draft for a draft model of its own",
        )
