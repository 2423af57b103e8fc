"""What goes wrong fetching from the hub, as errors that say what to do: PullError and its
kinds, and huggingface-hub's exceptions (gated, missing, offline, stalled) translated into them."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from localspec.core.errors import LocalspecError
from localspec.models.entries import HubArtifact
from localspec.models.hub_floor import HubTooSlowError
from localspec.models.hub_settings import HubSettings


class PullError(LocalspecError):
    """A file could not be fetched: not on the hub, not reachable, gated, or interrupted."""


class HubUnreachableError(PullError):
    """The hub could not be asked (no connection, no answer, or offline by choice): nothing is
    known about the files, neither right nor wrong."""


class ChecksumMismatchError(PullError):
    """A fetched file is not the file the registry or the hub vouches for; it is kept aside
    for --accept-hash to take it without a new download."""

    def __init__(self, message: str, hint: str, actual: str, kept: Path) -> None:
        super().__init__(message, hint)
        self.actual = actual
        self.kept = kept


class FileNotOnHubError(PullError):
    """The hub answered, and the repo has no such file at that revision: known to be absent,
    unlike a file the hub could not be asked about."""

    def __init__(self, message: str, hint: str, name: str) -> None:
        super().__init__(message, hint)
        self.name = name


def missing_file(artifact: HubArtifact, name: str, settings: HubSettings) -> FileNotOnHubError:
    return FileNotOnHubError(
        f"{artifact.repo} has no file {name!r} at revision {artifact.revision} on {settings.endpoint}",
        "the models.toml entry names a file the repo does not have: fix `files`",
        name,
    )


def offline_missing(artifact: HubArtifact, what: str) -> PullError:
    return HubUnreachableError(
        f"offline (HF_HUB_OFFLINE is set) and {artifact.repo}: {what} is not in the hub cache",
        "unset HF_HUB_OFFLINE to download it, or point HF_HUB_CACHE at a cache that has it",
    )


@contextmanager
def hub_errors(artifact: HubArtifact, name: str | None, settings: HubSettings) -> Iterator[None]:
    """huggingface-hub's exceptions, as errors that say what to do."""
    from huggingface_hub.errors import (
        BadRequestError,
        EntryNotFoundError,
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo, where = artifact.repo, f"{settings.endpoint}/{artifact.repo}"
    try:
        yield
    except GatedRepoError as exc:
        raise PullError(
            f"{repo} is gated: its license must be accepted before download",
            f"accept it at {where}, then run `hf auth login` or set HF_TOKEN",
        ) from exc
    except RepositoryNotFoundError as exc:
        raise PullError(
            f"{repo} was not found on {settings.endpoint}",
            "check the repo id in models.toml; a private repo needs `hf auth login` or HF_TOKEN",
        ) from exc
    except RevisionNotFoundError as exc:
        raise PullError(f"{repo} has no revision {artifact.revision!r}", "fix `revision` in models.toml") from exc
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as exc:
        if not settings.offline:  # online, this is how huggingface-hub reports a failed metadata call
            raise _interrupted(repo, name, settings, exc) from exc
        raise offline_missing(artifact, name or f"revision {artifact.revision}") from exc
    except EntryNotFoundError as exc:
        raise missing_file(artifact, name or "?", settings) from exc
    except (HFValidationError, BadRequestError) as exc:  # the hub refused the name itself
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PullError(
            f"{settings.endpoint} refused {repo if name is None else f'{name} in {repo}'} as a name: {reason}",
            "fix the repo id or file name in models.toml",
        ) from exc
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise _interrupted(repo, name, settings, exc) from exc
        raise PullError(
            f"the disk holding {settings.cache_dir} is full; {name} was not kept",
            "free some space (`localspec rm PAIR` removes a pulled pair) and run the same command again",
        ) from exc
    except Exception as exc:  # the transport's errors (requests, httpx, httpx2) depend on the hub client's version
        raise _interrupted(repo, name, settings, exc) from exc


def _interrupted(repo: str, name: str | None, settings: HubSettings, exc: BaseException) -> PullError:
    slow = _cause(exc, HubTooSlowError)
    if slow is not None:
        return _stalled(repo, name, settings, slow)
    if _timed_out(exc):
        return _stalled(repo, name, settings)
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if name is None:
        return HubUnreachableError(
            f"could not ask {settings.endpoint} about {repo}: {reason}",
            "check your connection (HF_ENDPOINT names a mirror); HF_HUB_OFFLINE=1 uses files already in the hub cache",
        )
    return PullError(
        f"the download of {name} from {repo} failed: {reason}; nothing partial was kept",
        "run the same command again to finish; HF_HUB_OFFLINE=1 uses files already in the hub cache",
    )


def _timed_out(exc: BaseException | None) -> bool:
    """Is a timeout behind exc? The transport's own class (httpx, requests) depends on the
    hub client's version, and huggingface-hub wraps it, so the chain is read by name."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, TimeoutError) or any(
            c.__name__.endswith(("Timeout", "TimeoutException")) for c in type(exc).__mro__
        ):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def _cause(exc: BaseException | None, kind: type[HubTooSlowError]) -> HubTooSlowError | None:
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, kind):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def _stalled(repo: str, name: str | None, settings: HubSettings, slow: HubTooSlowError | None = None) -> PullError:
    seconds = settings.timeout if name is None else settings.download_timeout
    if slow is not None:
        why = f"a trickle: {slow.received} bytes in {slow.seconds:g} s, under {slow.floor / 1000:g} kB/s"
    else:
        why = f"no reply within {seconds:g} s"
    if name is None:
        what = f"about {repo} ({why})"
    else:
        what = f"while sending {name} from {repo} ({why}); nothing partial was kept"
    return HubUnreachableError(
        f"{settings.endpoint} stopped answering {what}",
        "check your connection or proxy, then run the same command again; on a slow link raise "
        "HF_HUB_ETAG_TIMEOUT and HF_HUB_DOWNLOAD_TIMEOUT (seconds); HF_ENDPOINT names a mirror; "
        "HF_HUB_OFFLINE=1 uses files already in the hub cache",
    )
