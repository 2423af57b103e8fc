"""What the chat runs with: the pair and strategy (changing them loads a new runtime) and the
sampling options of the next request (changing them loads nothing)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Literal

from localspec.errors import InvalidRequestError

DraftTokens = int | Literal["auto"]

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
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int | None = None
    max_tokens: int = 1024

    def needs_new_runtime(self, other: ChatSettings) -> bool:
        return any(getattr(self, name) != getattr(other, name) for name in RUNTIME_FIELDS)

    def sampling(self) -> dict[str, Any]:
        return {
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "min_p": self.min_p,
            "seed": self.seed,
        }

    def model_label(self) -> str:
        name = _short(self.model) if self.model else "default model"
        return f"{name} + {_short(self.draft_model)}" if self.draft_model else name

    def with_changes(self, **changes: Any) -> ChatSettings:
        known = {f.name for f in fields(self)}
        unknown = set(changes) - known
        if unknown:
            raise InvalidRequestError(f"unknown chat setting(s): {', '.join(sorted(unknown))}")
        return replace(self, **changes)


def parse_draft_tokens(text: str) -> DraftTokens:
    value = text.strip().lower()
    if value in ("", "auto"):
        return "auto"
    try:
        n = int(value)
    except ValueError:
        raise InvalidRequestError(f"draft length must be 'auto' or a whole number, got {text!r}") from None
    if n < 0:
        raise InvalidRequestError(f"draft length must be 'auto' or a whole number >= 0, got {n}")
    return n


def parse_temperature(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise InvalidRequestError(f"temperature must be a number (0 = greedy), got {text!r}") from None
    if not 0 <= value <= 5:
        raise InvalidRequestError(f"temperature must be between 0 and 5, got {value}")
    return value


def _short(path: str | None) -> str:
    if not path:
        return ""
    return path.replace("\\", "/").rsplit("/", 1)[-1]
