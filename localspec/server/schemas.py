"""The OpenAI request bodies localspec serves, validated at the edge, and the error object it
answers a bad one with; the response objects live in responses.py."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from localspec.core.errors import InvalidRequestError
from localspec.core.sampling import (
    KNOBS,
    MAX_TOP_LOGPROBS,
    SamplingConfig,
    check_knob,
    check_penalty,
    check_repeat,
)

# Fields clients send that do not change the text, accepted and not used, as llama-server and
# Ollama ignore them: the one list of them. reasoning_effort is here because the models served
# here either do not reason or do it whatever it says; `prediction` only says what to expect.
HARMLESS_FIELDS = frozenset(
    {
        "user",
        "metadata",
        "store",
        "service_tier",
        "parallel_tool_calls",
        "safety_identifier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "reasoning_effort",
        "verbosity",
        "prediction",
        "modalities",
    }
)

# llama-server's and Ollama's fields with no equivalent here (other samplers, slots, timings):
# an app written for them sends them, so they are ignored and named in a warning header
# rather than refused. Any other unknown field is still a 400 (a misspelt one is caught).
PEER_FIELDS = frozenset(
    {
        "mirostat",
        "mirostat_tau",
        "mirostat_eta",
        "typical_p",
        "tfs_z",
        "dynatemp_range",
        "dynatemp_exponent",
        "xtc_probability",
        "xtc_threshold",
        "dry_multiplier",
        "dry_base",
        "dry_allowed_length",
        "dry_penalty_last_n",
        "dry_sequence_breakers",
        "top_n_sigma",
        "samplers",
        "min_keep",
        "penalize_nl",
        "penalty_last_n",
        "ignore_eos",
        "n_keep",
        "n_probs",
        "n_indent",
        "id_slot",
        "slot_id",
        "t_max_predict_ms",
        "t_max_prompt_ms",
        "return_tokens",
        "timings_per_token",
        "post_sampling_probs",
        "chat_template_kwargs",
        "keep_alive",
        "options",
    }
)
# llama-server's per-request speculation fields, read by localspec.server.speculation.
# "speculative" itself: the same fields as one object ({"n_max": 8}), or true/false.
LLAMA_SPECULATIVE = frozenset(
    {
        "speculative",
        "speculative.n_max",
        "speculative.n_min",
        "speculative.p_min",
        "speculative.types",
        "speculative.type",
    }
)
# llama-server's names for fields that have an equivalent here: the equivalent's name.
PEER_NAMES = {"n_predict": "max_tokens", "json_schema": "response_format"}
# n: choices are generated one after another, so n multiplies a request's time; 4 is
# llama-server's cap too (its --parallel default), and more is what a runaway client sends.
MAX_CHOICES = 4
WARNING_HEADER = "X-Localspec-Warning"


class ApiError(Exception):
    """An OpenAI error object with its HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False
    include_obfuscation: bool | None = None  # padding against length side channels: not needed locally


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[TextPart] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class GenerationRequest(BaseModel):
    """What chat and text completions share. Unknown fields are kept so that they can be
    refused by name: a field that would change the output is never silently ignored."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=0)
    max_completion_tokens: int | None = Field(default=None, ge=0)
    # Their ranges are SamplingConfig's; le=2 is OpenAI's own limit, refused as OpenAI does.
    temperature: float | None = Field(default=None, le=2)
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: float | None = 0
    presence_penalty: float | None = 0
    logit_bias: dict[str, float] | None = None  # token id (as text) -> bias in [-100, 100]
    # llama-server's names for llama.cpp's repeat penalty (1: off; the last 64 tokens by default).
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    # Chat: logprobs true and top_logprobs N; completions: logprobs N (see logprob_top).
    logprobs: bool | int | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    # Choices, generated one after another (each with the next seed where a seed is given).
    n: int | None = Field(default=1, ge=1, le=MAX_CHOICES)
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: dict[str, Any] | None = None  # text, json_object or json_schema (server/grammar.py)
    # llama-server's name: true reuses any cached prompt prefix, which is faster but may tip a
    # near-tie another way than a fresh evaluation; None takes the server's --cache-prompt.
    cache_prompt: bool | None = None
    # This request's drafting: {"strategy": "none" | "auto" | ..., "draft_tokens": N, "max_draft": N}
    # (localspec.server.speculation reads it with llama-server's speculative.* fields).
    speculation: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _peer_names(cls, data: Any) -> Any:
        """llama-server's n_predict (-1: no limit) and json_schema, read as max_tokens and
        response_format where those are not given."""
        if not isinstance(data, dict) or not any(name in data for name in PEER_NAMES):
            return data
        data = dict(data)
        if "n_predict" in data:
            n_predict = data.pop("n_predict")
            if "max_tokens" not in data and "max_completion_tokens" not in data:
                if isinstance(n_predict, int) and not isinstance(n_predict, bool) and n_predict < 0:
                    n_predict = None  # llama-server's -1: until a stop or the context is full
                data["max_tokens"] = n_predict
        if "json_schema" in data:
            schema = data.pop("json_schema")
            if "response_format" not in data and schema is not None:
                data["response_format"] = {"type": "json_schema", "json_schema": {"schema": schema}}
        return data

    @property
    def choices(self) -> int:
        return self.n or 1

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @field_validator("temperature", "top_p", "top_k", "min_p")
    @classmethod
    def _in_range(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is None:
            return None
        try:
            checked: float = check_knob(str(info.field_name), value)
        except InvalidRequestError as exc:
            reason = exc.message if exc.hint is None else f"{exc.message}: {exc.hint}"
            raise PydanticCustomError("invalid_value", "{reason}", {"reason": reason}) from None
        return checked

    @field_validator("frequency_penalty", "presence_penalty")
    @classmethod
    def _penalty_in_range(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is None:
            return None
        try:
            return check_penalty(str(info.field_name), value)
        except InvalidRequestError as exc:
            raise PydanticCustomError("invalid_value", "{reason}", {"reason": exc.message}) from None

    @field_validator("repeat_penalty", "repeat_last_n")
    @classmethod
    def _repeat_in_range(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is None:
            return None
        try:
            checked: float = check_repeat(str(info.field_name), value)
        except InvalidRequestError as exc:
            raise PydanticCustomError("invalid_value", "{reason}", {"reason": exc.message}) from None
        return checked

    def sampling(self) -> SamplingConfig:
        """The sampler settings; a field left out takes SamplingConfig's default, as in `localspec
        run` (a small model wants min-p and top-k trimming to stay coherent)."""
        given = {name: getattr(self, name) for name in KNOBS}
        given["frequency_penalty"] = self.frequency_penalty
        given["presence_penalty"] = self.presence_penalty
        given["repeat_penalty"] = self.repeat_penalty
        given["repeat_last_n"] = self.repeat_last_n
        try:
            given["logit_bias"] = tuple((int(token), bias) for token, bias in (self.logit_bias or {}).items())
            return SamplingConfig(**{name: value for name, value in given.items() if value is not None})
        except ValueError:
            raise ApiError(400, "logit_bias keys must be token ids", param="logit_bias") from None
        except InvalidRequestError as exc:
            raise ApiError(400, exc.message, param="logit_bias") from None

    def logprob_top(self) -> int | None:
        """How many alternatives each token's logprobs list (None: no logprobs): chat's way,
        `logprobs: true` with `top_logprobs: N`."""
        return (self.top_logprobs or 0) if self.logprobs is True else None

    def refuse_unsupported(self) -> list[str]:
        """400 naming the first field that asks for something localspec does not do; the
        llama-server fields it ignores, for the warning header."""
        changes_output = {
            "functions": bool(self.functions),
            "function_call": self.function_call not in (None, "none", "auto"),
        }
        for name, refused in changes_output.items():
            if refused:
                raise ApiError(400, f"'{name}' is not supported by localspec serve", param=name, code="unsupported")
        ignored = []
        for name in self.model_extra or {}:
            if name in PEER_FIELDS:
                ignored.append(name)
            elif name not in HARMLESS_FIELDS and name not in LLAMA_SPECULATIVE:
                raise ApiError(400, f"unknown or unsupported field '{name}'", param=name, code="unsupported")
        return ignored


class ChatRequest(GenerationRequest):
    messages: list[ChatMessage]

    def chat(self) -> list[dict[str, Any]]:
        """The messages as role/content strings, as chat templates take them; an assistant's
        tool calls and a tool result's call id go along for templates that render them."""
        if not self.messages:
            raise ApiError(400, "'messages' is empty: give at least one message", param="messages")
        out: list[dict[str, Any]] = []
        for i, message in enumerate(self.messages):
            if message.role not in ("system", "developer", "user", "assistant", "tool"):
                raise ApiError(400, f"message role {message.role!r} is not supported", param=f"messages[{i}].role")
            role = "system" if message.role == "developer" else message.role
            entry: dict[str, Any] = {"role": role, "content": _content_of(message, i)}
            if message.tool_calls:
                entry["tool_calls"] = message.tool_calls
            if message.tool_call_id is not None:
                entry["tool_call_id"] = message.tool_call_id
            out.append(entry)
        return out


class CompletionRequest(GenerationRequest):
    prompt: str | list[str] | list[int]  # a text, a list holding one text, or token ids
    suffix: str | None = None
    echo: bool = False
    best_of: int | None = None

    def source(self) -> dict[str, Any]:
        """Runtime.stream's prompt (text or token ids), or a fill-in-the-middle request."""
        prompt: str | list[int]
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str):
            if len(self.prompt) != 1:
                raise ApiError(400, "give one prompt: several prompts in one request are not supported", param="prompt")
            prompt = str(self.prompt[0])
        else:
            prompt = self.prompt  # type: ignore[assignment]
        if self.suffix is None:
            return {"prompt": prompt}
        if not isinstance(prompt, str):
            raise ApiError(400, "'suffix' needs the prompt as text, not token ids", param="suffix")
        return {"fim": (prompt, self.suffix)}

    def logprob_top(self) -> int | None:
        """Completions' way: `logprobs: N` asks for N alternatives per token (0: none)."""
        if self.logprobs is None or self.logprobs is False:
            return None
        if self.logprobs is True or not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ApiError(400, f"'logprobs' must be a whole number 0 to {MAX_TOP_LOGPROBS}", param="logprobs")
        return int(self.logprobs)

    def refuse_unsupported(self) -> list[str]:
        if self.echo:
            raise ApiError(400, "'echo' is not supported by localspec serve", param="echo", code="unsupported")
        if self.best_of not in (None, 1):
            raise ApiError(400, "'best_of' is not supported by localspec serve", param="best_of", code="unsupported")
        if self.tools or self.tool_choice not in (None, "none", "auto"):
            raise ApiError(400, "tools are for /v1/chat/completions", param="tools", code="unsupported")
        return super().refuse_unsupported()


WIRE_MEDIA_PARTS = ("image_url", "input_audio")  # the media parts a request may send (no local paths)


def _content_of(message: ChatMessage, i: int) -> str | list[dict[str, Any]]:
    """The message's text, or its parts where it holds images or audio (image_url parts: an
    http(s) URL is refused or fetched by server/image_urls.py; input_audio parts: base64
    inline, as OpenAI sends them)."""
    if not isinstance(message.content, list) or all(part.type not in WIRE_MEDIA_PARTS for part in message.content):
        return _text_of(message, i)
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(message.content):
        if part.type == "text" and part.text is not None:
            parts.append({"type": "text", "text": part.text})
            continue
        extra = part.model_extra or {}
        if part.type == "input_audio" and isinstance(extra.get("input_audio"), dict):
            audio = extra["input_audio"]
            parts.append(
                {"type": "input_audio", "input_audio": {"data": audio.get("data"), "format": audio.get("format")}}
            )
            continue
        url = extra.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        if part.type != "image_url" or not isinstance(url, str):
            raise ApiError(
                400, "a content part must be text, image_url or input_audio", param=f"messages[{i}].content[{j}]"
            )
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts


def _text_of(message: ChatMessage, i: int) -> str:
    if message.content is None:
        if message.role == "assistant" and message.tool_calls:
            return ""  # an assistant turn that only called tools: OpenAI's own shape
        raise ApiError(400, f"message {i} has no content", param=f"messages[{i}].content")
    if isinstance(message.content, str):
        return message.content
    texts = []
    for j, part in enumerate(message.content):
        if part.type != "text" or part.text is None:
            raise ApiError(
                400,
                f"content part of type {part.type!r} is not supported: only text, image_url and input_audio",
                param=f"messages[{i}].content[{j}]",
            )
        texts.append(part.text)
    return "".join(texts)
