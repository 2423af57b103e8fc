"""Logit processing shared by target and drafter, so p and q are shaped the same way.

Rejection sampling is exact for any processing function f as long as the target's p is
f(target logits) and the draft's q is f(draft logits); the chain below is therefore applied
identically to both. Distributions are kept sparse (ids, probs): after min-p/top-k only a
handful of tokens survive, which keeps per-position work in microseconds instead of
sorting the whole vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from localspec.errors import InvalidRequestError

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def check_knob(name: str, value: Any) -> Any:
    """One sampling knob, checked: the value to keep, or InvalidRequestError naming the knob
    and the fix. Every front end builds a SamplingConfig, so this is the one range check."""
    if name == "seed":  # a negative seed means "random", as llama.cpp's --seed -1 does
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise InvalidRequestError(f"seed must be a whole number, got {value!r}")
        return None if value is None or value < 0 else value
    kinds = (int, np.integer) if name == "top_k" else (int, float, np.integer, np.floating)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise InvalidRequestError(f"{name} must be a number, got {value!r}")
    holds, must_be, fix = {
        "temperature": (value >= 0 and math.isfinite(value), "0 or more", "use 0 for greedy decoding"),
        "top_k": (value >= 0, "0 (off) or more", None),
        "top_p": (0 < value <= 1, "in (0, 1]", "use 1 to turn it off"),
        "min_p": (0 <= value < 1, "in [0, 1)", "use 0 to turn it off"),
    }[name]
    if not holds:
        raise InvalidRequestError(f"{name} must be {must_be}, got {value}", fix)
    return value


@dataclass(frozen=True)
class SamplingConfig:
    """How to sample, with every knob's default; temperature 0 means greedy and the other
    knobs then do nothing. Built with a bad value, it raises InvalidRequestError."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in KNOBS:
            object.__setattr__(self, name, check_knob(name, getattr(self, name)))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


KNOBS = tuple(f.name for f in fields(SamplingConfig))


@dataclass(frozen=True)
class Distribution:
    """A sparse probability distribution over token ids; probs sum to 1."""

    ids: IntArray
    probs: FloatArray

    def prob(self, token: int) -> float:
        hit = self.probs[self.ids == token]
        return float(hit[0]) if hit.size else 0.0

    def sample(self, rng: np.random.Generator) -> int:
        cdf = np.cumsum(self.probs)
        idx = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
        return int(self.ids[min(idx, self.ids.size - 1)])

    def dense(self, vocab: int) -> FloatArray:
        out = np.zeros(vocab, dtype=np.float64)
        out[self.ids] = self.probs
        return out


def one_hot(token: int) -> Distribution:
    return Distribution(np.array([token], dtype=np.int64), np.array([1.0]))


def process(logits: npt.NDArray[np.floating], cfg: SamplingConfig) -> Distribution:
    """The sampler chain: min-p -> top-k -> top-p (all on raw logits), then temperature.

    Like llama.cpp, the truncations look at the untempered distribution and temperature
    only reshapes what survives; this keeps the candidate set independent of temperature.
    """
    row = np.asarray(logits, dtype=np.float64)
    top = float(row.max())
    if cfg.min_p > 0:
        # p_i / p_max >= min_p  <=>  logit_i >= logit_max + log(min_p)
        ids = np.flatnonzero(row >= top + math.log(cfg.min_p))
    else:
        ids = np.arange(row.size)
    vals = row[ids]
    if 0 < cfg.top_k < ids.size:
        keep = np.argpartition(-vals, cfg.top_k - 1)[: cfg.top_k]
        ids, vals = ids[keep], vals[keep]
    order = np.argsort(-vals, kind="stable")
    ids, vals = ids[order], vals[order]
    if cfg.top_p < 1:
        p = np.exp(vals - vals[0])
        cdf = np.cumsum(p) / p.sum()
        n = int(np.searchsorted(cdf, cfg.top_p - 1e-9, side="left")) + 1  # tolerate rounding
        ids, vals = ids[:n], vals[:n]
    scaled = np.exp((vals - vals[0]) / cfg.temperature)
    return Distribution(ids.astype(np.int64), scaled / scaled.sum())
