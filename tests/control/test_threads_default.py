"""llama.cpp's thread count on a shared machine: by default only the cores other programs leave
free (a worker that loses its core stalls the others at every barrier), and a warning in a
request's stats and in `localspec run` when the threads and everything else want more cores
than the machine has. The machine's state is set through the two readings the choice rests
on (the busy cores, the load average), so the tests hold on any machine."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from localspec.api import runtime_for
from localspec.cli.main import main
from localspec.control import contention
from localspec.control.contention import default_threads, oversubscribed
from localspec.control.hardware import physical_cores
from localspec.core.backend_loader import load_backend
from localspec.core.protocol import Backend

CORES = os.cpu_count() or 1


@pytest.mark.parametrize(
    ("physical", "logical", "busy", "threads"),
    [
        (4, 8, 0.0, 4),  # quiet: one per physical core
        (4, 8, 5.8, 2),  # two logical cores left
        (4, 8, 8.0, 1),  # all taken: one thread, never none
        (2, 2, 0.9, 1),  # a 2-core machine with one other busy program (issue 56's case)
        (2, 2, 0.2, 2),  # a little background noise is no reason to halve
    ],
)
def test_the_default_takes_the_physical_cores_other_programs_leave_free(
    physical: int, logical: int, busy: float, threads: int
) -> None:
    assert default_threads(physical, logical, busy) == threads


@pytest.mark.model
@pytest.mark.parametrize("busy", [0.0, float(CORES)])
def test_a_model_loaded_without_threads_runs_what_the_machine_leaves_free(
    smollm2_q4_1: Path, monkeypatch: pytest.MonkeyPatch, busy: float
) -> None:
    monkeypatch.setattr("localspec.backends.llamacpp.backend.busy_cores", lambda: busy)
    backend = load_backend("llamacpp", str(smollm2_q4_1), n_ctx=256)
    try:
        expected = default_threads(physical_cores(), CORES, busy)
        assert backend.capabilities.extra["threads"] == str(expected)
    finally:
        backend.close()


def test_oversubscription_is_more_load_than_cores_with_threads_that_wait_on_each_other(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(contention, "load_average", lambda: CORES + 3.0)
    assert "oversubscribed" in (oversubscribed(2) or "")
    assert oversubscribed(1) is None  # one thread waits for no other

    monkeypatch.setattr(contention, "load_average", lambda: CORES - 0.5)
    assert oversubscribed(2) is None


@pytest.fixture(scope="module")
def two_threads(smollm2_q4_1: Path) -> Iterator[Backend]:
    backend = load_backend("llamacpp", str(smollm2_q4_1), n_ctx=256, threads=2)
    yield backend
    backend.close()


@pytest.mark.model
def test_a_request_on_an_oversubscribed_machine_says_so_in_its_stats(
    two_threads: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = runtime_for(two_threads, None, strategy="none", calibrate=False)
    monkeypatch.setattr(contention, "load_average", lambda: CORES + 3.0)
    crowded = runtime.generate("Hello", max_tokens=2, temperature=0).stats.notices
    monkeypatch.setattr(contention, "load_average", lambda: 0.0)
    quiet = runtime.generate("Hello", max_tokens=2, temperature=0).stats.notices

    assert any("oversubscribed" in n and "threads=1" in n for n in crowded)
    assert not any("oversubscribed" in n for n in quiet)


@pytest.mark.model
def test_run_warns_on_an_oversubscribed_machine_naming_its_flag(
    smollm2_q4_1: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setattr(contention, "load_average", lambda: CORES + 3.0)
    argv = ["run", "-m", str(smollm2_q4_1), "--threads", "2", "--ctx", "256", "--max-tokens", "2", "-t", "0", "hi"]

    assert main([*argv, "--strategy", "none"]) == 0

    err = capsys.readouterr().err
    assert "localspec: note: the machine is oversubscribed" in err and "pass --threads 1" in err
