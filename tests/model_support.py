"""The test suite's own way of opening the default model, for conftest fixtures and for tests
that open one themselves (several conftest.py files share the module name `conftest`, so tests
import these from here, never from a conftest)."""

from __future__ import annotations

from pathlib import Path

from localspec.core.protocol import Backend

TEST_N_CTX = 2048  # small contexts keep the suite's memory and load time down


def load_llamacpp(path: Path, n_ctx: int = TEST_N_CTX) -> Backend:
    from localspec.core.backend_loader import load_backend

    return load_backend("llamacpp", str(path), n_ctx=n_ctx)
