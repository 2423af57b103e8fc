"""A request's prompt as the target's token ids: text, ids as given, a chat (images
included), or a chat offered tools; and Prompt, one checked and tokenized ahead of its turn."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from localspec.common.media import has_images, image_chat_tokens
from localspec.common.templates import chat_tokens, normalize_messages, render_chat
from localspec.common.tools import ToolRequest, tool_style, with_calls
from localspec.core.engine import check_fits
from localspec.core.errors import InvalidRequestError
from localspec.core.protocol import Backend
from localspec.core.validate import chat_as_prompt, clean_text


@dataclass(frozen=True)
class Prompt:
    """A prompt a runtime has checked and tokenized (Runtime.prepare). stream() and generate()
    take it as prompt= and use its ids as they are: a server tokenizes each request once."""

    ids: tuple[int, ...]


def prompt_tokens(
    target: Backend, prompt: str | Sequence[int] | None, messages: Sequence[Mapping[str, Any]] | None
) -> list[int]:
    """prompt is text, or token ids as given (a fill-in-the-middle prompt's control tokens),
    or a chat given in messages' place."""
    prompt, messages = chat_as_prompt(prompt, messages)
    if (prompt is None) == (messages is None):
        raise InvalidRequestError("give either prompt= (plain text) or messages= (a chat), not both or neither")
    if messages is not None and has_images(messages):
        return image_chat_tokens(target, messages)
    if messages is not None:
        chat = normalize_messages(messages)
        text = render_chat(target.chat_template(), chat, target.special_texts(), source=target.info.path)
        return chat_tokens(target, text, [m["content"] for m in chat])
    if isinstance(prompt, (list, tuple)):
        n_vocab = target.info.n_vocab
        ids_ok = all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < n_vocab for t in prompt)
        if not prompt or not ids_ok:
            raise InvalidRequestError(f"prompt token ids must be whole numbers 0 to {n_vocab - 1}, at least one")
        return list(prompt)
    if not isinstance(prompt, str):
        raise InvalidRequestError(f"prompt must be a string or a list of token ids, got {type(prompt).__name__}")
    prompt = clean_text(prompt)
    if not prompt:
        raise InvalidRequestError("the prompt is empty", "give some text to continue")
    return target.tokenize(prompt, add_special=True, parse_special=False)


def prepare(
    target: Backend, prompt: str | Sequence[int] | None, messages: Sequence[Mapping[str, Any]] | None
) -> Prompt:
    """A prompt checked and tokenized once: one that does not fit the context is refused here."""
    tokens = prompt_tokens(target, prompt, messages)
    check_fits(tokens, target.info.n_ctx)
    return Prompt(tuple(tokens))


def tool_prompt(target: Backend, tools: ToolRequest, messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """A chat offered tools, as token ids: through the model's own template where it renders
    tools, else with Hermes' system block (the grammar of a forced call follows the same)."""
    template = target.chat_template()
    given = normalize_messages(with_calls(messages))
    if not tool_style(template).native:
        return prompt_tokens(target, None, tools.messages(given))
    chat = normalize_messages(tools.native_messages(given))
    text = render_chat(template, chat, target.special_texts(), tools=tools.tools(), source=target.info.path)
    return chat_tokens(target, text, [m["content"] for m in chat])


def request_tokens(
    target: Backend,
    prompt: str | Sequence[int] | Prompt | None,
    messages: Sequence[Mapping[str, Any]] | None,
    tools: ToolRequest | None,
) -> list[int]:
    """A request's prompt as token ids, checked to fit: a Prompt's ids as prepared, a chat
    with the tools it offers, or prompt= and messages= as prompt_tokens() takes them."""
    if tools is not None:  # the functions are described in the chat: a chat it must be
        given, chat = (prompt, None) if isinstance(prompt, Prompt) else chat_as_prompt(prompt, messages)
        if chat is None or given is not None:
            raise InvalidRequestError("tools= needs a chat", "give messages=[...] instead of prompt=")
        tokens = tool_prompt(target, tools, chat)
    elif isinstance(prompt, Prompt):  # checked and tokenized by prepare(): not again
        if messages is not None:
            raise InvalidRequestError("give either prompt= or messages=, not both")
        tokens = list(prompt.ids)
    else:
        return list(prepare(target, prompt, messages).ids)
    check_fits(tokens, target.info.n_ctx)
    return tokens
