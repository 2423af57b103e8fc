"""A DFlash drafter proposing blocks for its target on llama.cpp (strategy dflash).

The drafters are tiny echoing ones (localspec/testing/dflash_support.py): along a run of one token they are
right for the whole block, where it ends they are wrong from there on, so steps keep part of
a block and roll the rest back. The targets are a dense llama and a hybrid qwen35, whose long
rejections go beyond its snapshots and replay the kept tokens. Whatever is drafted, the
output must stay exactly the target's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp", reason="the llama.cpp backend tests need llama-cpp-python")

from test_llamacpp_sampling import P_FLOOR, SAMPLING, chi_square_p_value, exact_first_two, sample_first_two, worst_cells

import localspec
from localspec.api import Runtime, TextDelta, runtime_for
from localspec.backends.llamacpp.backend import LlamaCppBackend
from localspec.cli.main import main
from localspec.control.policy import AdaptiveDraftLength
from localspec.core.errors import ModelLoadError
from localspec.core.sampling import SamplingConfig
from localspec.core.stats import Step
from localspec.testing.dflash_support import DFlashSpec, write_dflash_gguf
from localspec.testing.gguf_writer import HybridSpec, Spec, write_gguf, write_qwen35_gguf

PROMPT = "the world and the world and the"
# Runs of one token with changes between them (dense), and a stretch of new tokens before a
# run (hybrid): both kinds of step, kept blocks and cut ones.
DENSE = Spec("llama", embed_scale=0.05, seed=1)
HYBRID = HybridSpec()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    folder = tmp_path_factory.mktemp("dflash")
    dense = write_gguf(DENSE, folder / "llama.gguf")
    hybrid = write_qwen35_gguf(HYBRID, folder / "qwen35.gguf")
    return {
        "dense": (dense, write_dflash_gguf(dense, folder / "llama-dflash.gguf", DFlashSpec(target_layers=(1, 2)))),
        "hybrid": (hybrid, write_dflash_gguf(hybrid, folder / "qwen35-dflash.gguf", DFlashSpec(target_layers=(1, 3)))),
    }


def dflash_runtime(target: LlamaCppBackend, drafter: Path, gamma: int) -> Runtime:
    block = target.dflash_drafter(str(drafter))
    return runtime_for(target, strategy="dflash", block=block, draft_tokens=gamma, calibrate=False)


def steps_of(runtime: Runtime, max_tokens: int) -> tuple[list[int], list[Step]]:
    tokens: list[int] = []
    steps: list[Step] = []
    with runtime.stream(PROMPT, max_tokens=max_tokens, temperature=0) as stream:
        for event in stream:
            if isinstance(event, TextDelta) and event.step is not None:
                steps.append(event.step)
                tokens.extend(event.step.tokens)
    return tokens, steps


@pytest.mark.parametrize("kind", ["dense", "hybrid"])
@pytest.mark.parametrize("gamma", [3, 15])
def test_greedy_dflash_drafting_reproduces_plain_decoding(files, opened, kind: str, gamma: int) -> None:
    target_path, drafter = files[kind]
    target = opened(target_path)
    plain = runtime_for(target, strategy="none").generate(prompt=PROMPT, max_tokens=60, temperature=0)
    spec = dflash_runtime(target, drafter, gamma).generate(prompt=PROMPT, max_tokens=60, temperature=0)
    assert spec.tokens == plain.tokens
    assert spec.stats.drafted > spec.stats.accepted > 0  # blocks kept and blocks cut


def test_a_long_rejected_block_on_a_hybrid_replays_and_stays_exact(files, opened) -> None:
    target_path, drafter = files["hybrid"]
    target = opened(target_path)
    beyond = target.capabilities.replays_beyond
    assert beyond is not None and beyond < 15
    plain = runtime_for(target, strategy="none").generate(prompt=PROMPT, max_tokens=40, temperature=0)
    tokens, steps = steps_of(dflash_runtime(target, drafter, 15), 40)
    assert tokens == plain.tokens
    assert any(s.drafted - s.accepted > beyond for s in steps), "no block was rejected past the snapshots"
    assert any(s.accepted > 0 for s in steps)


# Where the greedy text is in a run, so a block's first two guesses are sometimes both kept.
@pytest.mark.parametrize(("kind", "into_run"), [("dense", 24), ("hybrid", 50)])
def test_dflash_sampling_follows_the_targets_law(files, opened, kind: str, into_run: int) -> None:
    target_path, drafter = files[kind]
    target = opened(target_path)
    runtime = dflash_runtime(target, drafter, 2)
    start = runtime.prompt_tokens(PROMPT)
    prompt = (
        start + runtime_for(target, strategy="none").generate(prompt=start, max_tokens=into_run, temperature=0).tokens
    )
    law = exact_first_two(target, prompt, SamplingConfig(**SAMPLING))
    samples = sample_first_two(runtime, prompt, n=400)
    assert samples.cut_drafts > 0 and samples.whole_drafts > 0, samples.summary(law)
    p = chi_square_p_value(samples.counts, law)
    assert p > P_FLOOR, worst_cells(samples.counts, law)


def test_the_drafters_cache_holds_what_a_clean_injection_would(files, opened) -> None:
    """After steps that injected, drafted, rejected and replayed, a block's laws are those of
    a drafter that read the same text once."""
    target_path, drafter_path = files["hybrid"]
    target = opened(target_path)
    runtime = dflash_runtime(target, drafter_path, 15)
    result = runtime.generate(prompt=PROMPT, max_tokens=30, temperature=0)
    context = runtime.prompt_tokens(PROMPT) + result.tokens
    cfg, rng = SamplingConfig(**SAMPLING), np.random.default_rng(0)

    def block_laws(target: LlamaCppBackend, drafter: object) -> np.ndarray:
        target.rollback(0)
        target.eval_block(context[:-1], "none")
        draft = drafter.propose(context, 15, cfg, rng)  # type: ignore[attr-defined]
        return np.array([d.prob(context[-1]) for d in draft.dists])

    walked = block_laws(target, runtime.drafter)
    fresh_target = opened(target_path)
    fresh = fresh_target.dflash_drafter(str(drafter_path))
    fresh.start(context, warm=False)
    np.testing.assert_allclose(walked, block_laws(fresh_target, fresh), atol=1e-5)


def test_auto_prices_the_block_as_one_pass_and_stays_exact(files) -> None:
    target_path, drafter = files["hybrid"]
    runtime = localspec.load(model=str(target_path), draft_model=str(drafter), strategy="dflash", n_ctx=256, threads=1)
    try:
        policy = runtime.policy
        assert isinstance(policy, AdaptiveDraftLength) and runtime.label == "dflash"
        assert policy.draft_seconds_per_pass > 0 and policy.draft_seconds_per_token == 0
        assert policy.replays_beyond == runtime.target.capabilities.replays_beyond
        assert runtime.engine.lookup is not None  # n-gram lookup still drafts beside the blocks
        with localspec.load(model=str(target_path), n_ctx=256, threads=1, strategy="none") as plain:
            expected = plain.generate(prompt=PROMPT, max_tokens=40, temperature=0).tokens
        assert runtime.generate(prompt=PROMPT, max_tokens=40, temperature=0).tokens == expected
    finally:
        runtime.close()


def test_a_drafter_made_for_deeper_layers_is_refused_with_what_fits(files, tmp_path: Path, capsys) -> None:
    target_path, _ = files["dense"]
    deep = write_dflash_gguf(target_path, tmp_path / "deep.gguf", DFlashSpec(target_layers=(1, 7)))
    code = main(["run", "-m", str(target_path), "--strategy", "dflash", "--draft-model", str(deep), "-t", "0", "hi"])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err
    assert "layer 7" in err and "--strategy ngram" in err


def test_a_drafter_of_another_width_is_refused(files, tmp_path: Path, opened) -> None:
    narrow_target = write_gguf(Spec("llama", hidden=32, heads=2, kv_heads=1), tmp_path / "narrow.gguf")
    narrow = write_dflash_gguf(narrow_target, tmp_path / "narrow-dflash.gguf", DFlashSpec(heads=2))
    target = opened(files["dense"][0])
    with pytest.raises(ModelLoadError, match="32 wide"):
        target.dflash_drafter(str(narrow))
    assert runtime_for(target, strategy="none").generate(prompt=PROMPT, max_tokens=4, temperature=0).tokens


def test_a_file_that_is_not_a_dflash_drafter_is_refused(files, capsys) -> None:
    target_path, _ = files["dense"]
    code = main(["run", "-m", str(target_path), "--strategy", "dflash", "--draft-model", str(target_path), "hi"])
    err = capsys.readouterr().err
    assert code != 0 and "not a DFlash drafter" in err and "Traceback" not in err
    code = main(["run", "-m", str(target_path), "--strategy", "dflash", "hi"])
    err = capsys.readouterr().err
    assert code != 0 and "--draft-model" in err and "Traceback" not in err
