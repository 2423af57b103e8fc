"""A pair that names its target's vision projector (`mmproj` in models.toml): `pull` fetches it
beside the target, loading the pair reads images without `--mmproj`, `export --to
llama-server` passes it, `rm` deletes it; a projector the repo does not have costs images
only, never the text model. Against the fake hub on 127.0.0.1, with the tiny
vision pair of tests/images/test_images.py as the repo's files."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from localspec.api import load
from localspec.cli.main import main
from localspec.models.hub_errors import PullError
from localspec.models.pull import NotPulledError, is_pulled, pull, resolve_pair
from localspec.models.registry import RegistryError, load_registry
from localspec.models.removal import remove
from localspec.testing.fakehub import FakeHub, model_toml
from localspec.testing.vision_writer import png_bytes, write_vision_pair

REPO = "test/tiny-vision-GGUF"
REGISTRY = (
    model_toml("tiny-vision", REPO, ["vision-target.gguf"])
    + model_toml("tiny-vision-mmproj", REPO, ["mmproj.gguf"], params="30K")
    + """[pairs.tiny-vision]
description = "A tiny target that reads images through its projector"
target = "tiny-vision"
strategy = "ngram"
mmproj = "tiny-vision-mmproj"
"""
)


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, temporary_localspec_home: Path) -> Iterator[FakeHub]:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    target, projector = write_vision_pair(tmp_path / "written")
    with FakeHub() as fake:
        fake.add(REPO, {target.name: target.read_bytes(), projector.name: projector.read_bytes()})
        temporary_localspec_home.mkdir(parents=True, exist_ok=True)
        (temporary_localspec_home / "models.toml").write_text(REGISTRY)
        yield fake


def test_pull_fetches_the_projector_after_the_target(hub: FakeHub) -> None:
    result = pull("tiny-vision", endpoint=hub.endpoint, progress=False)
    assert [(f.role, f.name) for f in result.files] == [("target", "vision-target.gguf"), ("mmproj", "mmproj.gguf")]
    resolved = resolve_pair("tiny-vision")
    assert resolved.mmproj is not None
    assert resolved.mmproj.read_bytes() == hub.repos[REPO].files["mmproj.gguf"]


def test_a_pulled_pair_with_a_projector_reads_images_without_mmproj_given(hub: FakeHub) -> None:
    pull("tiny-vision", endpoint=hub.endpoint, progress=False)
    image = {"type": "image", "data": png_bytes(24, 20)}
    messages = [{"role": "user", "content": [image, {"type": "text", "text": "What is it?"}]}]
    with load("tiny-vision", calibrate=False, n_ctx=256, threads=1) as runtime:
        assert runtime.generate(messages=messages, max_tokens=4, temperature=0).stats.generated_tokens == 4


def test_export_to_llama_server_passes_the_projector(hub: FakeHub, capsys: pytest.CaptureFixture[str]) -> None:
    pull("tiny-vision", endpoint=hub.endpoint, progress=False)
    assert main(["export", "tiny-vision", "--to", "llama-server"]) == 0
    out = capsys.readouterr().out
    assert f"--mmproj {resolve_pair('tiny-vision').mmproj}" in out


def test_a_pair_whose_projector_is_missing_is_not_pulled_and_says_how_to_fetch_it(hub: FakeHub) -> None:
    pull("tiny-vision", endpoint=hub.endpoint, progress=False)
    assert is_pulled(load_registry().pair("tiny-vision"), "llamacpp")
    resolve_pair("tiny-vision").mmproj.unlink()  # type: ignore[union-attr]
    assert not is_pulled(load_registry().pair("tiny-vision"), "llamacpp")
    with pytest.raises(NotPulledError, match=r"missing: Tiny-Vision-Mmproj") as refused:
        resolve_pair("tiny-vision")
    assert "localspec pull tiny-vision" in str(refused.value.hint)


def test_rm_deletes_the_projector_with_the_pair(hub: FakeHub) -> None:
    pull("tiny-vision", endpoint=hub.endpoint, progress=False)
    projector = resolve_pair("tiny-vision").mmproj
    assert sorted(model for model, _ in remove("tiny-vision").removed) == ["tiny-vision", "tiny-vision-mmproj"]
    assert projector is not None and not projector.exists()


@pytest.mark.parametrize(
    ("projector", "said"),
    [
        ('"nowhere"', "no model 'nowhere'"),
        ('"mlx-only"', "has no llama.cpp GGUF"),
    ],
)
def test_an_mmproj_that_is_no_projector_gguf_is_refused_naming_the_key(
    tmp_path: Path, projector: str, said: str
) -> None:
    mlx_only = '[models.mlx-only]\nname = "M"\nfamily = "tiny"\nlicense = "mit"\nparams = "1K"\n'
    mlx_only += 'mlx = { repo = "test/m-mlx", revision = "main", files = ["*.safetensors"] }\n\n'
    text = REGISTRY.replace('mmproj = "tiny-vision-mmproj"', f"mmproj = {projector}") + "\n" + mlx_only
    user = tmp_path / "models.toml"
    user.write_text(text)
    with pytest.raises(RegistryError, match=rf"pair 'tiny-vision': key 'mmproj': .*{said}"):
        load_registry(user)


def test_show_and_list_name_the_projector(hub: FakeHub, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", "tiny-vision"]) == 0
    assert "projector (images): Tiny-Vision-Mmproj" in capsys.readouterr().out
    assert main(["list", "--json"]) == 0
    assert '"mmproj": "tiny-vision-mmproj"' in capsys.readouterr().out


# -- a projector the repo does not have: the text model is pulled, images are off


def without_projector(hub: FakeHub) -> None:
    """The repo as if models.toml had guessed a projector name it does not have."""
    del hub.repos[REPO].files["mmproj.gguf"]


def pulled_files(home: Path) -> list[str]:
    return sorted(p.relative_to(home / "pulled").as_posix() for p in (home / "pulled").rglob("*") if p.is_file())


def test_a_projector_the_repo_lacks_leaves_the_text_model_pulled_and_says_so_in_one_line(
    hub: FakeHub, temporary_localspec_home: Path
) -> None:
    without_projector(hub)
    result = pull("tiny-vision", endpoint=hub.endpoint, progress=False)
    assert [(f.role, f.name) for f in result.files] == [("target", "vision-target.gguf")]
    (note,) = result.notes
    assert f"{REPO}@main has no mmproj.gguf" in note and "images are off for this pair" in note
    assert "--mmproj PATH" in note and "localspec add NAME --target" in note and "\n" not in note
    resolved = resolve_pair("tiny-vision")
    assert resolved.mmproj is None and resolved.target.read_bytes() == hub.repos[REPO].files["vision-target.gguf"]
    assert is_pulled(load_registry().pair("tiny-vision"), "llamacpp")
    # Whole records only: the target's, the projector's absence, the pair's mark; nothing half-written.
    assert pulled_files(temporary_localspec_home) == [
        "llamacpp/absent/tiny-vision-mmproj.json",
        "llamacpp/pairs/tiny-vision",
        "llamacpp/tiny-vision.json",
    ]


def test_pull_prints_the_missing_projector_line_once_even_when_quiet(
    hub: FakeHub, capsys: pytest.CaptureFixture[str]
) -> None:
    without_projector(hub)
    assert main(["pull", "tiny-vision", "--endpoint", hub.endpoint, "--quiet"]) == 0
    out = capsys.readouterr().out
    assert out.count("without its projector") == 1 and "images are off" in out


def test_an_app_pulling_with_its_own_progress_line_is_told_of_the_missing_projector(hub: FakeHub) -> None:
    without_projector(hub)
    told: list[str] = []
    pull("tiny-vision", endpoint=hub.endpoint, progress=False, on_progress=lambda _d, _t, what: told.append(what))
    assert [line for line in told if "without its projector" in line] != []


def test_a_dry_run_says_the_projector_is_missing_and_records_nothing(
    hub: FakeHub, temporary_localspec_home: Path
) -> None:
    without_projector(hub)
    result = pull("tiny-vision", endpoint=hub.endpoint, progress=False, dry_run=True)
    assert [f.role for f in result.files] == ["target"]
    assert result.notes[0].startswith("would pull tiny-vision without its projector")
    assert not (temporary_localspec_home / "pulled").exists()


def test_a_projector_published_later_is_fetched_by_the_next_pull(hub: FakeHub, temporary_localspec_home: Path) -> None:
    files = dict(hub.repos[REPO].files)
    without_projector(hub)
    pull("tiny-vision", endpoint=hub.endpoint, progress=False)
    hub.add(REPO, files)  # a new commit with the projector
    result = pull("tiny-vision", endpoint=hub.endpoint, progress=False)
    assert result.notes == () and ("mmproj", "mmproj.gguf") in [(f.role, f.name) for f in result.files]
    assert resolve_pair("tiny-vision").mmproj is not None
    assert not (temporary_localspec_home / "pulled" / "llamacpp" / "absent" / "tiny-vision-mmproj.json").exists()


def test_a_pair_pulled_without_its_projector_pulls_again_offline_and_stays_text_only(
    hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    without_projector(hub)
    pull("tiny-vision", endpoint=hub.endpoint, progress=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (note,) = pull("tiny-vision", endpoint=hub.endpoint, progress=False).notes
    assert "stays without its projector (images off)" in note
    assert resolve_pair("tiny-vision").mmproj is None


def test_a_projector_download_that_fails_still_fails_the_pull(hub: FakeHub) -> None:
    hub.cut_after("mmproj.gguf", 100, then_down=True)
    with pytest.raises(PullError, match=r"the download of mmproj.gguf from test/tiny-vision-GGUF failed"):
        pull("tiny-vision", endpoint=hub.endpoint, progress=False)
    assert not is_pulled(load_registry().pair("tiny-vision"), "llamacpp")
    with pytest.raises(NotPulledError, match="missing: Tiny-Vision-Mmproj"):
        resolve_pair("tiny-vision")


def test_rm_of_a_pair_pulled_without_its_projector_leaves_no_record_of_it(
    hub: FakeHub, temporary_localspec_home: Path
) -> None:
    without_projector(hub)
    pull("tiny-vision", endpoint=hub.endpoint, progress=False)
    assert [model for model, _ in remove("tiny-vision").removed] == ["tiny-vision"]
    assert pulled_files(temporary_localspec_home) == []
