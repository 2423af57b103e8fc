"""Side-by-side benchmark: plain decoding and each strategy on the same prompts, in one
process, interleaved, so the speedups are ratios measured under the same conditions.

Each repeat runs plain decoding, every strategy, and plain decoding again, back to back; a
row's speedup is the median over repeats of the strategy's rate divided by the mean plain
rate of the same repeat. Plain runs on both sides cancel a machine that speeds up or slows
down steadily during a repeat, which would otherwise favour whichever runs first. On a
shared machine a burst of load lasting a second or two hits one run and not its
neighbours: the ratio of summed times lets that burst move the figure by up to 10 %, the
median of paired ratios does not. The tokens/s columns are totals over all runs.

With `min_seconds`, a prompt is repeated beyond `repeats` (up to MAX_REPEAT_FACTOR times as
often) until plain decoding has run that long on it: a 58-token answer takes a third of the
time of a 160-token one, so at the same repeat count its cells carry about 1.7 times the
noise, and every cell should rest on a similar amount of measured time."""

from __future__ import annotations

import math
import platform
import resource
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from localspec.api import Completion, Runtime, runtime_for
from localspec.control.contention import unreliable_note
from localspec.control.hardware import physical_cores
from localspec.control.prompts import BenchPrompt
from localspec.core.choices import DraftTokens, Trees
from localspec.core.protocol import Backend
from localspec.core.stats import Stats
from localspec.strategies import named

# --min-seconds repeats a prompt at most this many times as often as --repeats asks.
MAX_REPEAT_FACTOR = 4
# A row whose speedup and tokens/s columns differ by more than this factor, or sit on the two
# sides of 1 by more than NOISE_BAND, is shown as noise rather than as a speedup.
CONTRADICTION = 1.25
NOISE_BAND = 0.05


@dataclass
class BenchRow:
    prompt: str
    strategy: str
    plain_tokens_per_s: float
    spec_tokens_per_s: float
    speedup: float
    acceptance_rate: float
    tokens_per_step: float
    mean_gamma: float
    tokens: int
    plain_tokens: int
    peak_rss_mb: float
    acceptance_by_position: list[float] = field(default_factory=list)
    # Share of the drafted tokens an n-gram lookup beside a draft model guessed (see Engine).
    lookup_share: float = 0.0
    repeats: int = 0  # how many times the prompt ran (more than asked under min_seconds)
    # The lowest and highest of the per-repeat ratios behind `speedup`: how noisy the cell is.
    speedup_low: float = 0.0
    speedup_high: float = 0.0
    peer_program: str = ""
    peer_tokens_per_s: float = 0.0
    peer_tokens: int = 0
    vs_peer: float = 0.0
    # Every peer run on this row ("llama-lookup (γ=4)": its tokens/s); peer_* above is the first.
    peers: dict[str, float] = field(default_factory=dict)
    # Greedy: every repeat's answer was plain decoding's bit for bit by construction (None:
    # sampled); see Stats.bit_exact.
    bit_exact: bool | None = None
    inexact_reason: str = ""
    # Plain decoding's passes (one a token, and one more where an answer ends at an end of
    # text, which is not emitted), all its runs together, and their rate: llama-bench's tg
    # counts every pass as a token.
    plain_passes: int = 0
    plain_passes_per_s: float = 0.0
    # Plain decoding's answer (greedy: every run's), and the peers whose answer was another
    # text: their speed is another answer's, not this one's.
    answer: str = ""
    other_answers: list[str] = field(default_factory=list)
    # llama-bench over plain decoding's positions and passes here (tok/s), run right after the
    # prompt's rows as its peers are (bench --peers): minutes later the host runs another speed.
    llama_bench_like: float | None = None

    @property
    def contradicted(self) -> bool:
        """Whether the speedup and the row's own tokens/s columns point different ways (one
        faster than plain, the other slower, or apart by more than CONTRADICTION): then the
        runs disagree with each other, and the row says only that it is within the noise."""
        if not self.plain_tokens_per_s or not self.speedup:
            return False
        columns = self.spec_tokens_per_s / self.plain_tokens_per_s
        opposite = (columns - 1) * (self.speedup - 1) < 0 and abs(columns - self.speedup) > NOISE_BAND
        return opposite or max(columns, self.speedup) / min(columns, self.speedup) > CONTRADICTION

    def add_peer(self, program: str, tokens_per_s: float, tokens: int) -> None:
        if not self.peer_program:
            self.peer_program, self.peer_tokens_per_s, self.peer_tokens = program, tokens_per_s, tokens
            self.vs_peer = self.spec_tokens_per_s / tokens_per_s if tokens_per_s else 0.0
        self.peers[program] = tokens_per_s


@dataclass
class _Tally:
    tokens: int = 0
    seconds: float = 0.0
    merged: Stats = field(default_factory=Stats)
    rates: list[float] = field(default_factory=list)  # one per repeat
    answer: str = ""  # the first run's text

    def add(self, result: Completion) -> None:
        stats = result.stats
        self.answer = self.answer or result.text
        self.tokens += stats.generated_tokens
        self.seconds += stats.decode_seconds
        self.rates.append(stats.generated_tokens / stats.decode_seconds if stats.decode_seconds > 0 else 0.0)
        m = self.merged
        m.generated_tokens += stats.generated_tokens
        m.verify_steps += stats.verify_steps
        for g, c in stats.gamma_histogram.items():
            m.gamma_histogram[g] = m.gamma_histogram.get(g, 0) + c
        drafted = list(stats.drafted_by_position)
        for i, d in enumerate(drafted):
            m.record_position(i, d, stats.accepted_by_position[i])
        m.drafted += stats.drafted
        m.accepted += stats.accepted
        m.lookup_drafted += stats.lookup_drafted
        m.lookup_accepted += stats.lookup_accepted
        if stats.bit_exact is not None:
            m.bit_exact = stats.bit_exact and m.bit_exact is not False
            m.inexact_reason = m.inexact_reason or stats.inexact_reason

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def paired_ratios(rates: Sequence[float], plain: Sequence[float]) -> list[float]:
    return [r / p for r, p in zip(rates, plain, strict=True) if p > 0]


def bracketing_means(plain: Sequence[float]) -> list[float]:
    """The plain rate of each repeat: the mean of the runs before and after its strategies."""
    return [(before + after) / 2 for before, after in zip(plain[::2], plain[1::2], strict=True)]


def paired_speedup(ratios: Sequence[float]) -> float:
    """Median over repeats of rate / plain rate of the same repeat (see the module doc)."""
    return statistics.median(ratios) if ratios else 0.0


def peak_rss_mb() -> float:
    # ru_maxrss is KiB on Linux, bytes on macOS.
    scale = 1 if platform.system() == "Darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20


@dataclass(frozen=True)
class Contender:
    """One column of the comparison: a label, the runtime strategy and its drafter."""

    label: str
    strategy: str
    draft: Backend | None = None  # a drafter that lives in the target (an in-memory self-drafter)
    # A drafter with weights and a context of its own: opened for each of this column's runs
    # and closed after it, so plain decoding and n-gram lookup are timed with one model in
    # the process, as llama.cpp's own programs run (a second llama.cpp context slowed plain
    # F16 decoding from about 72 to 50-59 tok/s on a 2-core host). Each run then starts
    # with a fresh runtime, as a new user's first request does.
    open_draft: Callable[[], Backend] | None = None


@dataclass(frozen=True)
class BenchPlan:
    """How each prompt is run: its request, and how often (see the module doc on min_seconds)."""

    max_tokens: int = 160
    temperature: float = 0.0
    repeats: int = 1
    draft_tokens: DraftTokens = "auto"
    seed: int = 0  # run r of a prompt takes seed + r
    min_seconds: float = 0.0
    trees: Trees = "auto"  # what the drafting columns verify beside their chains (plain: nothing)


OnRun = Callable[[int, int, str], None]  # (done, total, what)


def bench(
    target: Backend,
    contenders: Sequence[Contender],
    prompts: Sequence[BenchPrompt],
    plan: BenchPlan = BenchPlan(),
    on_run: OnRun | None = None,
    after_prompt: Callable[[list[BenchRow]], None] | None = None,
) -> list[BenchRow]:
    """on_run(done, total, what) is told of each run before it starts; total counts the plan's
    repeats (min_seconds may add runs beyond it). after_prompt(rows) runs after each prompt's
    rows are measured: the peers' runs of that prompt, so that the machine's drift between
    localspec's runs and theirs is a minute's, not the whole suite's."""
    plain = Contender("none", "none")
    field_ = [plain, *[c for c in contenders if c.label != "none"]]
    total, done = len(prompts) * plan.repeats * (len(field_) + 1), [0]

    def told(what: str) -> None:
        done[0] += 1
        if on_run is not None:
            on_run(done[0], max(total, done[0]), what)

    rows: list[BenchRow] = []
    for prompt in prompts:
        rows += (measured := _bench_prompt(target, field_, prompt, plan, told))
        if after_prompt is not None:
            after_prompt(measured)
    return rows


def _bench_prompt(
    target: Backend,
    field_: list[Contender],
    prompt: BenchPrompt,
    plan: BenchPlan,
    told: Callable[[str], None],
) -> list[BenchRow]:
    """One prompt's rows: every column run plan.repeats times (or more, see min_seconds), interleaved."""
    # A fresh runtime per prompt: the controller must adapt within the request.
    runtimes = {c.label: _runtime(target, c, c.draft, plan) for c in field_ if c.open_draft is None}
    tallies = {c.label: _Tally() for c in field_}
    # The prompt from an empty cache, as a peer program's fresh process reads it: a prefix
    # the last prompt left there was evaluated in other blocks, which can tip a near-tie
    # (llama.cpp's logits depend on a block's size) and give another answer.
    target.rollback(0)
    runtimes["none"].generate(messages=prompt.messages, max_tokens=8, temperature=0)  # warm caches
    base = tallies["none"]
    r = 0
    while r < plan.repeats or (base.seconds < plan.min_seconds and r < plan.repeats * MAX_REPEAT_FACTOR):
        # Interleaved, so drift in machine speed hits every column alike; plain on both
        # sides (see the module doc).
        for c in [*field_, field_[0]]:
            told(f"prompt {prompt.id!r}, {'plain decoding' if c.label == 'none' else c.label}, run {r + 1}")
            request = {"messages": prompt.messages, "max_tokens": plan.max_tokens, "temperature": plan.temperature}
            tallies[c.label].add(_timed(c, runtimes, target, plan, {**request, "seed": plan.seed + r}))
        r += 1
    shown = [c for c in field_ if c.label != "none" or len(field_) == 1]
    return [_row(prompt.id, c.label, tallies[c.label], base, r) for c in shown]


def _row(prompt: str, label: str, t: _Tally, base: _Tally, repeats: int) -> BenchRow:
    """A column's row on one prompt, its speedup paired with plain decoding's runs (base)."""
    m = t.merged
    plain_rates = bracketing_means(base.rates)
    ratios = paired_ratios(bracketing_means(t.rates) if t is base else t.rates, plain_rates)
    return BenchRow(
        prompt=prompt,
        strategy=label,
        plain_tokens_per_s=base.rate,
        spec_tokens_per_s=t.rate,
        speedup=paired_speedup(ratios),
        speedup_low=min(ratios, default=0.0),
        speedup_high=max(ratios, default=0.0),
        acceptance_rate=m.acceptance_rate,
        tokens_per_step=m.tokens_per_step,
        mean_gamma=m.mean_gamma,
        tokens=t.tokens,
        plain_tokens=base.tokens,
        peak_rss_mb=peak_rss_mb(),
        acceptance_by_position=m.acceptance_by_position[:8],
        lookup_share=m.lookup_share,
        repeats=repeats,
        bit_exact=m.bit_exact,
        inexact_reason=m.inexact_reason,
        plain_passes=base.merged.verify_steps,
        plain_passes_per_s=base.merged.verify_steps / base.seconds if base.seconds > 0 else 0.0,
        answer=base.answer,
    )


def _timed(
    c: Contender,
    runtimes: dict[str, Runtime],
    target: Backend,
    plan: BenchPlan,
    request: dict[str, Any],
) -> Completion:
    """One run of a column: on its runtime, or with its drafter opened for this run only."""
    if c.open_draft is None:
        return runtimes[c.label].generate(**request)
    draft = c.open_draft()
    try:
        return _runtime(target, c, draft, plan).generate(**request)
    finally:
        draft.close()


def _runtime(target: Backend, c: Contender, draft: Backend | None, plan: BenchPlan) -> Runtime:
    """A column's runtime; plain decoding's asks for no tree, as it drafts nothing to branch."""
    trees = plan.trees if named(c.strategy)[0].source != "none" else "auto"
    return runtime_for(target, draft, strategy=c.strategy, draft_tokens=plan.draft_tokens, label=c.label, trees=trees)


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "physical_cores": physical_cores(),
        "system": platform.platform(),
        "python": platform.python_version(),
    }


def geometric_mean(values: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values and min(values) > 0 else 0.0


@dataclass(frozen=True)
class VsLlamaBench:
    """Plain decoding against llama-bench's generation test, from an empty context (the
    issue's `-n 128`) and at the prompts' mean length (`-d`), where attention costs the same.
    Like for like: passes a second against llama-bench over the same positions, prompt by
    prompt (-d its length less one, where the first answer token's pass runs; -n its runs'
    passes), both as means over the prompts (like_depth, like_passes: the runs' means): a pass
    costs more the deeper it runs, and steps up where the cache's cells in use pass 256."""

    ours: float
    empty: float
    at_depth: float | None = None
    depth: int = 0
    ours_passes: float = 0.0  # plain decoding's passes a second, mean over the prompts
    like: float | None = None  # llama-bench -d like_depth -n like_passes
    like_depth: int = 0
    like_passes: int = 0


def _peer_lines(strategy: str, rows: Sequence[BenchRow]) -> list[str]:
    """A strategy's geometric mean over each peer it ran beside. A row whose own runs disagree
    measured nothing against a peer either: it is left out, as from the mean against plain."""
    lines = []
    for program in dict.fromkeys(p for r in rows for p in r.peers):
        timed = [r for r in rows if r.peers.get(program)]
        ratios = [r.spec_tokens_per_s / r.peers[program] for r in timed if not r.contradicted]
        if not ratios:
            continue
        out = len(timed) - len(ratios)
        lines.append(
            f"{strategy} vs {program}: {geometric_mean(ratios):.2f}x "
            f"({min(ratios):.2f}x to {max(ratios):.2f}x, ahead on {sum(x > 1 for x in ratios)} of {len(ratios)}"
            f"{f'; {out} within the noise, left out' if out else ''})"
        )
    return lines


def format_summary(
    rows: Sequence[BenchRow], vs_llama_bench: VsLlamaBench | None = None, busy: str | None = None
) -> str:
    """Per strategy: the geometric mean speedup over plain decoding, and over each peer (with
    the lowest and highest prompt); then plain decoding against llama-bench, when run; then
    why the figures are unreliable, when the machine was busy (busy says how) or rows were
    noise. Rows that are noise are left out of every mean: they measured nothing."""
    lines = []
    for strategy in dict.fromkeys(r.strategy for r in rows):
        mine = [r for r in rows if r.strategy == strategy]
        speedups = [r.speedup for r in mine if not r.contradicted]
        noise = len(mine) - len(speedups)
        left_out = f"; {noise} within the noise, left out" if noise else ""
        if speedups:
            lines.append(
                f"{strategy}: {geometric_mean(speedups):.2f}x plain decoding (geometric mean of {len(speedups)} "
                f"prompts, {min(speedups):.2f}x to {max(speedups):.2f}x{left_out})"
            )
        else:
            lines.append(f"{strategy}: the same as plain decoding within the noise (every prompt's runs disagreed)")
        line = _exactness_line(mine)
        if line:
            lines.append(f"{strategy}: {line}")
        lines += _peer_lines(strategy, mine)
    if vs_llama_bench is not None:
        v = vs_llama_bench
        line = f"plain decoding {v.ours:.1f} tok/s (mean over the prompts) vs llama-bench -n 128 {v.empty:.1f} tok/s: "
        line += f"{v.ours / v.empty:.2f}x"
        if v.at_depth:
            line += f"; at the prompts' mean length (-d {v.depth}) {v.at_depth:.1f} tok/s: {v.ours / v.at_depth:.2f}x"
        lines.append(line)
        if v.like:
            lines.append(
                f"like for like: plain decoding {v.ours_passes:.1f} passes/s (every pass a token, an end of text's "
                f"too, as tg counts) vs llama-bench at each prompt's positions (mean -d {v.like_depth} "
                f"-n {v.like_passes}) {v.like:.1f} tok/s: {v.ours_passes / v.like:.2f}x"
            )
    for program in dict.fromkeys(p for r in rows for p in r.other_answers):
        prompts = ", ".join(r.prompt for r in rows if program in r.other_answers)
        lines.append(
            f"note: {program} answered another text than plain decoding on {prompts}: "
            "there it is timed on another answer (marked * in the table)"
        )
    if busy is not None:
        lines.append(f"warning: {unreliable_note(busy)}")
    if any(r.contradicted for r in rows):
        lines.append(
            "noise: a row's runs disagreed (its tokens/s columns and its per-run ratios point different ways); "
            "its speedup is the same as plain decoding within the noise, and more --repeats would settle it"
        )
    return "\n".join(lines)


def _exactness_line(rows: Sequence[BenchRow]) -> str:
    """Whether the strategy's greedy answers were plain decoding's by construction."""
    judged = [r for r in rows if r.bit_exact is not None]
    if not judged:
        return ""
    off = [r for r in judged if not r.bit_exact]
    if not off:
        return f"greedy output is plain decoding's bit for bit by construction on all {len(judged)} prompts"
    return (
        f"greedy output not bit-exact by construction on {len(off)} of {len(judged)} prompts: "
        f"{off[0].inexact_reason} (--exact makes it so)"
    )


def format_table(rows: Sequence[BenchRow]) -> str:
    peers = list(dict.fromkeys(p for r in rows for p in r.peers))
    # A draft model drafts beside n-gram lookup: say how much of its rows' drafting was lookup.
    lookup = any(r.lookup_share for r in rows)
    head = (
        f"{'prompt':<12} {'strategy':<8} {'plain t/s':>9} {'spec t/s':>9} {'speedup':>8} "
        f"{'accept':>7} {'tok/step':>8} {'mean γ':>7}" + (f" {'lookup':>6}" if lookup else "") + f" {'RSS MB':>7}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.prompt:<12} {r.strategy:<8} {r.plain_tokens_per_s:>9.1f} {r.spec_tokens_per_s:>9.1f} "
            + (f"{'noise':>8}" if r.contradicted else f"{r.speedup:>7.2f}x")
            + f" {r.acceptance_rate:>7.0%} {r.tokens_per_step:>8.2f} {r.mean_gamma:>7.2f}"
            + ((f" {r.lookup_share:>6.0%}" if r.lookup_share else f" {'-':>6}") if lookup else "")
            + f" {r.peak_rss_mb:>7.0f}"
            + "".join(
                f" {p:<26} {r.peers[p]:>8.1f} {r.spec_tokens_per_s / r.peers[p]:>6.2f}x"
                + ("*" if p in r.other_answers else "")
                if r.peers.get(p)
                else ""
                for p in peers
            )
        )
    return "\n".join(lines)


def rows_to_json(rows: Sequence[BenchRow]) -> list[dict[str, Any]]:
    return [{**asdict(r), "contradicted": r.contradicted} for r in rows]
