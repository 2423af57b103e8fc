"""SIGTERM and SIGHUP (a closed terminal, `kill`, a service manager stopping us) end a
command the way Ctrl+C does: as a KeyboardInterrupt, so every `finally` runs, temporary
files go and child processes are stopped."""

from __future__ import annotations

import signal
import threading
from types import FrameType


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def interrupt_on_termination() -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set handlers (an app embedding main() in a thread)
    for name in ("SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is not None:
            signal.signal(sig, _interrupt)
