"""`echo hello | localspec run "Translate to French:"` answers the prompt followed by the piped
text, as `llm` does; with nothing piped the prompt is all there is."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from localspec.cli.run import joined_with_piped

RUN = [sys.executable, "-m", "localspec", "run", "--backend", "reference", "--model", "reference", "-n", "1", "--json"]


def prompt_tokens(prompt: str, piped: str | None, home: Path) -> int:
    """How many tokens the model was given (the reference model's answer hardly depends on them)."""
    done = subprocess.run(
        [*RUN, prompt],
        input=piped,
        stdin=None if piped is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        env={"LOCALSPEC_HOME": str(home), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    return int(json.loads(done.stdout)["stats"]["prompt_tokens"])


def test_piped_text_follows_the_prompt(temporary_localspec_home: Path) -> None:
    piped = prompt_tokens("Translate to French:", "hello\n", temporary_localspec_home)
    assert piped == prompt_tokens("Translate to French:\n\nhello", None, temporary_localspec_home)
    assert piped > prompt_tokens("Translate to French:", None, temporary_localspec_home)


def test_the_join_is_the_prompt_a_blank_line_and_the_piped_text() -> None:
    assert joined_with_piped("Translate to French:", "hello\n") == "Translate to French:\n\nhello"
    assert joined_with_piped("Just this", None) == "Just this"
    assert joined_with_piped("Just this", "  \n") == "Just this"
