"""huggingface-hub's settings (endpoint, cache, token, offline, timeouts), read from its
variables when a pull starts rather than once at import, so settings made later still count."""

from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localspec.common.progress import Announce, announced
from localspec.models.hub_floor import MIN_BYTES_PER_SECOND

DEFAULT_ENDPOINT = "https://huggingface.co"
# huggingface-hub's own defaults: seconds to connect and between two reads, for the metadata
# calls (HF_HUB_ETAG_TIMEOUT) and for a file's bytes (HF_HUB_DOWNLOAD_TIMEOUT).
DEFAULT_TIMEOUT = 10.0
WAITING_AFTER = 1.0  # a hub call still unanswered this many seconds in says so


@dataclass(frozen=True)
class HubSettings:
    endpoint: str
    cache_dir: Path
    token: str | None
    offline: bool
    timeout: float = DEFAULT_TIMEOUT  # metadata calls: connect, and wait between reads
    download_timeout: float = DEFAULT_TIMEOUT  # a file's bytes: the same, per read

    @classmethod
    def resolve(
        cls, endpoint: str | None = None, cache_dir: str | Path | None = None, token: str | None = None
    ) -> HubSettings:
        return cls(
            endpoint or hub_endpoint(),
            Path(cache_dir) if cache_dir else hub_cache_dir(),
            token,
            hub_offline(),
            hub_timeout("HF_HUB_ETAG_TIMEOUT"),
            hub_timeout("HF_HUB_DOWNLOAD_TIMEOUT"),
        )


def hub_timeout(variable: str) -> float:
    """Seconds from huggingface-hub's timeout variable; unset, empty or not a positive number
    means its default (as huggingface-hub reads them)."""
    try:
        value = float(os.environ.get(variable, ""))
    except ValueError:
        return DEFAULT_TIMEOUT
    return value if value > 0 else DEFAULT_TIMEOUT


def waiting_for_hub(settings: HubSettings, what: str, announce: Announce | None) -> Any:
    """A context in which a hub call still unanswered after WAITING_AFTER seconds is announced,
    with how long it may still wait and the variable that sets it."""
    if announce is None or settings.offline:
        return nullcontext()
    line = (
        f"waiting for {settings.endpoint} ({what}); gives up after {settings.timeout:g} s without an answer "
        f"or under {MIN_BYTES_PER_SECOND / 1000:g} kB/s (HF_HUB_ETAG_TIMEOUT sets it)"
    )
    return announced(line, announce, after=WAITING_AFTER)


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT).rstrip("/")


def hub_cache_dir() -> Path:
    """Where huggingface-hub keeps weights, honouring its variables as they are now."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "huggingface" / "hub"


def hub_offline() -> bool:
    return any(
        os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE") for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )
