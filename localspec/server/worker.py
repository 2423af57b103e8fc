"""The server's requests as jobs on the served Pool (serve --parallel N: lanes whose passes
are shared): which job runs on which runtime, and when, is the pool's dispatcher's to say
(localspec.dispatch); this module turns requests into jobs, their events into the client's,
and the dispatcher's refusals into 503s. A cancelled job stops after the verify step in
flight. A job for another pair waits until it holds every runtime, then that pair replaces
the served one."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from localspec.api import Finished, Prompt, Runtime, TextDelta
from localspec.core.engine import check_fits
from localspec.core.errors import ContextFullError, LocalspecError
from localspec.core.sampling import LogprobRecorder, SamplingConfig
from localspec.core.stats import Stats
from localspec.dispatch import Dispatcher, LineFullError, Ticket
from localspec.pool import Pool
from localspec.server.fim import FimTokens, find_fim_tokens
from localspec.server.grammar import GrammarRequest
from localspec.server.metrics import ServerMetrics
from localspec.server.request_prompts import raw_prompt
from localspec.server.schemas import ApiError
from localspec.strategies import drafting

log = logging.getLogger("localspec.server")

Item = TextDelta | Finished | BaseException
Loader = Callable[[str], Runtime | Pool]
HISTORY = 64  # finished jobs kept for /health and the tests
PROMPT_KEYS = ("prompt", "messages", "fim", "tools")  # a request's prompt, which becomes one Prompt


class QueueFullError(ApiError):
    def __init__(self, waiting: int, retry_after: int) -> None:
        super().__init__(
            503,
            f"the server is busy: {waiting} requests are waiting; retry in {retry_after} s",
            type="server_error",
            code="queue_full",
            headers={"Retry-After": str(retry_after)},
        )


def shutting_down() -> ApiError:
    return ApiError(503, "the server is shutting down", type="server_error", code="shutting_down")


def not_loaded(model_id: str, error: BaseException) -> ApiError:
    return ApiError(503, f"{model_id} could not be loaded: {error}", type="server_error", code="model_not_loaded")


@dataclass
class Job:
    """One generation request. `emit` must be safe to call from the generation thread."""

    model: str
    request: Mapping[str, Any]  # Runtime.stream keyword arguments
    emit: Callable[[Item], None]
    logprobs: int | None = None  # alternatives per token's logprobs; None: no logprobs
    recorder: LogprobRecorder | None = None  # made when the job runs, for the model it runs on
    grammar: GrammarRequest | None = None  # a JSON response_format or a forced tool call
    # Tokenized in the request's thread (Worker.check_prompt); None: the generation thread does it.
    prompt: Prompt | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)
    steps: int = 0  # verify steps whose tokens were taken from the runtime
    steps_at_cancel: int | None = None
    outcome: str = "waiting"  # then running, finished, cancelled or failed
    finished: threading.Event = field(default_factory=threading.Event)
    submitted: float = 0.0  # perf_counter when it was queued, for the metrics' queue time
    stats: Stats | None = None  # its figures so far, once it generates
    ticket: Ticket | None = None  # its place in the served pool's line, then its runtime
    # Whether each step's text is sent: a whole answer needs only its Finished, and every event
    # wakes the server's event loop (several lanes' steps would keep it busy).
    deltas: bool = True

    def cancel(self) -> None:
        """Ask the generation to stop; it ends after the verify step in flight."""
        if not self.cancelled.is_set():
            self.steps_at_cancel = self.steps
            self.cancelled.set()


class Worker:
    """Jobs, each waiting in the served pool's line and run in a thread of its own once given a
    runtime. `max_queue` jobs may wait; more get a 503 with Retry-After. Given no runtime, a
    thread loads `model_id` once begin() is called, jobs waiting in a line without runtimes
    meanwhile; `on_loaded` then hears None, or the load's error (each waiting job gets a 503)."""

    def __init__(
        self,
        runtime: Runtime | None,
        model_id: str,
        loader: Loader,
        max_queue: int,
        on_loaded: Callable[[BaseException | None], None] | None = None,
    ) -> None:
        # A runtime handed in is the app's own: served, set aside for another pair, never closed here.
        self.pool: Pool | None = Pool.single(runtime, owned=False) if runtime is not None else None
        self.model_id = model_id
        self.loader = loader
        self.max_queue = max_queue
        self.on_loaded = on_loaded
        self.loaded = threading.Event()  # set once the first runtime is there, or its load failed
        self.load_error: BaseException | None = None
        self._begun = threading.Event()
        self.history: deque[Job] = deque(maxlen=HISTORY)
        self.served = 0
        self.metrics = ServerMetrics()
        self._fim: FimTokens | bool | None = False  # False: not looked up yet for this model
        self._cond = threading.Condition()  # guards the jobs' outcomes and the figures below
        self._jobs: list[Job] = []  # waiting or running
        self._room = Dispatcher(0)  # the line while no pool is served (one loads)
        self._stopping = False
        self._seconds: deque[float] = deque(maxlen=8)  # recent request durations, for Retry-After
        # Held while the runtime is replaced, so a request thread never tokenizes with a closed model.
        self.swap_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        if runtime is not None:
            self.loaded.set()
            self._begun.set()
        else:
            self._thread(self._load_when_begun, "localspec-load")

    @property
    def runtime(self) -> Runtime | None:
        """The served pool's first runtime: what prompts are tokenized and checked with."""
        return self.pool.runtimes[0] if self.pool is not None else None

    # -- requests -----------------------------------------------------------------------------

    def begin(self) -> None:
        """Start loading the served model (a worker made without a runtime)."""
        self._begun.set()

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._stopping:
                raise shutting_down()
            if self.load_error is not None:
                raise not_loaded(self.model_id, self.load_error)
            prompt, reuse = job.prompt.ids if job.prompt is not None else None, job.request.get("reuse_prefix", "any")
            ticket = Ticket(prompt, self._swaps(job.model), job.model, reuse)
            try:
                self._line().enter(ticket, self.max_queue)
            except LineFullError as full:
                self.metrics.ended(job.model, "refused")
                raise QueueFullError(full.waiting, self._retry_after(full.waiting)) from None
            job.ticket, job.submitted = ticket, time.perf_counter()
            self._jobs.append(job)
            self._cond.notify_all()
        self._thread(lambda: self._run(job), "localspec-generation")

    def withdraw(self, job: Job) -> None:
        """A client left: drop its job if it still waits, else stop it after this step."""
        with self._cond:
            if job.outcome == "waiting":
                self._drop(job, "cancelled")
                return
        job.cancel()

    def status(self) -> dict[str, Any]:
        with self._cond:
            state = "error" if self.load_error is not None else "ok" if self.loaded.is_set() else "loading"
            running = sum(job.outcome != "waiting" for job in self._jobs)  # in a runtime, ended or not
            return {
                "status": state,
                **({"error": str(self.load_error)} if self.load_error is not None else {}),
                "model": self.model_id,
                "busy": bool(running),
                "running": running,
                "parallel": len(self.pool.runtimes) if self.pool is not None else 1,
                "waiting": sum(job.outcome == "waiting" for job in self._jobs),
                "served": self.served,
            }

    def queue_by_model(self) -> dict[str, tuple[int, int]]:
        """Per model: requests running and waiting, for /metrics."""
        with self._cond:
            counts: dict[str, tuple[int, int]] = {}
            for job in self._jobs:
                running, waiting = counts.get(job.model, (0, 0))
                counts[job.model] = (running + (job.outcome != "waiting"), waiting + (job.outcome == "waiting"))
            return counts

    def passes_by_model(self) -> dict[str, int]:
        """The served model's shared passes since it was loaded, for /metrics (none without lanes)."""
        with self._cond:
            pool = self.pool
        passes = pool.shared_passes() if pool is not None else None
        return {self.model_id: passes} if passes is not None else {}

    def wait_until(self, condition: Callable[[dict[str, Any]], bool], timeout: float | None = None) -> bool:
        """Block until condition(status()) holds, e.g. lambda s: not s["busy"]; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: condition(self.status()), timeout)

    def _line(self) -> Dispatcher:
        """Where a job waits now: the served pool's line, or the room while one loads (_cond held)."""
        return self.pool.dispatch if self.pool is not None else self._room

    def _swaps(self, model: str) -> bool:
        """Whether a job for `model` needs every runtime: another pair is loaded in their place."""
        return model != self.model_id

    def _drop(self, job: Job, outcome: str, item: Item | None = None) -> None:
        """End a job that has not run (_cond held)."""
        job.outcome = outcome
        self.metrics.ended(job.model, outcome)
        if job.ticket is not None:
            job.ticket.leave()
        if item is not None:
            job.emit(item)
        self._jobs.remove(job)
        job.finished.set()
        self._cond.notify_all()

    def _thread(self, target: Callable[[], None], name: str) -> None:
        self._threads = [thread for thread in self._threads if thread.is_alive()]
        thread = threading.Thread(target=target, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def check_prompt(
        self, model: str, request: Mapping[str, Any], grammar: GrammarRequest | None = None
    ) -> Prompt | None:
        """Tokenize the prompt and compile the response format now, in the request's thread,
        so a prompt that does not fit or a schema that cannot be used is refused with a status
        before a stream begins; the job carries the ids, so the prompt is tokenized once.
        Skipped (None) when another model must be loaded first: the generation thread
        tokenizes it then."""
        with self.swap_lock:
            runtime = self.runtime
            if runtime is None or model != self.model_id:
                return None
            if grammar is not None:
                grammar.constraint(runtime)  # compiled now so a bad schema is a 400 before the stream
            if (speculation := request.get("speculation")) is not None:
                drafting(runtime.plan, speculation)  # a strategy the model was not loaded with: a 400 now
            return self._tokenize(runtime, request)

    def _tokenize(self, runtime: Runtime, request: Mapping[str, Any]) -> Prompt:
        """The request's prompt, checked and tokenized: user-given ids or a chat by the runtime;
        a raw text, a chat offered tools and a fill-in-the-middle request into ids made here."""
        sampling = request.get("sampling")
        n_vocab = runtime.target.info.n_vocab
        if isinstance(sampling, SamplingConfig) and any(t >= n_vocab for t, _ in sampling.logit_bias):
            raise ApiError(400, f"logit_bias names a token id over {self.model_id}'s {n_vocab - 1}", param="logit_bias")
        try:
            if "tools" in request and request["tools"] is not None:
                ids = runtime.tool_prompt(request["tools"], request["messages"])
            elif "fim" in request:
                ids = self._fim_prompt(runtime, *request["fim"])
            elif isinstance(request.get("prompt"), str):
                ids = raw_prompt(runtime, request["prompt"])
            else:
                return runtime.prepare(request.get("prompt"), request.get("messages"))
            check_fits(ids, runtime.target.info.n_ctx)
            return Prompt(tuple(ids))
        except ContextFullError as exc:
            raise ContextFullError(exc.message, "shorten the prompt, or start the server with a larger --ctx") from None

    def _fim_prompt(self, runtime: Runtime, prefix: str, suffix: str) -> list[int]:
        fim = self._fim_tokens(runtime)
        if fim is None:
            raise ApiError(
                400,
                f"{self.model_id} has no fill-in-the-middle tokens in its vocabulary, so 'suffix' cannot be used",
                param="suffix",
                code="fim_unsupported",
            )
        target = runtime.target
        head = target.tokenize("", add_special=True, parse_special=False)
        return fim.prompt(
            prefix, suffix, lambda text: target.tokenize(text, add_special=False, parse_special=False), head
        )

    def _sampling(self, runtime: Runtime, job: Job, sampling: SamplingConfig) -> SamplingConfig:
        """The request's sampling with its per-request parts: the logprob recorder and the grammar."""
        if job.logprobs is not None:
            job.recorder = LogprobRecorder(job.logprobs, runtime.target.token_bytes)
            sampling = replace(sampling, logprobs=job.recorder)
        if job.grammar is not None:
            sampling = replace(sampling, constraint=job.grammar.constraint(runtime))
        return sampling

    def _fim_tokens(self, runtime: Runtime) -> FimTokens | None:
        """The loaded model's fill-in-the-middle tokens, looked up once per model."""
        if self._fim is False:
            self._fim = find_fim_tokens(runtime.target.vocab_identity())
        assert not isinstance(self._fim, bool)
        return self._fim

    def stop(self) -> None:
        """End the requests in flight after their current step and refuse those waiting."""
        with self._cond:
            self._stopping = True
            for job in list(self._jobs):
                if job.outcome == "waiting":
                    self._drop(job, "cancelled", shutting_down())
                else:
                    job.cancel()
            self._cond.notify_all()
        self._begun.set()

    def close(self, timeout: float = 30.0) -> None:
        self.stop()
        # A load cannot be interrupted: the thread closes what it loads once it sees the stop.
        deadline = time.monotonic() + (timeout if self.loaded.is_set() else min(timeout, 2.0))
        for thread in list(self._threads):
            thread.join(max(deadline - time.monotonic(), 0.0))
        with self.swap_lock:  # the pool closes its runtimes unless it is an app's own runtime
            served, self.pool = self.pool, None
            if served is not None:
                served.close()

    def _retry_after(self, waiting: int) -> int:
        per_request = sum(self._seconds) / len(self._seconds) if self._seconds else 1.0
        return max(1, round(per_request * (waiting + 1)))

    # -- a job's thread --------------------------------------------------------------------------

    def _run(self, job: Job) -> None:
        assert job.ticket is not None
        try:
            lane = job.ticket.wait()
        except LocalspecError:  # its line was closed: whoever closed it has ended the job
            return
        with self._cond:
            if job.outcome != "waiting":  # withdrawn as its runtime was given
                job.ticket.leave()
                return
            job.outcome = "running"
            self._cond.notify_all()
        started = time.perf_counter()
        self.metrics.started(job.model, started - job.submitted)
        try:
            self._serve(job, lane)
        finally:
            job.ticket.leave()
            with self._cond:
                self._jobs.remove(job)
                self.served += 1
                self._seconds.append(time.perf_counter() - started)
                self.history.append(job)
                self._cond.notify_all()
            job.finished.set()

    def _load_when_begun(self) -> None:
        self._begun.wait()
        if not self._stopping:  # else stopped before the load began (the port was taken, say)
            self._first_load()

    def _first_load(self) -> None:
        """Load the served model. A failed load fails every waiting job and every later one
        with its error."""
        try:
            pool = _as_pool(self.loader(self.model_id))
        except Exception as exc:  # whatever stopped it, the server says it and stops
            log.info("loading %s failed: %s", self.model_id, exc)
            self._failed(exc)
            if self.on_loaded is not None:
                self.on_loaded(exc)
            return
        with self.swap_lock, self._cond:
            stopping = self._stopping
            if not stopping:
                self._install(pool, self.model_id)
            self.loaded.set()
            self._cond.notify_all()
        if stopping:  # stopped while it loaded: nobody will close it otherwise
            pool.close()
            return
        if pool.note:
            log.warning("%s", pool.note)
        if self.on_loaded is not None:
            self.on_loaded(None)

    def _failed(self, error: BaseException) -> None:
        """No model to serve: every job waiting, and every later one, gets the load's error."""
        with self._cond:
            self.load_error = error
            for job in list(self._jobs):
                if job.outcome == "waiting":
                    self._drop(job, "failed", not_loaded(self.model_id, error))
            self._room.close(not_loaded(self.model_id, error))
            self.loaded.set()
            self._cond.notify_all()

    def _install(self, pool: Pool, model: str) -> None:
        """Serve `pool` for `model`: the jobs waiting in the room move to its line, in their
        order; those for another pair there need every runtime (swap_lock and _cond held)."""
        self.pool, self.model_id = pool, model
        self._room.hand_over(pool.dispatch, lambda ticket: self._swaps(ticket.key or model))

    def _serve(self, job: Job, lane: int) -> None:
        try:
            runtime = self._runtime_for(job, lane)
            prompt = job.prompt if job.prompt is not None else self._tokenize(runtime, job.request)
            request = {key: value for key, value in job.request.items() if key not in PROMPT_KEYS}
            request["sampling"] = self._sampling(runtime, job, request["sampling"])
            with runtime.stream(prompt, **request) as events:
                for event in events:
                    job.stats = event.stats
                    if isinstance(event, TextDelta) and event.tokens:
                        job.steps += 1
                    if job.cancelled.is_set():
                        break
                    if isinstance(event, Finished):
                        self._end(job, "finished", event)
                    elif job.deltas:
                        job.emit(event)
        except (LocalspecError, ApiError) as exc:
            self._end(job, "failed", exc)
            return
        except Exception as exc:  # a bug must end this request, not the generation thread
            log.exception("generation failed")
            self._end(job, "failed", exc)
            return
        if job.cancelled.is_set():
            self._end(job, "cancelled", shutting_down() if self._stopping else None)
        else:
            self._end(job, "finished")

    def _end(self, job: Job, outcome: str, item: Item | None = None) -> None:
        """The job's outcome, counted in the metrics before its last event is sent (so a
        client that reads /metrics after its answer finds it there); once per job."""
        if job.outcome != "running":
            return
        job.outcome = outcome
        self.metrics.ended(job.model, outcome, job.stats)
        if item is not None:
            job.emit(item)

    def _runtime_for(self, job: Job, lane: int) -> Runtime:
        """The runtime the job was given, once its pair is served: another pair is loaded in
        place of the current one (one pair in memory at a time) while the job holds every
        runtime, and the job then takes the first runtime of the new pool."""
        if not self._swaps(job.model) and self.pool is not None:
            return self.pool.runtimes[lane]
        log.info("loading %s in place of %s", job.model, self.model_id)
        with self.swap_lock:
            with self._cond:  # the jobs behind it, and those that come meanwhile, wait in the room
                served, self.pool = self.pool, None
                if served is not None:
                    served.dispatch.hand_over(self._room)
            if served is not None:
                served.close()
            self._fim = False
            served, error = self._load_in_place(job.model)
            with self._cond:
                if served is None:
                    assert error is not None
                    self._failed(error)
                    raise error
                if error is None:  # first in the new line, ahead of those that waited behind it
                    job.ticket = served.dispatch.enter(Ticket(key=job.model))
                self._install(served, self.model_id if error is not None else job.model)
        if error is not None:
            raise error
        assert job.ticket is not None
        return served.runtimes[job.ticket.wait()]

    def _load_in_place(self, model: str) -> tuple[Pool | None, BaseException | None]:
        """`model`'s pool; where it cannot be loaded, the pair served before (kept serving)
        and the error; where that fails too, no pool."""
        try:
            return _as_pool(self.loader(model)), None
        except BaseException as exc:
            try:
                return _as_pool(self.loader(self.model_id)), exc
            except Exception as again:
                log.info("loading %s again failed: %s", self.model_id, again)
                return None, exc


def _as_pool(served: Runtime | Pool) -> Pool:
    return served if isinstance(served, Pool) else Pool.single(served)
