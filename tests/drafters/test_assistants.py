"""Gemma 4's MTP assistant drafting for its target, checked the same way on llama.cpp (a tiny
gemma4 GGUF and its gemma4-assistant file) and MLX (a tiny gemma4 folder and its assistant
folder): the agreement check reads it as it drafts, at the target's next position, and at the
default draft length it is calibrated as users run it while the output stays the target's.
What only one backend has stays in test_llamacpp_assistant.py and test_mlx_assistant.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from head_support import assert_agreement_is_measured_as_it_drafts, assert_calibrated_as_users_run_it

import localspec

BACKENDS = ["llamacpp", "mlx"]


def write_pair(backend: str, folder: Path) -> tuple[Path, Path]:
    """The tiny target and an assistant that agrees with it often, as the backend reads them."""
    if backend == "llamacpp":
        pytest.importorskip("llama_cpp", reason="the llama.cpp backend tests need llama-cpp-python")
        from localspec.testing.gguf_writer import Gemma4Spec, write_gemma4_pair

        return write_gemma4_pair(Gemma4Spec(echo=True, seed=1, head_scale=8.0), folder)
    pytest.importorskip("mlx.core", reason="the MLX backend needs mlx: pip install 'localspec[mlx]'")
    pytest.importorskip("mlx_lm.models.gemma4_text", reason="gemma4 needs mlx-lm 0.32 or later")
    from test_mlx_assistant import assistant_config, write_assistant, write_target

    target = write_target(folder / "gemma-4-tiny-it")
    return target, write_assistant(folder / "gemma-4-tiny-it-assistant", assistant_config(width=64), agreeing=True)


@pytest.fixture(scope="module", params=BACKENDS)
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Path]:
    backend: str = request.param
    return (backend, *write_pair(backend, tmp_path_factory.mktemp(f"gemma4-{backend}")))


PROMPT = "the world and the world and the"


def test_the_agreement_check_reads_the_assistant_at_the_targets_next_position(pair: tuple[str, Path, Path]) -> None:
    backend, target, assistant = pair
    runtime = localspec.load(
        model=str(target),
        draft_model=str(assistant),
        backend=backend,
        n_ctx=256,
        threads=1,
        draft_tokens=3,
        calibrate=False,
    )
    with runtime:
        assert runtime.draft is not None and runtime.draft.shared  # type: ignore[attr-defined]
        tokens = runtime.prompt_tokens(PROMPT * 2)[:24]
        assert_agreement_is_measured_as_it_drafts(runtime.target, runtime.draft, tokens)


def test_at_the_default_draft_length_the_assistant_is_calibrated_and_output_stays_the_targets(
    pair: tuple[str, Path, Path],
) -> None:
    backend, target, assistant = pair
    with localspec.load(model=str(target), backend=backend, n_ctx=256, threads=1, strategy="none") as plain:
        expected = plain.generate(prompt=PROMPT, max_tokens=40, temperature=0)
    with localspec.load(
        model=str(target), draft_model=str(assistant), backend=backend, n_ctx=256, threads=1
    ) as runtime:
        assert runtime.label == "mtp" and runtime.draft is not None  # as users run it
        # Before a request: a loaded host's drift can mark the cached timings stale after one.
        assert_calibrated_as_users_run_it(runtime.target, runtime.draft, runtime.policy)
        assert runtime.generate(prompt=PROMPT, max_tokens=40, temperature=0).tokens == expected.tokens
