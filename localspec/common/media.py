"""Images in chat messages: OpenAI's `image_url` content parts (data: URLs), and
{"type": "image", "path": ...} or {"type": "image", "data": bytes} parts in Python, become a
marker in the rendered chat and the images' bytes beside it, for a target that sees images."""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from localspec.common.templates import _has_special, normalize_messages, render_chat
from localspec.core.errors import InvalidRequestError
from localspec.core.protocol import Backend

IMAGE_PARTS = ("image_url", "image")
INLINE_HINT = "send the image inline as a data URL (data:image/png;base64,...)"


@runtime_checkable
class SeesImages(Protocol):
    """A backend that reads images beside text (llama.cpp with a projector)."""

    def image_marker(self) -> str | None:
        """The text that stands for one image in tokenize_images' prompt; None: this load
        reads no images (no projector)."""
        ...

    def tokenize_images(self, text: str, images: Sequence[bytes], names: Sequence[str]) -> list[int]: ...


@dataclass
class Images:
    """The images a chat holds, in order, and how errors name each."""

    data: list[bytes] = field(default_factory=list)
    names: list[str] = field(default_factory=list)


def has_images(messages: Sequence[Mapping[str, Any]]) -> bool:
    return any(
        isinstance(m, Mapping)
        and isinstance(m.get("content"), list)
        and any(isinstance(p, Mapping) and p.get("type") in IMAGE_PARTS for p in m["content"])
        for m in messages
    )


def marker_of(target: Backend) -> str:
    """The target's image marker, or the refusal that says how to load one that reads images."""
    marker = target.image_marker() if isinstance(target, SeesImages) else None
    if marker is None:
        where = "" if isinstance(target, SeesImages) else f" on the {target.info.backend} backend"
        raise InvalidRequestError(
            f"{target.info.name} reads text only{where}: a chat message's content holds an image",
            "load the model with its projector: --mmproj FILE (the llama.cpp backend), or send text only",
        )
    return marker


def take_images(
    messages: Sequence[Mapping[str, Any]], marker: str, paths: bool = True
) -> tuple[list[dict[str, Any]], Images]:
    """The messages with each image part replaced by a text part holding marker, and the
    images' bytes; paths: whether {"type": "image", "path": ...} may read a local file (not
    for a server's requests)."""
    images = Images()
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, Mapping) else None
        if not isinstance(content, list):
            out.append(dict(m) if isinstance(m, Mapping) else m)
            continue
        parts: list[Any] = []
        for j, part in enumerate(content):
            if isinstance(part, Mapping) and part.get("type") in IMAGE_PARTS:
                data, name = image_part(part, f"message {i} part {j}", paths)
                images.data.append(data)
                images.names.append(name)
                parts.append({"type": "text", "text": marker})
            else:
                parts.append(part)
        out.append({**m, "content": parts})
    return out, images


def image_part(part: Mapping[str, Any], where: str, paths: bool) -> tuple[bytes, str]:
    """The bytes of one image part, and the name errors call it by."""
    if part.get("type") == "image_url":
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, Mapping) else url
        if not isinstance(url, str):
            raise InvalidRequestError(f"{where}: image_url needs a url", INLINE_HINT)
        return data_url(url, where), f"the image in {where}"
    if "data" in part and isinstance(part["data"], bytes | bytearray):
        named = part.get("path")  # a caller that read the file itself names it so
        name = os.fspath(named) if isinstance(named, str | os.PathLike) else f"the image in {where}"
        return bytes(part["data"]), name
    path = part.get("path")
    if not isinstance(path, str | os.PathLike) or not paths:
        hint = 'give {"type": "image", "path": "photo.png"} or "data": bytes' if paths else INLINE_HINT
        raise InvalidRequestError(f"{where}: an image part needs a path or data", hint)
    try:
        with open(path, "rb") as file:
            return file.read(), os.fspath(path)
    except OSError as exc:
        raise InvalidRequestError(
            f"cannot read the image {os.fspath(path)}: {exc.strerror}", "check its path"
        ) from None


def data_url(url: str, where: str) -> bytes:
    """The bytes of a base64 data: URL; a remote URL is refused, saying why."""
    if url.startswith(("http://", "https://")):
        raise InvalidRequestError(
            f"{where}: localspec does not fetch images from URLs (a request could make it reach any "
            "address this machine can, on your network too)",
            INLINE_HINT,
        )
    head, comma, payload = url.partition(",")
    if not url.startswith("data:") or not comma or not head.endswith(";base64"):
        raise InvalidRequestError(f"{where}: the image URL is not a base64 data URL", INLINE_HINT)
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequestError(f"{where}: the data URL's base64 is malformed", INLINE_HINT) from None


def image_chat_tokens(target: Backend, messages: Sequence[Mapping[str, Any]], paths: bool = True) -> list[int]:
    """A chat holding images as the target's token ids, each image's positions as the
    placeholder ids its backend gives them."""
    marker = marker_of(target)
    given, images = take_images(messages, marker, paths)
    chat = normalize_messages(given)
    pieces = [c.replace(marker, "") for c in (m["content"] for m in chat)]
    if any(p and _has_special(target, p) for p in pieces):
        raise InvalidRequestError(
            "a chat message holding an image contains the model's control tokens",
            "remove text such as <|im_end|> or <|im_start|> from the message",
        )
    text = render_chat(target.chat_template(), chat, target.special_texts(), source=target.info.path)
    assert isinstance(target, SeesImages)
    tokens = target.tokenize_images(text, images.data, images.names)
    if not tokens or tokens[-1] < 0:
        raise InvalidRequestError("the prompt ends with an image", "put some text after the image")
    return tokens
