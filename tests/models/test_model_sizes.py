"""Sizes before a download: models.toml's pinned byte counts, else an estimate from the
parameter count and quantization, shown by `list`, by an offline `pull --dry-run` and checked
by `registry check` against the hub's real sizes."""

from __future__ import annotations

from pathlib import Path

import pytest

from localspec.cli.main import main
from localspec.models.audit import ESTIMATE_SLACK, check_registry
from localspec.models.entries import HubArtifact, PyPIArtifact
from localspec.models.registry import load_registry
from localspec.models.sizes import estimate_bytes, param_count
from localspec.testing.fakehub import TOKENS, FakeHub, model_toml, pair_toml, tiny_gguf


def test_parameter_counts_are_read_and_effective_counts_are_not_guessed() -> None:
    assert param_count("135M") == 135e6
    assert param_count("1.7B") == 1.7e9
    assert param_count("35B-A3B") == 35e9  # a mixture of experts downloads every expert
    assert param_count("E4B") is None  # Gemma's effective parameters are not the file's


def pinned_sizes() -> list[tuple[str, str, str, int]]:
    """(model, backend, file name, bytes) for every size models.toml pins."""
    rows = []
    for model in load_registry().models.values():
        for backend, artifact in model.artifacts.items():
            if isinstance(artifact, PyPIArtifact) and artifact.size:
                rows.append((model.id, backend, artifact.source.member, artifact.size))
            elif isinstance(artifact, HubArtifact) and artifact.files and all(f.size for f in artifact.files):
                rows.append((model.id, backend, artifact.files[0].name, sum(f.size or 0 for f in artifact.files)))
    return rows


@pytest.mark.parametrize(("model_id", "backend", "name", "size"), pinned_sizes())
def test_the_estimate_falls_within_the_slack_of_every_size_the_registry_pins(
    model_id: str, backend: str, name: str, size: int
) -> None:
    guess = estimate_bytes(load_registry().models[model_id].params, name, backend)
    assert guess is not None
    assert abs(guess - size) <= ESTIMATE_SLACK * size, (guess, size)


def test_list_shows_a_size_for_every_downloadable_pair_marking_estimates(
    temporary_localspec_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines()[1:] if line and not line.startswith("~")}
    assert "98.4 MB" in rows["smollm2-135m"]  # pinned: exact, no mark
    assert "~17.4 GB" in rows["qwen3.6-27b"]
    unknown = [pair for pair, line in rows.items() if " ? " in line]
    assert unknown == ["gemma-4-e4b"], "only effective-parameter models have no estimate"
    assert "~ an estimate from the parameter count" in out


def test_an_offline_dry_run_says_what_it_would_fetch_from_the_registry(
    temporary_localspec_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["pull", "qwen3.6-27b", "--dry-run", "--endpoint", "http://127.0.0.1:9", "-q"])
    out = capsys.readouterr().out
    assert code == 0
    assert "would fetch ~17.4 GB" in out
    assert "Qwen3.6-27B-Q4_K_M.gguf" in out
    assert "the hub could not be reached" in out


def estimated(params: str) -> str:
    """A registry whose target's size is estimated from `params`."""
    est = model_toml("est", "test/est-GGUF", ["est-q8_0.gguf"], params)
    return est + pair_toml("est", "A target whose size the registry does not pin", "est", "ngram")


@pytest.fixture
def est_hub(fake_hub: FakeHub) -> FakeHub:
    fake_hub.add("test/est-GGUF", {"est-q8_0.gguf": tiny_gguf(TOKENS, padding=1 << 20)})
    return fake_hub


@pytest.mark.parametrize(("scale", "ok"), [(1.0, True), (3.0, False)])
def test_registry_check_sets_the_estimate_beside_the_hubs_size(
    est_hub: FakeHub, temporary_localspec_home: Path, scale: float, ok: bool
) -> None:
    real = len(est_hub.repos["test/est-GGUF"].files["est-q8_0.gguf"])
    params = real * 8 / 8.5 * scale / 1e6  # Q8_0: 8.5 bits a weight
    (temporary_localspec_home / "models.toml").write_text(estimated(f"{params:.4f}M"))
    finding = next(f for f in check_registry(["est"], endpoint=est_hub.endpoint) if f.subject == "est size")
    assert finding.ok is ok
    assert "on the hub" in finding.detail
    assert ("correct the model's params" in finding.detail) is not ok


def test_the_chats_pull_dialog_says_how_much_it_will_download(temporary_localspec_home: Path) -> None:
    from localspec.tui.models import missing_pair
    from localspec.tui.settings import ChatSettings

    missing = missing_pair(ChatSettings().with_changes(model="qwen3.6-27b"))
    assert missing is not None
    assert "Pull it now?" in missing.description
    assert "~17.4 GB to download" in missing.description
