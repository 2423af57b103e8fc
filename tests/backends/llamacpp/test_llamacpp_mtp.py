"""A model's own MTP head drafting for it on llama.cpp (strategy mtp): Qwen3.5's nextn layer.

The tiny qwen35 GGUFs the tests write carry one random MTP block, so its guesses are poor but
its arithmetic is real: what matters here is that the head's cache always holds what a clean
pass over the accepted text would (its states re-read from the target), and that the output
stays exactly the target's."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("llama_cpp", reason="the llama.cpp backend tests need llama-cpp-python")

from head_support import assert_calibrated_as_users_run_it, assert_each_row_is_the_token_asked_for
from test_llamacpp_sampling import P_FLOOR, SAMPLING, chi_square_p_value, exact_first_two, sample_first_two, worst_cells

import localspec
from localspec.api import runtime_for
from localspec.backends.llamacpp.backend import LlamaCppBackend
from localspec.cli.main import main
from localspec.core.errors import InvalidRequestError
from localspec.core.sampling import SamplingConfig
from localspec.testing.gguf_writer import HybridSpec, write_qwen35_gguf

LOOPING = "the world and the world and the"


@pytest.fixture(scope="module")
def with_head(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_qwen35_gguf(HybridSpec(nextn=1, mtp_echo=1.0), tmp_path_factory.mktemp("mtp") / "qwen35-mtp.gguf")


def test_a_read_of_several_tokens_drafts_on_from_the_state_of_the_token_asked_for(tmp_path: Path, opened) -> None:
    # A random MTP block (not the echo head): its guesses depend on the state it drafts from.
    # Qwen3.5's MTP graph computes its states for every token before it picks the output rows.
    target = opened(write_qwen35_gguf(HybridSpec(nextn=1), tmp_path / "qwen35-mtp-random.gguf"))
    text = [119, 260, 35, 122, 114, 117, 111, 103, 263, 113, 103, 261, 40, 41]
    assert_each_row_is_the_token_asked_for(target, target.mtp_head(), text, 9, atol=1e-4)


def test_mtp_sampling_follows_the_targets_law(with_head, opened) -> None:
    target = opened(with_head)
    runtime = runtime_for(target, target.mtp_head(), strategy="draft", draft_tokens=2, calibrate=False)
    start = runtime.prompt_tokens(LOOPING)
    prompt = start + runtime_for(target, strategy="none").generate(prompt=start, max_tokens=60, temperature=0).tokens
    law = exact_first_two(target, prompt, SamplingConfig(**SAMPLING))
    samples = sample_first_two(runtime, prompt, n=600)
    assert samples.cut_drafts > 0, "no draft was ever rejected: the residual path went untested"
    p = chi_square_p_value(samples.counts, law)
    assert p > P_FLOOR, worst_cells(samples.counts, law)


def test_auto_drafts_with_the_head_a_gguf_ships(with_head) -> None:
    runtime = localspec.load(model=str(with_head), n_ctx=256)  # the default draft length, calibrated
    try:
        assert runtime.label == "mtp" and runtime.draft is not None
        assert_calibrated_as_users_run_it(runtime.target, runtime.draft, runtime.policy)
        plain = localspec.load(model=str(with_head), n_ctx=256, strategy="none")
        with plain:
            expected = plain.generate(prompt=LOOPING, max_tokens=40, temperature=0).tokens
        assert runtime.generate(prompt=LOOPING, max_tokens=40, temperature=0).tokens == expected
    finally:
        runtime.close()


def test_mtp_on_a_gguf_without_the_head_is_refused_with_what_to_use(tmp_path: Path, capsys) -> None:
    path = write_qwen35_gguf(HybridSpec(), tmp_path / "no-head.gguf")
    code = main(["run", "-m", str(path), "--strategy", "mtp", "-t", "0", "--max-tokens", "8", "hi"])
    err = capsys.readouterr().err
    assert code != 0
    assert "no MTP head" in err and "MTP-GGUF" in err and "Traceback" not in err
    model = LlamaCppBackend(str(path), n_ctx=64)
    try:
        with pytest.raises(InvalidRequestError):
            model.mtp_head()
    finally:
        model.close()


def test_mtp_on_another_backend_names_the_one_that_runs_it(tmp_path: Path, capsys) -> None:
    pytest.importorskip("torch")
    from localspec.testing.gguf_writer import Spec, write_gguf

    path = write_gguf(Spec("llama"), tmp_path / "llama.gguf")
    code = main(["run", "-m", str(path), "--backend", "torch", "--strategy", "mtp", "--max-tokens", "4", "hi"])
    err = capsys.readouterr().err
    assert code != 0 and "--backend llamacpp" in err and "Traceback" not in err


def test_verbose_says_why_a_head_that_never_drafted_stayed_idle(with_head, opened) -> None:
    from localspec.control.costs import CostCurve
    from localspec.control.factory import model_policy

    target = opened(with_head)
    policy = model_policy(CostCurve([0.010, 0.019, 0.027]), 0.008, agreement=0.2)
    runtime = runtime_for(target, target.mtp_head(), strategy="draft", calibrate=False, policy=policy)
    result = runtime.generate(prompt=LOOPING, max_tokens=8, temperature=0)
    assert result.stats.drafted == result.stats.lookup_drafted  # the head itself stayed idle
    note = runtime.idle_drafter_note(result.stats)
    assert note is not None and "1.90 single-token steps" in note and "0.80 of a step" in note
    busy = runtime_for(target, target.mtp_head(), strategy="draft", draft_tokens=3, calibrate=False)
    assert busy.idle_drafter_note(busy.generate(prompt=LOOPING, max_tokens=8, temperature=0).stats) is None
