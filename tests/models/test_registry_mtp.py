"""This year's pairs in models.toml (Qwen3.5/3.6 drafting with their MTP head, Gemma 4 with its
assistant sidecar), sidecar files in a model's entry, and `localspec registry check` reading
an MTP head or a sidecar drafter from GGUF headers on the fake hub."""

from __future__ import annotations

from pathlib import Path

import pytest

from localspec.cli.main import main
from localspec.models.audit import Finding, check_registry
from localspec.models.entries import HubArtifact, backend_refusal
from localspec.models.registry import RegistryError, load_registry, user_registry_file
from localspec.testing.fakehub import TOKENS, FakeHub, model_toml, pair_toml, split_gguf, tiny_gguf


def header_gguf(arch: str, width: int, tokens: list[str] | None = TOKENS, **keys: int) -> bytes:
    """A GGUF with a tokenizer and architecture keys only (a header is all the check reads)."""
    return tiny_gguf(tokens, padding=4096, arch=arch, embedding_length=width, **keys)


REGISTRY = "".join(
    [
        model_toml("hybrid", "test/hybrid-MTP-GGUF", ["hybrid.gguf"], "?"),
        model_toml("hybrid-old", "test/hybrid-GGUF", ["hybrid.gguf"], "?"),
        model_toml("gem", "test/gem-GGUF", ["gem-Q4_K_M.gguf", "mtp-gem.gguf"], "?"),
        model_toml("gem-wrong-size", "test/gem-GGUF", ["gem-Q4_K_M.gguf", "mtp-gem-big.gguf"], "?"),
        model_toml("gem-split", "test/gem-split-GGUF", ["gem-00001-of-00002.gguf", "mtp-gem.gguf"], "?"),
        pair_toml("hybrid", "drafted by its MTP head", "hybrid", "mtp"),
        pair_toml("hybrid-old", "a conversion without the head", "hybrid-old", "mtp"),
        pair_toml("gem", "with an assistant sidecar", "gem", "ngram"),
        pair_toml("gem-wrong-size", "with the sidecar of another size", "gem-wrong-size", "ngram"),
        pair_toml("gem-split", "split, with a sidecar", "gem-split", "ngram"),
    ]
)


@pytest.fixture
def hub(fake_hub: FakeHub, temporary_localspec_home: Path) -> FakeHub:
    fake_hub.add("test/hybrid-MTP-GGUF", {"hybrid.gguf": header_gguf("qwen35", 64, nextn_predict_layers=1)})
    fake_hub.add("test/hybrid-GGUF", {"hybrid.gguf": header_gguf("qwen35", 64)})
    sidecar = header_gguf("gemma4-assistant", 32, nextn_predict_layers=4, embedding_length_out=64)
    big = header_gguf("gemma4-assistant", 32, nextn_predict_layers=4, embedding_length_out=128)
    target = header_gguf("gemma4", 64)
    fake_hub.add("test/gem-GGUF", {"gem-Q4_K_M.gguf": target, "mtp-gem.gguf": sidecar, "mtp-gem-big.gguf": big})
    fake_hub.add("test/gem-split-GGUF", {**split_gguf("gem", TOKENS, 2), "mtp-gem.gguf": sidecar})
    (temporary_localspec_home / "models.toml").write_text(REGISTRY)
    return fake_hub


def mtp_findings(findings: list[Finding]) -> list[tuple[str, bool, str]]:
    return [(f.subject, f.ok, f.detail) for f in findings if f.subject.startswith("MTP")]


# -- the packaged pairs


def test_this_years_qwen_pairs_draft_with_their_mtp_head_from_mtp_keeping_repos() -> None:
    registry = load_registry()
    wanted = {
        "qwen3.6-27b": "unsloth/Qwen3.6-27B-MTP-GGUF",
        "qwen3.6-35b-a3b": "unsloth/Qwen3.6-35B-A3B-MTP-GGUF",
        "qwen3.5-9b": "unsloth/Qwen3.5-9B-MTP-GGUF",
    }
    for pair_id, repo in wanted.items():
        pair = registry.pair(pair_id)
        artifact = pair.target.artifacts["llamacpp"]
        assert isinstance(artifact, HubArtifact) and artifact.repo == repo
        assert (pair.strategy, pair.mtp, pair.drafter) == ("mtp", "yes", None)
    moe = registry.models["qwen3.6-35b-a3b"].artifacts["llamacpp"]
    assert isinstance(moe, HubArtifact) and moe.files[0].name == "Qwen3.6-35B-A3B-UD-Q4_K_M.gguf"


def test_gemma_4_pairs_bring_their_assistant_sidecar_and_draft_with_it() -> None:
    registry = load_registry()
    for pair_id, size in (("gemma-4-e4b", "E4B"), ("gemma-4-12b", "12B"), ("gemma-4-31b", "31B")):
        pair = registry.pair(pair_id)
        artifact = pair.target.artifacts["llamacpp"]
        assert isinstance(artifact, HubArtifact)
        assert artifact.repo == f"unsloth/gemma-4-{size}-it-qat-GGUF"  # unsloth keeps QAT files apart
        assert [f.name for f in artifact.files] == [
            f"gemma-4-{size}-it-qat-UD-Q4_K_XL.gguf",
            f"mtp-gemma-4-{size}-it.gguf",
        ]
        assert (pair.strategy, pair.mtp) == ("mtp", "yes")


def test_mlx_entries_come_from_mlx_community_mtp_repos() -> None:
    models = load_registry().models
    repos = {m: models[m].artifacts["mlx"] for m in ("qwen3.6-27b", "qwen3.6-35b-a3b")}
    assert {m: a.repo for m, a in repos.items() if isinstance(a, HubArtifact)} == {
        "qwen3.6-27b": "mlx-community/Qwen3.6-27B-MTP-bf16",
        "qwen3.6-35b-a3b": "mlx-community/Qwen3.6-35B-A3B-MTP-4bit",
    }


def test_the_new_entries_are_unpinned_until_checked_against_the_hub() -> None:
    registry = load_registry()
    for pair_id in ("qwen3.6-27b", "qwen3.6-35b-a3b", "qwen3.5-9b", "gemma-4-e4b", "gemma-4-12b", "gemma-4-31b"):
        for artifact in registry.pair(pair_id).target.artifacts.values():
            assert isinstance(artifact, HubArtifact) and not artifact.pinned
            assert all(f.sha256 is None and f.size is None for f in artifact.files)


def test_no_pair_offers_a_backend_that_refuses_its_strategy() -> None:
    registry = load_registry()
    for pair in registry.pairs.values():
        assert [b for b in pair.backends if backend_refusal(pair, b)] == [], pair.id
    for pair_id in ("qwen3.6-27b", "qwen3.6-35b-a3b"):
        assert registry.pair(pair_id).backends == ("llamacpp", "mlx")
    qwen = registry.models["qwen3.6-27b"]
    assert "torch" not in qwen.artifacts and qwen.safetensors is not None
    assert qwen.safetensors.repo == "Qwen/Qwen3.6-27B"  # what `localspec export` hands to vLLM and SGLang


def test_registry_check_says_when_a_backend_cannot_run_a_pairs_strategy(
    temporary_localspec_home: Path, tmp_path: Path
) -> None:
    temporary_localspec_home.mkdir(parents=True, exist_ok=True)
    user_registry_file().write_text(
        '[models.hybrid-st]\nname = "H"\nfamily = "qwen3.5"\nlicense = "mit"\nparams = "?"\n'
        f'torch = {{ path = "{tmp_path}" }}\n'
        '[pairs.hybrid-st]\ndescription = "d"\ntarget = "hybrid-st"\nstrategy = "mtp"\n'
    )
    (finding,) = check_registry(["hybrid-st"], endpoint="http://127.0.0.1:9")  # asks no hub
    assert (finding.backend, finding.subject, finding.ok) == ("torch", "strategy", False)
    assert "the torch backend does not run MTP drafters" in finding.detail and "`safetensors`" in finding.detail


def test_last_years_pairs_draft_without_mtp() -> None:
    registry = load_registry()
    assert all(registry.pair(p).mtp is None for p in ("qwen3-8b", "gemma-3-12b", "smollm2-135m"))


# -- sidecars in a model's entry


def test_a_sidecar_follows_every_shard_of_a_split_target(temporary_localspec_home: Path) -> None:
    temporary_localspec_home.mkdir(parents=True, exist_ok=True)
    user_registry_file().write_text(REGISTRY)
    artifact = load_registry().models["gem-split"].artifacts["llamacpp"]
    assert isinstance(artifact, HubArtifact)
    assert [f.name for f in artifact.files] == ["gem-00001-of-00002.gguf", "gem-00002-of-00002.gguf", "mtp-gem.gguf"]
    assert [f.name for f in artifact.sidecars] == ["mtp-gem.gguf"]


@pytest.mark.parametrize(
    ("files", "problem"),
    [
        ('["mtp-gem.gguf"]', "mtp-gem.gguf is a sidecar drafter: list the model's own GGUF first"),
        ('["mtp-gem.gguf", "gem.gguf"]', "then at most one sidecar mtp-\\*.gguf"),
        ('["gem.gguf", "mtp-a.gguf", "mtp-b.gguf"]', "then at most one sidecar mtp-\\*.gguf"),
    ],
)
def test_a_sidecar_without_its_model_first_is_refused(temporary_localspec_home: Path, files: str, problem: str) -> None:
    temporary_localspec_home.mkdir(parents=True, exist_ok=True)
    user_registry_file().write_text(REGISTRY.replace('["gem-Q4_K_M.gguf", "mtp-gem.gguf"]', files))
    with pytest.raises(RegistryError, match=f"model 'gem', backend 'llamacpp': key 'files': .*{problem}"):
        load_registry()


# -- registry check


def test_an_mtp_head_is_found_in_the_targets_header(hub: FakeHub) -> None:
    assert mtp_findings(check_registry(["hybrid"], endpoint=hub.endpoint)) == [
        ("MTP head", True, "qwen35 with 1 nextn layer: the MTP head is in the file")
    ]


def test_a_conversion_without_the_mtp_head_is_a_mismatch(hub: FakeHub) -> None:
    assert mtp_findings(check_registry(["hybrid-old"], endpoint=hub.endpoint)) == [
        (
            "MTP head",
            False,
            "qwen35 without nextn layers: converted without its MTP head; use a *-MTP-GGUF conversion",
        )
    ]


def test_a_sidecar_is_checked_as_a_file_and_as_a_drafter_for_its_target(hub: FakeHub) -> None:
    findings = check_registry(["gem"], endpoint=hub.endpoint)
    assert all(f.ok for f in findings)
    assert [f.subject for f in findings] == [
        "gem test/gem-GGUF@main",
        "gem-Q4_K_M.gguf",
        "mtp-gem.gguf",
        "MTP mtp-gem.gguf",
    ]
    assert findings[-1].detail == "gemma4-assistant drafter (4 layers) for this 64-wide gemma4"


def test_the_sidecar_of_another_size_is_a_mismatch(hub: FakeHub) -> None:
    assert mtp_findings(check_registry(["gem-wrong-size"], endpoint=hub.endpoint)) == [
        (
            "MTP mtp-gem-big.gguf",
            False,
            "drafts for a model 128 wide; this gemma4 is 64 wide (the sidecar of another size?)",
        )
    ]


def test_a_sidecar_with_another_tokenizer_is_a_mismatch(hub: FakeHub) -> None:
    other = header_gguf("gemma4-assistant", 32, [t.upper() for t in TOKENS], nextn_predict_layers=4)
    hub.add("test/gem-GGUF", {"gem-Q4_K_M.gguf": header_gguf("gemma4", 64), "mtp-gem.gguf": other})
    assert mtp_findings(check_registry(["gem"], endpoint=hub.endpoint)) == [
        ("MTP mtp-gem.gguf", False, "token 5 differs: target b'tok3', drafter b'TOK3' (different tokenizers)")
    ]


def test_a_missing_sidecar_names_the_file_and_skips_the_drafter_check(hub: FakeHub) -> None:
    hub.rename("test/gem-GGUF", "mtp-gem.gguf", "mtp-gem-it.gguf")
    assert [(f.subject, f.detail) for f in check_registry(["gem"], endpoint=hub.endpoint) if not f.ok] == [
        ("mtp-gem.gguf", "not in the repo (renamed? it has mtp-gem-it.gguf)"),
        ("MTP mtp-gem.gguf", "not checked: the target's files are not all there"),
    ]


def test_a_split_target_with_a_sidecar_is_checked_shard_by_shard_then_read_from_its_first(hub: FakeHub) -> None:
    """The shards here are llama files without a width: the sidecar is compared with the first."""
    findings = check_registry(["gem-split"], endpoint=hub.endpoint)
    assert [(f.subject, f.ok) for f in findings][1:] == [
        ("gem-00001-of-00002.gguf", True),
        ("gem-00002-of-00002.gguf", True),
        ("mtp-gem.gguf", True),
        ("MTP mtp-gem.gguf", False),
    ]
    assert findings[-1].detail == (
        "the target (llama) declares no embedding_length: not a model this sidecar drafts for"
    )


def test_the_command_exits_non_zero_on_a_missing_mtp_head(hub: FakeHub, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["registry", "check", "hybrid-old", "--endpoint", hub.endpoint]) == 1
    out = capsys.readouterr().out
    assert "MTP head" in out and "MISMATCH" in out and out.endswith("1 mismatch in 3 checks\n")
