"""The Backend protocol's promises, checked the same way on every backend that runs here: the
reference model, and llama.cpp, torch and MLX on the tiny GGUFs of localspec/testing/gguf_writer.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from localspec.backends.reference import ReferenceBackend
from localspec.core.backend_loader import load_backend
from localspec.core.errors import BackendUnavailableError, InvalidRequestError
from localspec.core.protocol import Backend, LogitsMode
from localspec.testing.gguf_writer import Spec

TEXT_IDS = [5 + (i * 37) % 250 for i in range(400)]  # token ids valid in every tiny vocabulary

Opener = Callable[[int], Backend]  # n_ctx -> a freshly loaded backend


class Case:
    """A backend on one model, with how close a rerun of its forward pass must come."""

    def __init__(self, name: str, spec: Spec | None, tolerance: float) -> None:
        self.name, self.spec, self.tolerance = name, spec, tolerance

    def __repr__(self) -> str:
        return self.name if self.spec is None else f"{self.name}-{self.spec.arch}"


CASES = [
    Case("reference", None, 0.0),
    Case("llamacpp", Spec("llama"), 1e-4),
    *(Case("torch", Spec(arch), 1e-4) for arch in ("llama", "qwen2", "gemma3")),
    Case("mlx", Spec("llama"), 1e-4),
]


@pytest.fixture(params=CASES, ids=repr)
def case(request: pytest.FixtureRequest) -> Case:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def open_backend(case: Case, models: Callable[[object], Path]) -> Iterator[Opener]:
    opened: list[Backend] = []

    def open_one(n_ctx: int) -> Backend:
        if case.spec is None:
            backend: Backend = ReferenceBackend(n_ctx=n_ctx)
        else:
            try:
                backend = load_backend(case.name, str(models(case.spec)), n_ctx=n_ctx, threads=1)
            except BackendUnavailableError as exc:
                pytest.skip(str(exc))
        opened.append(backend)
        return backend

    yield open_one
    for backend in opened:
        backend.close()


def test_rollback_then_new_tokens_equals_evaluating_the_new_text_fresh(case: Case, open_backend: Opener) -> None:
    backend = open_backend(256)
    backend.eval_block(TEXT_IDS[:12], "none")
    backend.eval_block(TEXT_IDS[12:20], "all")  # a draft ...
    backend.rollback(14)  # ... of which two tokens were kept
    assert list(backend.cached_tokens()) == TEXT_IDS[:14]
    other = [7, 8, 9, 10, 11]
    continued = backend.eval_block(other, "all").copy()
    fresh = open_backend(256).eval_block([*TEXT_IDS[:14], *other], "all")[14:]
    np.testing.assert_allclose(continued, fresh, rtol=case.tolerance, atol=case.tolerance)
    assert backend.n_past == 19


@pytest.mark.parametrize(("mode", "n_rows"), [("all", 4), ("last", 1), ("none", 0)])
def test_logits_modes_return_the_rows_asked_for(open_backend: Opener, mode: LogitsMode, n_rows: int) -> None:
    backend = open_backend(256)
    vocab = backend.info.n_vocab
    backend.eval_block(TEXT_IDS[:4], "none")
    rows = backend.eval_block(TEXT_IDS[4:8], mode)
    assert rows.shape == (n_rows, vocab) and rows.dtype == np.float32
    assert backend.eval_block([], "all").shape == (0, vocab)
    assert backend.n_past == 8


def test_a_full_context_is_refused_and_leaves_the_cache_as_it_was(open_backend: Opener) -> None:
    backend = open_backend(16)
    n_ctx, block = backend.info.n_ctx, backend.capabilities.max_block  # llama.cpp may round n_ctx up
    for start in range(0, n_ctx - 6, block):
        backend.eval_block(TEXT_IDS[start : min(start + block, n_ctx - 6)], "none")
    with pytest.raises(InvalidRequestError, match=f"context of {n_ctx} tokens is full"):
        backend.eval_block(TEXT_IDS[n_ctx - 6 : n_ctx + 4], "all")
    assert backend.n_past == n_ctx - 6
