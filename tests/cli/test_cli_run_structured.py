"""CLI transcripts for `localspec run --json-schema FILE` and `--json-object` on the real
default model: the answer is JSON valid for the schema, and a missing or broken schema file
is refused before a model is loaded, saying what to fix."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from localspec.cli.main import main

CITY = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "population": {"type": "integer", "minimum": 0, "maximum": 100000000},
    },
    "required": ["name", "population"],
    "additionalProperties": False,
}


@pytest.fixture
def default_model_in_home(smollm2_q4_1: Path, temporary_localspec_home: Path) -> Path:
    models = temporary_localspec_home / "models"
    models.mkdir(parents=True)
    target = models / smollm2_q4_1.name
    target.symlink_to(smollm2_q4_1)
    return target


@pytest.mark.model
def test_run_json_schema_answers_with_json_valid_for_the_schema(
    default_model_in_home: Path, tmp_path: Path, capsys
) -> None:
    schema = tmp_path / "city.json"
    schema.write_text(json.dumps(CITY))
    code = main(["run", "Paris as JSON, with its population.", "-t", "0", "-n", "60", "--json-schema", str(schema)])
    out = capsys.readouterr().out
    assert code == 0
    jsonschema.validate(json.loads(out), CITY)


@pytest.mark.model
def test_run_json_object_answers_with_a_json_object(default_model_in_home: Path, capsys) -> None:
    assert main(["run", "Describe a cat as JSON.", "-t", "0", "-n", "60", "--json-object", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["text"].startswith("{")  # unconstrained, the model answers in prose
    if record["finish_reason"] == "stop":  # the 135M model may fill an open object until -n
        assert isinstance(json.loads(record["text"]), dict)


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "no JSON schema file at"), ("{not json", "is not JSON"), ("[1, 2]", "is a list, not an object")],
    ids=["missing", "not-json", "not-an-object"],
)
def test_run_refuses_a_schema_file_it_cannot_use(tmp_path: Path, capsys, content: str | None, message: str) -> None:
    schema = tmp_path / "schema.json"
    if content is not None:
        schema.write_text(content)
    # A model path that does not exist: the schema must be refused before any load is tried.
    args = ["run", "hi", "--json-schema", str(schema), "--model", str(tmp_path / "none.gguf")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_json_schema_and_json_object_are_one_or_the_other(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit):
        main(["run", "hi", "--json-schema", str(tmp_path / "x.json"), "--json-object"])
    assert "not allowed with" in capsys.readouterr().err
