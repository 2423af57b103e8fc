"""The packaged Qwen3.5/3.6 and Gemma 4 pairs name their target's vision projector (unsloth's
mmproj-F16.gguf beside the target's GGUF), so that `pull` fetches it and `export` hands it
on: llama-server its file (`--mmproj`), vLLM and SGLang their image settings. The pulls run
against the fake hub on 127.0.0.1 serving tiny GGUFs under the packaged repos' names."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from localspec.cli.main import main
from localspec.models.audit import check_registry
from localspec.models.entries import HubArtifact, Pair
from localspec.models.export import export_pair
from localspec.models.pull import pull, resolve_pair
from localspec.models.registry import load_registry
from localspec.testing.fakehub import FakeHub, tiny_gguf

THIS_YEARS_FAMILIES = {"qwen3.5", "gemma4"}  # Qwen3.5 and 3.6 share a family (one tokenizer)


def vision_pairs() -> list[Pair]:
    """This year's pairs whose target has a llama.cpp GGUF (the MLX-only assistant pairs too)."""
    return [
        p
        for p in load_registry().pairs.values()
        if p.family in THIS_YEARS_FAMILIES and isinstance(p.target.artifacts.get("llamacpp"), HubArtifact)
    ]


def test_every_qwen3_5_3_6_and_gemma_4_pair_names_its_targets_projector() -> None:
    pairs = vision_pairs()
    assert {p.id for p in pairs} >= {"qwen3.6-27b", "qwen3.6-35b-a3b", "qwen3.5-9b", "gemma-4-e4b", "gemma-4-31b"}
    for pair in pairs:
        assert pair.mmproj is not None, pair.id
        projector, target = pair.mmproj.artifacts["llamacpp"], pair.target.artifacts["llamacpp"]
        assert isinstance(projector, HubArtifact) and isinstance(target, HubArtifact)
        assert (projector.repo, projector.revision) == (target.repo, target.revision), pair.id
        assert [f.name for f in projector.files] == ["mmproj-F16.gguf"], pair.id
        assert pair.mmproj.family == pair.family


def runs_on_llamacpp() -> list[str]:
    return [p.id for p in vision_pairs() if "llamacpp" in p.backends]


@pytest.fixture
def packaged_hub(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> FakeHub:
    """The fake hub serving a tiny GGUF (one tokenizer for all) under every llama.cpp file name
    of the vision pairs' repos."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    repos: dict[str, dict[str, bytes]] = defaultdict(dict)
    for pair in (load_registry().pair(p) for p in runs_on_llamacpp()):
        for model in pair.models_for("llamacpp"):
            artifact = model.artifacts["llamacpp"]
            assert isinstance(artifact, HubArtifact)
            for file in artifact.files:
                repos[artifact.repo][file.name] = tiny_gguf(["a", "b", "c"], padding=64)
    for repo, files in repos.items():
        fake_hub.add(repo, files)
    return fake_hub


@pytest.mark.parametrize("pair_id", runs_on_llamacpp())
def test_pull_fetches_the_projector_and_export_passes_it_to_llama_server(
    packaged_hub: FakeHub, pair_id: str, capsys: pytest.CaptureFixture[str]
) -> None:
    result = pull(pair_id, endpoint=packaged_hub.endpoint, progress=False)
    assert ("mmproj", "mmproj-F16.gguf") in [(f.role, f.name) for f in result.files] and result.notes == ()
    projector = resolve_pair(pair_id).mmproj
    assert projector is not None and projector.name == "mmproj-F16.gguf"
    assert main(["export", pair_id, "--to", "llama-server"]) == 0
    assert f"--mmproj {projector}" in capsys.readouterr().out


@pytest.mark.parametrize("pair_id", ["qwen3.6-27b", "gemma-4-e4b"])
def test_a_packaged_pair_whose_repo_lacks_the_projector_still_pulls_its_text_model(
    packaged_hub: FakeHub, pair_id: str
) -> None:
    target = load_registry().pair(pair_id).target.artifacts["llamacpp"]
    assert isinstance(target, HubArtifact)
    del packaged_hub.repos[target.repo].files["mmproj-F16.gguf"]
    (note,) = pull(pair_id, endpoint=packaged_hub.endpoint, progress=False).notes
    assert f"{target.repo}@main has no mmproj-F16.gguf" in note
    resolved = resolve_pair(pair_id)
    assert resolved.mmproj is None and resolved.target.name == target.files[0].name


@pytest.mark.parametrize("pair_id", runs_on_llamacpp())
def test_vllm_and_sglang_exports_of_the_packaged_pairs_carry_their_image_settings(pair_id: str) -> None:
    pair = load_registry().pair(pair_id)
    vllm = export_pair(pair, "vllm").argv
    assert "--limit-mm-per-prompt" in vllm or "--language-model-only" in vllm
    assert "--enable-multimodal" in export_pair(pair, "sglang").argv


def test_a_dry_run_lists_the_projector_beside_the_target(packaged_hub: FakeHub) -> None:
    result = pull("qwen3.5-9b", endpoint=packaged_hub.endpoint, progress=False, dry_run=True)
    assert [(f.role, f.name) for f in result.files] == [
        ("target", "Qwen3.5-9B-Q4_K_M.gguf"),
        ("mmproj", "mmproj-F16.gguf"),
    ]


def test_an_export_given_its_own_gguf_resolver_finds_the_projector_beside_the_target(tmp_path: Path) -> None:
    pair = load_registry().pair("gemma-4-31b")
    snapshot = tmp_path / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    projector = snapshot / "mmproj-F16.gguf"
    projector.write_bytes(b"GGUF")

    def resolver(p: Pair) -> tuple[Path, Path | None]:
        return snapshot / "gemma-4-31B-it-qat-UD-Q4_K_XL.gguf", None

    argv = export_pair(pair, "llama-server", ggufs=resolver).argv
    assert argv[argv.index("--mmproj") + 1] == str(projector)
    projector.unlink()  # pulled without it: the repo had none
    assert "--mmproj" not in export_pair(pair, "llama-server", ggufs=resolver).argv


def test_registry_check_checks_each_projector_file_with_its_pair(packaged_hub: FakeHub) -> None:
    def projector_findings() -> list[str]:
        found = check_registry(["qwen3.5-9b"], endpoint=packaged_hub.endpoint)
        return [f.result for f in found if f.subject == "mmproj-F16.gguf"]

    assert projector_findings() == ["ok"]
    del packaged_hub.repos["unsloth/Qwen3.5-9B-MTP-GGUF"].files["mmproj-F16.gguf"]
    assert projector_findings() == ["MISMATCH"]
