"""`--tree` (run, bench, chat, serve) and load(trees=...): a tree asked for at every step, or
chains only, for experiments and tests; by default the controller decides where a tree pays.
A tree changes how many tokens a pass keeps, never which: greedy output stays plain decoding's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import localspec.api
import localspec.cli.run
from localspec.cli.main import build_parser, main
from localspec.cli.options import load_options
from localspec.control.trees import AskedTree
from localspec.core.choices import TreeAsk, parse_trees
from localspec.core.errors import InvalidRequestError
from localspec.core.options import LoadOptions
from localspec.runtime import Runtime

# A list the model copies, continued as raw text: n-gram lookup finds second continuations to
# branch on ("apple," is followed by "banana" and by "fig"). Asked through the chat template,
# SmolLM2 Q4_1 copied the list on AVX-512 kernels and answered something else on AVX2's.
PROMPT = "apple, banana, cherry, date, apple, fig, apple, banana, cherry, date, apple, fig, apple, banana,"


@pytest.mark.parametrize(
    ("text", "trees"),
    [("auto", "auto"), ("off", "off"), ("3", TreeAsk(3, 1)), ("2,4", TreeAsk(2, 4)), (" OFF ", "off")],
)
def test_a_tree_is_spelled_auto_off_or_positions_and_alternatives(text: str, trees: object) -> None:
    assert parse_trees(text) == trees


@pytest.mark.parametrize("command", [["run", "hi"], ["bench"], ["chat"], ["serve"]])
def test_every_command_that_loads_a_model_takes_tree_and_leaves_it_to_the_controller_by_default(
    command: list[str],
) -> None:
    parser = build_parser()
    assert load_options(parser.parse_args(command)).trees == "auto"
    assert load_options(parser.parse_args([*command, "--tree", "2,3"])).trees == TreeAsk(2, 3)


@pytest.mark.parametrize("bad", ["wide", "0", "2,0", "1,2,3", "2,"])
def test_a_bad_tree_is_refused_before_loading_with_the_spellings_named(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run", "hi", "--tree", bad])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --tree" in err and "auto (trees where they pay), off (chains only), or P[,A]" in err


def test_load_options_take_a_tree_spelled_as_the_command_line_spells_it() -> None:
    assert LoadOptions(trees="2,1").trees == TreeAsk(2, 1)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="a tree is auto, off or P"):
        LoadOptions(trees="bushy")  # type: ignore[arg-type]


@pytest.fixture
def default_model_in_home(smollm2_q4_1: Path, temporary_localspec_home: Path) -> Path:
    models = temporary_localspec_home / "models"
    models.mkdir(parents=True)
    (models / smollm2_q4_1.name).symlink_to(smollm2_q4_1)
    return models / smollm2_q4_1.name


@pytest.mark.model
def test_a_greedy_answer_with_a_tree_at_every_step_is_plain_decodings(
    default_model_in_home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded: list[Runtime] = []

    def load(*args: Any, **kwargs: Any) -> Runtime:
        loaded.append(localspec.api.load(*args, **kwargs))
        return loaded[-1]

    monkeypatch.setattr(localspec.cli.run, "load", load)
    answers = []
    for options in (["--strategy", "none"], ["--tree", "2", "--draft-tokens", "4"]):
        assert main(["run", PROMPT, "--raw", "-t", "0", "-n", "64", "--json", *options]) == 0
        answers.append(json.loads(capsys.readouterr().out))
    plain, tree = answers
    assert tree["text"] == plain["text"]
    asked = loaded[-1].engine.trees
    assert isinstance(asked, AskedTree) and asked.steps > 5, "the tree was not verified"
    assert tree["stats"]["strategy"] == "ngram" and tree["stats"]["accepted"] > 0
