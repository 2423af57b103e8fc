"""The user's side of the registry: `path =` entries that need no hub at all, `localspec add`
writing a checked pair of the user's own GGUF files, and a pair's draft length applied."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localspec.api import load_pair
from localspec.cli.main import main
from localspec.core.errors import ModelLoadError, PairMismatchError
from localspec.models.entries import LocalArtifact
from localspec.models.local_pairs import add_local_pair
from localspec.models.pull import is_pulled, pull, resolve_pair
from localspec.models.registry import load_registry, user_registry_file
from localspec.testing.fakehub import OTHER_TOKENS, TOKENS, tiny_gguf

NOWHERE = "http://127.0.0.1:9"  # the discard port: any request to the hub would fail

LOCAL = """
[models.mine]
name = "Mine"
family = "tiny"
license = "mit"
params = "66K"
llamacpp = {{ path = "{target}" }}

[models.mine-small]
name = "Mine-Small"
family = "tiny"
license = "mit"
params = "17K"
llamacpp = {{ path = "{drafter}" }}

[pairs.mine]
description = "my own files"
target = "mine"
drafter = "mine-small"
strategy = "draft"
draft_tokens = 3
"""


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    out = {"target": tmp_path / "t.gguf", "drafter": tmp_path / "d.gguf", "foreign": tmp_path / "f.gguf"}
    out["target"].write_bytes(tiny_gguf(TOKENS))
    out["drafter"].write_bytes(tiny_gguf(TOKENS, padding=1 << 12))
    out["foreign"].write_bytes(tiny_gguf(OTHER_TOKENS, padding=1 << 12))
    return out


def write_user_registry(text: str) -> Path:
    user_registry_file().parent.mkdir(parents=True, exist_ok=True)
    user_registry_file().write_text(text)
    return user_registry_file()


def test_a_pair_of_local_files_works_with_no_hub(files: dict[str, Path]) -> None:
    write_user_registry(LOCAL.format(target=files["target"], drafter=files["drafter"]))
    result = pull("mine", endpoint=NOWHERE, progress=False)
    assert [(f.name, f.cached) for f in result.files] == [("d.gguf", True), ("t.gguf", True)]
    resolved = resolve_pair("mine")
    assert (resolved.target, resolved.drafter) == (files["target"], files["drafter"])
    assert is_pulled(load_registry().pair("mine"), "llamacpp")


def test_a_relative_path_is_read_from_the_registry_file_s_folder(files: dict[str, Path]) -> None:
    registry = write_user_registry(LOCAL.format(target="../t.gguf", drafter="../d.gguf"))
    artifact = load_registry().models["mine"].artifacts["llamacpp"]
    assert artifact == LocalArtifact(registry.parent / "../t.gguf")
    assert resolve_pair("mine").target.resolve() == files["target"]


def test_rm_never_deletes_the_user_s_own_files_and_says_how_to_drop_the_pair(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    write_user_registry(LOCAL.format(target=files["target"], drafter=files["drafter"]))
    assert main(["rm", "mine"]) == 2  # nothing localspec fetched to remove
    err = capsys.readouterr().err
    assert "is made of your own files" in err and "has no pulled files" not in err
    assert f"delete its [pairs.mine] entry from {user_registry_file()}" in err
    assert files["target"].is_file() and files["drafter"].is_file()


def test_a_missing_local_file_names_the_path_and_the_entry(files: dict[str, Path]) -> None:
    gone = files["target"].with_name("gone.gguf")
    registry = write_user_registry(LOCAL.format(target=gone, drafter=files["drafter"]))
    with pytest.raises(ModelLoadError, match=rf"^model 'mine' points at {gone}, which is not there") as refused:
        resolve_pair("mine")
    assert refused.value.hint == f"fix its `path` in {registry}"


def test_add_checks_the_pair_and_writes_the_entry(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["add", "ours", "--target", str(files["target"]), "--drafter", str(files["drafter"]), "--draft-tokens", "3"]
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith(f"added pair ours to {user_registry_file()}: t.gguf drafted by d.gguf\n")
    pair = load_registry().pair("ours")
    assert (pair.strategy, pair.draft_tokens, pair.drafter is not None) == ("draft", 3, True)
    assert pair.target.artifacts["llamacpp"] == LocalArtifact(files["target"])
    assert resolve_pair("ours").drafter == files["drafter"]


def test_add_refuses_a_drafter_with_another_tokenizer_and_writes_nothing(files: dict[str, Path]) -> None:
    with pytest.raises(PairMismatchError, match=r"f\.gguf cannot draft for t\.gguf: token 5 differs"):
        add_local_pair("ours", files["target"], files["foreign"])
    assert not user_registry_file().exists()


def test_add_refuses_a_name_already_taken(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["add", "qwen3", "--target", str(files["target"])]) == 2
    assert "localspec: error: 'qwen3' is already in the registry" in capsys.readouterr().err


def test_a_pair_s_draft_length_applies_unless_the_caller_gives_one(
    files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    write_user_registry(LOCAL.format(target=files["target"], drafter=files["drafter"]))
    calls: list[object] = []
    monkeypatch.setattr("localspec.api._load_files", lambda options, on_progress: calls.append(options.draft_tokens))
    load_pair("mine")
    load_pair("mine", draft_tokens="auto")  # every CLI's and UI's default
    load_pair("mine", draft_tokens=5)
    assert calls == [3, 3, 5]


@pytest.mark.model
def test_run_pair_honours_the_pair_s_draft_length(
    smollm2_q4_1: Path, derived_models, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["add", "real", "--target", str(smollm2_q4_1), "--drafter", str(derived_models["Q8_0"])]) == 0
    text = user_registry_file().read_text().replace('draft_tokens = "auto"', "draft_tokens = 2")
    user_registry_file().write_text(text)
    capsys.readouterr()
    for argv, longest in (([], 2), (["--draft-tokens", "3"], 3)):
        prompt = "Count from one to twenty."
        assert main(["run", prompt, "--model", "real", "--json", "-t", "0", "-n", "16", *argv]) == 0
        stats = json.loads(capsys.readouterr().out)["stats"]
        assert max(int(k) for k in stats["gamma_histogram"]) == longest, argv


def test_add_on_a_gguf_with_an_mtp_head_writes_strategy_mtp(tmp_path: Path) -> None:
    from localspec.testing.gguf_writer import HybridSpec, write_qwen35_gguf

    target = write_qwen35_gguf(HybridSpec(nextn=1), tmp_path / "qwen35-mtp.gguf")
    pair = add_local_pair("headed", target)
    assert (pair.strategy, pair.drafter, pair.mtp) == ("mtp", None, "yes")
    assert pair.description == "qwen35-mtp.gguf by its own MTP head"
    plain = add_local_pair("headless", write_qwen35_gguf(HybridSpec(), tmp_path / "qwen35.gguf"))
    assert plain.strategy == "ngram"


def test_add_of_a_gemma4_target_and_its_assistant_writes_strategy_mtp(tmp_path: Path) -> None:
    from localspec.testing.gguf_writer import Gemma4Spec, write_gemma4_pair

    target, assistant = write_gemma4_pair(Gemma4Spec(), tmp_path)
    pair = add_local_pair("gem", target, assistant)
    assert (pair.strategy, pair.mtp) == ("mtp", "yes")
    assert resolve_pair("gem").drafter == assistant


def test_add_refuses_an_assistant_made_for_another_width(tmp_path: Path) -> None:
    from localspec.testing.gguf_writer import Gemma4Spec, write_gemma4_pair

    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    target, _ = write_gemma4_pair(Gemma4Spec(), tmp_path / "a")
    _, other = write_gemma4_pair(Gemma4Spec(hidden=96), tmp_path / "b")
    with pytest.raises(PairMismatchError, match="drafts for a model 96 wide; this gemma4 is 64 wide"):
        add_local_pair("gem", target, other)
    assert not user_registry_file().exists()
