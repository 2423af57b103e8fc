"""Which cached rows a new prompt keeps exactly (localspec.core.reuse), on the kernel figures
llama.cpp's default plan gives a Q4_1 file: one-token bits up to 63 rows, large blocks from 64."""

from __future__ import annotations

from localspec.core.protocol import Exactness
from localspec.core.reuse import CachedRows

Q4_1 = Exactness(None, prompt_rows=63, prompt_why="flash attention's tiled kernel", pieces_from=64)


def prompt(shared: int, rest: int, base: int = 1000) -> list[int]:
    """shared tokens every prompt here starts with, rest of its own, and its last token."""
    return [*range(shared), *range(base, base + rest), 7]


def after(first: list[int], known: Exactness = Q4_1) -> CachedRows:
    """The rows after first's prompt went in from an empty cache, as the engine puts it in."""
    rows = CachedRows(512, known)
    rows.prompt_in(first, 0, 0, len(first) - 1)
    return rows


def test_a_long_prompt_keeps_what_an_earlier_long_prompts_large_block_computed() -> None:
    rows = after(prompt(30, 70))
    # 119 rows: the rest after the 30 shared ones is 89, a large block of its own.
    assert rows.exact_keep(prompt(30, 89, base=5000), 30) == 30
    # 79 rows: keeping 30 would leave a rest of 49; keeping 15 leaves the large block of 64.
    assert rows.exact_keep(prompt(30, 49, base=5000), 30) == 15


def test_rows_in_blocks_that_part_from_a_large_blocks_are_not_kept() -> None:
    short = after(prompt(30, 10))  # 40 rows: a small block, one-token bits
    assert short.exact_keep(prompt(30, 89, base=5000), 30) == 0
    assert short.exact_keep(prompt(30, 5, base=5000), 30) == 30  # a short prompt keeps them
    long = after(prompt(30, 70))
    assert long.exact_keep(prompt(30, 5, base=5000), 30) == 0  # and not a long prompt's
    # Past one max_block the fresh evaluation's last block is its own size: not kept so.
    assert long.exact_keep(prompt(30, 600, base=5000), 30) == 0


def test_decode_steps_end_the_large_blocks_and_a_follow_up_keeps_the_prompt_before_them() -> None:
    first = prompt(30, 70)
    rows = after(first)
    past = len(first) - 1
    for block in (1, 5, 3):  # verify blocks: small, one-token bits
        rows.kept(past, block, block)
        past += block
    answer = [*first, *range(9000, 9009)]
    follow_up = [*answer, *range(7000, 7080), 7]
    assert rows.exact_keep(follow_up, len(answer)) == len(first) - 1
    rows.kept(40, 1, None)  # a tree's pass at 40: nothing past it stays large-block rows
    assert rows.exact_keep(follow_up, len(answer)) == 40


def test_without_the_backends_word_on_large_blocks_nothing_of_them_is_kept() -> None:
    unknown = Exactness(None, prompt_rows=63, prompt_why="flash attention's tiled kernel")
    rows = after(prompt(30, 70), unknown)
    assert rows.exact_keep(prompt(30, 89, base=5000), 30) == 0


def test_a_prompt_over_several_blocks_keeps_large_block_rows_only_up_to_a_small_last_block() -> None:
    rows = CachedRows(128, Q4_1)
    first = prompt(0, 140)  # blocks of 128 and 12 rows: the second sums as one-token passes
    rows.prompt_in(first, 0, 0, len(first) - 1)
    assert rows.large_blocks == 128 and rows.one_token_like == 0
