"""Images and audio in chat messages: OpenAI's `image_url` content parts (data: URLs) and
`input_audio` parts ({"data": base64, "format": "wav"}), and {"type": "image", "path": ...} or
{"type": "image", "data": bytes} parts in Python, become a marker in the rendered chat and the
media's bytes beside it, for a target whose projector reads them (llama.cpp's mtmd tells an
audio clip from an image by its bytes). The bytes are checked here before any decoder sees
them: a known image or audio format, and a size a decoder can hold."""

from __future__ import annotations

import base64
import binascii
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from localspec.common.templates import _has_special, normalize_messages, render_chat
from localspec.core.errors import InvalidRequestError
from localspec.core.protocol import Backend

IMAGE_PARTS = ("image_url", "image")
MEDIA_PARTS = (*IMAGE_PARTS, "input_audio")
INLINE_HINT = "send the image inline as a data URL (data:image/png;base64,...)"
AUDIO_FORMATS = "WAV or MP3"
AUDIO_HINT = 'send {"type": "input_audio", "input_audio": {"data": "<base64 of the file>", "format": "wav"}}'


def audio_format(data: bytes) -> str | None:
    """ "wav", "mp3" or "flac" from a file's first bytes, as llama.cpp's mtmd tells audio from
    images (mtmd-helper.cpp, is_audio_file); None: not audio."""
    if len(data) < 12:
        return None
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "wav"
    if data[:3] == b"ID3" or (data[0] == 0xFF and data[1] & 0xE0 == 0xE0):
        return "mp3"
    return "flac" if data[:4] == b"fLaC" else None


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


def media_types(messages: Sequence[Mapping[str, Any]]) -> set[str]:
    """The media part types the messages hold ("image_url", "image", "input_audio")."""
    return {
        p["type"]
        for m in messages
        if isinstance(m, Mapping) and isinstance(m.get("content"), list)
        for p in m["content"]
        if isinstance(p, Mapping) and p.get("type") in MEDIA_PARTS
    }


def has_images(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the messages hold an image or audio part (both are read through the projector)."""
    return bool(media_types(messages))


def marker_of(target: Backend, what: str = "an image") -> str:
    """The target's media marker, or the refusal that says how to load one that reads what
    the chat holds."""
    marker = target.image_marker() if isinstance(target, SeesImages) else None
    if marker is None:
        where = "" if isinstance(target, SeesImages) else f" on the {target.info.backend} backend"
        raise InvalidRequestError(
            f"{target.info.name} reads text only{where}: a chat message's content holds {what}",
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
            if isinstance(part, Mapping) and part.get("type") in MEDIA_PARTS:
                where = f"message {i} part {j}"
                data, name = (
                    audio_part(part, where) if part["type"] == "input_audio" else image_part(part, where, paths)
                )
                images.data.append(data)
                images.names.append(name)
                parts.append({"type": "text", "text": marker})
            else:
                parts.append(part)
        out.append({**m, "content": parts})
    return out, images


def image_part(part: Mapping[str, Any], where: str, paths: bool) -> tuple[bytes, str]:
    """The bytes of one image part, and the name errors call it by; audio is refused here, so
    that a clip goes in an input_audio part, as OpenAI's API sends it."""
    data, name = _image_bytes(part, where, paths)
    if audio_format(data) is not None:
        raise InvalidRequestError(f"{name} holds audio, not an image", AUDIO_HINT)
    return data, name


def audio_part(part: Mapping[str, Any], where: str) -> tuple[bytes, str]:
    """The bytes of one input_audio part (base64 text, or bytes from Python), checked to be a
    clip mtmd decodes, and the name errors call it by."""
    given = part.get("input_audio")
    data = given.get("data") if isinstance(given, Mapping) else None
    if isinstance(data, str):
        try:
            data = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRequestError(f"{where}: input_audio's base64 is malformed", AUDIO_HINT) from None
    if not isinstance(data, bytes | bytearray):
        raise InvalidRequestError(f"{where}: an input_audio part needs input_audio.data", AUDIO_HINT)
    fmt = given.get("format") if isinstance(given, Mapping) else None
    if fmt is not None and fmt not in ("wav", "mp3", "flac"):
        raise InvalidRequestError(f"{where}: input_audio's format {fmt!r} is not read", f"send {AUDIO_FORMATS}")
    name = f"the audio in {where}"
    if audio_format(bytes(data)) is None:
        raise InvalidRequestError(f"{name} is not audio localspec reads", f"send a {AUDIO_FORMATS} file")
    return bytes(data), name


def _image_bytes(part: Mapping[str, Any], where: str, paths: bool) -> tuple[bytes, str]:
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


def file_part(path: str, what: str, fix: str) -> dict[str, Any]:
    """A file's content part, read now (a wrong path is said before any model loads): an
    input_audio part where its bytes are a clip (size checked), else an image part; both name
    the path. what: the file as the user gave it ("image", "clip"); fix: how to correct an
    unreadable path (the option or command that named it)."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as exc:
        raise InvalidRequestError(f"cannot read the {what} {path}: {exc.strerror}", fix) from None
    fmt = audio_format(data)
    if fmt is None:
        return {"type": "image", "data": data, "path": path}
    check_audio(data, path)
    return {"type": "input_audio", "input_audio": {"data": data, "format": fmt}, "path": path}


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
    kinds = media_types(messages)
    what = "audio" if kinds == {"input_audio"} else "an image and audio" if "input_audio" in kinds else "an image"
    marker = marker_of(target, what)
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


# Refused before decoding: an image file past this size, or past this many pixels, would
# take the decoder's memory (stb_image holds every pixel) for a picture the projector
# shrinks to a few hundred positions anyway.
MAX_IMAGE_BYTES = 32 * 1024 * 1024
MAX_IMAGE_PIXELS = 64 * 1024 * 1024
FORMATS = "PNG, JPEG, GIF or BMP"
# An audio clip past this size is refused before decoding: 32 MiB is over 15 minutes of 16-bit
# WAV at 16 kHz, 22 500 positions in the context at a Whisper-style projector's 25 a second.
MAX_AUDIO_BYTES = 32 * 1024 * 1024


# -- the bytes of one image, checked before any decoder sees them --------------------------------


def image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from a PNG, GIF, BMP or JPEG header; None: not one of those."""
    if data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) >= 24:
        return struct.unpack(">II", data[16:24])
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return struct.unpack("<HH", data[6:10])
    if data.startswith(b"BM") and len(data) >= 26:
        w, h = struct.unpack("<ii", data[18:26])
        return abs(w), abs(h)
    if data.startswith(b"\xff\xd8"):
        return _jpeg_size(data)
    return None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    """The frame header's size, walking the markers before it (none found: None)."""
    at = 2
    while at + 9 <= len(data) and data[at] == 0xFF:
        marker, length = data[at + 1], int.from_bytes(data[at + 2 : at + 4], "big")
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            h, w = struct.unpack(">HH", data[at + 5 : at + 9])
            return w, h
        at += 2 + length
    return (0, 0) if data.startswith(b"\xff\xd8\xff") else None


def check_image(data: bytes, name: str) -> None:
    """Refuse, naming the fix, what is not a still image the decoder takes or is too large."""
    if len(data) > MAX_IMAGE_BYTES:
        raise InvalidRequestError(
            f"{name} is {len(data) / 2**20:.0f} MiB, past the {MAX_IMAGE_BYTES // 2**20} MiB an image may take",
            "send a smaller image (the model sees it at its projector's size anyway)",
        )
    size = image_size(data)
    if size is None:
        raise InvalidRequestError(f"{name} is not an image localspec reads", f"send a {FORMATS} file")
    if size[0] * size[1] > MAX_IMAGE_PIXELS:
        raise InvalidRequestError(
            f"{name} is {size[0]}x{size[1]} pixels, past the {MAX_IMAGE_PIXELS // 2**20} megapixels an image may take",
            "scale the image down first",
        )


def check_audio(data: bytes, name: str) -> None:
    """Refuse an audio clip too large to decode (its format was recognised by audio_format)."""
    if len(data) > MAX_AUDIO_BYTES:
        raise InvalidRequestError(
            f"{name} is {len(data) / 2**20:.0f} MiB, past the {MAX_AUDIO_BYTES // 2**20} MiB a clip may take",
            "send a shorter clip, or one compressed as MP3",
        )
