"""An EAGLE-3 head drafting for its target on llama.cpp (strategy eagle3, backends/llamacpp/eagle3.py).

The heads the tests write (localspec/testing/eagle3_support.py) guess a near-bigram target's next token from
the token alone, so they are often right and sometimes wrong: the output must stay exactly
the target's either way, and the head's cache must hold what a clean pass over the accepted
text would (its states re-read through fc from the target's layers once verified)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp", reason="the llama.cpp backend tests need llama-cpp-python")

from head_support import assert_agreement_is_measured_as_it_drafts, assert_each_row_is_the_token_asked_for, blocks_atol
from test_llamacpp_sampling import P_FLOOR, SAMPLING, chi_square_p_value, exact_first_two, sample_first_two, worst_cells

import localspec
from localspec.api import runtime_for
from localspec.backends.llamacpp.backend import LlamaCppBackend
from localspec.cli.main import main
from localspec.core.acceptance import accept_greedy
from localspec.core.errors import InvalidRequestError, ModelLoadError
from localspec.core.sampling import SamplingConfig
from localspec.drafters.model import ModelDrafter
from localspec.testing.eagle3_support import HeadSpec, write_eagle3_gguf
from localspec.testing.gguf_writer import HybridSpec, Spec, write_gguf, write_qwen35_gguf

TARGET = Spec("llama", mix=0.02, head=1.0)  # close to a bigram model, with an output head of its own
TEXT = [119, 260, 35, 122, 114, 117, 111, 103, 263, 113, 103, 261, 40, 41]
PROMPT = "the world and the world and the"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("eagle3")
    return {
        "target": write_gguf(TARGET, folder / "target.gguf"),
        "head": write_eagle3_gguf(TARGET, HeadSpec(), folder / "eagle3-target.gguf"),
        # g weighs as much as the token: what the head reads from the target shows in its logits
        "heavy": write_eagle3_gguf(TARGET, HeadSpec(fc=3.0), folder / "eagle3-heavy.gguf"),
        # g weighs about as much as the token: right at the first position about half the time
        "middle": write_eagle3_gguf(TARGET, HeadSpec(fc=1.0), folder / "eagle3-middle.gguf"),
        # g reaches nothing: its guess is a function of the token it reads, at every position
        "token_only": write_eagle3_gguf(TARGET, HeadSpec(reads_g=False), folder / "eagle3-token-only.gguf"),
        "d2t": write_eagle3_gguf(TARGET, HeadSpec(draft_vocab=200), folder / "eagle3-d2t.gguf"),
    }


def test_the_head_reads_drafted_positions_again_with_the_targets_states_once_verified(files, opened) -> None:
    # A clean pass: the target decodes the text, the head reads it with the target's layers.
    target = opened(files["target"])
    head = target.eagle3_head(str(files["heavy"]))
    target.eval_block(TEXT, "none")
    clean = head.eval_block(TEXT, "all").copy()

    # The same text reached through a draft: 3 guesses on the head's own states, a verify
    # pass that keeps them all, and the head rolled back to the accepted text, moving on.
    target = opened(files["target"])
    head = target.eagle3_head(str(files["heavy"]))
    m = 8
    target.eval_block(TEXT[:m], "none")
    head.eval_block(TEXT[: m + 1], "last")
    drafted = [head.eval_block([token], "last").copy() for token in TEXT[m + 1 : m + 3]]
    target.eval_block(TEXT[m : m + 4], "all")
    head.rollback(m + 3)
    target.eval_block(TEXT[m + 4 :], "none")
    rest = head.eval_block(TEXT[m + 3 :], "all")
    np.testing.assert_allclose(rest, clean[m + 3 :], atol=blocks_atol(target, 1e-4, len(TEXT)))
    # and the guesses were made from its own states, not the target's (which it could not have had)
    assert not np.allclose(drafted[-1][-1], clean[m + 2], atol=1e-3)


@pytest.mark.parametrize("head", ["heavy", "token_only"])
def test_a_read_of_several_tokens_gives_the_row_of_the_token_asked_for(files, opened, head: str) -> None:
    # llama.cpp's eagle3 graph hands back the batch's first rows, whichever rows were flagged.
    target = opened(files["target"])
    assert_each_row_is_the_token_asked_for(target, target.eagle3_head(str(files[head])), TEXT, 9, atol=1e-4)


def test_each_draft_starts_from_the_last_accepted_token_not_the_first_of_its_read(files, opened) -> None:
    # The token-only head on a near-bigram target: right nearly everywhere the target follows
    # its bigram, so drafts are kept whole (the head then reads the last drafted token and the
    # target's next one in one pass) and sometimes cut. Draft lengths 1 and 3 in turn.
    target = opened(files["target"])
    drafter = ModelDrafter(target.eagle3_head(str(files["token_only"])), min_confidence=0)
    context = target.tokenize(PROMPT, add_special=True, parse_special=False)
    target.eval_block(context[:-1], "none")
    drafter.start(context)
    firsts: list[tuple[int, int]] = []  # (context length, first drafted token)
    after: list[str] = []  # what the draft before each became: "whole", "cut" (some kept) or "none kept"
    last = "none kept"
    for step in range(40):
        draft = drafter.propose(context, 1 + 2 * (step % 2), SamplingConfig(temperature=0.0), np.random.default_rng(0))
        firsts.append((len(context), draft.tokens[0]))
        after.append(last)
        past = target.n_past
        kept, bonus = accept_greedy(draft.tokens, target.eval_block([context[-1], *draft.tokens], "all"))
        context += [*draft.tokens[:kept], bonus]
        target.rollback(past + 1 + kept)
        drafter.commit(context, kept)
        last = "whole" if kept == len(draft.tokens) else "cut" if kept else "none kept"
    # What the head guesses at each of those positions in one clean pass over the accepted text.
    clean = opened(files["target"])
    clean.eval_block(context, "none")
    rows = clean.eagle3_head(str(files["token_only"])).eval_block(context, "all")
    top2 = np.sort(rows, axis=1)[:, -2:]
    clear = [(n, first) for n, first in firsts if top2[n - 1, 1] - top2[n - 1, 0] > 1e-3]  # no near-tie
    assert len(clear) > len(firsts) * 3 // 4
    assert [first for _, first in clear] == [int(np.argmax(rows[n - 1])) for n, _ in clear]
    # So the first position is accepted exactly where that guess is the target's next token.
    accepted = sum(context[n] == first for n, first in firsts)
    agreed = sum(context[n] == int(np.argmax(rows[n - 1])) for n, _ in firsts)
    assert accepted == agreed > len(firsts) * 3 // 4
    assert after.count("whole") > len(after) // 2, after  # mostly kept whole: the row read after them counts
    assert len(set(after)) > 1, "no draft was ever rejected: the head's rollback went untested"


@pytest.mark.parametrize(("head", "gamma"), [("middle", 1), ("head", 3), ("d2t", 3)])
def test_greedy_eagle3_drafting_reproduces_plain_decoding(files, opened, head: str, gamma: int) -> None:
    target = opened(files["target"])
    plain = runtime_for(target, strategy="none").generate(prompt=PROMPT, max_tokens=60, temperature=0)
    drafter = target.eagle3_head(str(files[head]))
    runtime = runtime_for(target, drafter, strategy="draft", draft_tokens=gamma, calibrate=False, label="eagle3")
    spec = runtime.generate(prompt=PROMPT, max_tokens=60, temperature=0)
    assert spec.tokens == plain.tokens
    drafted = spec.stats.drafted - spec.stats.lookup_drafted
    accepted = spec.stats.accepted - spec.stats.lookup_accepted
    assert drafted > accepted > drafted / 4, (drafted, accepted)  # often right, and some guesses cut


def test_a_smaller_draft_vocabulary_maps_onto_the_targets(files, opened) -> None:
    from localspec.testing.eagle3_support import head_tensors
    from localspec.testing.gguf_writer import bpe_vocab

    target = opened(files["target"])
    head = target.eagle3_head(str(files["d2t"]))
    target.eval_block(TEXT, "none")
    rows = head.eval_block(TEXT, "all")[1:]  # x_0 alone guesses nothing
    mapped = head_tensors(TARGET, HeadSpec(draft_vocab=200), len(bpe_vocab()[0]))["d2t"]
    assert np.isfinite(rows[:, mapped]).all()
    assert np.isneginf(np.delete(rows, mapped, axis=1)).all()  # tokens the head cannot name


def test_eagle3_sampling_follows_the_targets_law(files, opened) -> None:
    target = opened(files["target"])
    runtime = runtime_for(
        target, target.eagle3_head(str(files["head"])), strategy="draft", draft_tokens=2, calibrate=False
    )
    start = runtime.prompt_tokens(PROMPT)
    prompt = start + runtime_for(target, strategy="none").generate(prompt=start, max_tokens=30, temperature=0).tokens
    law = exact_first_two(target, prompt, SamplingConfig(**SAMPLING))
    samples = sample_first_two(runtime, prompt, n=600)
    assert samples.cut_drafts > 0, "no draft was ever rejected: the residual path went untested"
    assert samples.whole_drafts > 0, "no draft was ever kept whole: the acceptance path went untested"
    p = chi_square_p_value(samples.counts, law)
    assert p > P_FLOOR, worst_cells(samples.counts, law)


def test_the_agreement_check_reads_the_head_with_the_targets_layers(files, opened) -> None:
    target = opened(files["target"])
    tokens = target.tokenize(PROMPT * 2, add_special=True, parse_special=False)
    assert_agreement_is_measured_as_it_drafts(target, target.eagle3_head(str(files["head"])), tokens)


def test_strategy_eagle3_loads_the_head_given_as_the_drafter(files) -> None:
    runtime = localspec.load(
        model=str(files["target"]),
        draft_model=str(files["head"]),
        strategy="eagle3",
        n_ctx=256,
        threads=1,
    )  # as a user runs it: the draft length chosen per step from this machine's calibrated costs
    with runtime:
        assert runtime.label == "eagle3" and runtime.draft is not None
        assert runtime.draft.info.architecture == "eagle3" and runtime.draft.info.n_layers == 1
        result = runtime.generate(prompt=PROMPT, max_tokens=30, temperature=0)
        assert result.stats.strategy == "eagle3"
    with localspec.load(model=str(files["target"]), strategy="none", n_ctx=256, threads=1) as plain:
        assert plain.generate(prompt=PROMPT, max_tokens=30, temperature=0).tokens == result.tokens


def test_a_hybrid_target_feeds_its_head_across_recurrent_rollback(tmp_path: Path, opened) -> None:
    hybrid = HybridSpec()
    target_path = write_qwen35_gguf(hybrid, tmp_path / "qwen35.gguf")
    head_path = write_eagle3_gguf(hybrid, HeadSpec(layer_ids=(0, 1, 3)), tmp_path / "eagle3-qwen35.gguf")
    target = opened(target_path)
    plain = runtime_for(target, strategy="none").generate(prompt=PROMPT, max_tokens=40, temperature=0)
    runtime = runtime_for(target, target.eagle3_head(str(head_path)), strategy="draft", draft_tokens=3, calibrate=False)
    spec = runtime.generate(prompt=PROMPT, max_tokens=40, temperature=0)
    assert spec.tokens == plain.tokens
    assert spec.stats.drafted - spec.stats.lookup_drafted > 0


@pytest.mark.parametrize(("spec", "ids"), [(TARGET, (0, 1, 3)), (HybridSpec(), (0, 1, 4))])
def test_a_head_that_reads_the_targets_final_hidden_state_drafts_for_it(
    tmp_path: Path, opened, spec: Spec | HybridSpec, ids: tuple[int, ...]
) -> None:
    # Layer n_layers: the final hidden state, which llama.cpp's draft-eagle3 accepts too.
    write = write_gguf if isinstance(spec, Spec) else write_qwen35_gguf
    target = opened(write(spec, tmp_path / "target.gguf"))  # type: ignore[operator]
    head = target.eagle3_head(str(write_eagle3_gguf(spec, HeadSpec(layer_ids=ids), tmp_path / "eagle3-final.gguf")))
    plain = runtime_for(target, strategy="none").generate(prompt=PROMPT, max_tokens=40, temperature=0)
    spec_run = runtime_for(target, head, strategy="draft", draft_tokens=3, calibrate=False)
    result = spec_run.generate(prompt=PROMPT, max_tokens=40, temperature=0)
    assert result.tokens == plain.tokens
    assert result.stats.accepted - result.stats.lookup_accepted > 0


@pytest.mark.parametrize(
    ("head", "said"),
    [
        (HeadSpec(layer_ids=(1, 3, 7)), "reads layer 7 of its target, but target.gguf has layers 0-2"),
        (HeadSpec(target_width=96), "reads hidden states 96 wide, but target.gguf's are 64"),
    ],
)
def test_a_head_made_for_another_target_is_refused_with_what_to_use(
    files, tmp_path: Path, capsys, head: HeadSpec, said: str
) -> None:
    path = write_eagle3_gguf(TARGET, head, tmp_path / "eagle3-other.gguf")
    argv = ["run", "-m", str(files["target"]), "--draft-model", str(path), "--strategy", "eagle3", "-t", "0", "hi"]
    code = main([*argv, "--max-tokens", "4"])
    err = capsys.readouterr().err
    assert code != 0 and said in err and "made for target.gguf" in err and "Traceback" not in err
    model = LlamaCppBackend(str(files["target"]), n_ctx=64)
    try:
        with pytest.raises(ModelLoadError):
            model.eagle3_head(str(path))
        assert model.eval_block(TEXT[:3], "last").shape[0] == 1  # the target lives on
    finally:
        model.close()


def test_strategy_eagle3_names_the_file_it_needs(files, capsys) -> None:
    code = main(["run", "-m", str(files["target"]), "--strategy", "eagle3", "--max-tokens", "4", "hi"])
    err = capsys.readouterr().err
    assert code != 0 and "EAGLE-3 head" in err and "--draft-model" in err and "Traceback" not in err
    with pytest.raises(InvalidRequestError, match="is not an EAGLE-3 head"):
        localspec.load(model=str(files["target"]), draft_model=str(files["target"]), strategy="eagle3")


def test_a_head_path_that_does_not_exist_is_named_as_missing_not_as_another_kind(files, tmp_path: Path, capsys) -> None:
    missing = tmp_path / "eagle3-missing.gguf"
    code = main(["run", "-m", str(files["target"]), "--draft-model", str(missing), "--strategy", "eagle3", "hi"])
    err = capsys.readouterr().err
    assert code != 0 and f"no such file: {missing}" in err and "check the path" in err
    assert "not an EAGLE-3 head" not in err and "Traceback" not in err
    with pytest.raises(ModelLoadError, match="no such file") as refused:
        localspec.load(model=str(files["target"]), draft_model=str(missing), strategy="eagle3")
    assert refused.value.hint
    model = LlamaCppBackend(str(files["target"]), n_ctx=64)
    try:  # the backend's own call says the same, with a hint for a head (not the default model's)
        with pytest.raises(ModelLoadError, match="no such file") as refused:
            model.eagle3_head(str(missing))
        assert "EAGLE-3 head made for target.gguf" in (refused.value.hint or "")
    finally:
        model.close()


def test_a_pair_added_with_its_head_loads_by_name_as_eagle3(files) -> None:
    from localspec.models.local_pairs import add_local_pair

    add_local_pair("e3", files["target"], files["head"])
    with localspec.load("e3", n_ctx=256, threads=1, calibrate=False) as runtime:
        assert runtime.label == "eagle3" and runtime.draft is not None
        assert runtime.draft.info.architecture == "eagle3"
