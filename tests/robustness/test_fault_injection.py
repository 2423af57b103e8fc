"""Fault injection, kept small for CI: a few Ctrl+C points per backend at random calls of
prefill and decode, cancelled and abandoned streams. LOCALSPEC_FAULT_CASES raises the
counts (benchmarks/fault_injection.py runs the full ones and prints the table)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from backends.reference import ReferenceBackend
from localspec.api import Runtime, runtime_for
from localspec.core.protocol import Backend
from localspec.testing.fault_support import (
    SHORT_PROMPT,
    Injector,
    Tally,
    abandoning_threads,
    answer,
    cancelled_streams,
    interrupts,
    killed_pulls,
    llamacpp_injector,
    reference_injector,
    torch_injector,
)

CASES = int(os.environ.get("LOCALSPEC_FAULT_CASES", "4"))


def assert_clean(tally: Tally) -> None:
    assert tally.tried > 0 and not tally.failures, tally.failures


def reference_runtime(strategy: str = "ngram") -> Runtime:
    return runtime_for(ReferenceBackend(seed=5, n_ctx=2048), None, strategy=strategy, draft_tokens=3, calibrate=False)


@pytest.mark.parametrize("strategy", ["none", "ngram"])
def test_reference_survives_interrupts_anywhere(strategy: str) -> None:
    expected = answer(reference_runtime(strategy))
    assert_clean(interrupts(reference_runtime(strategy), expected, reference_injector, CASES, 1, "reference"))


def test_reference_survives_cancelled_and_abandoned_streams() -> None:
    expected = answer(reference_runtime())
    assert_clean(cancelled_streams(reference_runtime(), expected, 5 * CASES, 2, "reference streams"))
    assert_clean(abandoning_threads(reference_runtime(), expected, CASES, 3, "reference threads"))


def llamacpp_runtime(target: Backend, draft: Backend | None) -> Runtime:
    strategy = "draft" if draft is not None else "ngram"
    return runtime_for(target, draft, strategy=strategy, draft_tokens=3, calibrate=False)


@pytest.fixture(scope="module")
def llamacpp_answer(smollm2_q4_1: Path, load_model: Callable[..., Backend]) -> str:
    """The greedy answer of a fresh runtime that nothing interrupted: what every case must give."""
    return answer(llamacpp_runtime(load_model(smollm2_q4_1, n_ctx=1024), None))


@pytest.mark.model
@pytest.mark.parametrize("with_draft", [False, True], ids=["ngram", "draft"])
def test_llamacpp_survives_interrupts_in_prefill_and_decode(
    smollm2_q4_1: Path,
    derived_models: Any,
    load_model: Callable[..., Backend],
    llamacpp_answer: str,
    with_draft: bool,
) -> None:
    target = load_model(smollm2_q4_1, n_ctx=1024)
    draft = load_model(derived_models["Q8_0"], n_ctx=1024) if with_draft else None
    # The drafter's own calls are interrupted too: llama_decode serves both models.
    rt = llamacpp_runtime(target, draft)
    assert_clean(interrupts(rt, llamacpp_answer, llamacpp_injector, CASES, 4, "llama.cpp"))


@pytest.mark.model
def test_llamacpp_survives_cancelled_and_abandoned_streams(
    smollm2_q4_1: Path, load_model: Callable[..., Backend], llamacpp_answer: str
) -> None:
    rt = llamacpp_runtime(load_model(smollm2_q4_1, n_ctx=1024), None)
    expected = llamacpp_answer
    assert_clean(cancelled_streams(rt, expected, 3 * CASES, 5, "llama.cpp streams"))
    assert_clean(abandoning_threads(rt, expected, CASES, 6, "llama.cpp threads"))


def test_torch_survives_interrupts_in_prefill_and_decode(models: Callable[[object], Path]) -> None:
    pytest.importorskip("torch")
    from backends.torch.backend import TorchBackend
    from localspec.testing.gguf_writer import Spec

    path = str(models(Spec("llama")))

    def runtime() -> Runtime:
        backend = TorchBackend(path, n_ctx=2048, threads=1)  # type: ignore[arg-type]
        return runtime_for(backend, None, strategy="ngram", draft_tokens=3, calibrate=False)

    injector: Injector = torch_injector
    assert_clean(interrupts(runtime(), answer(runtime()), injector, CASES, 7, "torch", SHORT_PROMPT))


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_pulls_killed_mid_file_leave_nothing_and_a_rerun_finishes(tmp_path: Path) -> None:
    assert_clean(killed_pulls(min(CASES, 3), 9, tmp_path))


def test_the_hostile_environment_drivers_hold_at_small_counts() -> None:
    # The rows benchmarks/fault_injection.py counts for issue 33 (each class has its own tests
    # too): a pipe or device as the model, forged Host/Origin headers, a full or read-only disk.
    from localspec.testing.hostile_support import disk_writes, pipes_and_devices, rebinding

    for tally in (pipes_and_devices(None), rebinding(), disk_writes()):
        assert_clean(tally)


def test_the_issue_47_drivers_hold_at_small_counts() -> None:
    # The rows benchmarks/fault_injection.py counts for issue 47 (each class has its own tests
    # too): a template that loops without printing, a trickling hub, symlink loops as models.
    from localspec.testing.hostile_inputs_support import looping_templates, symlink_loops, trickling_hubs

    for tally in (looping_templates(1, 12), trickling_hubs(2, 13), symlink_loops(None)):
        assert_clean(tally)
