"""The test suite's own way of opening the default model, for conftest fixtures and for tests
that open one themselves (several conftest.py files share the module name `conftest`, so tests
import these from here, never from a conftest)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from localspec.core.protocol import Backend

if TYPE_CHECKING:
    from localspec.backends.llamacpp.backend import LlamaCppBackend

TEST_N_CTX = 2048  # small contexts keep the suite's memory and load time down


def load_llamacpp(path: Path, n_ctx: int = TEST_N_CTX) -> Backend:
    from localspec.core.backend_loader import load_backend

    return load_backend("llamacpp", str(path), n_ctx=n_ctx)


def llamacpp_target(runtime: Any) -> LlamaCppBackend:
    """A runtime's target, checked to be llama.cpp's (the image tests read its projector)."""
    from localspec.backends.llamacpp.backend import LlamaCppBackend

    assert isinstance(runtime.target, LlamaCppBackend)
    return runtime.target
