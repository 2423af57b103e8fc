"""The benchmark prompt suite: one prompt per kind of work people do with a local model.
Speculation gains differ hugely between them, so every figure is reported per prompt."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from localspec.core.errors import InvalidRequestError

CODE = """def load_users(path):
    users = []
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, email, age = line.split(",")
            users.append({"name": name, "email": email, "age": int(age)})
    return users


def adults(users):
    result = []
    for user in users:
        if user["age"] >= 18:
            result.append(user)
    return result
"""

PASSAGE = (
    "The Rhine is one of the major European rivers. It begins in the Swiss Alps, flows along the "
    "Swiss-Austrian and Swiss-German borders, then through the Rhineland and finally empties into the "
    "North Sea in the Netherlands. It is about 1,230 kilometres long. The Rhine has been a vital "
    "navigable waterway since Roman times, carrying goods deep inland, and it formed part of the "
    "northern frontier of the Roman Empire. Castles and fortifications along its banks recall its role "
    "as a trade route and a border. Today it is one of the most heavily used waterways in the world."
)


@dataclass(frozen=True)
class BenchPrompt:
    id: str
    messages: tuple[dict[str, str], ...]


SUITE: tuple[BenchPrompt, ...] = (
    BenchPrompt(
        "code_edit",
        (
            {
                "role": "user",
                "content": "Add type hints to this Python code:\n\n```python\n" + CODE + "```",
            },
        ),
    ),
    BenchPrompt(
        "summarize",
        (
            {
                "role": "user",
                "content": "Summarize this passage in three sentences, quoting its key facts.\n\n" + PASSAGE,
            },
        ),
    ),
    BenchPrompt("chat", ({"role": "user", "content": "Explain why the sky is blue."},)),
    BenchPrompt(
        "math",
        (
            {
                "role": "user",
                "content": "A train travels 180 km in 2 hours and then 120 km in "
                "1.5 hours. What is its average speed? Show your steps.",
            },
        ),
    ),
    BenchPrompt(
        "structured",
        (
            {
                "role": "user",
                "content": "Return a JSON array of three objects with the keys "
                '"name", "capital" and "population" for France, Germany and Italy.',
            },
        ),
    ),
)


def load_prompts(path: str | Path) -> list[BenchPrompt]:
    """A JSONL file: one object per line with an id and either prompt or chat messages."""
    out: list[BenchPrompt] = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise InvalidRequestError(f"cannot read prompts file {path}: {exc.strerror}") from exc
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise InvalidRequestError(f"{path}:{n} is not JSON: {exc}") from exc
        if not isinstance(obj, dict) or "id" not in obj or ("prompt" in obj) == ("messages" in obj):
            raise InvalidRequestError(
                f"{path}:{n} needs an 'id' and exactly one of 'prompt' or 'messages'",
                'e.g. {"id": "q1", "prompt": "Explain recursion."}',
            )
        messages = obj.get("messages") or [{"role": "user", "content": str(obj["prompt"])}]
        out.append(BenchPrompt(str(obj["id"]), tuple(messages)))
    if not out:
        raise InvalidRequestError(f"{path} holds no prompts")
    return out


def load_prompt_sets(sources: Sequence[str]) -> list[BenchPrompt]:
    """Prompts from several places in order: "suite" is the built-in suite, anything else a
    JSONL file as load_prompts reads."""
    out: list[BenchPrompt] = []
    for source in sources:
        out += SUITE if source == "suite" else load_prompts(source)
    return out
