"""Pausing Python's cyclic garbage collector around allocation-heavy work.

A reconcile allocates many short-lived objects and frees them by reference counting; the
allocations alone trigger the collector's full passes over every object of the process, which
are mostly the loaded documents: at 5,000 nodes x 20,000 instances those passes took a quarter
of a balance call and a second of every warm run, landing in whichever stage allocated next.
``balance`` and ``reconcile`` run with the collector paused; ``watch`` collects once after each
run, while it waits for the next event, so the time an edit takes to reach ``plan.json`` holds
no collection.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["collector_paused"]


@contextmanager
def collector_paused() -> Iterator[None]:
    """Disable the cyclic collector inside the block (a no-op when it is already disabled,
    so blocks nest); the previous state is restored on the way out, whatever happens."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
