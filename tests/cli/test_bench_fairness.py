"""The bench times plain decoding and n-gram lookup with one model in the process, as
llama.cpp's programs run, and reports every peer it ran beside each row."""

from __future__ import annotations

import argparse
import io
import itertools
import os
import stat
from collections.abc import Sequence
from pathlib import Path

import pytest

from localspec.backends.reference import ReferenceBackend
from localspec.backends.reference import load as load_reference
from localspec.cli.bench import PeerPlan, llama_bench_figures, run_peers
from localspec.common.progress import Steps
from localspec.control.prompts import SUITE
from localspec.core.protocol import Logits, LogitsMode
from localspec.tooling.bench import (
    BenchPlan,
    BenchRow,
    Contender,
    VsLlamaBench,
    bench,
    format_summary,
    format_table,
    geometric_mean,
)
from localspec.tooling.peers import PeerRun, answer_after, run_llama_bench, run_peer, same_answer

OPEN: list[ReferenceBackend] = []


class WatchedTarget(ReferenceBackend):
    """Notes how many drafters were open at every pass of the target."""

    seen: list[int]

    def eval_block(self, tokens: Sequence[int], logits: LogitsMode = "all") -> Logits:
        self.seen.append(len(OPEN))
        return super().eval_block(tokens, logits)


class Drafter(ReferenceBackend):
    def close(self) -> None:
        OPEN.remove(self)
        super().close()


def open_drafter() -> ReferenceBackend:
    backend = load_reference("reference:seed=3,noise=0.3")
    backend.__class__ = Drafter
    OPEN.append(backend)
    return backend


def test_no_drafter_is_open_while_plain_decoding_or_ngram_is_timed(temporary_localspec_home: Path) -> None:
    target = load_reference("reference:seed=3")
    target.__class__ = WatchedTarget
    target.seen = []  # type: ignore[attr-defined]
    contenders = [Contender("ngram", "ngram"), Contender("draft", "draft", open_draft=open_drafter)]
    rows = bench(target, contenders, SUITE[:1], BenchPlan(max_tokens=12, repeats=2))
    assert [r.strategy for r in rows] == ["ngram", "draft"]
    assert not OPEN  # every drafter was closed after its run
    seen = target.seen  # type: ignore[attr-defined]
    assert 1 in seen and 0 in seen
    # Passes with a drafter open come in runs of the draft column only: plain and n-gram
    # runs (12 tokens, at least a few passes each) sit between them with none open.
    assert sum(1 for a, b in itertools.pairwise(seen) if a == 0 and b == 1) == 2


def test_the_peers_of_a_prompt_run_right_after_its_rows(temporary_localspec_home: Path) -> None:
    # The machine drifts over a suite's minutes: a peer timed minutes after localspec's runs of
    # the same prompt is compared across that drift, one timed right after them is not.
    target = load_reference("reference:seed=3")
    target.__class__ = WatchedTarget
    target.seen = []  # type: ignore[attr-defined]
    calls: list[tuple[list[str], int]] = []

    def peers(rows: list[BenchRow]) -> None:
        calls.append(([r.prompt for r in rows], len(target.seen)))  # type: ignore[attr-defined]

    rows = bench(
        target, [Contender("ngram", "ngram")], SUITE[:2], BenchPlan(max_tokens=12, repeats=2), after_prompt=peers
    )
    first, second = SUITE[0].id, SUITE[1].id
    assert [names for names, _ in calls] == [[first], [second]]
    assert [r.prompt for r in rows] == [first, second]
    # The first prompt's peers ran before any pass of the second prompt, and after all of the first's.
    assert 0 < calls[0][1] < calls[1][1] == len(target.seen)  # type: ignore[attr-defined]


def test_the_summary_gives_geometric_means_against_plain_and_each_peer() -> None:
    rows = []
    for prompt, speedup, ours, lookup4, lookup8 in (("a", 2.0, 100.0, 80.0, 100.0), ("b", 0.5, 25.0, 25.0, 20.0)):
        # Each row's speedup agrees with its own tokens/s columns (plain is 50 tok/s in both).
        row = BenchRow(prompt, "ngram", 50.0, ours, speedup, 0.5, 1.5, 2.0, 10, 10, 100.0)
        row.add_peer("llama-lookup (γ=4)", lookup4, 10)
        row.add_peer("llama-lookup (γ=8)", lookup8, 10)
        rows.append(row)
    assert rows[0].peer_program == "llama-lookup (γ=4)" and rows[0].vs_peer == 1.25
    summary = format_summary(rows, VsLlamaBench(50.0, 52.0, 55.0, 300))
    assert "ngram: 1.00x plain decoding" in summary
    expected = f"{geometric_mean([1.25, 1.0]):.2f}x (1.00x to 1.25x, ahead on 1 of 2)"
    assert f"ngram vs llama-lookup (γ=4): {expected}" in summary
    assert "vs llama-bench -n 128 52.0 tok/s: 0.96x" in summary
    assert "at the prompts' mean length (-d 300) 55.0 tok/s: 0.91x" in summary
    table = format_table(rows)
    assert "llama-lookup (γ=8)" in table and "1.25x" in table


class SilentTarget(ReferenceBackend):
    """Every token ends the answer: each run is one pass that emits nothing."""

    def end_of_generation(self) -> frozenset[int]:
        return frozenset(range(self.info.n_vocab))


def test_plain_decoding_counts_the_pass_that_ends_an_answer_as_llama_bench_does(
    temporary_localspec_home: Path,
) -> None:
    target = load_reference("reference:seed=3")
    target.__class__ = SilentTarget
    (row,) = bench(target, [Contender("none", "none")], SUITE[:1], BenchPlan(max_tokens=12, repeats=2))
    # Two repeats, plain decoding before and after each: four runs of one pass and no token.
    assert (row.plain_tokens, row.plain_passes, row.repeats) == (0, 4, 2)
    assert row.plain_passes_per_s > 0 and row.plain_tokens_per_s == 0


def test_the_summary_compares_passes_with_llama_bench_over_the_same_positions() -> None:
    row = BenchRow("a", "ngram", 50.0, 60.0, 1.2, 0.5, 1.5, 2.0, 10, 10, 100.0)
    summary = format_summary([row], VsLlamaBench(50.0, 52.0, 55.0, 100, 51.0, 60.0, 99, 150))
    assert "vs llama-bench at each prompt's positions (mean -d 99 -n 150) 60.0 tok/s: 0.85x" in summary
    assert "plain decoding 51.0 passes/s" in summary


def test_llama_bench_is_read_from_its_json(tmp_path: Path) -> None:
    fake = tmp_path / "llama-bench"
    fake.write_text(
        f'#!/bin/sh\necho "$@" > {tmp_path}/args\necho \'[{{"n_prompt": 0, "n_gen": 128, "avg_ts": 75.4}}]\'\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    assert run_llama_bench(tmp_path, "model.gguf", 128, 2) == 75.4
    assert run_llama_bench(tmp_path, "model.gguf", 128, 2, depth=300) == 75.4
    assert "-n 128 -d 300 -t 2" in (tmp_path / "args").read_text()  # the context depth of our prompts
    os.remove(fake)
    assert run_llama_bench(tmp_path, "model.gguf") is None  # a folder without llama-bench


def test_a_peer_that_answers_another_text_is_marked_where_its_speed_is_compared() -> None:
    prompt = "<|im_start|>user\nList three colors.<|im_end|>\n<|im_start|>assistant\n"
    # llama-lookup's stdout (llama.cpp as vendored): the prompt's tokens echoed, then each kept token.
    stdout = f"\n\n{prompt}1. Red\n2. Blue\n3. Green<|im_end|>\n\n\n"
    theirs = answer_after(stdout, prompt)
    assert theirs == "1. Red\n2. Blue\n3. Green<|im_end|>\n\n\n"
    assert same_answer("1. Red\n2. Blue\n3. Green", theirs)  # an end of text's text after it
    assert same_answer("1. Red\n2. Blue\n3. Green, and", theirs.replace("<|im_end|>", ""))  # a shorter limit
    assert not same_answer("1. Red\n2. Green\n3. Blue", theirs)
    assert answer_after("the prompt re-spelt", prompt) is None
    same, other = (BenchRow(p, "ngram", 50.0, 60.0, 1.2, 0.5, 1.5, 2.0, 10, 10, 100.0) for p in ("same", "other"))
    for row in (same, other):
        row.add_peer("llama-lookup (γ=4)", 50.0, 10)
    other.other_answers.append("llama-lookup (γ=4)")
    summary = format_summary([same, other])
    assert "note: llama-lookup (γ=4) answered another text than plain decoding on other:" in summary
    lines = format_table([same, other]).splitlines()
    assert lines[2].endswith("1.20x") and lines[3].endswith("1.20x*")


def test_a_peers_end_of_text_is_not_counted_as_a_token_of_its_answer(tmp_path: Path) -> None:
    # llama.cpp's examples count the end of text's token as decoded; localspec emits and counts
    # only the answer's. A run that stopped within n_predict ended on one; a run at the limit
    # goes one past n_predict, every token of it generated.
    fake = tmp_path / "llama-lookup"
    for decoded, max_tokens, answer in ((36, 160, 35), (161, 160, 161), (12, 12, 11)):
        fake.write_text(
            f'#!/bin/sh\necho "the prompt the answer"\n'
            f'echo "decoded   {decoded} tokens in    2.000 seconds, speed:   {decoded / 2:.3f} t/s" >&2\n'
        )
        fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
        result = run_peer(tmp_path, PeerRun("llama-lookup", "model.gguf", "the prompt", max_tokens, 4))
        assert (result.tokens, result.seconds, result.tokens_per_s) == (answer, 2.0, answer / 2)


def test_a_peers_drafted_and_kept_tokens_are_read_as_it_prints_them(tmp_path: Path) -> None:
    # lookup.cpp's closing lines, as vendored; lookup_fidelity.py compares them with the replays'.
    fake = tmp_path / "llama-lookup"
    fake.write_text(
        '#!/bin/sh\necho "the prompt the answer"\n'
        'echo "decoded   53 tokens in    2.000 seconds, speed:   26.500 t/s" >&2\n'
        'echo "n_draft      = 8" >&2\necho "n_predict    = 53" >&2\necho "n_drafted    = 48" >&2\n'
        'echo "n_accept     = 41" >&2\necho "accept       = 85.417%" >&2\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    result = run_peer(tmp_path, PeerRun("llama-lookup", "model.gguf", "the prompt", 160, 8))
    assert (result.drafted, result.accepted, result.decoded, result.tokens) == (48, 41, 53, 52)
    assert result.acceptance_rate == pytest.approx(0.85417)


def test_llama_bench_runs_like_for_like_right_after_each_prompts_rows(tmp_path: Path) -> None:
    # llama-bench over a prompt's positions, timed minutes after that prompt's rows, read the
    # host's drift as a difference between plain decoding and llama.cpp's.
    log = tmp_path / "log"
    lookup = tmp_path / "llama-lookup"
    speed = "decoded   13 tokens in    0.100 seconds, speed:   130.000 t/s"
    lookup.write_text(f'#!/bin/sh\necho lookup >> {log}\necho "{speed}" >&2\n')
    bench_program = tmp_path / "llama-bench"
    bench_program.write_text(
        "#!/bin/sh\nn=128; d=0\n"
        'while [ $# -gt 0 ]; do [ "$1" = "-n" ] && n=$2; [ "$1" = "-d" ] && d=$2; shift; done\n'
        f'echo "bench -n $n -d $d" >> {log}\necho "[{{\\"n_gen\\": $n, \\"avg_ts\\": 75.4}}]"\n'
    )
    for fake in (lookup, bench_program):
        fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    row = BenchRow("a", "ngram", 50.0, 60.0, 1.2, 0.5, 1.5, 2.0, 10, 10, 100.0)
    row.plain_passes, row.repeats, row.plain_passes_per_s = 40, 2, 51.0  # two plain runs a repeat: 10 passes each
    args = argparse.Namespace(peer_draft_tokens=[4], max_tokens=12, threads=2, repeats=2, draft_model=None)
    plan = PeerPlan(tmp_path, "model.gguf", {"a": "the prompt"}, {"a": 31})
    run_peers(args, plan, Steps("bench", stream=io.StringIO()), [row])
    # After the row's lookup runs (one a repeat), at the row's positions.
    assert log.read_text().splitlines() == ["lookup", "lookup", "bench -n 10 -d 30"]
    assert row.llama_bench_like == 75.4
    figures = llama_bench_figures(args, plan, [row])
    assert figures is not None and (figures.like, figures.like_depth, figures.like_passes) == (75.4, 30, 10)
    # At the suite's end only the two reference runs (an empty context, the prompts' mean length).
    assert log.read_text().splitlines()[3:] == ["bench -n 128 -d 0", "bench -n 128 -d 31"]


def test_a_row_whose_runs_disagree_is_left_out_of_the_peers_means_too() -> None:
    # One disturbed run took a row to 25 tok/s while its paired ratio stayed 1.0: against a peer
    # timed at another moment it would read 0.5x, a measurement of the disturbance.
    kept = BenchRow("a", "ngram", 50.0, 60.0, 1.2, 0.5, 1.5, 2.0, 10, 10, 100.0)
    noisy = BenchRow("b", "ngram", 50.0, 25.0, 1.0, 0.5, 1.5, 2.0, 10, 10, 100.0)
    assert noisy.contradicted and not kept.contradicted
    for row in (kept, noisy):
        row.add_peer("llama-lookup (γ=4)", 50.0, 10)
    summary = format_summary([kept, noisy])
    assert (
        "ngram vs llama-lookup (γ=4): 1.20x (1.20x to 1.20x, ahead on 1 of 1; 1 within the noise, left out)" in summary
    )
    only_noise = format_summary([noisy])
    assert "vs llama-lookup" not in only_noise and "within the noise" in only_noise
