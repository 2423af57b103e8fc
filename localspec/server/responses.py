"""The response objects localspec serve writes back (chat.completion, text_completion, usage,
logprobs, its speculation figures), apart from the request bodies that schemas.py validates."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from localspec.core.sampling import TokenLogprob
from localspec.core.stats import Stats

# The engine's finish reasons in OpenAI's words: a filled context is a length limit too.
FINISH_REASONS = {"stop": "stop", "max_tokens": "length", "context_full": "length"}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def usage(stats: Stats) -> dict[str, int]:
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.generated_tokens,
        "total_tokens": stats.prompt_tokens + stats.generated_tokens,
    }


def combined(answers: Sequence[Stats]) -> Stats:
    """The stats of n choices of one request as one: counts and times summed, the prompt once."""
    if len(answers) == 1:
        return answers[0]
    total = replace(answers[0], gamma_histogram=dict(answers[0].gamma_histogram))
    for stats in answers[1:]:
        for name in SUMMED:
            setattr(total, name, getattr(total, name) + getattr(stats, name))
        for gamma, count in stats.gamma_histogram.items():
            total.gamma_histogram[gamma] = total.gamma_histogram.get(gamma, 0) + count
    return total


SUMMED = (
    "prefill_tokens",
    "prefill_seconds",
    "generated_tokens",
    "decode_seconds",
    "draft_seconds",
    "verify_seconds",
    "verify_steps",
    "drafted",
    "accepted",
    "forced",
    "forced_drafted",
    "drafted_steps",
)


def speculation(stats: Stats) -> dict[str, Any]:
    """localspec's figures for one request: an extra key OpenAI clients ignore. Drafting's
    figures leave out what a grammar forced (those tokens are known, not guessed: counting
    them would report an acceptance near 1 for any structured answer, drafted or not)."""
    return {
        "strategy": stats.strategy,
        "drafted_tokens": stats.drafted - stats.forced_drafted,
        "accepted_tokens": stats.accepted - stats.forced,
        "acceptance_rate": round(stats.drafter_acceptance_rate, 4),
        "forced_tokens": stats.forced,  # what the grammar forced (jump-forward), verified in the same passes
        "verify_steps": stats.verify_steps,
        "tokens_per_step": round(stats.tokens_per_step, 4),
        "mean_draft_length": round(stats.mean_gamma, 4),
        "decode_tokens_per_s": round(stats.decode_tokens_per_s, 2),
        "prompt_tokens_evaluated": stats.prefill_tokens,
        # The prompt's evaluation (with the first token where it came from the prompt's pass) and
        # the decoding after it, as llama-server's timings split a request.
        "prompt_seconds": round(stats.prefill_seconds, 4),
        "decode_seconds": round(stats.decode_seconds, 4),
        # Greedy: plain decoding's answer bit for bit by construction (null when sampled).
        "bit_exact": stats.bit_exact,
        "inexact_reason": stats.inexact_reason or None,  # why bit_exact is false
        # A prefix reused beyond a fresh evaluation's blocks (cache_prompt: true): whether the answer
        # is still a fresh evaluation's by construction (null when nothing was so reused).
        "fresh_exact": stats.fresh_exact,
        "fresh_inexact_reason": stats.fresh_inexact_reason or None,
    }


ChatObject = Literal["chat.completion", "chat.completion.chunk"]


def token_text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def chat_logprobs(entries: list[TokenLogprob] | None) -> dict[str, Any] | None:
    """OpenAI's chat logprobs: per token its text, bytes, logprob and top alternatives."""
    if entries is None:
        return None

    def one(text: bytes, logprob: float) -> dict[str, Any]:
        return {"token": token_text(text), "logprob": logprob, "bytes": list(text)}

    content = [{**one(e.text, e.logprob), "top_logprobs": [one(t, lp) for _, t, lp in e.top]} for e in entries]
    return {"content": content, "refusal": None}


def text_logprobs(entries: list[TokenLogprob] | None, offset: int = 0) -> dict[str, Any] | None:
    """The completions API's older shape: parallel lists, top alternatives as {token: logprob};
    offset: where the first token's text begins in the answer."""
    if entries is None:
        return None
    offsets = []
    for e in entries:
        offsets.append(offset)
        offset += len(token_text(e.text))
    return {
        "tokens": [token_text(e.text) for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{token_text(t): lp for _, t, lp in e.top} for e in entries],
        "text_offset": offsets,
    }


@dataclass(frozen=True)
class Answered:
    """One choice's whole answer: its text, why it ended and its tokens' logprobs if asked."""

    text: str
    finish: str
    logprobs: list[TokenLogprob] | None = None


def chat_completion(rid: str, created: int, model: str, answered: Answered, stats: Stats) -> dict[str, Any]:
    text, finish, logprobs = answered.text, answered.finish, answered.logprobs
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": chat_logprobs(logprobs),
                "finish_reason": FINISH_REASONS.get(finish, finish),
            }
        ],
        "usage": usage(stats),
        "speculation": speculation(stats),
    }


def text_completion(rid: str, created: int, model: str, answered: Answered, stats: Stats) -> dict[str, Any]:
    text, logprobs = answered.text, answered.logprobs
    finish = FINISH_REASONS.get(answered.finish, answered.finish)
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": text_logprobs(logprobs), "finish_reason": finish}],
        "usage": usage(stats),
        "speculation": speculation(stats),
    }
