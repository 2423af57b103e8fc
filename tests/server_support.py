"""The embedded model behind a real `localspec serve` for the server tests, and plain decoding
that evaluates every prompt as a fresh request would (what a served answer must equal)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from conftest import TEST_N_CTX

from localspec.api import Runtime, load
from localspec.server import LocalServer, Settings

MODEL = "smollm2-135m"


@contextmanager
def serving(model: Path) -> Iterator[LocalServer]:
    def loader(model_id: str) -> Runtime:
        return load(str(model), n_ctx=TEST_N_CTX, calibrate=False)

    with LocalServer(loader(MODEL), MODEL, loader, port=0, settings=Settings(log=lambda line: None)) as srv:
        srv.start()
        yield srv


@contextmanager
def fresh_plain(model: Path) -> Iterator[Runtime]:
    with load(str(model), n_ctx=TEST_N_CTX, calibrate=False, strategy="none", memory=False) as runtime:
        runtime.engine.exact_prefix = True
        yield runtime
