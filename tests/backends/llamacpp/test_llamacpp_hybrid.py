"""Hybrid targets on llama.cpp: Qwen3.5's Gated DeltaNet (recurrent) layers beside attention.

Recurrent state cannot be cut at a position, so a rejected draft is taken back through
llama.cpp's per-token snapshots of the last decode, or a copy of the state plus a replay
(backends/llamacpp/backend.py, RecurrentRollback). Each path must leave the model exactly where a
clean decode of the kept tokens leaves it, and every strategy must stay lossless on top.
The models are tiny random-weight qwen35 GGUFs the tests write (localspec/testing/gguf_writer.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp", reason="the llama.cpp backend tests need llama-cpp-python")

from test_llamacpp_sampling import (
    P_FLOOR,
    SAMPLING,
    chi_square_p_value,
    exact_first_two,
    sample_first_two,
    worst_cells,
)

import localspec
from localspec.api import runtime_for
from localspec.backends.llamacpp import library
from localspec.backends.llamacpp.backend import LlamaCppBackend
from localspec.cli.main import main
from localspec.core.protocol import Backend
from localspec.core.sampling import SamplingConfig
from localspec.testing.gguf_writer import HybridSpec, write_qwen35_gguf

TEXT = [119, 260, 35, 122, 114, 117, 111, 103, 263, 113, 103, 261]
LOOPING = "the world and the world and the"  # the tiny model's greedy text falls into loops


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """hybrid(**spec fields) -> the path of that tiny qwen35 GGUF, written once."""
    folder = tmp_path_factory.mktemp("hybrids")
    made: dict[HybridSpec, Path] = {}

    def get(**fields: object) -> Path:
        spec = HybridSpec(**fields)  # type: ignore[arg-type]
        if spec not in made:
            made[spec] = write_qwen35_gguf(spec, folder / f"qwen35-{len(made)}.gguf")
        return made[spec]

    return get


# Rows a pass computed in other blocks than the clean pass's agree to 1e-4 on the CPU. On a GPU
# device whose load check found blocks parting from one-token passes (device_check.py) they
# differ by its kernels' rounding (2e-2 on lavapipe, logits up to 15); a wrong recurrent state
# differs by the logits' own scale.
DEVICE_ATOL = 0.1


def atol(model: LlamaCppBackend, block: int = 5) -> float:
    rows = model.capabilities.exactness.rows
    return 1e-4 if model.capabilities.device != "gpu" or rows is None or rows >= block else DEVICE_ATOL


def clean_logits(load: Callable[..., LlamaCppBackend], path: Path, tokens: list[int], rows: int) -> np.ndarray:
    """The last `rows` rows of a fresh model's pass over tokens: where no rollback happened."""
    return load(path).eval_block(tokens, "all")[-rows:].copy()


@pytest.mark.parametrize("snapshots", [16, 0], ids=["llama.cpp-snapshots", "state-copies"])
def test_a_rejected_draft_leaves_a_hybrid_where_a_clean_decode_of_the_kept_tokens_does(
    hybrid, opened, snapshots: int
) -> None:
    path = hybrid()
    model = opened(path, recurrent_snapshots=snapshots)
    assert model._recurrent is not None and model._recurrent.snapshots == snapshots
    model.eval_block(TEXT[:8], "none")
    for _ in range(3):  # verify blocks, each with rejected tokens taken back
        kept = model.n_past + 2
        model.eval_block([40, 41, 42, 43, 44], "all")
        model.rollback(kept)
        after = model.eval_block([7, 8], "all").copy()
        np.testing.assert_allclose(after, clean_logits(opened, path, list(model.cached_tokens()), 2), atol=atol(model))


def test_llama_cpps_snapshots_take_back_a_verify_block_without_copying_state(hybrid, opened) -> None:
    model = opened(hybrid())
    model.eval_block(TEXT[:8], "none")
    model.eval_block([40, 41, 42, 43], "all")
    model.rollback(9)
    model.eval_block([5], "all")
    assert model._recurrent is not None and model._recurrent._copy is None  # no copy was ever needed


@pytest.mark.parametrize("snapshots", [16, 0], ids=["llama.cpp-snapshots", "state-copies"])
def test_a_hybrid_drafter_takes_back_drafts_made_one_token_at_a_time(hybrid, opened, snapshots: int) -> None:
    path = hybrid()
    drafter = opened(path, recurrent_snapshots=snapshots)
    drafter.eval_block(TEXT[:8], "none")
    for accepted in (1, 0, 2):
        start = drafter.n_past
        for token in (50, 51, 52):  # a draft model proposes one token per pass
            drafter.eval_block([token], "last")
        drafter.rollback(start + accepted)
        after = drafter.eval_block([9, 10], "all").copy()
        np.testing.assert_allclose(
            after, clean_logits(opened, path, list(drafter.cached_tokens()), 2), atol=atol(drafter)
        )


def test_going_back_behind_every_copy_replays_the_kept_prefix(hybrid, opened) -> None:
    path = hybrid()
    model = opened(path)
    model.eval_block(TEXT, "none")
    model.rollback(3)  # another request that shares only the first 3 tokens
    after = model.eval_block([12, 13], "all").copy()
    np.testing.assert_allclose(after, clean_logits(opened, path, [*TEXT[:3], 12, 13], 2), atol=atol(model))


def test_a_copy_of_the_state_is_taken_where_a_rollback_can_use_it_not_before_every_plain_step(
    hybrid, opened, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Once a rollback needed a copy, the engine's bookkeeping rollback after every plain step
    # (it drops nothing) must not make a copy due: one a step cost a small hybrid 6 % of its
    # decoding. A drafter's run of one-token decodes, which a later rollback may cross, still
    # gets one, and the rollback it takes lands where a clean decode does.
    import llama_cpp

    copies: list[int] = []
    real = llama_cpp.llama_state_seq_get_data_ext
    monkeypatch.setattr(llama_cpp, "llama_state_seq_get_data_ext", lambda *a: copies.append(1) or real(*a))
    path = hybrid()
    model = opened(path)
    model.eval_block(TEXT, "none")
    model.rollback(3)  # behind every snapshot: copies start
    model.eval_block(TEXT[3:6], "none")

    def plain_steps(tokens: list[int]) -> None:  # a token, then the engine's rollback to where it is
        for token in tokens:
            model.eval_block([token], "last")
            model.rollback(model.n_past)

    plain_steps(TEXT[6:8])  # the first follows the prompt's block: two decodes, one copy at most
    before = len(copies)
    plain_steps(TEXT[8:12])
    assert len(copies) == before  # none for plain steps
    for token in (50, 51, 52):  # a drafter's run of one-token decodes, all kept ...
        model.eval_block([token], "last")
    model.rollback(model.n_past)
    start = model.n_past
    for token in (53, 54, 55):  # ... arms a copy where the next run starts
        model.eval_block([token], "last")
    assert len(copies) == before + 1
    model.rollback(start + 1)  # across three decodes: the copy, and one token replayed
    after = model.eval_block([9, 10], "all").copy()
    expected = clean_logits(opened, path, list(model.cached_tokens()), 2)
    # 1e-3: this context's rows, computed in five other blocks than the clean pass's, part by up
    # to 1.2e-4 on the float model; a state from the wrong position parts by the logits' scale.
    np.testing.assert_allclose(after, expected, atol=max(atol(model), 1e-3))


# -- every strategy stays lossless on a hybrid target --------------------------------------------


def drafters(
    path: Path, load: Callable[..., LlamaCppBackend], kind: str, target: LlamaCppBackend
) -> tuple[Backend | None, str]:
    if kind == "ngram":
        return None, "ngram"
    if kind == "qspec":  # the target requantized by llama.cpp's own call: a hybrid too
        return target.make_self_drafter("qspec", "Q4_0"), "draft"
    # A perturbed copy of the target: a hybrid drafter that agrees with it most of the time.
    return load(Path(str(path).replace(".gguf", "-drafter.gguf"))), "draft"


@pytest.mark.parametrize("kind", ["ngram", "draft", "qspec"])
@pytest.mark.parametrize("snapshots", [16, 0], ids=["llama.cpp-snapshots", "state-copies"])
def test_greedy_speculation_on_a_hybrid_target_reproduces_plain_decoding(
    hybrid, opened, tmp_path: Path, kind: str, snapshots: int
) -> None:
    path = hybrid()
    write_qwen35_gguf(HybridSpec(noise=0.3), Path(str(path).replace(".gguf", "-drafter.gguf")))
    target = opened(path, recurrent_snapshots=snapshots)
    plain = runtime_for(target, strategy="none").generate(prompt=LOOPING, max_tokens=80, temperature=0)
    drafter, strategy = drafters(path, opened, kind, target)
    runtime = runtime_for(target, drafter, strategy=strategy, draft_tokens=4, calibrate=False)
    spec = runtime.generate(prompt=LOOPING, max_tokens=80, temperature=0)
    assert spec.tokens == plain.tokens
    assert spec.stats.accepted > 0 and spec.stats.drafted > spec.stats.accepted  # kept and cut


@pytest.mark.parametrize("kind", ["ngram", "draft", "qspec"])
def test_speculative_sampling_on_a_hybrid_target_follows_the_targets_law(hybrid, opened, kind: str) -> None:
    path = hybrid()
    write_qwen35_gguf(HybridSpec(noise=0.3), Path(str(path).replace(".gguf", "-drafter.gguf")))
    target = opened(path)
    drafter, strategy = drafters(path, opened, kind, target)
    runtime = runtime_for(target, drafter, strategy=strategy, draft_tokens=2, calibrate=False)
    # The prompt ends inside the loop the model's greedy text falls into: lookup guesses it,
    # and the target at temperature 1 keeps the guess often but not always.
    start = runtime.prompt_tokens(LOOPING)
    prompt = start + runtime_for(target, strategy="none").generate(prompt=start, max_tokens=60, temperature=0).tokens
    law = exact_first_two(target, prompt, SamplingConfig(**SAMPLING))
    samples = sample_first_two(runtime, prompt, n=600)
    assert samples.whole_drafts > 0 and samples.cut_drafts > 0, "the drafts were not both kept and cut"
    p = chi_square_p_value(samples.counts, law)
    assert p > P_FLOOR, worst_cells(samples.counts, law)


def test_the_default_strategy_answers_on_a_hybrid_gguf_as_plain_decoding_does(hybrid, capsys) -> None:
    # What a new user met: `localspec run` on a qwen35 GGUF stopped mid-answer with
    # "llama_decode failed" as soon as lookup drafted.
    path = str(hybrid())
    outputs = []
    for strategy in ("none", "ngram", "auto"):
        code = main(["run", "-m", path, "--strategy", strategy, "-t", "0", "--max-tokens", "60", LOOPING])
        captured = capsys.readouterr()
        assert code == 0, captured.err
        outputs.append(captured.out)
    assert outputs[0] == outputs[1] == outputs[2]


def test_only_the_drafters_that_read_the_targets_passes_load_a_hybrid_with_snapshots(hybrid, tmp_path: Path) -> None:
    """llama.cpp writes a hybrid's recurrent-state snapshots with every pass. Plain decoding never
    takes a draft back, and n-gram lookup (auto's choice without an MTP head) takes its rare
    rejections back from state copies, so both ask for none, as llama-server does; a draft
    model and an MTP head keep them. The answers are the same either way."""
    path = str(hybrid())
    drafter = write_qwen35_gguf(HybridSpec(noise=0.3), tmp_path / "drafter.gguf")
    loads = {
        ("none", path, None): 0,
        ("ngram", path, None): 0,
        ("auto", path, None): 0,
        ("draft", path, str(drafter)): 4,
        ("auto", str(hybrid(nextn=1, mtp_echo=1.0)), None): 4,
    }
    answers = {}
    for (strategy, model, draft), snapshots in loads.items():
        runtime = localspec.load(model, strategy=strategy, draft_model=draft, threads=1)
        try:
            target = runtime.target
            assert isinstance(target, LlamaCppBackend) and target._recurrent is not None
            assert target._recurrent.snapshots == snapshots == int(library.llama.llama_n_rs_seq(target._ctx)), strategy
            if model == path:
                answers[strategy] = runtime.generate(
                    prompt=LOOPING, max_tokens=60, temperature=0, speculation={"strategy": "none"}
                ).tokens
        finally:
            runtime.close()
    assert len(set(map(tuple, answers.values()))) == 1 and len(answers["none"]) == 60


def test_n_gram_on_a_hybrid_takes_its_first_rejection_back_from_a_copy_not_from_the_start(
    hybrid, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without snapshots every rejection takes the copy path. Copies must be there from the
    # first draft on: a first rejection replayed from position 0 would evaluate the whole
    # conversation again.
    from localspec.backends.llamacpp.recurrent import RecurrentRollback

    replays: list[int | None] = []
    real = RecurrentRollback.rewind
    monkeypatch.setattr(
        RecurrentRollback, "rewind", lambda self, n, cached: replays.append(real(self, n, cached)) or replays[-1]
    )
    path = str(hybrid())
    plain = localspec.load(path, strategy="none", threads=1)
    try:
        expected = plain.generate(prompt=LOOPING, max_tokens=80, temperature=0)
    finally:
        plain.close()
    runtime = localspec.load(path, strategy="ngram", draft_tokens=4, threads=1)
    try:
        spec = runtime.generate(prompt=LOOPING, max_tokens=80, temperature=0)  # the load's first request
    finally:
        runtime.close()
    assert spec.tokens == expected.tokens
    assert spec.stats.accepted > 0 and spec.stats.drafted > spec.stats.accepted  # kept and cut
    taken_back = [at for at in replays if at is not None]
    assert taken_back and 0 not in taken_back, replays


def test_layer_skipping_on_a_hybrid_is_refused_with_what_works_instead(hybrid, capsys) -> None:
    code = main(["run", "-m", str(hybrid()), "--strategy", "layerskip", "-t", "0", "--max-tokens", "8", "hi"])
    err = capsys.readouterr().err
    assert code != 0
    assert "qwen35" in err and "--strategy ngram" in err and "Traceback" not in err


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_a_hybrid_on_a_backend_without_recurrent_layers_names_the_one_that_runs_it(
    hybrid, capsys, backend: str
) -> None:
    pytest.importorskip("torch" if backend == "torch" else "mlx")
    code = main(["run", "-m", str(hybrid()), "--backend", backend, "-t", "0", "--max-tokens", "8", "hi"])
    err = capsys.readouterr().err
    assert code != 0
    assert "qwen35" in err and "llamacpp" in err and "Traceback" not in err
