"""Loading a model in the chat app: on a worker thread, with a fetch offered for a model not
downloaded yet, the old runtime closed only once its last reply lets go, past chats recalled."""

from __future__ import annotations

from collections.abc import Callable

from textual import work
from textual.worker import get_current_worker

from localspec.api import Runtime
from localspec.core.errors import BackendClosedError, LocalspecError
from localspec.tui.chat_base import ChatBase
from localspec.tui.history import HistoryError
from localspec.tui.job import ReplyJob
from localspec.tui.screens import FetchScreen, LoadErrorScreen
from localspec.tui.settings import ChatSettings, remember

# Past chats fed to n-gram lookup's memory when a model loads: the newest this many.
RECALLED_CONVERSATIONS = 100


class ModelLoading(ChatBase):
    """The part of the chat app that loads, replaces and recalls into its runtime."""

    def start_loading(self, settings: ChatSettings) -> None:
        missing = self._missing_model(settings) if self._missing_model else None
        if missing is not None:
            self.status.show("The model is not downloaded yet.", "error")

            def fetched(ok: bool | None) -> None:
                if ok:
                    self.start_loading(settings)
                else:
                    self.status.show("No model loaded: Ctrl+O to choose one, or Ctrl+Q to quit.", "error")

            self.push_screen(FetchScreen(missing), fetched)
            return
        self.loading = True
        self.status.show(f"Loading {settings.model_label()} (strategy {settings.load.strategy})…", "busy")
        self._load(settings, self.runtime, self._last_job)

    @work(thread=True, exclusive=True, group="load")
    def _load(self, settings: ChatSettings, previous: Runtime | None, previous_job: ReplyJob | None) -> None:
        try:
            runtime = self._load_runtime(settings, self._announce_loading)
            plain_step = _modelled_plain_step(runtime)
        except Exception as exc:
            self.call_from_thread(self._load_failed, settings, exc)
            return
        self.call_from_thread(self._loaded, settings, runtime, plain_step)
        if previous is not None and previous is not runtime:
            # No request starts while loading, so the last job is the only one that can still
            # hold the old runtime (it was stopped and lets go within one step).
            if previous_job is not None:
                previous_job.released.wait()
            previous.close()

    def _announce_loading(self, what: str) -> None:
        # From load()'s timer thread, once a step has run for a while: say what it is.
        self.call_from_thread(self.status.show, f"{what[:1].upper()}{what[1:]}…", "busy")

    def _loaded(self, settings: ChatSettings, runtime: Runtime, plain_step: Callable[[], float | None]) -> None:
        self.runtime, self._plain_step, self.settings, self.loading = runtime, plain_step, settings, False
        self._last_job = None
        self.update_topbar()
        self.show_ready()
        self._recall(runtime, self._past_chats())

    def _past_chats(self) -> list[list[dict[str, str]]]:
        """The newest saved chats as messages, read here in the app's thread (the history's)."""
        if self.history is None:
            return []
        chats = []
        try:
            for summary in self.history.conversations(RECALLED_CONVERSATIONS):
                conversation = self.history.get(summary.id)
                system = [{"role": "system", "content": conversation.system}] if conversation.system else []
                chats.append(system + [{"role": m.role, "content": m.content} for m in conversation.messages])
        except HistoryError:
            pass  # the history's own notice has said what is wrong with it
        return chats

    @work(thread=True, group="recall")
    def _recall(self, runtime: Runtime, chats: list[list[dict[str, str]]]) -> None:
        # After the first answer can start: each chat takes the runtime only for its tokenizing.
        worker = get_current_worker()
        for messages in chats:
            if worker.is_cancelled:
                return
            try:
                runtime.remember(messages=messages)
            except BackendClosedError:
                return  # closed for another model
            except LocalspecError:
                continue  # a chat the template refuses is left out

    def _load_failed(self, settings: ChatSettings, exc: BaseException) -> None:
        self.loading = False
        still = f"; still using {self.settings.model_label()}" if self.runtime else ""
        self.status.show(f"Could not load {settings.model_label()}{still}", "error")

        def chosen(choice: str | None) -> None:
            if choice == "retry":
                self.start_loading(settings)
            elif choice == "quit":
                self.exit()
            else:
                self.open_settings(settings)
            if self.runtime is not None:
                self.show_ready()

        self.push_screen(LoadErrorScreen(settings, exc), chosen)

    async def apply_settings(self, new: ChatSettings) -> None:
        if self._remember_settings:
            remember(new)
        if new.needs_new_runtime(self.settings) or self.runtime is None:
            await self.cancel_turn()
            self.start_loading(new)
            return
        system_changed = new.system != self.settings.system
        self.settings = new
        if system_changed and self.conversation_id is not None:
            self._save(lambda h, cid: h.set_system(cid, new.system))
        self.update_topbar()


def _modelled_plain_step(runtime: Runtime) -> Callable[[], float | None]:
    """t_verify(1) as the controller's cost curve has it now, else from the calibration cache
    or the prior for a fixed draft length: nothing is timed before the first reply."""
    policy = runtime.policy
    if policy.prices() is not None:
        return lambda: prices.step if (prices := policy.prices()) is not None else None
    if not runtime.plan.drafts:
        return lambda: None
    try:
        from localspec.control.calibrate import starting_calibration

        measured = starting_calibration(runtime.target).verify_seconds[0]
    except Exception:
        return lambda: None  # the estimate is optional; a model that cannot be timed still chats
    return lambda: measured
