"""Images attached to a chat message: `/image PATH` in the prompt reads the file now (a wrong
path is said at once, not after the model has started), and the next message carries it as an
image part; the saved chat keeps the paths, read again when the chat is reopened."""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from localspec.common.media import image_part
from localspec.core.errors import InvalidRequestError

COMMAND = "/image"
USAGE = "/image PATH attaches an image to your next message; /image alone removes what is attached"


@dataclass(frozen=True)
class Attachment:
    """One image file, its bytes read when it was attached."""

    path: str
    data: bytes

    @property
    def name(self) -> str:
        return os.path.basename(self.path) or self.path

    def part(self) -> dict[str, Any]:
        return {"type": "image", "data": self.data, "path": self.path}


def attach_command(text: str) -> list[str] | None:
    """The paths `/image PATH...` names ([] for `/image` alone); None: not the command, a message."""
    stripped = text.strip()
    head, _, rest = stripped.partition(" ")
    if head != COMMAND:
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
    data, _ = image_part({"type": "image", "path": path}, "the attachment", paths=True)
    return Attachment(os.path.abspath(path), data)


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
    return [
        Attachment(str(p["path"]), p["data"]) for p in content if isinstance(p, Mapping) and p.get("type") == "image"
    ]


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
