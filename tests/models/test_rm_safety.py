"""`localspec rm` removes only what nothing else uses and never reaches outside localspec's
folders through a link; a name the hub refuses is reported as a name (issue 20)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from localspec.cli.main import main
from localspec.models.default_model import DEFAULT_MODEL
from localspec.models.pull import pull, resolve_pair
from localspec.models.removal import remove
from localspec.store import models_dir
from localspec.testing.fakehub import FakeHub, serve_test_pairs


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, temporary_localspec_home: Path) -> Iterator[FakeHub]:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with FakeHub() as fake:
        serve_test_pairs(fake, temporary_localspec_home)
        yield fake


def test_rm_does_not_follow_a_link_out_of_its_folders(hub: FakeHub, tmp_path: Path) -> None:
    pull("tiny", endpoint=hub.endpoint, progress=False)
    link = resolve_pair("tiny").target
    precious = tmp_path / "elsewhere" / "precious.gguf"
    precious.parent.mkdir()
    precious.write_bytes(link.read_bytes())
    link.unlink()
    link.symlink_to(precious)  # a link planted in the cache, pointing outside it

    remove("tiny")

    assert precious.read_bytes() and not link.is_symlink()


def test_rm_of_a_pair_keeps_the_embedded_default_model_it_drafts_with(capsys: pytest.CaptureFixture[str]) -> None:
    default = models_dir() / DEFAULT_MODEL.filename
    default.parent.mkdir(parents=True)
    default.write_bytes(b"GGUF stand-in")

    assert main(["rm", "smollm2-1.7b"]) == 0

    assert default.exists()
    assert "kept smollm2-135m-instruct: it is the embedded default model" in capsys.readouterr().out


def test_a_repo_id_the_hub_rejects_is_reported_as_a_bad_name(hub: FakeHub, temporary_localspec_home: Path) -> None:
    from localspec.models.hub_errors import PullError

    registry = temporary_localspec_home / "models.toml"
    registry.write_text(
        registry.read_text()
        + '\n[models.badly-named]\nname = "B"\nfamily = "tiny"\nlicense = "mit"\nparams = "1K"\n'
        + 'llamacpp = { repo = "test/bad--name", revision = "main", files = ["b.gguf"] }\n'
        + '\n[pairs.badly-named]\ndescription = "x"\ntarget = "badly-named"\n'
        + 'strategy = "ngram"\ndraft_tokens = "auto"\n'
    )
    with pytest.raises(PullError, match="as a name") as caught:
        pull("badly-named", endpoint=hub.endpoint, progress=False)
    assert "connection" not in str(caught.value)


def test_rm_for_one_backend_keeps_the_files_another_backend_s_pull_uses(
    hub: FakeHub, temporary_localspec_home: Path
) -> None:
    registry = temporary_localspec_home / "models.toml"
    registry.write_text(
        registry.read_text()
        + '\n[models.shared]\nname = "S"\nfamily = "tiny"\nlicense = "mit"\nparams = "66K"\n'
        + 'mlx = { repo = "test/tiny-target-mlx", revision = "main", files = ["*.json", "*.safetensors"] }\n'
        + 'torch = { repo = "test/tiny-target-mlx", revision = "main", files = ["*.json", "*.safetensors"] }\n'
        + '\n[pairs.shared]\ndescription = "x"\ntarget = "shared"\nstrategy = "ngram"\n'
    )
    pull("shared", backend="mlx", endpoint=hub.endpoint, progress=False)
    pull("shared", backend="torch", endpoint=hub.endpoint, progress=False)
    files = [p for p in resolve_pair("shared", backend="torch").target.rglob("*") if p.is_file()]
    assert files

    removal = remove("shared", backend="mlx")

    assert all(p.exists() for p in files)
    assert removal.kept and "the torch pull of shared uses the same files" in removal.kept[0][1]
