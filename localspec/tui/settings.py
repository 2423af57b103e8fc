"""What the chat runs with: the pair and strategy (changing them loads a new runtime) and the
sampling options of the next request (changing them loads nothing)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from localspec.core.backend_loader import kind_of
from localspec.core.errors import InvalidRequestError
from localspec.core.options import LOAD_FIELDS, LoadOptions
from localspec.core.sampling import KNOBS, SamplingConfig


@dataclass(frozen=True)
class ChatSettings:
    load: LoadOptions = field(default_factory=LoadOptions)  # what the runtime is built from
    system: str = ""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    max_tokens: int = 1024

    def needs_new_runtime(self, other: ChatSettings) -> bool:
        return self.load != other.load

    def model_label(self) -> str:
        """The model's one name (see localspec.models.naming), and its drafter's file."""
        model, draft_model = self.load.model, self.load.draft_model
        name = _canonical(model, self.load.backend)
        return f"{name} + {_short(draft_model)}" if draft_model else name

    def with_changes(self, **changes: Any) -> ChatSettings:
        """These settings with some changed: a load option (strategy="ngram") changes `load`, a
        sampling knob (temperature=0.2) changes `sampling`."""
        knobs = {name: changes.pop(name) for name in KNOBS if name in changes}
        loading = {name: changes.pop(name) for name in LOAD_FIELDS if name in changes}
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise InvalidRequestError(f"unknown chat setting(s): {', '.join(sorted(unknown))}")
        changes["sampling"] = replace(changes.get("sampling", self.sampling), **knobs)
        changes["load"] = changes.get("load", self.load).changed(**loading)
        return replace(self, **changes)


def parse_temperature(text: str) -> float:
    """Its range is checked by SamplingConfig when the settings are changed."""
    try:
        return float(text.strip())
    except ValueError:
        raise InvalidRequestError(f"temperature must be a number (0 = greedy), got {text!r}") from None


@lru_cache(maxsize=16)
def _canonical(model: str | None, backend: str) -> str:
    if kind_of(backend).specs:
        return model or backend  # a reference model's spec is its name
    from localspec.models.naming import canonical_name

    return canonical_name(model)


def _short(path: str | None) -> str:
    if not path:
        return ""
    return path.replace("\\", "/").rsplit("/", 1)[-1]


# What the chat remembers of its settings from one session to the next (the last ones applied).
REMEMBERED = ("model", "draft_model", "mmproj", "strategy", "draft_tokens", "temperature")


def remembered_file() -> Path:
    from localspec.store import data_dir

    return data_dir() / "chat-settings.json"


def remember(settings: ChatSettings) -> None:
    """Keep the settings for the next `localspec chat` (quietly: a chat goes on without it)."""
    from localspec.store import save_json_quietly

    load = settings.load
    values = {
        "model": load.model,
        "draft_model": load.draft_model,
        "mmproj": load.mmproj,  # the projector goes with its model: a chat reopened on it still sees images
        "strategy": load.strategy,
        "draft_tokens": load.draft_tokens,
        "temperature": settings.sampling.temperature,
    }
    save_json_quietly(remembered_file(), values, "the chat's settings (not kept for next time)")


def remembered() -> dict[str, Any]:
    """The settings the last chat applied; {} when there are none or they cannot be read."""
    try:
        values = json.loads(remembered_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in values.items() if k in REMEMBERED} if isinstance(values, dict) else {}
