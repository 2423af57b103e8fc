"""`localspec add` and a vision model's projector: an mmproj GGUF given with --mmproj, or found
beside the target, becomes the pair's `mmproj`, so the pair reads images with no --mmproj;
a projector that does not fit, or one given as a model, is refused with nothing written.
The tiny vision pair of tests/images/test_images.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from localspec.api import load
from localspec.cli.main import main
from localspec.core.errors import InvalidRequestError
from localspec.models.local_pairs import add_local_pair
from localspec.models.pull import resolve_pair
from localspec.models.registry import user_registry_file
from localspec.testing.gguf_writer import Spec, write_gguf
from localspec.testing.vision_writer import ProjectorSpec, png_bytes, write_projector, write_vision_pair


@pytest.fixture
def vision(tmp_path: Path) -> tuple[Path, Path]:
    """(target, projector), side by side in one folder as a model repo ships them."""
    return write_vision_pair(tmp_path / "vision")


def test_add_finds_the_projector_beside_the_target_and_the_pair_reads_images(vision: tuple[Path, Path]) -> None:
    target, projector = vision
    pair = add_local_pair("eyes", target)
    assert pair.mmproj is not None
    assert resolve_pair("eyes").mmproj == projector
    image = {"type": "image", "data": png_bytes(24, 20)}
    messages = [{"role": "user", "content": [image, {"type": "text", "text": "What is it?"}]}]
    with load("eyes", calibrate=False, n_ctx=256, threads=1) as runtime:  # no mmproj= given
        assert runtime.generate(messages=messages, max_tokens=4, temperature=0).stats.generated_tokens == 4


def test_add_says_which_projector_it_took(vision: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["add", "eyes", "--target", str(vision[0])]) == 0
    assert "with the vision projector mmproj.gguf" in capsys.readouterr().out


def test_a_text_model_alone_in_its_folder_gets_no_projector(tmp_path: Path) -> None:
    target = write_gguf(Spec(arch="llama"), tmp_path / "text.gguf")
    assert add_local_pair("plain", target).mmproj is None
    assert "mmproj" not in user_registry_file().read_text()


def test_a_projector_beside_the_target_made_for_another_width_is_left_out(tmp_path: Path) -> None:
    target = write_gguf(Spec(arch="llama"), tmp_path / "text.gguf")
    write_projector(ProjectorSpec(out_width=48), tmp_path / "mmproj-other.gguf")
    assert add_local_pair("plain", target).mmproj is None


def test_a_broken_file_named_mmproj_beside_the_target_is_passed_over(vision: tuple[Path, Path]) -> None:
    (vision[0].parent / "mmproj-partial.gguf").write_bytes(vision[1].read_bytes()[:100])
    assert resolve_pair(add_local_pair("eyes", vision[0]).id).mmproj == vision[1]


def test_a_projector_given_for_another_width_is_refused_and_nothing_written(
    vision: tuple[Path, Path], tmp_path: Path
) -> None:
    wrong = write_projector(ProjectorSpec(out_width=48), tmp_path / "mmproj-48.gguf")
    with pytest.raises(InvalidRequestError, match="its vision output is 48 wide, the model's embeddings 64"):
        add_local_pair("eyes", vision[0], mmproj=wrong)
    assert not user_registry_file().exists()


def test_a_projector_given_as_the_target_is_refused_naming_mmproj(vision: tuple[Path, Path]) -> None:
    with pytest.raises(InvalidRequestError, match="is a vision projector") as refused:
        add_local_pair("eyes", vision[1])
    assert "--mmproj" in str(refused.value.hint)
    assert not user_registry_file().exists()


def test_a_model_given_as_the_projector_is_refused(vision: tuple[Path, Path]) -> None:
    with pytest.raises(InvalidRequestError, match="is not a vision projector"):
        add_local_pair("eyes", vision[0], mmproj=vision[0])


def test_two_fitting_projectors_beside_the_target_ask_for_one(vision: tuple[Path, Path]) -> None:
    target, projector = vision
    (target.parent / "mmproj-copy.gguf").write_bytes(projector.read_bytes())
    with pytest.raises(InvalidRequestError, match="several projectors") as refused:
        add_local_pair("eyes", target)
    assert "--mmproj" in str(refused.value.hint)
    assert add_local_pair("eyes", target, mmproj=projector).mmproj is not None


def test_add_takes_an_audio_projector_beside_the_target_and_the_pair_hears_clips(tmp_path: Path) -> None:
    from localspec.testing.audio_writer import write_audio_pair

    target, projector = write_audio_pair(tmp_path / "ears")
    assert resolve_pair(add_local_pair("ears", target).id).mmproj == projector
