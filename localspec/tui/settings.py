"""What the chat runs with: the pair and strategy (changing them loads a new runtime) and the
sampling options of the next request (changing them loads nothing)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from localspec.choices import DraftTokens
from localspec.errors import InvalidRequestError
from localspec.sampling import KNOBS, SamplingConfig

# Fields a Runtime is built from; everything else applies to the next request only.
RUNTIME_FIELDS = ("model", "draft_model", "backend", "strategy", "draft_tokens", "n_ctx", "threads", "rpc")


@dataclass(frozen=True)
class ChatSettings:
    model: str | None = None  # None: the embedded default
    draft_model: str | None = None
    backend: str = "llamacpp"
    strategy: str = "auto"
    draft_tokens: DraftTokens = "auto"
    n_ctx: int = 4096
    threads: int | None = None
    rpc: str | None = None  # llama.cpp rpc-servers the target is split over
    system: str = ""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    max_tokens: int = 1024

    def needs_new_runtime(self, other: ChatSettings) -> bool:
        return any(getattr(self, name) != getattr(other, name) for name in RUNTIME_FIELDS)

    def model_label(self) -> str:
        name = _short(self.model) if self.model else "default model"
        return f"{name} + {_short(self.draft_model)}" if self.draft_model else name

    def with_changes(self, **changes: Any) -> ChatSettings:
        """These settings with some changed; a sampling knob (temperature=0.2) changes `sampling`."""
        knobs = {name: changes.pop(name) for name in KNOBS if name in changes}
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise InvalidRequestError(f"unknown chat setting(s): {', '.join(sorted(unknown))}")
        changes["sampling"] = replace(changes.get("sampling", self.sampling), **knobs)
        return replace(self, **changes)


def parse_temperature(text: str) -> float:
    """Its range is checked by SamplingConfig when the settings are changed."""
    try:
        return float(text.strip())
    except ValueError:
        raise InvalidRequestError(f"temperature must be a number (0 = greedy), got {text!r}") from None


def _short(path: str | None) -> str:
    if not path:
        return ""
    return path.replace("\\", "/").rsplit("/", 1)[-1]
