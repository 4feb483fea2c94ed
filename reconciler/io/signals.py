"""Stopping long-running loops (``watch``, ``agent --watch``) cleanly on SIGTERM and SIGINT."""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

__all__ = ["stop_on_signals"]


def stop_on_signals(stop: threading.Event, log: logging.Logger) -> None:
    """Set ``stop`` on SIGTERM or SIGINT; only the main thread can install handlers."""
    if threading.current_thread() is not threading.main_thread():
        return

    def handle(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s; stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
