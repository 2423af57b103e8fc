"""Saved chat conversations: one SQLite file in the user directory, its schema versioned.

A file that cannot serve as the history is never written over. A corrupt or unreadable one
is renamed aside (history.sqlite3.corrupt-<timestamp>) and a fresh history started; one
from a newer localspec, or locked by another process, is left alone and this session keeps
its history in memory. Either way `notice` says what happened, for the app to show.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localspec.core.errors import LocalspecError
from localspec.store import StoreError, data_dir, disk_full_message, private_dir

SCHEMA_VERSION = 1
FILENAME = "history.sqlite3"

_SCHEMA = """
CREATE TABLE schema_version (version INTEGER NOT NULL);
CREATE TABLE conversations (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    model TEXT NOT NULL,
    system TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE messages (
    id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    stats TEXT,
    drafted_spans TEXT,
    created REAL NOT NULL
);
CREATE INDEX messages_by_conversation ON messages(conversation_id, id);
"""


class HistoryError(LocalspecError):
    """The history could not be read or written."""


def history_file() -> Path:
    return data_dir() / FILENAME


@dataclass(frozen=True)
class StoredMessage:
    role: str
    content: str
    stats: dict[str, Any] | None = None  # what the status line showed for this reply
    drafted_spans: tuple[tuple[int, int], ...] = ()  # character ranges the drafter guessed

    @classmethod
    def unanswered(cls, prompt: str) -> StoredMessage:
        """A prompt sent but abandoned before any reply (the chat quit during prefill):
        kept, so what the user typed is not lost, and marked, so it is not taken as a turn."""
        return cls("user", prompt, {"unanswered": True})

    @classmethod
    def stopped(
        cls, text: str, stats: dict[str, Any] | None = None, spans: tuple[tuple[int, int], ...] = ()
    ) -> StoredMessage:
        """A reply cut short (Esc, or quitting mid-answer): what was written, marked stopped."""
        return cls("assistant", text, {**(stats or {}), "stopped": True}, spans)

    @property
    def is_stopped(self) -> bool:
        return self.role == "assistant" and bool(self.stats and self.stats.get("stopped"))

    @property
    def is_unanswered(self) -> bool:
        return self.role == "user" and bool(self.stats and self.stats.get("unanswered"))


@dataclass(frozen=True)
class ConversationSummary:
    id: int
    title: str
    model: str
    updated: float
    n_messages: int


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    model: str
    system: str
    messages: tuple[StoredMessage, ...]


class History:
    """The conversation store. One connection, used from one thread (the app's)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path if path is not None else history_file()
        self.notice: str | None = None  # set when the file on disk could not be used
        self.persistent = True
        self._db = self._open()

    # -- opening ---------------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        try:
            private_dir(self.path.parent)
        except (OSError, StoreError) as exc:  # the store says why it could not make the folder
            return self._in_memory(f"the history folder {self.path.parent} cannot be created ({exc})")
        try:
            db = self._connect_checked()
        except _Unusable as exc:
            return self._in_memory(str(exc))
        except (sqlite3.DatabaseError, OSError) as exc:
            return self._set_aside(exc)
        return db

    def _connect_checked(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=2.0)
        with contextlib.suppress(OSError):  # best effort: a file we cannot chmod still serves
            os.chmod(self.path, 0o600)  # the chats are this user's only
        try:
            db.execute("PRAGMA foreign_keys = ON")
            version = _schema_version(db)
            if version is None:
                with db:
                    db.executescript(_SCHEMA)
                    db.execute("INSERT INTO schema_version VALUES (?)", (SCHEMA_VERSION,))
            elif version > SCHEMA_VERSION:
                raise _Unusable(
                    f"{self.path} was written by a newer localspec (schema {version}, this one reads "
                    f"{SCHEMA_VERSION}); it is left untouched and this session's chats are not saved"
                )
            check = db.execute("PRAGMA quick_check").fetchone()
            if not check or check[0] != "ok":
                raise sqlite3.DatabaseError(f"integrity check failed: {check[0] if check else 'no answer'}")
        except sqlite3.OperationalError as exc:
            db.close()
            if "locked" in str(exc) or "busy" in str(exc):
                raise _Unusable(
                    f"{self.path} is in use by another localspec; this session's chats are not saved"
                ) from exc
            raise
        except BaseException:
            db.close()
            raise
        return db

    def _set_aside(self, exc: BaseException) -> sqlite3.Connection:
        aside = self.path.with_name(f"{self.path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
        n = 1
        while aside.exists():  # two set aside in the same second: neither overwrites the other
            n += 1
            aside = aside.with_name(f"{self.path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}-{n}")
        try:
            os.replace(self.path, aside)
            for suffix in ("-wal", "-shm", "-journal"):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(f"{self.path}{suffix}")
            db = self._connect_checked()
        except (OSError, sqlite3.DatabaseError, _Unusable) as again:
            return self._in_memory(f"{self.path} could not be read ({exc}) nor set aside ({again})")
        self.notice = f"the chat history could not be read ({exc}); it was moved to {aside.name} and a new one started"
        return db

    def _in_memory(self, why: str) -> sqlite3.Connection:
        self.notice = why
        self.persistent = False
        db = sqlite3.connect(":memory:")
        db.execute("PRAGMA foreign_keys = ON")
        db.executescript(_SCHEMA)
        db.execute("INSERT INTO schema_version VALUES (?)", (SCHEMA_VERSION,))
        return db

    # -- reading ---------------------------------------------------------------------------

    def conversations(self, limit: int = 500) -> list[ConversationSummary]:
        """Newest first."""
        query = (
            "SELECT c.id, c.title, c.model, c.updated, COUNT(m.id) FROM conversations c "
            "LEFT JOIN messages m ON m.conversation_id = c.id GROUP BY c.id ORDER BY c.updated DESC, c.id DESC LIMIT ?"
        )
        with self._errors("list the saved chats"):
            rows = self._db.execute(query, (limit,)).fetchall()
        return [ConversationSummary(int(r[0]), str(r[1]), str(r[2]), float(r[3]), int(r[4])) for r in rows]

    def get(self, conversation_id: int) -> Conversation:
        with self._errors("open the chat"):
            head = self._db.execute(
                "SELECT id, title, model, system FROM conversations WHERE id = ?", (conversation_id,)
            ).fetchone()
            if head is None:
                raise HistoryError(f"there is no saved chat {conversation_id}", "pick one from the list")
            rows = self._db.execute(
                "SELECT role, content, stats, drafted_spans FROM messages WHERE conversation_id = ? ORDER BY id",
                (conversation_id,),
            ).fetchall()
        messages = tuple(_message_from_row(row) for row in rows)
        return Conversation(int(head[0]), str(head[1]), str(head[2]), str(head[3]), messages)

    # -- writing ---------------------------------------------------------------------------

    def create(self, title: str, model: str, system: str = "") -> int:
        now = time.time()
        with self._errors("save the chat"), self._db:
            cur = self._db.execute(
                "INSERT INTO conversations (title, model, system, created, updated) VALUES (?, ?, ?, ?, ?)",
                (title, model, system, now, now),
            )
        assert cur.lastrowid is not None
        return cur.lastrowid

    def append(self, conversation_id: int, message: StoredMessage) -> None:
        now = time.time()
        stats = json.dumps(message.stats) if message.stats is not None else None
        spans = json.dumps([list(s) for s in message.drafted_spans]) if message.drafted_spans else None
        with self._errors("save the message"), self._db:
            self._db.execute(
                "INSERT INTO messages (conversation_id, role, content, stats, drafted_spans, created) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (conversation_id, message.role, message.content, stats, spans, now),
            )
            self._db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation_id))

    def drop_last(self, conversation_id: int, role: str) -> bool:
        """Delete the newest message if it has this role (a reply being regenerated)."""
        with self._errors("update the chat"), self._db:
            row = self._db.execute(
                "SELECT id, role FROM messages WHERE conversation_id = ? ORDER BY id DESC LIMIT 1", (conversation_id,)
            ).fetchone()
            if row is None or row[1] != role:
                return False
            self._db.execute("DELETE FROM messages WHERE id = ?", (row[0],))
        return True

    def set_system(self, conversation_id: int, system: str) -> None:
        with self._errors("update the chat"), self._db:
            self._db.execute("UPDATE conversations SET system = ? WHERE id = ?", (system, conversation_id))

    def delete(self, conversation_id: int) -> None:
        with self._errors("delete the chat"), self._db:
            self._db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    def close(self) -> None:
        self._db.close()

    @contextlib.contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            # SQLite rolls the transaction back: what was saved before stays as it was.
            if "full" in str(exc):
                raise HistoryError(
                    f"could not {doing}: {disk_full_message(self.path.parent)}",
                    "free some space there; the chat stays on screen until then",
                ) from exc
            if "readonly" in str(exc):
                raise HistoryError(
                    f"could not {doing}: {self.path} is read-only here",
                    "make it writable, or set LOCALSPEC_HOME to a folder you can write",
                ) from exc
            raise HistoryError(
                f"could not {doing}: {exc}", f"check {self.path} (its disk may be full or the file damaged)"
            ) from exc


class _Unusable(Exception):
    """The file is fine but this session must not write it."""


def _schema_version(db: sqlite3.Connection) -> int | None:
    """None for an empty file; raises DatabaseError for a file that is not a history."""
    tables = {str(r[0]) for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not tables:
        return None
    if "schema_version" not in tables:
        raise sqlite3.DatabaseError(f"not a localspec history (tables: {', '.join(sorted(tables))})")
    row = db.execute("SELECT MAX(version) FROM schema_version").fetchone()
    if row is None or not isinstance(row[0], int):
        raise sqlite3.DatabaseError("the schema_version table is empty")
    return row[0]


def _message_from_row(row: Sequence[Any]) -> StoredMessage:
    # A damaged stats or spans field costs that field only, never the message.
    stats: dict[str, Any] | None = None
    spans: tuple[tuple[int, int], ...] = ()
    with contextlib.suppress(TypeError, ValueError):
        loaded = json.loads(row[2]) if row[2] else None
        stats = loaded if isinstance(loaded, dict) else None
    with contextlib.suppress(TypeError, ValueError):
        spans = tuple((int(a), int(b)) for a, b in json.loads(row[3])) if row[3] else ()
    return StoredMessage(str(row[0]), str(row[1]), stats, spans)
