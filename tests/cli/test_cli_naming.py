"""Every command names a model the same way (-m/--model MODEL: a pair name from `localspec
list` or a GGUF path; chat and serve also take it as their argument), and a model is shown
by one name."""

from __future__ import annotations

from pathlib import Path

import pytest

from localspec.cli.main import build_parser, main
from localspec.cli.options import MODEL_HELP
from localspec.models.naming import canonical_name
from localspec.tui.settings import ChatSettings

MODEL_COMMANDS = ["run", "chat", "serve", "bench", "doctor"]


def help_text(command: str) -> str:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sub.choices[command].format_help()  # type: ignore[union-attr]


@pytest.mark.parametrize("command", MODEL_COMMANDS)
def test_every_command_takes_the_model_as_dash_m_with_the_same_help(command: str) -> None:
    text = " ".join(help_text(command).split())
    assert "--model MODEL, -m MODEL" in text
    assert " ".join(MODEL_HELP.split()) in text


@pytest.mark.parametrize("command", ["chat", "serve"])
def test_chat_and_serve_also_take_it_as_their_argument_but_not_twice(command: str, capsys) -> None:
    assert "the same as --model" in " ".join(help_text(command).split())
    extra = ["--history-path"] if command == "chat" else []
    code = main([command, "smollm2-135m", "-m", "qwen2.5-7b", *extra])
    assert code == 2
    assert "the model is named twice" in capsys.readouterr().err


def test_doctor_takes_a_pair_name_and_says_how_to_pull_it(capsys) -> None:
    assert main(["doctor", "-m", "qwen2.5-7b"]) == 2
    assert "localspec pull qwen2.5-7b" in capsys.readouterr().err


def test_the_default_model_has_one_name_everywhere(tmp_path: Path) -> None:
    gguf = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    names = {canonical_name(None), canonical_name("default"), canonical_name("smollm2-135m"), canonical_name(str(gguf))}
    assert names == {"smollm2-135m"}
    assert ChatSettings().model_label() == "smollm2-135m"
    assert canonical_name(str(tmp_path / "mine.gguf")) == "mine.gguf"


def test_serve_names_the_model_as_every_other_command_does(tmp_path: Path) -> None:
    from localspec.cli.serve import _served_id

    default_file = str(tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf")
    draft = str(tmp_path / "tiny-drafter.gguf")
    assert _served_id(None, None) == _served_id(default_file, None) == "smollm2-135m"
    assert _served_id("default", None) == "smollm2-135m"
    assert _served_id(None, draft) == "smollm2-135m+tiny-drafter"
    assert _served_id(str(tmp_path / "mine.gguf"), None) == "mine"
