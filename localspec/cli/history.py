"""`localspec history`: the chats `localspec chat` saved, listed, shown, exported."""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING, Any

from localspec.core.errors import InvalidRequestError

if TYPE_CHECKING:  # the module itself is imported when the command runs: it brings in Textual
    from localspec.tui.history import Conversation, History


def register(sub: Any) -> None:
    p = sub.add_parser(
        "history",
        help="list, show or export the saved chats",
        description="The chats `localspec chat` saved: `history` lists them newest first, `history show ID` "
        "prints one, `history export [ID]` writes one (or all) as Markdown or JSON on stdout.",
    )
    p.add_argument("action", nargs="?", choices=["list", "show", "export"], default="list", help="default: list")
    p.add_argument("id", nargs="?", type=int, help="the chat's number, as `localspec history` lists it")
    p.add_argument("--format", choices=["markdown", "json"], default="markdown", help="for export (default markdown)")
    p.add_argument("--limit", type=int, default=50, help="how many chats to list (default 50)")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from localspec.tui.history import History, history_file

    if not history_file().exists():
        print("No saved chats yet: `localspec chat` saves every chat as you go.")
        return 0
    history = History()
    try:
        if args.action == "list":
            return _list(history, args.limit)
        if args.action == "show" and args.id is None:
            raise InvalidRequestError("which chat? give its number", "`localspec history` lists them")
        ids = [args.id] if args.id is not None else [c.id for c in reversed(history.conversations(limit=1_000_000))]
        chats = [history.get(i) for i in ids]
    finally:
        history.close()
    if args.action == "export" and args.format == "json":
        print(json.dumps([_as_json(c) for c in chats], indent=1, ensure_ascii=False))
    else:
        print("\n\n".join(_as_markdown(c) for c in chats))
    return 0


def _list(history: History, limit: int) -> int:
    listed = history.conversations(limit)
    if not listed:
        print("No saved chats yet: `localspec chat` saves every chat as you go.")
        return 0
    for c in listed:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(c.updated))
        print(f"{c.id:>4}  {when}  {c.n_messages:>3} messages  {c.model:<20}  {c.title}")
    print("\n`localspec history show ID` prints one; `localspec history export [ID] --format json` exports.")
    return 0


def _as_markdown(c: Conversation) -> str:
    lines = [f"# {c.title}", "", f"Model: {c.model}"]
    if c.system:
        lines += ["", f"System: {c.system}"]
    for m in c.messages:
        who = "You" if m.role == "user" else "Assistant"
        mark = " (stopped)" if m.is_stopped else " (not answered)" if m.is_unanswered else ""
        lines += ["", f"## {who}{mark}", "", m.content]
    return "\n".join(lines)


def _as_json(c: Conversation) -> dict[str, Any]:
    return {
        "id": c.id,
        "title": c.title,
        "model": c.model,
        "system": c.system,
        "messages": [
            {"role": m.role, "content": m.content, "stopped": m.is_stopped, "unanswered": m.is_unanswered}
            for m in c.messages
        ],
    }
