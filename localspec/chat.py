"""Renders chat messages with the model's own Jinja template, as transformers does."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from localspec.errors import InvalidRequestError

# Used only when a model ships no template; ChatML is what most small instruct models use.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

Message = Mapping[str, str]


def _raise(message: str) -> None:
    raise InvalidRequestError(f"the model's chat template refused the messages: {message}")


def render_chat(
    template: str | None,
    messages: Sequence[Message],
    special: Mapping[str, str],
    add_generation_prompt: bool = True,
) -> str:
    if not messages:
        raise InvalidRequestError("no chat messages given", "pass at least one {'role': 'user', 'content': ...}")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
            raise InvalidRequestError(f"chat message {i} needs 'role' and 'content' keys, got {m!r}")
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        compiled = env.from_string(template or CHATML)
        context: dict[str, Any] = {"messages": list(messages), "add_generation_prompt": add_generation_prompt}
        return compiled.render(**context, **special)
    except jinja2.TemplateError as exc:
        raise InvalidRequestError(f"the model's chat template failed: {exc}") from exc
