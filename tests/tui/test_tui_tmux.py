"""`localspec chat` in a real terminal: tmux runs it, send-keys types, capture-pane reads."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    shutil.which("tmux") is None, reason="tmux is not installed (apt-get install -y tmux runs this test)"
)


class Terminal:
    """One tmux server of its own (-L), so a user's tmux is never touched."""

    def __init__(self, socket: str) -> None:
        self.socket = socket

    def tmux(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True)

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "chat", *keys)

    def type(self, text: str) -> None:
        self.tmux("send-keys", "-t", "chat", "-l", text)

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "chat").stdout

    def wait_for(self, text: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = self.screen()
            if text in screen:
                return screen
            time.sleep(0.1)
        raise AssertionError(f"{text!r} never appeared; the screen was:\n{self.screen()}")


@pytest.fixture
def terminal(temporary_localspec_home: Path) -> Iterator[Terminal]:
    # The environment goes in the command: a tmux server does not pass on its client's.
    command = " ".join(
        [
            "env",
            f"LOCALSPEC_HOME={shlex.quote(str(temporary_localspec_home))}",
            "TERM=xterm-256color",
            shlex.quote(sys.executable),
            "-m localspec chat reference --backend reference --draft-model reference:noise=0.3 --strategy draft",
            "-t 0 -n 40",
        ]
    )
    term = Terminal(f"localspec-test-{uuid.uuid4().hex[:8]}")
    started = term.tmux("new-session", "-d", "-s", "chat", "-x", "110", "-y", "32", command)
    assert started.returncode == 0, started.stderr
    try:
        yield term
    finally:
        term.tmux("kill-server")


def test_chat_in_a_real_terminal(terminal: Terminal, temporary_localspec_home: Path) -> None:
    terminal.wait_for("Ready: reference + reference:noise=0.3")
    terminal.type("Hello from tmux")
    terminal.keys("Enter")
    screen = terminal.wait_for("tok/step")
    assert "Hello from tmux" in screen and "est." in screen
    terminal.keys("C-t")
    terminal.wait_for("drafted and accepted")
    terminal.keys("C-q")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "tok/step" in terminal.screen():
        time.sleep(0.1)
    assert "tok/step" not in terminal.screen()  # the app quit and gave the terminal back
    assert (temporary_localspec_home / "history.sqlite3").exists()
