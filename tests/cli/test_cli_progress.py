"""Long steps say what they do and how far they have got (stderr, so stdout stays the answer);
doctor and bench explain their figures and say when a busy machine made them unreliable.
The busy machine is made by the test: CPU hogs, one more than the cores, ended with it."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from localspec.cli import doctor
from localspec.cli.main import main
from localspec.cli.run import first_token_announced
from localspec.common.progress import Steps, announced, report, reporting
from localspec.control import contention
from localspec.control.hardware import cpu_probe
from localspec.testing.gguf_writer import Spec, write_gguf
from localspec.tooling.bench import BenchRow, format_summary, format_table
from localspec.tui.live_stats import Figures, format_figures

HOG_SECONDS = 120  # each hog ends by itself after this, should the test be killed


@pytest.fixture
def busy_machine() -> Iterator[None]:
    hog = f"import time\nend = time.monotonic() + {HOG_SECONDS}\nwhile time.monotonic() < end: pass"
    hogs = [subprocess.Popen([sys.executable, "-c", hog]) for _ in range(2 * (os.cpu_count() or 1) + 1)]
    try:
        yield
    finally:
        for p in hogs:
            p.kill()
        for p in hogs:
            p.wait()


@pytest.fixture
def quick_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """doctor's probe of the machine, on small buffers: the test is about what doctor says."""
    monkeypatch.setattr(doctor, "probe", lambda refresh=False: cpu_probe())


def test_steps_count_in_a_log_one_line_each() -> None:
    log = io.StringIO()
    with Steps("localspec doctor", total=2, stream=log) as steps:
        steps.step("measuring this machine")
        steps.step("timing the model's passes")
    assert log.getvalue().splitlines() == [
        "localspec doctor [1/2] measuring this machine…",
        "localspec doctor [2/2] timing the model's passes…",
    ]


def test_a_slow_step_reports_how_far_it_has_got_once_announced() -> None:
    said: list[str] = []
    seen = threading.Event()

    def announce(text: str) -> None:
        said.append(text)
        seen.set()

    with announced("deriving the qspec drafter", announce, after=0.0):
        assert seen.wait(30)
        report("candidate 1 of 2 (Q4_0)")
    assert said == ["deriving the qspec drafter", "deriving the qspec drafter: candidate 1 of 2 (Q4_0)"]


def test_run_says_what_it_waits_for_before_the_first_token() -> None:
    log = io.StringIO()
    progress = Steps("localspec:", stream=log)

    def slow_first() -> Iterator[str]:
        deadline = threading.Event()
        while "reading the prompt" not in log.getvalue():  # the first token waits for the announcement
            deadline.wait(0.05)
        yield "first"
        yield "second"

    assert list(first_token_announced(slow_first(), progress)) == ["first", "second"]  # type: ignore[arg-type]
    assert log.getvalue() == "localspec: reading the prompt, then writing the first words…\n"


def test_deriving_a_drafter_says_it_is_writing_a_copy(tmp_path: Path) -> None:
    from localspec.backends.llamacpp.copies import quantize

    source = write_gguf(Spec("llama"), tmp_path / "tiny.gguf")
    said: list[str] = []
    with reporting(said.append):
        quantize(source, tmp_path / "tiny.Q8_0.gguf", "Q8_0")
    assert said[0] == "writing a Q8_0 copy of the model"


def test_doctor_counts_its_steps_on_stderr_and_explains_gamma(quick_probe: None, capsys) -> None:
    assert main(["doctor", "--backend", "reference", "--model", "reference"]) == 0
    captured = capsys.readouterr()
    assert "localspec doctor [2/4] measuring this machine" in captured.err
    assert "localspec doctor [4/4] timing the model's passes" in captured.err
    assert "localspec doctor" not in captured.out
    out = captured.out
    assert "γ (gamma) is the draft length" in out
    assert "free drafter (one whose guesses cost nothing" in out
    assert "behind 512 tokens of context" in out


def test_doctor_comments_on_a_measurement_far_from_its_prediction() -> None:
    [note] = doctor.doctor_warnings(None, 0.364, 0.364, 0.0105)
    assert "measured 35x the prediction" in note and "lower bound" in note


def test_doctor_calls_a_noisy_single_step_unreliable() -> None:
    [note] = doctor.doctor_warnings(None, 0.010, 0.030, 0.010)
    assert "unreliable" in note and "10.0 ms one way and 30.0 ms the other" in note


def test_a_busy_machine_is_detected_and_doctor_says_its_figures_are_unreliable(
    busy_machine: None, quick_probe: None, capsys
) -> None:
    assert contention.sample().busy
    assert main(["doctor", "--backend", "reference", "--model", "reference", "--refresh"]) == 0
    out = capsys.readouterr().out
    assert "note: the machine was busy while this was measured" in out and "unreliable" in out


def test_bench_under_a_busy_machine_warns_its_figures_are_unreliable(busy_machine: None, capsys) -> None:
    assert main(["bench", "--backend", "reference", "--model", "reference", "--only", "chat", "-n", "4"]) == 0
    captured = capsys.readouterr()
    assert "warning: the machine was busy" in captured.out
    assert "localspec bench [3/3] prompt 'chat', plain decoding, run 1" in captured.err


def _row(plain: float, spec: float, speedup: float) -> BenchRow:
    return BenchRow("chat", "ngram", plain, spec, speedup, 0.5, 1.5, 2.0, 40, 40, 100.0)


def test_bench_never_prints_a_speedup_its_own_columns_contradict() -> None:
    contradicted, fine = _row(1.6, 2.5, 0.51), _row(10.0, 15.0, 1.48)
    table = format_table([contradicted, fine])
    assert "0.51x" not in table and "noise" in table and "1.48x" in table
    summary = format_summary([contradicted, fine])
    assert "ngram: 1.48x plain decoding (geometric mean of 1 prompts" in summary and "1 within the noise" in summary
    assert "the same as plain decoding within the noise" in format_summary([contradicted])


def test_the_chat_does_not_claim_a_slowdown_from_noise() -> None:
    noisy = Figures(40, 2.0, 0.3, 1.1, 2.0, 0.41, "ngram", final=True)
    assert "×0.41" not in format_figures(noisy) and "≈ plain" in format_figures(noisy)
    assert "est. ×1.50 vs plain" in format_figures(Figures(40, 2.0, 0.6, 2.0, 3.0, 1.5, "ngram", final=True))
