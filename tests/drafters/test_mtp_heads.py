"""A model's own MTP head (Qwen3.5's nextn block) drafting for it, checked the same way on
llama.cpp (a tiny qwen35 GGUF with one nextn layer) and MLX (a tiny qwen3_5 folder with mtp.*
weights). The heads' guesses are poor but their arithmetic is real: what matters is that a
head's cache always holds what a clean pass over the accepted text would (positions it read
with its own states are read again with the target's), and that the output stays exactly the
target's. What only one backend has (its law test's harness, its refusals, MoE and quantized
heads) stays in test_llamacpp_mtp.py and test_mlx_mtp.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from head_support import assert_agreement_is_measured_as_it_drafts

from localspec.api import runtime_for
from localspec.core.protocol import Backend


@dataclass(frozen=True)
class HeadCase:
    """A target with an MTP head on one backend: texts its tiny vocabulary holds, and how close
    a head's rows must come to a clean pass's."""

    backend: str
    text: list[int]  # token ids for the cache tests
    prompt: str  # a prompt whose greedy answer the head drafts for, with some guesses right
    drafted_from: int  # where the cache test starts drafting
    atol: float


CASES = [
    HeadCase(
        "llamacpp",
        [119, 260, 35, 122, 114, 117, 111, 103, 263, 113, 103, 261, 40, 41],
        "the world and the world and the",
        8,
        1e-4,
    ),
    HeadCase("mlx", [0, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], "abcabcab", 6, 1e-5),
]


def write_target(backend: str, folder: Path) -> Path:
    """The tiny target with its head, as the backend reads it."""
    if backend == "llamacpp":
        pytest.importorskip("llama_cpp", reason="the llama.cpp backend tests need llama-cpp-python")
        from localspec.testing.gguf_writer import HybridSpec, write_qwen35_gguf

        return write_qwen35_gguf(HybridSpec(nextn=1, mtp_echo=1.0), folder / "qwen35-mtp.gguf")
    pytest.importorskip("mlx.core", reason="the MLX backend needs mlx: pip install 'localspec[mlx]'")
    pytest.importorskip("mlx_lm.models.qwen3_5", reason="qwen3_5 needs mlx-lm 0.31 or later")
    from test_mlx_hybrid import save_folder, tiny_hybrid
    from test_mlx_mtp import write_mtp_weights

    target = save_folder(tiny_hybrid(), folder / "qwen3_5-mtp")
    write_mtp_weights(target)
    return target


@pytest.fixture(scope="module", params=CASES, ids=lambda case: case.backend)
def case_and_path(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[HeadCase, Path]:
    case: HeadCase = request.param
    return case, write_target(case.backend, tmp_path_factory.mktemp(f"mtp-{case.backend}"))


@pytest.fixture
def case(case_and_path: tuple[HeadCase, Path]) -> HeadCase:
    return case_and_path[0]


@pytest.fixture
def opened(case_and_path: tuple[HeadCase, Path]) -> Iterator[Callable[[], Backend]]:
    """Opens the case's target afresh (one thread: a tiny model never waits on another)."""
    from localspec.core.backend_loader import load_backend

    case, path = case_and_path
    backends: list[Backend] = []

    def load() -> Backend:
        backends.append(load_backend(case.backend, str(path), n_ctx=256, threads=1))
        return backends[-1]

    yield load
    for backend in backends:
        backend.close()


def test_the_head_reads_drafted_positions_again_with_the_targets_states_once_verified(
    case: HeadCase, opened: Callable[[], Backend]
) -> None:
    text, m = case.text, case.drafted_from
    # A clean pass: the target decodes the text, the head reads it with the target's states.
    target = opened()
    head = target.mtp_head()  # type: ignore[attr-defined]
    target.eval_block(text, "none")
    clean = head.eval_block(text, "all").copy()
    # The same text reached through a draft: the head guesses 2 tokens on its own states, the
    # target verifies them, and the head is rolled back to the accepted ones and moves on.
    target = opened()
    head = target.mtp_head()  # type: ignore[attr-defined]
    target.eval_block(text[:m], "none")
    head.eval_block(text[: m + 1], "last")
    for token in text[m + 1 : m + 3]:
        head.eval_block([token], "last")
    target.eval_block(text[m : m + 4], "all")  # the verify pass
    target.rollback(m + 3)
    head.rollback(m + 3)  # both drafts kept
    target.eval_block(text[m + 3 :], "none")  # and the target goes on to the end
    rest = head.eval_block(text[m + 3 :], "all")
    np.testing.assert_allclose(rest, clean[m + 3 :], atol=case.atol)


@pytest.mark.parametrize("gamma", [1, 3])
def test_greedy_mtp_drafting_reproduces_plain_decoding(
    case: HeadCase, opened: Callable[[], Backend], gamma: int
) -> None:
    target = opened()
    plain = runtime_for(target, strategy="none", calibrate=False).generate(
        prompt=case.prompt, max_tokens=60, temperature=0
    )
    head = target.make_self_drafter("mtp", None)  # type: ignore[attr-defined]
    assert head.capabilities.self_draft == "mtp"
    runtime = runtime_for(target, head, strategy="draft", draft_tokens=gamma, calibrate=False)
    spec = runtime.generate(prompt=case.prompt, max_tokens=60, temperature=0)
    assert spec.tokens == plain.tokens
    assert spec.stats.drafted > spec.stats.accepted > 0


def test_the_agreement_check_reads_the_head_with_the_targets_states(
    case: HeadCase, opened: Callable[[], Backend]
) -> None:
    target = opened()
    assert_agreement_is_measured_as_it_drafts(target, target.mtp_head(), case.text * 2)  # type: ignore[attr-defined]
