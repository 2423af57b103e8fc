"""A request's prompt as the server reads it: a raw completion's control tokens parsed as
llama-server does, and the keywords a job passes to the runtime for each kind of prompt."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from localspec.api import Finished, Runtime, TextDelta
from localspec.common.tools import ToolRequest
from localspec.core.errors import InvalidRequestError
from localspec.core.sampling import SamplingConfig
from localspec.core.validate import clean_text
from localspec.pool import Pool

log = logging.getLogger("localspec.server")

Item = TextDelta | Finished | BaseException
Loader = Callable[[str], Runtime | Pool]
HISTORY = 64  # finished jobs kept for /health and the tests
PROMPT_KEYS = ("prompt", "messages", "fim", "tools")  # a request's prompt, which becomes one Prompt


def raw_prompt(runtime: Runtime, text: str) -> list[int]:
    """A completion's prompt as llama-server reads it: control tokens written as text
    (`<|im_start|>`, `<fim_prefix>`) become those tokens, since apps that apply their own
    template send them so. Chat content never goes through here: a pasted `<|im_end|>` there
    stays text (common/templates.chat_tokens)."""
    text = clean_text(text)
    if not text:
        raise InvalidRequestError("the prompt is empty", "give some text to continue")
    return runtime.target.tokenize(text, add_special=True, parse_special=True)


def stream_kwargs(
    *,
    prompt: str | Sequence[int] | None = None,
    messages: Sequence[Mapping[str, Any]] | None = None,
    fim: tuple[str, str] | None = None,
    tools: ToolRequest | None = None,
    max_tokens: int,
    stop: Sequence[str],
    sampling: SamplingConfig,
) -> dict[str, Any]:
    request: dict[str, Any] = {"max_tokens": max_tokens, "stop": list(stop), "sampling": sampling}
    if messages is not None:
        request["messages"] = list(messages)
        if tools is not None:
            request["tools"] = tools  # rendered once the model, and so its template, is known
    elif fim is not None:
        request["fim"] = fim  # made into token ids once the model is known (Worker._tokenize)
    else:
        request["prompt"] = prompt
    return request
