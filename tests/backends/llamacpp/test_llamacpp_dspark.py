"""A DSpark drafter proposing blocks for its target on llama.cpp (strategy dspark).

The drafters are tiny ones written here (localspec/testing/dspark_support.py): DFlash's echoing
backbone with a Markov head that is the target's own bigram, chained by llama.cpp inside the
block pass on the argmax before each position. On a dense llama close to a bigram the chain is
right for whole blocks and wrong where the context weighs in; on a hybrid qwen35 it is wrong
more often than right, so long blocks are rolled back and replayed. Both layouts are run:
anchor-first (the anchor's row guesses, DeepSpec's) and bonus-anchor (SpecForge's, as DFlash).
Whatever is drafted, the output must stay exactly the target's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp", reason="the llama.cpp backend tests need llama-cpp-python")

from test_llamacpp_sampling import P_FLOOR, SAMPLING, chi_square_p_value, exact_first_two, sample_first_two, worst_cells

import localspec
from localspec.api import Runtime, runtime_for
from localspec.backends.llamacpp.backend import LlamaCppBackend
from localspec.cli.main import main
from localspec.control.policy import AdaptiveDraftLength
from localspec.core.sampling import SamplingConfig
from localspec.testing.dflash_support import DFlashSpec, write_dflash_gguf
from localspec.testing.dspark_support import DSparkSpec, write_dspark_gguf
from localspec.testing.gguf_writer import HybridSpec, Spec, write_gguf, write_qwen35_gguf

PROMPT = "the world and the world and the"
DENSE = Spec("llama", mix=0.02, head=1.0)  # close to a bigram: the Markov head's guesses often hold
HYBRID = HybridSpec()
BLOCK = 8


def backbone(layers: tuple[int, int]) -> DFlashSpec:
    return DFlashSpec(target_layers=layers, block_size=BLOCK)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    folder = tmp_path_factory.mktemp("dspark")
    dense = write_gguf(DENSE, folder / "llama.gguf")
    hybrid = write_qwen35_gguf(HYBRID, folder / "qwen35.gguf")

    def drafter(target: Path, name: str, layers: tuple[int, int], anchor: bool = True) -> Path:
        spec = DSparkSpec(backbone=backbone(layers), sample_from_anchor=anchor)
        return write_dspark_gguf(target, folder / name, spec)

    return {
        "dense": (dense, drafter(dense, "llama-dspark.gguf", (1, 2))),
        "dense, bonus anchor": (dense, drafter(dense, "llama-dspark-bonus.gguf", (1, 2), anchor=False)),
        "hybrid": (hybrid, drafter(hybrid, "qwen35-dspark.gguf", (1, 3))),
        # The same backbone without the Markov head: a DFlash drafter.
        "dense dflash": (dense, write_dflash_gguf(dense, folder / "llama-dflash.gguf", backbone((1, 2)))),
    }


def dspark_runtime(target: LlamaCppBackend, drafter: Path, gamma: int) -> Runtime:
    block = target.dspark_drafter(str(drafter))
    return runtime_for(target, strategy="dspark", block=block, draft_tokens=gamma, calibrate=False)


def plain_tokens(target: LlamaCppBackend, prompt: str | list[int], n: int) -> list[int]:
    return runtime_for(target, strategy="none").generate(prompt=prompt, max_tokens=n, temperature=0).tokens


@pytest.mark.parametrize("kind", ["dense", "dense, bonus anchor", "hybrid"])
@pytest.mark.parametrize("gamma", [3, BLOCK])
def test_greedy_dspark_drafting_reproduces_plain_decoding(files, opened, kind: str, gamma: int) -> None:
    target_path, drafter = files[kind]
    target = opened(target_path)
    plain = plain_tokens(target, PROMPT, 60)
    spec = dspark_runtime(target, drafter, gamma).generate(prompt=PROMPT, max_tokens=60, temperature=0)
    assert spec.tokens == plain
    assert spec.stats.drafted > spec.stats.accepted > 0  # blocks kept and blocks cut


def test_an_anchor_first_block_guesses_as_many_tokens_as_it_has_rows(files, opened) -> None:
    """DeepSpec's layout: the anchor's own row guesses the next token, so a block of 8 rows
    drafts 8; the bonus-anchor layout drafts 7, as DFlash does."""
    target = opened(files["dense"][0])
    assert target.dspark_drafter(str(files["dense"][1])).most == BLOCK
    assert target.dspark_drafter(str(files["dense, bonus anchor"][1])).most == BLOCK - 1
    tokens = target.tokenize(PROMPT, add_special=True, parse_special=False)
    target.eval_block(tokens[:-1], "none")
    drafter = target.dspark_drafter(str(files["dense"][1]))
    drafter.start(tokens)
    draft = drafter.propose(tokens, BLOCK, SamplingConfig(temperature=0.0), np.random.default_rng(0))
    assert len(draft.tokens) == BLOCK


def test_the_markov_head_is_what_agrees_with_a_bigram_like_target(files, opened) -> None:
    """The same backbone without its Markov head (a DFlash drafter) is kept far less often:
    llama.cpp applies the head in localspec's block pass, chained on each guess before."""
    target_path, dspark = files["dense"]
    target = opened(target_path)
    with_head = dspark_runtime(target, dspark, BLOCK).generate(prompt=PROMPT, max_tokens=80, temperature=0).stats
    block = target.dflash_drafter(str(files["dense dflash"][1]))
    runtime = runtime_for(target, strategy="dflash", block=block, draft_tokens=BLOCK - 1, calibrate=False)
    without = runtime.generate(prompt=PROMPT, max_tokens=80, temperature=0).stats
    assert with_head.accepted / with_head.drafted > 0.6
    assert with_head.accepted / with_head.drafted > 2 * without.accepted / max(without.drafted, 1)


# Where the greedy text is in a run, so a block's first two guesses are sometimes both kept.
@pytest.mark.parametrize(("kind", "into_run"), [("dense", 24), ("hybrid", 50)])
def test_dspark_sampling_follows_the_targets_law(files, opened, kind: str, into_run: int) -> None:
    target_path, drafter = files[kind]
    target = opened(target_path)
    runtime = dspark_runtime(target, drafter, 2)
    start = runtime.prompt_tokens(PROMPT)
    prompt = start + plain_tokens(target, start, into_run)
    law = exact_first_two(target, prompt, SamplingConfig(**SAMPLING))
    samples = sample_first_two(runtime, prompt, n=400)
    assert samples.cut_drafts > 0 and samples.whole_drafts > 0, samples.summary(law)
    p = chi_square_p_value(samples.counts, law)
    assert p > P_FLOOR, worst_cells(samples.counts, law)


def test_strategy_dspark_loads_its_file_prices_a_block_as_one_pass_and_stays_exact(files) -> None:
    target_path, drafter = files["hybrid"]
    runtime = localspec.load(model=str(target_path), draft_model=str(drafter), strategy="dspark", n_ctx=256, threads=1)
    try:
        policy = runtime.policy
        assert isinstance(policy, AdaptiveDraftLength) and runtime.label == "dspark"
        assert policy.draft_seconds_per_pass > 0 and policy.draft_seconds_per_token == 0
        with localspec.load(model=str(target_path), n_ctx=256, threads=1, strategy="none") as plain:
            expected = plain.generate(prompt=PROMPT, max_tokens=40, temperature=0).tokens
        assert runtime.generate(prompt=PROMPT, max_tokens=40, temperature=0).tokens == expected
    finally:
        runtime.close()


def test_the_cli_runs_dspark_as_plain_decoding_writes(files, capsys) -> None:
    target_path, drafter = files["dense"]
    args = ["run", "-m", str(target_path), "-t", "0", "-n", "30", "--raw", PROMPT]
    assert main([*args[:1], "--strategy", "none", *args[1:]]) == 0
    plain = capsys.readouterr().out
    assert main([*args[:1], "--strategy", "dspark", "--draft-model", str(drafter), *args[1:]]) == 0
    assert capsys.readouterr().out == plain


@pytest.mark.parametrize(
    ("strategy", "file", "said"),
    [
        ("dspark", "dense dflash", "run it with --strategy dflash"),  # no Markov head
        ("dflash", "dense", "run it with --strategy dspark"),  # a Markov head
        ("dspark", "target", "not a DSpark drafter"),
    ],
)
def test_a_file_of_another_kind_is_refused_with_the_strategy_that_runs_it(
    files, capsys, strategy: str, file: str, said: str
) -> None:
    target_path = files["dense"][0]
    drafter = target_path if file == "target" else files[file][1]
    code = main(["run", "-m", str(target_path), "--strategy", strategy, "--draft-model", str(drafter), "hi"])
    err = capsys.readouterr().err
    assert code != 0 and said in err and "Traceback" not in err


def test_dspark_without_a_drafter_file_says_to_give_one(files, capsys) -> None:
    code = main(["run", "-m", str(files["dense"][0]), "--strategy", "dspark", "hi"])
    err = capsys.readouterr().err
    assert code != 0 and "DSpark drafter" in err and "--draft-model" in err and "Traceback" not in err


def test_a_dspark_drafter_made_for_deeper_layers_is_refused_with_what_fits(files, tmp_path: Path, capsys) -> None:
    target_path = files["dense"][0]
    deep = write_dspark_gguf(target_path, tmp_path / "deep.gguf", DSparkSpec(backbone=backbone((1, 7))))
    code = main(["run", "-m", str(target_path), "--strategy", "dspark", "--draft-model", str(deep), "hi"])
    err = capsys.readouterr().err
    assert code != 0 and "layer 7" in err and "DSpark drafter" in err and "Traceback" not in err
