"""Renders chat messages with the model's own Jinja template, as transformers does."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import meta, nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from localspec.core.errors import InvalidRequestError
from localspec.core.protocol import Backend
from localspec.core.validate import clean_text

# Used only when a model ships no template; ChatML is what most small instruct models use.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

Message = Mapping[str, Any]

# A template is code from a model file: what it may build is bounded, so `'a' * 10**10` or
# `9**9**9` is refused instead of exhausting memory or the CPU.
MAX_RENDERED_CHARS = 16_000_000
MAX_EXPONENT = 256
# Loop turns and calls a render may take, and its time: a template that loops without
# printing (nested loops, a macro that calls itself twice) is refused instead of hanging.
# Real templates take a few steps per message, so a chat of thousands of turns fits.
MAX_TEMPLATE_STEPS = 1_000_000
MAX_TEMPLATE_SECONDS = 5.0


class TemplateBudgetError(SecurityError):
    """A render ran past its steps or seconds: the template itself is at fault, not the chat."""


class _CountingCodeGenerator(CodeGenerator):
    """Compiles every `for` to iterate through environment.counted, which counts its turns."""

    def visit_For(self, node: nodes.For, frame: Frame) -> None:
        counted = isinstance(node.iter, nodes.Call) and isinstance(node.iter.node, nodes.EnvironmentAttribute)
        if not counted:
            node.iter = nodes.Call(nodes.EnvironmentAttribute("counted"), [node.iter], [], None, None)
            node.iter.set_lineno(node.lineno)
        super().visit_For(node, frame)


class _Counted:
    """An iterable whose every item is a step of the render (its length is the wrapped one's,
    so `loop.length` stays cheap)."""

    def __init__(self, env: BoundedSandbox, iterable: Iterable[Any]) -> None:
        self.env, self.iterable = env, iterable

    def __iter__(self) -> Iterator[Any]:
        for item in self.iterable:
            self.env.step()
            yield item

    def __len__(self) -> int:
        return len(self.iterable)  # type: ignore[arg-type]  # a TypeError tells LoopContext to count


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox with a ceiling on repeated sequences, powers, output, and on the
    steps (loop turns and calls) and seconds a render may take."""

    intercepted_binops = frozenset({"*", "**"})
    code_generator_class = _CountingCodeGenerator

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.steps = 0
        self.deadline = time.monotonic() + MAX_TEMPLATE_SECONDS

    def step(self) -> None:
        self.steps += 1
        if self.steps > MAX_TEMPLATE_STEPS:
            raise TemplateBudgetError(f"it ran past {MAX_TEMPLATE_STEPS:,} steps (loop turns, calls) without finishing")
        if self.steps % 256 == 0 and time.monotonic() > self.deadline:
            raise TemplateBudgetError(f"it ran past {MAX_TEMPLATE_SECONDS:g} s without finishing")

    def counted(self, iterable: Iterable[Any]) -> _Counted:
        return _Counted(self, iterable)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # Jinja's signature
        __self.step()
        return super().call(__context, __obj, *args, **kwargs)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**" and isinstance(right, int | float) and abs(right) > MAX_EXPONENT:
            raise SecurityError(f"the power {right} is too large")
        if operator == "*":
            size = _repeat_size(left, right) or _repeat_size(right, left)
            if size > MAX_RENDERED_CHARS:
                raise SecurityError(f"a repeated value of {size} items is too large")
        return super().call_binop(context, operator, left, right)


def _repeat_size(seq: Any, times: Any) -> int:
    if isinstance(seq, str | list | tuple) and isinstance(times, int):
        return len(seq) * times
    return 0


def message_text(i: int, content: Any) -> str:
    """A message's content as text: a string, None (empty, as OpenAI allows for an assistant
    turn), or OpenAI's list of parts, whose text parts are joined; anything else is refused."""
    if isinstance(content, str):
        return clean_text(content)
    if content is None:
        return ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise InvalidRequestError(
                    f"chat message {i} has a content part of type {kind!r}", "this model reads text parts only"
                )
            texts.append(clean_text(part["text"]))
        return "".join(texts)
    raise InvalidRequestError(
        f"chat message {i} has content of type {type(content).__name__}",
        "give the content as a string (or a list of {'type': 'text', 'text': ...} parts)",
    )


def normalize_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence) or not messages:
        raise InvalidRequestError("no chat messages given", "pass at least one {'role': 'user', 'content': ...}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
            raise InvalidRequestError(f"chat message {i} needs 'role' and 'content' keys, got {m!r}")
        if not isinstance(m["role"], str):
            raise InvalidRequestError(f"chat message {i} has a role of type {type(m['role']).__name__}, not text")
        out.append({**m, "content": message_text(i, m["content"])})
    return out


def chat_tokens(backend: Backend, text: str, contents: Sequence[str]) -> list[int]:
    """Tokens of a rendered chat: the template's markup with special-token parsing, the
    messages' content as plain text, so pasted `<|im_end|>` cannot forge a turn."""
    forged = [c for c in contents if c and _has_special(backend, c)]
    if not forged:  # the common case: one pass over the whole text, as before
        return backend.tokenize(text, add_special=False, parse_special=True)
    tokens: list[int] = []
    cursor = 0
    for content in contents:
        if content not in forged:
            continue
        at = text.find(content, cursor)
        if at < 0:
            raise InvalidRequestError(
                "a chat message contains the model's control tokens and its chat template changes the message",
                "remove text such as <|im_end|> or <|im_start|> from the message",
            )
        tokens += backend.tokenize(text[cursor:at], add_special=False, parse_special=True)
        tokens += backend.tokenize(content, add_special=False, parse_special=False)
        cursor = at + len(content)
    return tokens + backend.tokenize(text[cursor:], add_special=False, parse_special=True)


def _has_special(backend: Backend, text: str) -> bool:
    plain = backend.tokenize(text, add_special=False, parse_special=False)
    return backend.tokenize(text, add_special=False, parse_special=True) != plain


def takes_tools(template: str | None) -> bool:
    """Whether a chat template reads the `tools` variable (renders the functions itself)."""
    if not template:
        return False
    try:
        return "tools" in meta.find_undeclared_variables(BoundedSandbox().parse(template))
    except jinja2.TemplateError:
        return False


def _raise(message: str) -> None:
    raise InvalidRequestError(f"the model's chat template refused the messages: {message}")


_THREAD = threading.local()  # each thread's compiled templates: a render's budget is its environment's
_KEPT_TEMPLATES = 8


def _compiled(template: str) -> tuple[BoundedSandbox, jinja2.Template]:
    """The template compiled once per thread (compiling a model's template took 25 ms, every
    request), in an environment of its own whose budget each render resets."""
    kept: dict[str, tuple[BoundedSandbox, jinja2.Template]] = _THREAD.__dict__.setdefault("templates", {})
    if template not in kept:
        env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        if len(kept) >= _KEPT_TEMPLATES:
            kept.clear()
        kept[template] = (env, env.from_string(template))
    return kept[template]


def render_chat(
    template: str | None,
    messages: Sequence[Message],
    special: Mapping[str, str],
    add_generation_prompt: bool = True,
    tools: Sequence[Mapping[str, Any]] | None = None,
    source: str | None = None,
) -> str:
    """tools: OpenAI's tool objects, given to the template as transformers gives them;
    source: the model file the template came from, named when it fails."""
    messages = normalize_messages(messages)
    try:
        env, compiled = _compiled(template or CHATML)
        env.steps, env.deadline = 0, time.monotonic() + MAX_TEMPLATE_SECONDS  # this render's budget
        context: dict[str, Any] = {"messages": list(messages), "add_generation_prompt": add_generation_prompt}
        if tools is not None:
            context["tools"] = list(tools)
        pieces: list[str] = []
        size = 0
        for piece in compiled.generate(**context, **special):
            size += len(piece)
            if size > MAX_RENDERED_CHARS:
                raise SecurityError(f"the rendered chat passed {MAX_RENDERED_CHARS} characters")
            pieces.append(piece)
        return "".join(pieces)
    except TemplateBudgetError as exc:
        raise InvalidRequestError(
            f"the chat template in {source or 'the model'} was stopped: {exc}",
            "the template stored in that GGUF is broken: use a fixed copy of the model, or `localspec run --raw` "
            "to continue plain text without it",
        ) from exc
    except jinja2.TemplateError as exc:
        raise InvalidRequestError(f"the chat template in {source or 'the model'} failed: {exc}") from exc
    except (MemoryError, OverflowError, RecursionError, ValueError, TypeError, ArithmeticError) as exc:
        what = f"{type(exc).__name__}: {exc}"
        raise InvalidRequestError(f"the chat template in {source or 'the model'} failed: {what}") from exc
