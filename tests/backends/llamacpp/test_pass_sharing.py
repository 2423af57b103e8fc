"""Which waiting lane blocks share the next pass (backends/llamacpp/sharing.py), on the cost
curves of a CPU (a pass costs about its rows) and of a GPU (rows cost little)."""

from __future__ import annotations

from dataclasses import dataclass, field

from localspec.backends.llamacpp.sharing import gaps_to_fill, next_pass


@dataclass(eq=False)
class Block:
    tokens: list[int]
    alone: bool = False
    name: str = field(default="")


def cpu(rows: int) -> float:
    """SmolLM2 Q4_1's verify passes at 2 threads on the 2-core EPYC, about: 9.9 ms for one row,
    78.5 for 16 (benchmarks/results/verify_costs_q4_1.txt)."""
    return 0.0053 + 0.0046 * rows if rows else 0.0


def gpu(rows: int) -> float:
    return 0.010 + 0.0001 * rows if rows else 0.0


def test_a_plain_step_is_not_padded_into_a_wide_drafts_pass_where_rows_cost_their_share() -> None:
    # Padded to 16 rows beside a 16-token draft, the oldest lane's one token made a pass of 32
    # rows: about 252 ms where the two passes of their own took 141 ms (4 clients on copying
    # prompts, 2026-12-01). The pass with most rows a second is that padded one (17 rows in
    # 152 ms on this curve against 1 in 10); serving both soonest is not.
    step, draft = Block([1], name="step"), Block(list(range(16)), name="draft")
    assert next_pass([step, draft], 63, cpu, equal_only=False) == [step]
    assert next_pass([draft, step], 63, cpu, equal_only=False) == [draft]
    # Where rows cost next to nothing, one padded pass serves both sooner.
    assert next_pass([step, draft], 63, gpu, equal_only=False) == [step, draft]


def test_blocks_of_one_width_share_a_pass_and_the_row_limit_splits_them() -> None:
    steps = [Block([1]) for _ in range(4)]
    assert next_pass(steps, 63, cpu, equal_only=False) == steps
    drafts = [Block([1, 2, 3]) for _ in range(4)]
    assert next_pass(drafts, 7, cpu, equal_only=False) == drafts[:2]  # a K-quant's 7 rows


def test_a_step_pads_into_drafts_pass_where_its_padding_costs_less_than_a_pass_of_its_own() -> None:
    step, drafts = Block([1]), [Block([1, 2]) for _ in range(3)]
    # Its padded second row (4.6 ms) costs less than its own pass (9.9 ms), whichever came first.
    assert next_pass([*drafts, step], 63, cpu, equal_only=False) == [*drafts, step]
    assert next_pass([step, *drafts], 63, cpu, equal_only=False) == [step, *drafts]
    steep = lambda rows: 0.0001 + 0.01 * rows if rows else 0.0  # noqa: E731 - rows cost all of it
    assert next_pass([*drafts, step], 63, steep, equal_only=False) == drafts
    assert next_pass([step, *drafts], 63, steep, equal_only=False) == [step]


def test_a_model_with_recurrent_state_shares_only_equal_widths_and_an_image_goes_alone() -> None:
    step, draft = Block([1]), Block([1, 2])
    assert next_pass([step, draft], 63, lambda rows: float(rows > 0), equal_only=True) == [step]
    image = Block([5, 5, 5], alone=True)
    assert next_pass([image, step], 63, cpu, equal_only=False) == [image]


def test_idle_lanes_between_a_passs_lanes_are_filled_where_one_pass_costs_less_than_llamacpps_split() -> None:
    # llama.cpp runs lanes 0, 2 and 3 as two passes (0, then 2-3): lane 1 padded in makes one.
    assert gaps_to_fill([0, 2, 3], 1, 63, cpu) == [1]  # 4 rows for 23.7 ms against 24.4 in 2 passes
    assert gaps_to_fill([0, 3], 2, 63, cpu) == []  # 8 rows for 42.1 ms against 29.0: a pass costs its rows
    assert gaps_to_fill([0, 3], 2, 63, gpu) == [1, 2]
    assert gaps_to_fill([0, 1, 2], 1, 63, cpu) == []  # consecutive: one pass already
    assert gaps_to_fill([0, 7], 8, 63, cpu) == []  # 64 rows: more than the kernels keep exact
    assert gaps_to_fill([0, 7], 1, 63, cpu) == []  # 8 rows cost more than two passes of one
    assert gaps_to_fill([0, 7], 1, 63, gpu) == [1, 2, 3, 4, 5, 6]
