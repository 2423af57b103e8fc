"""GET /metrics: what the server has done, per model, in Prometheus' text format.

A metric llama-server exports (`llama-server --metrics`) keeps its name, `llamacpp:...`, so a
dashboard built for it reads this server unchanged; the rest are `localspec:...`. Every series
carries a `model` label (llama-server serves one model; this server may swap pairs).
Drafted and accepted tokens are the drafter's guesses, without what a grammar forced, as in a
response's `speculation` object (forced tokens are known, not guessed).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from localspec.core.stats import Stats

__all__ = ["CONTENT_TYPE_LATEST", "Passes", "Queue", "ServerMetrics", "exposition"]

# Per model: requests running and waiting (the worker's queue, read when scraped).
Queue = Callable[[], Mapping[str, tuple[int, int]]]
# Per model served in lanes: the target passes the lanes shared since it was loaded.
Passes = Callable[[], Mapping[str, int]]


@dataclass
class Tally:
    """One model's totals since the server started."""

    requests: Counter[str] = field(default_factory=Counter)  # by outcome: finished, cancelled, failed, refused
    prompt_evaluated: int = 0
    prompt_cached: int = 0
    prompt_seconds: float = 0.0
    predicted: int = 0
    predicted_seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    drafts: int = 0  # passes that verified a guessed draft
    forced: int = 0
    passes: int = 0
    longest: int = 0  # the longest sequence, prompt and answer
    queued: int = 0
    queued_seconds: float = 0.0

    def add(self, stats: Stats) -> None:
        self.prompt_evaluated += stats.prefill_tokens
        self.prompt_cached += max(0, stats.prompt_tokens - stats.prefill_tokens)
        self.prompt_seconds += stats.prefill_seconds
        self.predicted += stats.generated_tokens
        self.predicted_seconds += stats.decode_seconds
        self.drafted += stats.drafted - stats.forced_drafted
        self.accepted += stats.accepted - stats.forced
        self.drafts += stats.drafted_steps
        self.forced += stats.forced
        self.passes += stats.verify_steps
        self.longest = max(self.longest, stats.prompt_tokens + stats.generated_tokens)


# name, help, the tally's figure: counters (prometheus_client writes the _total suffix).
COUNTERS: tuple[tuple[str, str, Callable[[Tally], float]], ...] = (
    (
        "llamacpp:prompt_tokens",
        "Number of prompt tokens processed, excluding cached tokens",
        lambda t: t.prompt_evaluated,
    ),
    ("llamacpp:prompt_tokens_cached", "Number of prompt tokens reused from the cache", lambda t: t.prompt_cached),
    ("llamacpp:prompt_seconds", "Total time spent processing prompts", lambda t: t.prompt_seconds),
    ("llamacpp:tokens_predicted", "Number of generation tokens processed", lambda t: t.predicted),
    ("llamacpp:tokens_predicted_seconds", "Total time spent generating tokens", lambda t: t.predicted_seconds),
    ("llamacpp:spec_decode_num_draft_tokens", "Speculative: Total draft tokens generated", lambda t: t.drafted),
    (
        "llamacpp:spec_decode_num_accepted_tokens",
        "Speculative: Total draft tokens accepted by the target model",
        lambda t: t.accepted,
    ),
    (
        "llamacpp:spec_decode_num_drafts",
        "Speculative: Total speculative decoding verification steps",
        lambda t: t.drafts,
    ),
    ("localspec:verify_passes", "Target passes while generating, drafted or not", lambda t: t.passes),
    ("localspec:forced_tokens", "Tokens a grammar forced, verified in the same passes", lambda t: t.forced),
)


class ServerMetrics:
    """The totals, updated by the generation thread as requests end, read by /metrics."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tallies: dict[str, Tally] = {}

    def _tally(self, model: str) -> Tally:
        return self._tallies.setdefault(model, Tally())

    def started(self, model: str, queued_seconds: float) -> None:
        with self._lock:
            tally = self._tally(model)
            tally.queued += 1
            tally.queued_seconds += queued_seconds

    def ended(self, model: str, outcome: str, stats: Stats | None = None) -> None:
        """A request over: finished, cancelled, failed or refused; stats: what it generated."""
        with self._lock:
            tally = self._tally(model)
            tally.requests[outcome] += 1
            if stats is not None:
                tally.add(stats)

    def snapshot(self) -> dict[str, Tally]:
        with self._lock:
            return {model: replace(t, requests=Counter(t.requests)) for model, t in self._tallies.items()}


class _Collector(Collector):
    def __init__(self, metrics: ServerMetrics, queue: Queue, passes: Passes) -> None:
        self.metrics = metrics
        self.queue = queue
        self.passes = passes

    def collect(self) -> Iterator[Metric]:
        tallies = self.metrics.snapshot()
        queue = self.queue()
        for model in queue:
            tallies.setdefault(model, Tally())
        requests = CounterMetricFamily("localspec:requests", "Requests ended, by outcome", labels=["model", "outcome"])
        for model, tally in tallies.items():
            for outcome, count in sorted(tally.requests.items()):
                requests.add_metric([model, outcome], count)
        yield requests
        for name, text, figure in COUNTERS:
            counter = CounterMetricFamily(name, text, labels=["model"])
            for model, tally in tallies.items():
                counter.add_metric([model], figure(tally))
            yield counter
        yield from _gauges(tallies, queue)
        # A lane's steps share passes: llama_decode calls, as llama-server counts them, are fewer
        # than the verify passes its requests' figures add up to.
        decodes = CounterMetricFamily("llamacpp:n_decode", "Number of llama_decode() calls", labels=["model"])
        for model, count in self.passes().items():
            decodes.add_metric([model], count)
        yield decodes


def _gauges(tallies: Mapping[str, Tally], queue: Mapping[str, tuple[int, int]]) -> Iterator[Metric]:
    longest = GaugeMetricFamily("llamacpp:n_tokens_max", "Largest observed sequence length", labels=["model"])
    processing = GaugeMetricFamily("llamacpp:requests_processing", "Number of requests processing", labels=["model"])
    deferred = GaugeMetricFamily("llamacpp:requests_deferred", "Number of requests deferred", labels=["model"])
    waited = SummaryMetricFamily(
        "localspec:queue_seconds", "Time requests waited in the queue before they started", labels=["model"]
    )
    for model, tally in tallies.items():
        running, waiting = queue.get(model, (0, 0))
        longest.add_metric([model], tally.longest)
        processing.add_metric([model], running)
        deferred.add_metric([model], waiting)
        waited.add_metric([model], tally.queued, tally.queued_seconds)
    yield from (longest, processing, deferred, waited)


def exposition(metrics: ServerMetrics, queue: Queue, passes: Passes) -> bytes:
    """The metrics in Prometheus' text format; passes: the lanes' shared passes per model."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(metrics, queue, passes))
    return generate_latest(registry)
