"""A request's speculation in serve: localspec's own field,

    "speculation": {"strategy": "none" | "auto" | <the loaded strategy>, "draft_tokens": N, "max_draft": N,
                    "min_confidence": P}

and llama-server's speculative.* fields, mapped onto it: speculative.n_max is the longest
draft, speculative.p_min the floor under which a draft model or a head ends a draft
(min_confidence; localspec.drafters.model says how the two rules differ), speculative.types []
(or "none") turns drafting off; speculative.n_min and a list of other types are accepted and
named in the warning header, as nothing here follows them (the controller chooses each draft's
length, the loaded drafter drafts). The same fields may come as one object,
"speculative": {"n_max": 8}, and "speculative": false turns drafting off (true: as loaded).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from localspec.server.schemas import LLAMA_SPECULATIVE, ApiError, GenerationRequest
from localspec.strategies import SPECULATION_FIELDS, Speculation

# What a field that changes nothing here is told in the warning header.
NO_EFFECT = {
    "speculative.n_min": "the controller chooses each draft's length",
    "speculative.types": "the loaded drafter drafts; only [] turns it off",
    "speculative.type": "the loaded drafter drafts; only 'none' turns it off",
}


@dataclass(frozen=True)
class Asked:
    """What a request asked of speculation: the Speculation for Runtime.stream (None: the
    runtime's own), and the fields it sent that change nothing here, for the warning header."""

    speculation: Speculation | None = None
    no_effect: list[str] = field(default_factory=list)


def requested(body: GenerationRequest) -> Asked:
    """The request's speculation from its `speculation` field and llama-server's fields; a
    value of the wrong kind is a 400 naming the field."""
    peer = {name: value for name, value in (body.model_extra or {}).items() if name in LLAMA_SPECULATIVE}
    peer |= _nested(peer.pop("speculative", None))
    if body.speculation is None and not peer:
        return Asked()
    own = _own(body.speculation or {})
    no_effect = []
    max_draft = own.get("max_draft")
    if "speculative.n_max" in peer:
        n_max = _count(peer["speculative.n_max"], "speculative.n_max")
        max_draft = n_max if max_draft is None else max_draft  # localspec's own field wins
    if "speculative.n_min" in peer:
        _number(peer["speculative.n_min"], "speculative.n_min", None)
        no_effect.append(f"speculative.n_min ({NO_EFFECT['speculative.n_min']})")
    floor = own.get("min_confidence")
    if "speculative.p_min" in peer:
        p_min = _number(peer["speculative.p_min"], "speculative.p_min", 1.0)
        floor = p_min if floor is None else floor  # localspec's own field wins
    strategy = own.get("strategy", "auto")
    for name in ("speculative.types", "speculative.type"):
        if name in peer:
            if _off(peer[name], name):
                strategy = "none" if "strategy" not in own else strategy
            else:
                no_effect.append(f"{name} ({NO_EFFECT[name]})")
    return Asked(Speculation(strategy, own.get("draft_tokens", "auto"), max_draft, floor), no_effect)


def _nested(value: Any) -> dict[str, Any]:
    """llama-server's fields given as one "speculative" object, in their dotted names; a
    boolean as a switch (false: types [], drafting off)."""
    if value is None or value is True:
        return {}
    if value is False:
        return {"speculative.types": []}
    if not isinstance(value, Mapping):
        told = "'speculative' must be an object such as {\"n_max\": 8}, or true/false"
        raise ApiError(400, told, param="speculative")
    named = {f"speculative.{key}": item for key, item in value.items()}
    unknown = sorted(set(named) - LLAMA_SPECULATIVE)
    if unknown:
        fields = "n_max, n_min, p_min, types and type"
        raise ApiError(400, f"unknown field {unknown[0]!r}: 'speculative' takes {fields}", param=unknown[0])
    return named


def _own(given: Mapping[str, Any]) -> dict[str, Any]:
    """localspec's `speculation` object, its values checked for kind (the loaded runtime
    checks the strategy it names)."""
    unknown = sorted(set(given) - SPECULATION_FIELDS)
    if unknown:
        raise ApiError(
            400,
            f"unknown speculation field {unknown[0]!r}: it takes strategy, draft_tokens, max_draft and min_confidence",
            param=f"speculation.{unknown[0]}",
        )
    out = dict(given)
    if "strategy" in out and not isinstance(out["strategy"], str):
        raise ApiError(400, "'speculation.strategy' must be a strategy's name, e.g. \"none\"", param="speculation")
    if "draft_tokens" in out and out["draft_tokens"] != "auto":
        out["draft_tokens"] = _count(out["draft_tokens"], "speculation.draft_tokens", 'or "auto"')
    if out.get("max_draft") is not None:
        out["max_draft"] = _count(out["max_draft"], "speculation.max_draft")
    if out.get("min_confidence") is not None:
        out["min_confidence"] = _number(out["min_confidence"], "speculation.min_confidence", 1.0)
    return out


def _count(value: Any, name: str, also: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ApiError(400, f"'{name}' must be a whole number >= 0 {also}".rstrip(), param=name)
    return value


def _number(value: Any, name: str, most: float | None) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or value < 0
        or (most is not None and value > most)
    ):
        bound = f"0 to {most:g}" if most is not None else ">= 0"
        raise ApiError(400, f"'{name}' must be a number {bound}", param=name)
    return float(value)


def _off(value: Any, name: str) -> bool:
    """Whether llama-server's types turn drafting off: [] or "none" (a comma-separated text
    or a list of names, as its --spec-type takes them)."""
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ApiError(400, f"'{name}' must be a list of type names, e.g. [] or [\"ngram-simple\"]", param=name)
    names = [n.strip() for n in names if n.strip()]
    return not names or names == ["none"]
