"""Saved conversations: a damaged or foreign history file never crashes the chat nor costs the
other conversations."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from localspec.tui.history import SCHEMA_VERSION, History, StoredMessage, history_file


def test_history_lives_in_the_user_directory(temporary_localspec_home: Path) -> None:
    assert history_file() == temporary_localspec_home / "history.sqlite3"


def test_a_conversation_round_trips_with_stats_and_drafted_spans() -> None:
    history = History()
    cid = history.create("Rivers", "SmolLM2", "be brief")
    history.append(cid, StoredMessage("user", "Name a river"))
    history.append(cid, StoredMessage("assistant", "The Nile.", {"figures": {"tokens": 4}}, ((0, 3), (4, 8))))
    history.close()
    conversation = History().get(cid)
    assert (conversation.title, conversation.model, conversation.system) == ("Rivers", "SmolLM2", "be brief")
    assert conversation.messages == (
        StoredMessage("user", "Name a river"),
        StoredMessage("assistant", "The Nile.", {"figures": {"tokens": 4}}, ((0, 3), (4, 8))),
    )


def test_conversations_are_listed_newest_first_and_can_be_deleted() -> None:
    history = History()
    first, second = history.create("first", "m"), history.create("second", "m")
    history.append(first, StoredMessage("user", "touch"))  # now the newest
    assert [c.title for c in history.conversations()] == ["first", "second"]
    history.delete(first)
    assert [c.id for c in history.conversations()] == [second]


def test_drop_last_removes_only_a_message_of_the_given_role() -> None:
    history = History()
    cid = history.create("c", "m")
    history.append(cid, StoredMessage("user", "q"))
    assert not history.drop_last(cid, "assistant")
    assert history.drop_last(cid, "user")
    assert history.get(cid).messages == ()


def test_a_file_that_is_not_a_database_is_set_aside_and_a_new_history_started() -> None:
    path = history_file()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x00garbage" * 512)
    history = History()
    assert history.persistent and history.notice is not None and "corrupt-" in history.notice
    [aside] = path.parent.glob("history.sqlite3.corrupt-*")
    assert aside.read_bytes() == b"\x00garbage" * 512  # kept, never overwritten
    cid = history.create("fresh", "m")
    assert History().get(cid).title == "fresh"


def test_a_truncated_history_is_set_aside() -> None:
    history = History()
    # Few writes (each is a durable transaction) of long messages: a file as large as many.
    for i in range(20):
        history.append(history.create(f"chat {i}", "m"), StoredMessage("user", "x" * 5000))
    history.close()
    path = history_file()
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 3])
    reopened = History()
    assert reopened.notice is not None and reopened.conversations() == []


def test_a_sqlite_file_of_another_program_is_set_aside() -> None:
    path = history_file()
    path.parent.mkdir(parents=True)
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE other (x)")
    history = History()
    assert history.notice is not None and "not a localspec history" in history.notice


def test_a_history_from_a_newer_localspec_is_left_alone_and_not_written() -> None:
    path = history_file()
    history = History()
    history.create("kept", "m")
    history.close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    before = path.read_bytes()
    newer = History()
    assert not newer.persistent and newer.notice is not None and "newer localspec" in newer.notice
    newer.create("not saved", "m")
    newer.close()
    assert path.read_bytes() == before


def test_a_damaged_stats_field_costs_only_that_field() -> None:
    history = History()
    cid = history.create("c", "m")
    history.append(cid, StoredMessage("assistant", "kept", {"a": 1}, ((0, 2),)))
    history.close()
    with sqlite3.connect(history_file()) as db:
        db.execute("UPDATE messages SET stats = '{broken', drafted_spans = '[[1'")
    assert History().get(cid).messages == (StoredMessage("assistant", "kept"),)


def test_an_unwritable_history_folder_keeps_history_in_memory(tmp_path: Path, monkeypatch) -> None:
    blocker = tmp_path / "file-not-folder"
    blocker.write_text("")
    history = History(blocker / "history.sqlite3")
    assert not history.persistent and history.notice is not None
    cid = history.create("in memory", "m")
    assert history.get(cid).title == "in memory"


def test_the_history_command_lists_shows_and_exports_saved_chats(capsys) -> None:
    from localspec.cli.main import main

    assert main(["history"]) == 0
    assert "No saved chats yet" in capsys.readouterr().out
    history = History()
    cid = history.create("Sky colour", "smollm2-135m")
    history.append(cid, StoredMessage("user", "Why is the sky blue?"))
    history.append(cid, StoredMessage.stopped("Because of Rayleigh"))
    history.close()
    assert main(["history"]) == 0
    listed = capsys.readouterr().out
    assert f"{cid:>4}" in listed and "2 messages" in listed and "Sky colour" in listed and "smollm2-135m" in listed
    assert main(["history", "show", str(cid)]) == 0
    shown = capsys.readouterr().out
    assert shown.splitlines()[:3] == ["# Sky colour", "", "Model: smollm2-135m"]
    assert "## You\n\nWhy is the sky blue?" in shown and "## Assistant (stopped)\n\nBecause of Rayleigh" in shown
    assert main(["history", "export", "--format", "json"]) == 0
    [chat] = json.loads(capsys.readouterr().out)
    assert chat["messages"][1] == {
        "role": "assistant",
        "content": "Because of Rayleigh",
        "stopped": True,
        "unanswered": False,
    }
    assert main(["history", "show", "999"]) == 2
    assert "no saved chat 999" in capsys.readouterr().err
