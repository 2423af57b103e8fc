"""Images and audio clips attached to a chat message: `/image PATH` (or `/audio PATH`) in the
prompt reads the file now (a wrong path is said at once, not after the model has started), and
the next message carries it as an image part, or an input_audio part where its bytes are a
clip; the saved chat keeps the paths, read again when the chat is reopened."""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from localspec.common.media import file_part
from localspec.core.errors import InvalidRequestError

COMMANDS = ("/image", "/audio")  # either attaches a file; its bytes say which it is
USAGE = (
    "/image PATH attaches an image to your next message, /audio PATH a WAV or MP3 clip; "
    "/image alone removes what is attached"
)
AUDIO_SUFFIXES = (".wav", ".mp3", ".flac")


@dataclass(frozen=True)
class Attachment:
    """One image or audio file, its bytes read when it was attached; audio: the clip's format
    (None: an image)."""

    path: str
    data: bytes
    audio: str | None = None

    @property
    def name(self) -> str:
        return os.path.basename(self.path) or self.path

    @property
    def label(self) -> str:
        """How the transcript shows it (a terminal draws no pictures and plays no sound)."""
        return f"{'audio' if self.audio else 'image'}: {self.name}"

    def part(self) -> dict[str, Any]:
        if self.audio is not None:
            return {"type": "input_audio", "input_audio": {"data": self.data, "format": self.audio}, "path": self.path}
        return {"type": "image", "data": self.data, "path": self.path}


def label_of(path: str) -> str:
    """A saved attachment's label, from its file name (its bytes are read only when reopened)."""
    kind = "audio" if path.lower().endswith(AUDIO_SUFFIXES) else "image"
    return f"{kind}: {os.path.basename(path) or path}"


def attach_command(text: str) -> list[str] | None:
    """The paths `/image PATH...` (or `/audio`) names ([] for the command alone); None: not the
    command, a message."""
    stripped = text.strip()
    head, _, rest = stripped.partition(" ")
    if head not in COMMANDS:
        return None
    try:
        words = shlex.split(rest)  # a path with spaces is given in quotes, as in a shell
    except ValueError as exc:
        raise InvalidRequestError(f"cannot read the command's path: {exc}", USAGE) from None
    return [os.path.expanduser(word) for word in words]


def read_attachment(path: str) -> Attachment:
    """The file's bytes, or the refusal that names it and says to check its path."""
    if os.path.isdir(path):
        raise InvalidRequestError(f"{path} is a folder, not an image", "give the path of an image file")
    what = "clip" if path.lower().endswith(AUDIO_SUFFIXES) else "image"
    part = file_part(path, what, "check its path")
    clip = part.get("input_audio")
    if clip is not None:
        return Attachment(os.path.abspath(path), clip["data"], clip["format"])
    return Attachment(os.path.abspath(path), part["data"])


def user_message(text: str, images: Sequence[Attachment]) -> dict[str, Any]:
    """The chat message a user's text and attached images make: OpenAI-style parts, the images first."""
    if not images:
        return {"role": "user", "content": text}
    return {"role": "user", "content": [*(a.part() for a in images), {"type": "text", "text": text}]}


def text_of(message: Mapping[str, Any]) -> str:
    """A message's text, its image parts left out."""
    content = message.get("content", "")
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content if isinstance(p, Mapping) and p.get("type") == "text")


def attachments_of(message: Mapping[str, Any]) -> list[Attachment]:
    content = message.get("content")
    if not isinstance(content, list):
        return []
    found: list[Attachment] = []
    for part in content:
        if isinstance(part, Mapping) and part.get("type") == "image":
            found.append(Attachment(str(part["path"]), part["data"]))
        elif isinstance(part, Mapping) and part.get("type") == "input_audio" and "path" in part:
            clip = part["input_audio"]
            found.append(Attachment(str(part["path"]), clip["data"], clip["format"]))
    return found


def stored_paths(stats: Mapping[str, Any] | None) -> list[str]:
    paths = (stats or {}).get("images", [])
    return [str(p) for p in paths] if isinstance(paths, list) else []


def reread(paths: Sequence[str]) -> tuple[list[Attachment], list[str]]:
    """A saved message's images read again from their paths, and the paths no longer readable."""
    found: list[Attachment] = []
    missing: list[str] = []
    for path in paths:
        try:
            found.append(read_attachment(path))
        except InvalidRequestError:
            missing.append(path)
    return found, missing
