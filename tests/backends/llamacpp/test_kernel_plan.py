"""Which llama.cpp CPU kernels a model gets, and how a request is judged bit-exact.

kernel_plan keeps each kernel that sums a block in another order than a one-token pass out
of verify blocks where that is cheap, and says what is left; judge() turns that into one
request's Stats.bit_exact (run -v, bench and the server's stats read it).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from localspec.backends.llamacpp.kernels import (
    FLASH_SPLIT_AFTER,
    FLASH_TILED_ROWS,
    SPLIT_BLOCKS_UP_TO,
    TILED_ROWS,
    KernelSettings,
    kernel_plan,
)
from localspec.core.exactness import judge
from localspec.core.protocol import Capabilities, Exactness
from localspec.core.stats import Stats, Step

Q4_1, Q8_0, Q4_K, Q5_0, Q6_K, F16, F32 = 3, 8, 12, 6, 14, 1, 0
CPU = KernelSettings(
    exact=False,
    llamafile=True,
    flash=True,
    threads=2,
    repack=True,
    repack_forced=False,
    stateful=False,
    offloaded=False,
)


def test_k_quants_load_unrepacked_and_verify_in_pieces_below_the_tiled_kernel() -> None:
    plan = kernel_plan({Q4_K, Q6_K, Q5_0, Q8_0}, CPU)
    assert not plan.repack and plan.max_rows == TILED_ROWS - 1
    # What is left is flash attention's split, past 256 tokens of context.
    known = plan.exactness
    assert (known.cells, known.rows) == (FLASH_SPLIT_AFTER, SPLIT_BLOCKS_UP_TO) and "flash attention" in known.why


def test_legacy_quants_keep_their_kernels() -> None:
    plan = kernel_plan({Q4_1, Q8_0}, CPU)
    assert plan.repack and plan.max_rows is None
    assert plan.exactness.cells == FLASH_SPLIT_AFTER and plan.exactness.rows is None


def test_what_cannot_be_made_exact_cheaply_is_said() -> None:
    forced = kernel_plan({Q4_K}, replace(CPU, repack_forced=True))
    assert forced.repack and forced.exactness.cells == 0 and "LLAMA_ARG_REPACK" in forced.exactness.why
    assert "tinyBLAS" in kernel_plan({F16, F32}, CPU).exactness.why
    fa_off = kernel_plan({Q4_1}, replace(CPU, flash=False))
    assert fa_off.exactness.cells == 0 and "tinyBLAS" in fa_off.exactness.why
    hybrid = kernel_plan({Q4_K}, replace(CPU, stateful=True))
    assert hybrid.max_rows is None and hybrid.exactness.cells == 0 and "tiled" in hybrid.exactness.why
    assert kernel_plan({Q4_1}, replace(CPU, offloaded=True)).exactness.cells == 0


def test_without_llamafile_and_flash_attention_every_length_is_exact() -> None:
    assert kernel_plan({Q4_K, Q6_K}, replace(CPU, llamafile=False, flash=False)).exactness.cells is None
    assert kernel_plan({Q4_1}, replace(CPU, threads=1)).exactness.cells is None  # one thread never splits
    exact = kernel_plan({Q4_K, F16}, replace(CPU, llamafile=False, exact=True))
    assert not exact.repack and exact.max_rows is None and exact.exactness == Exactness(None)


@pytest.mark.parametrize(
    ("types", "switches", "rows", "kernel"),
    [
        ({Q4_1, Q8_0}, {}, FLASH_TILED_ROWS - 1, "flash attention's tiled kernel"),
        ({Q4_K, Q6_K, Q8_0}, {}, TILED_ROWS - 1, "tiled K-quant matmul"),
        ({F16, F32}, {}, 1, "tinyBLAS"),
        ({Q4_1}, {"flash": False}, 1, "tinyBLAS"),  # attention's products of 2+ rows
        ({Q4_1}, {"flash": False, "llamafile": False}, None, ""),
        ({Q4_K, F16}, {"exact": True, "llamafile": False}, None, ""),
        ({Q4_1}, {"offloaded": True}, 0, "device kernels"),
    ],
)
def test_the_plan_says_up_to_which_prompt_block_a_fresh_evaluation_sums_as_one_token_passes(
    types: set[int], switches: dict[str, Any], rows: int | None, kernel: str
) -> None:
    # The row counts measured on AVX2 and AVX-512 (VNNI, BF16) builds alike
    # (tests/backends/llamacpp/test_host_kinds.py).
    known = kernel_plan(types, replace(CPU, **switches)).exactness
    assert known.prompt_rows == rows and kernel in known.prompt_why


def test_a_prefix_reused_from_decode_steps_is_judged_against_the_fresh_evaluations_block() -> None:
    known = Exactness(256, "flash attention splits", prompt_rows=63, prompt_why="flash attention's tiled kernel")
    reused = Stats(strategy="none", prompt_tokens=120, generated_tokens=20, reused_tokens=50, reused_fresh_rows=119)
    judge(reused, known, greedy=True)
    assert reused.fresh_exact is False and "reused 50 cached tokens" in reused.fresh_inexact_reason
    assert "flash attention's tiled kernel" in reused.fresh_inexact_reason
    assert reused.bit_exact is True  # still plain decoding's answer on that cache
    # A short prompt's reuse of rows one-token passes computed is exact and not recorded as a
    # reuse at all (localspec.core.reuse, tests/server/test_exact_reuse.py); one the engine records had
    # its rows from a larger block, which may part even where the fresh block is small.
    short = Stats(strategy="none", prompt_tokens=40, generated_tokens=20, reused_tokens=10, reused_fresh_rows=39)
    judge(short, known, greedy=True)
    assert short.fresh_exact is False
    nothing = Stats(strategy="none", prompt_tokens=40, generated_tokens=20)
    judge(nothing, known, greedy=True)
    assert nothing.fresh_exact is None  # nothing reused that may part


def _stats(prompt: int, generated: int, gamma: int) -> Stats:
    stats = Stats(strategy="draft", prompt_tokens=prompt, generated_tokens=generated)
    stats.record_step(Step(drafted=gamma, accepted=gamma, draft_seconds=0, verify_seconds=0, gamma=gamma))
    return stats


@pytest.mark.parametrize(
    ("prompt", "generated", "gamma", "expected"),
    [(100, 156, 4, True), (100, 157, 4, False), (10, 10, 64, False), (10, 10, 63, True)],
)
def test_a_request_is_judged_by_how_far_its_context_went(
    prompt: int, generated: int, gamma: int, expected: bool
) -> None:
    stats = _stats(prompt, generated, gamma)
    judge(stats, Exactness(256, "flash attention splits", rows=64), greedy=True)
    assert stats.bit_exact is expected
    assert (stats.inexact_reason != "") is not expected
    assert ("bit-exact: plain decoding's" in stats.summary()) is expected


def test_plain_decoding_and_sampling_are_judged_for_what_they_are() -> None:
    plain = Stats(strategy="none", prompt_tokens=900, generated_tokens=900)
    judge(plain, Exactness(0, "anything"), greedy=True)
    assert plain.bit_exact is True  # it is plain decoding
    sampled = _stats(10, 10, 4)
    judge(sampled, Exactness(None), greedy=False)
    assert sampled.bit_exact is None and "distribution" in sampled.summary()
    unknown = _stats(10, 10, 4)
    judge(unknown, Capabilities().exactness, greedy=True)  # a backend that does not say
    assert unknown.bit_exact is False and "not known" in unknown.inexact_reason
    assert unknown.to_dict()["bit_exact"] is False


def test_bench_says_per_strategy_whether_its_greedy_answers_were_bit_exact() -> None:
    from dataclasses import replace

    from localspec.tooling.bench import BenchRow, format_summary

    row = BenchRow("p", "ngram", 1.0, 1.0, 1.0, 0.5, 1.5, 2.0, 10, 10, 0.0, bit_exact=True)
    assert "bit for bit by construction on all 2 prompts" in format_summary([row, replace(row, prompt="q")])
    parted = replace(row, prompt="q", bit_exact=False, inexact_reason="flash attention splits")
    assert "not bit-exact by construction on 1 of 2 prompts: flash attention splits" in format_summary([row, parted])
    assert "bit" not in format_summary([replace(row, bit_exact=None)])  # sampled: nothing to say
