"""Logit processing shared by target and drafter, so p and q are shaped the same way.

Rejection sampling is exact for any processing function f as long as the target's p is
f(target logits) and the draft's q is f(draft logits); the chain below is therefore applied
identically to both. Distributions are kept sparse (ids, probs): after min-p/top-k only a
handful of tokens survive, which keeps per-position work in microseconds instead of
sorting the whole vocabulary.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from localspec.core.errors import InvalidRequestError

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


def check_penalty(name: str, value: Any) -> float:
    """frequency_penalty or presence_penalty, in OpenAI's range."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InvalidRequestError(f"{name} must be a number, got {value!r}")
    if not -2 <= value <= 2:
        raise InvalidRequestError(f"{name} must be in [-2, 2], got {value}", "use 0 to turn it off")
    return float(value)


def check_repeat(name: str, value: Any) -> Any:
    """llama.cpp's repeat_penalty (above 0; 1 is off) or repeat_last_n (-1: the whole context, 0: off)."""
    kinds = (int, np.integer) if name == "repeat_last_n" else (int, float, np.integer, np.floating)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise InvalidRequestError(f"{name} must be a number, got {value!r}")
    if name == "repeat_penalty" and not (value > 0 and math.isfinite(value)):
        raise InvalidRequestError(f"repeat_penalty must be above 0, got {value}", "use 1 to turn it off")
    if name == "repeat_last_n" and value < -1:
        raise InvalidRequestError(f"repeat_last_n must be -1 (the whole context) or more, got {value}")
    return float(value) if name == "repeat_penalty" else int(value)


def check_logit_bias(bias: Any) -> tuple[tuple[int, float], ...]:
    """logit_bias as sorted (token id, bias) pairs, each bias in OpenAI's [-100, 100]."""
    pairs = bias.items() if hasattr(bias, "items") else bias
    out: dict[int, float] = {}
    for token, value in pairs:
        if isinstance(token, bool) or not isinstance(token, (int, np.integer)) or token < 0:
            raise InvalidRequestError(f"logit_bias keys must be token ids (0 or more), got {token!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
            raise InvalidRequestError(f"logit_bias values must be numbers in [-100, 100], got {value!r}")
        out[int(token)] = float(value)
    return tuple(sorted(out.items()))


class TokenConstraint(Protocol):
    """What the text may be (a grammar, a JSON schema), as the tokens it allows after what the
    request wrote so far. Masking the target's logits keeps speculation exact: a draft token
    outside the grammar has p = 0 and is rejected like any other."""

    def allowed_prefix(self, draft: Sequence[int]) -> int:
        """How many of the draft's tokens the constraint takes, from the text so far."""
        ...

    def mask(self, rows: npt.NDArray[np.floating], draft: Sequence[int], start: int = 0) -> None:
        """Set to -inf, in place, what row i may not be after draft[:start + i] (all allowed)."""
        ...

    def commit(self, tokens: Sequence[int]) -> None:
        """The tokens the request emitted."""
        ...


@dataclass(frozen=True)
class SamplingConfig:
    """How to sample, with every knob's default; temperature 0 means greedy and the other
    knobs then do nothing. Built with a bad value, it raises InvalidRequestError.

    The penalties and logit_bias change the target's logits before anything else (shape),
    as OpenAI defines them; logprobs, when given, is told each emitted token's log-probability."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    # llama.cpp's: a token among the last repeat_last_n of the context (prompt included) has a
    # positive logit divided by repeat_penalty, a negative one multiplied.
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    # One request's recorder and grammar: not settings, so they take no part in comparing configs.
    logprobs: LogprobRecorder | None = field(default=None, compare=False, repr=False)
    constraint: TokenConstraint | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in KNOBS:
            object.__setattr__(self, name, check_knob(name, getattr(self, name)))
        for name in ("frequency_penalty", "presence_penalty"):
            object.__setattr__(self, name, check_penalty(name, getattr(self, name)))
        object.__setattr__(self, "logit_bias", check_logit_bias(self.logit_bias))
        for name in ("repeat_penalty", "repeat_last_n"):
            object.__setattr__(self, name, check_repeat(name, getattr(self, name)))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def shapes_logits(self) -> bool:
        """Whether the target's logits must pass through shape() (and the numpy acceptance rule)."""
        return bool(
            self.frequency_penalty or self.presence_penalty or self.logit_bias or self.constraint or self.repeats
        )

    @property
    def repeats(self) -> bool:
        """Whether llama.cpp's repeat penalty changes anything."""
        return self.repeat_penalty != 1 and self.repeat_last_n != 0

    def repeat_window(self, context: Sequence[int], start: int) -> Sequence[int]:
        """The tokens before `start` that the repeat penalty's window may reach (the prompt's tail)."""
        if not self.repeats:
            return ()
        window = context[:start] if self.repeat_last_n < 0 else context[max(0, start - self.repeat_last_n) : start]
        # An image's positions hold placeholder ids (below 0), no token a penalty could touch.
        return window if not window or min(window) >= 0 else [t for t in window if t >= 0]


# The sampler's knobs, which every front end (CLI flags, TUI settings, keyword arguments) takes.
KNOBS = ("temperature", "top_k", "top_p", "min_p", "seed")
# What reshapes the target's logits, as serve's request fields and the Python API's keywords name it.
PENALTIES = ("frequency_penalty", "presence_penalty", "repeat_penalty", "repeat_last_n", "logit_bias")


def shape(
    rows: npt.NDArray[np.floating],
    cfg: SamplingConfig,
    generated: Sequence[int],
    draft: Sequence[int] = (),
    before: Sequence[int] = (),
    start: int = 0,
) -> npt.NDArray[np.floating]:
    """The target's logits with logit_bias, llama.cpp's repeat penalty and OpenAI's penalties
    applied (llama.cpp's order), then the constraint's mask; rows[i] follows generated +
    draft[:start + i] (a verify block's rows from start 0; a drafter's newest row from its
    draft so far), so each row counts what precedes it:

        mu[j] += logit_bias[j]
        mu[j] = mu[j] / r if mu[j] > 0 else mu[j] * r, for j among the last repeat_last_n tokens
        mu[j] -= c[j] * frequency_penalty + (c[j] > 0) * presence_penalty

    c[j]: how often token j was generated so far in this request (the prompt does not count);
    the repeat window reaches into the prompt (`before`: its tail, as llama-server counts it).
    Rejection sampling stays exact because acceptance compares with this shaped law."""
    if not cfg.shapes_logits:
        return rows
    out = np.array(rows)  # a copy: a backend may hand out its own buffer
    if cfg.logit_bias:
        ids = np.array([t for t, _ in cfg.logit_bias], dtype=np.int64)
        out[:, ids] += np.array([b for _, b in cfg.logit_bias])
    if cfg.repeats:
        n = cfg.repeat_last_n
        # Only the window's worth of history is copied (_repeat_penalize cuts it to n per row):
        # a long answer costs nothing more per step.
        history = [*before, *generated, *draft[:start]] if n < 0 else [*before[-n:], *generated[-n:], *draft[:start]]
        _repeat_penalize(out, cfg, history, draft[start:])
    if cfg.frequency_penalty or cfg.presence_penalty:
        _penalize(out, cfg, [*generated, *draft[:start]], draft[start:])
    if cfg.constraint is not None:
        cfg.constraint.mask(out, draft, start)
    return out


def _penalize(
    out: npt.NDArray[np.floating], cfg: SamplingConfig, generated: Sequence[int], draft: Sequence[int]
) -> None:
    counts = Counter(generated)
    for i, row in enumerate(out):
        if i:
            counts[draft[i - 1]] += 1
        if counts:
            ids = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
            c = np.fromiter(counts.values(), dtype=np.float64, count=len(counts))
            row[ids] -= c * cfg.frequency_penalty + cfg.presence_penalty


def _repeat_penalize(
    out: npt.NDArray[np.floating], cfg: SamplingConfig, history: Sequence[int], draft: Sequence[int]
) -> None:
    for i, row in enumerate(out):
        seen = [*history, *draft[:i]]
        if cfg.repeat_last_n > 0:
            seen = seen[-cfg.repeat_last_n :]
        if seen:
            ids = np.unique(np.asarray(seen, dtype=np.int64))
            vals = row[ids]
            row[ids] = np.where(vals > 0, vals / cfg.repeat_penalty, vals * cfg.repeat_penalty)


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    text: bytes
    logprob: float
    top: tuple[tuple[int, bytes, float], ...]  # the most likely tokens at this position, best first


MAX_TOP_LOGPROBS = 20  # alternatives per token: OpenAI's limit, serve's and the Python API's


def check_top_logprobs(top: Any) -> int:
    """top_logprobs as a whole number 0 to MAX_TOP_LOGPROBS, else InvalidRequestError."""
    if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
        raise InvalidRequestError(f"top_logprobs must be a whole number 0 to {MAX_TOP_LOGPROBS}, got {top!r}")
    return top


class LogprobRecorder:
    """Each emitted token's log-probability and the `top` most likely tokens at its position,
    from the target's logits as shape() leaves them (penalties, logit_bias), softmaxed as they
    are: before temperature and min-p/top-k/top-p, as OpenAI's and llama-server's logprobs
    are, so a greedy request still gets a distribution. The engine records; a reader takes
    the entries in order (one thread each: list appends and reads are atomic)."""

    def __init__(self, top: int, token_bytes: Callable[[int], bytes]) -> None:
        self.top = top
        self.token_bytes = token_bytes
        self.entries: list[TokenLogprob] = []
        self._read = 0

    def record(self, tokens: Sequence[int], rows: npt.NDArray[np.floating]) -> None:
        """rows[i]: the shaped logits that tokens[i] was chosen from."""
        for token, row in zip(tokens, rows, strict=False):
            logp = np.asarray(row, dtype=np.float64)
            top = float(logp.max())
            logp = logp - (top + math.log(float(np.exp(logp - top).sum())))
            best = np.argpartition(-logp, self.top - 1)[: self.top] if self.top else np.empty(0, np.int64)
            best = best[np.argsort(-logp[best], kind="stable")]
            best = best[np.isfinite(logp[best])]  # a token a grammar rules out is no alternative
            alts = tuple((int(t), self.token_bytes(int(t)), float(logp[t])) for t in best)
            self.entries.append(TokenLogprob(int(token), self.token_bytes(int(token)), float(logp[token]), alts))

    def take(self, n: int) -> list[TokenLogprob]:
        """The next n entries not yet taken."""
        out = self.entries[self._read : self._read + n]
        self._read += len(out)
        return out


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

    def keyed_sample(self, seed: int, position: int) -> int:
        """A seeded request's token at `position` (Gumbel-max with keyed_gumbels):
        argmax_t log p(t) + G(seed, position, t) is distributed as p, and it is the same
        draw whoever makes it, so a drafter and the target that share the noise agree
        whenever their laws lead to the same token."""
        with np.errstate(divide="ignore"):
            scores = np.log(self.probs) + keyed_gumbels(seed, position, self.ids)
        return int(self.ids[int(np.argmax(scores))])

    def dense(self, vocab: int) -> FloatArray:
        out = np.zeros(vocab, dtype=np.float64)
        out[self.ids] = self.probs
        return out


_U64 = (1 << 64) - 1


def _splitmix64(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """SplitMix64's finalizer: a well-mixed 64-bit hash (wrapping arithmetic)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def keyed_gumbels(seed: int, position: int, ids: IntArray) -> FloatArray:
    """Standard Gumbel noise for each token id at one context position of a seeded request,
    a hash of (seed, position, id): the same for every drawer, and independent of how many
    numbers anything drew before (the draft lengths, the tokens before)."""
    with np.errstate(over="ignore"):
        key = _splitmix64(np.array([seed & _U64], dtype=np.uint64))
        key = _splitmix64(key ^ np.uint64(position & _U64))
        bits = _splitmix64(key ^ ids.astype(np.uint64))
    u = ((bits >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53  # in (0, 1)
    return -np.log(-np.log(u))


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
