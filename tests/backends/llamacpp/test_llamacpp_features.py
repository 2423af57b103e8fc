"""The target's hidden-layer inputs that EAGLE-3 and DFlash drafters read (backends/llamacpp/features.py):
one row per cached position, the same after a rollback as after a clean pass, and a drafter
the target cannot feed refused with what to do instead of an abort inside llama.cpp."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp", reason="the llama.cpp backend tests need llama-cpp-python")

from localspec.backends.llamacpp.backend import LlamaCppBackend
from localspec.core.errors import ModelLoadError
from localspec.testing.gguf_writer import HybridSpec, Spec, write_gguf, write_qwen35_gguf

TEXT = [119, 260, 35, 122, 114, 117, 111, 103, 263, 113, 103, 261, 40, 41]
OTHER = [50, 51, 52, 260, 53]
IDS = (0, 1, 2)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("features")
    return {
        "llama": write_gguf(Spec("llama"), folder / "llama.gguf"),
        "qwen35": write_qwen35_gguf(HybridSpec(), folder / "qwen35.gguf"),
        "gemma3": write_gguf(Spec("gemma3"), folder / "gemma3.gguf"),
    }


@pytest.fixture
def opened() -> Iterator[Callable[[Path], LlamaCppBackend]]:
    backends: list[LlamaCppBackend] = []

    def load(path: Path) -> LlamaCppBackend:
        backends.append(LlamaCppBackend(str(path), n_ctx=64, threads=1))  # tiny: one thread never waits on another
        return backends[-1]

    yield load
    for backend in backends:
        backend.close()


def token_embeddings(path: Path) -> np.ndarray:
    from gguf import GGUFReader

    tensor = next(t for t in GGUFReader(str(path)).tensors if t.name == "token_embd.weight")
    return np.asarray(tensor.data, dtype=np.float32)


def test_every_token_of_a_batch_gets_its_row_whatever_its_output_flag(models, opened) -> None:
    target = opened(models["llama"])
    rows = target.layer_features(IDS, 64, "head.gguf", "EAGLE-3 head")
    assert rows.width == 3 * 64
    target.eval_block(TEXT, "none")  # no logits wanted: the layer inputs still come back
    batch = rows.rows[: len(TEXT)].copy()
    # Layer 0's input is the token's embedding row itself.
    np.testing.assert_array_equal(batch[:, :64], token_embeddings(models["llama"])[TEXT])
    target.rollback(0)
    for token in TEXT:  # one token a pass: the same rows
        target.eval_block([token], "last")
    np.testing.assert_allclose(rows.rows[: len(TEXT)], batch, atol=1e-4)
    assert np.abs(batch[:, 128:]).max() > 0  # the deeper layers' inputs are there too


@pytest.mark.parametrize("arch", ["llama", "qwen35"])
def test_rows_after_a_rollback_are_a_clean_passes(models, opened, arch: str) -> None:
    clean = opened(models[arch])
    clean_rows = clean.layer_features(IDS, 64, "head.gguf", "EAGLE-3 head")
    clean.eval_block(TEXT[:6] + OTHER, "none")

    target = opened(models[arch])
    rows = target.layer_features(IDS, 64, "head.gguf", "EAGLE-3 head")
    target.eval_block(TEXT[:4], "none")
    target.eval_block(TEXT[4:10], "all")  # a verify pass, four of its tokens then rejected
    target.rollback(6)
    target.eval_block(OTHER, "all")
    n = 6 + len(OTHER)
    np.testing.assert_allclose(rows.rows[:n], clean_rows.rows[:n], atol=1e-4)


def test_turning_capture_on_decodes_the_cached_positions_again(models, opened) -> None:
    target = opened(models["llama"])
    target.eval_block(TEXT, "none")
    target.layer_features(IDS, 64, "head.gguf", "EAGLE-3 head")
    assert target.n_past == 0  # their rows were never kept: the engine decodes them again


@pytest.mark.parametrize(
    ("path", "ids", "width", "said"),
    [
        ("llama", (1, 3, 7), 64, "reads layer 7 of its target, but llama.gguf has layers 0-2 and its final hidden"),
        ("llama", (0, 1, 2), 4096, "reads hidden states 4096 wide, but llama.gguf's are 64"),
        ("llama", (), 64, "names no layers of its target"),
        ("gemma3", (0, 1, 2), 64, "cannot hand out the hidden layers of gemma3.gguf (gemma3)"),
    ],
)
def test_a_drafter_the_target_cannot_feed_is_refused_before_llama_cpp_aborts(
    models, opened, path: str, ids: tuple[int, ...], width: int, said: str
) -> None:
    target = opened(models[path])
    with pytest.raises(ModelLoadError) as refused:
        target.layer_features(ids, width, "head.gguf", "EAGLE-3 head")
    assert said in refused.value.message and refused.value.hint
    target.eval_block(TEXT[:3], "last")  # and the target decodes on, capture off
    assert target.n_past == 3


def test_an_eagle3_head_reads_layer_n_layers_as_the_targets_final_hidden_state(models, opened) -> None:
    # As llama.cpp's draft-eagle3: layer n_layer is the state the MTP heads read (its nextn output).
    target = opened(models["qwen35"])
    rows = target.layer_features((0, 1, 4), 64, "head.gguf", "EAGLE-3 head")
    target.eval_block(TEXT, "none")
    final = rows.rows[: len(TEXT), 128:].copy()
    assert np.abs(final).max() > 0 and not np.allclose(final, rows.rows[: len(TEXT), 64:128])
    target.rollback(0)
    for token in TEXT:  # one token a pass: the same rows, each its own token's
        target.eval_block([token], "last")
    np.testing.assert_allclose(rows.rows[: len(TEXT), 128:], final, atol=1e-3)  # a batch sums otherwise


def test_where_llama_cpp_hands_out_no_final_state_the_head_reads_zeros_as_draft_eagle3_does(models, opened) -> None:
    # llama.cpp's llama graph has no final-state output: draft-eagle3 reads a buffer nothing fills.
    target = opened(models["llama"])
    rows = target.layer_features((0, 1, 3), 64, "head.gguf", "EAGLE-3 head")
    target.eval_block(TEXT, "none")
    assert np.abs(rows.rows[: len(TEXT), 64:128]).max() > 0
    assert not rows.rows[: len(TEXT), 128:].any()


def test_a_dflash_drafter_cannot_read_the_final_state_llama_cpp_would_not_give_it(models, opened) -> None:
    # llama.cpp's draft-dflash asks for the input of layer n_layer, which these graphs do not build.
    target = opened(models["qwen35"])
    with pytest.raises(ModelLoadError) as refused:
        target.layer_features((0, 1, 4), 64, "dflash.gguf", "DFlash drafter")
    assert "reads layer 4 of its target, but qwen35.gguf has layers 0-3:" in refused.value.message
