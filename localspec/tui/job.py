"""One reply being generated on a worker thread, handed to the UI in batches.

The worker iterates the runtime's stream and checks the cancel flag after every event; the
engine yields after every verify step (a few milliseconds), so Esc takes effect within one
step. The runtime polls the same flag between prompt chunks, so a long prompt evaluation
stops within one chunk. Closing the stream from the worker thread releases the runtime.

Events are buffered under a lock and the UI is woken at most once per batch, so a fast
model never floods the UI's message queue: however many steps ran since the last repaint,
the UI drains them in one go. The live figures are read on the worker, as each event
arrives, while the request's Stats hold still.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from localspec.api import Finished, Runtime, TextDelta
from localspec.core.errors import LocalspecError
from localspec.core.sampling import SamplingConfig
from localspec.tui.live_stats import Figures, LiveFigures


@dataclass
class Batch:
    """What arrived since the last drain."""

    deltas: list[TextDelta] = field(default_factory=list)
    finished: Finished | None = None
    figures: Figures | None = None  # as of the last delta
    error: BaseException | None = None
    done: bool = False  # the worker has let go of the runtime


class ReplyJob:
    def __init__(
        self,
        runtime: Runtime,
        messages: Sequence[Mapping[str, Any]],
        max_tokens: int,
        sampling: SamplingConfig,
        figures: LiveFigures | None = None,
    ) -> None:
        self.runtime = runtime
        self.messages = [dict(m) for m in messages]
        self.max_tokens = max_tokens
        self.sampling = sampling
        self.figures = figures or LiveFigures()
        self.cancelled = threading.Event()
        self._lock = threading.Lock()
        self._batch = Batch()
        self._woken = False
        self.released = threading.Event()

    def cancel(self) -> None:
        self.cancelled.set()

    def run(self, wake: Callable[[], object]) -> None:
        """The worker thread's body. Never raises: errors travel to the UI in the batch."""
        try:
            events = self.runtime.stream(
                messages=self.messages, max_tokens=self.max_tokens, cancel=self.cancelled, sampling=self.sampling
            )
            try:
                for event in events:
                    if self.cancelled.is_set():
                        break
                    self._put(event, wake)
            finally:
                events.close()
        except LocalspecError as exc:
            self._fail(exc)
        except Exception as exc:  # a bug must not take the app down with the reply
            self._fail(exc)
        finally:
            with self._lock:
                self._batch.done = True
            self.released.set()
            self._wake(wake, force=True)

    def drain(self) -> Batch:
        with self._lock:
            batch, self._batch = self._batch, Batch(done=self._batch.done)
            self._woken = False
        return batch

    def _put(self, event: TextDelta | Finished, wake: Callable[[], object]) -> None:
        figures = self.figures.push(event) if isinstance(event, TextDelta) else None
        with self._lock:
            if isinstance(event, TextDelta):
                self._batch.deltas.append(event)
                self._batch.figures = figures or self._batch.figures
            else:
                self._batch.finished = event
        self._wake(wake)

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            self._batch.error = exc

    def _wake(self, wake: Callable[[], object], force: bool = False) -> None:
        with self._lock:
            if self._woken and not force:
                return
            self._woken = True
        wake()
