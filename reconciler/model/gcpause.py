"""Pausing Python's cyclic garbage collector around allocation-heavy work.

A reconcile allocates many short-lived objects and frees them by reference counting; the
allocations alone trigger the collector's full passes over every object of the process, which
are mostly the loaded documents: at 5,000 nodes x 20,000 instances those passes took a quarter
of a balance call and a second of every warm run, landing in whichever stage allocated next.
``balance`` and ``reconcile`` run with the collector paused; ``watch`` collects once after each
run, while it waits for the next event, so the time an edit takes to reach ``plan.json`` holds
no collection.

That collection would walk every object of the process each time, though nearly all of them
(the loaded state, the caches carried between runs: ~690,000 objects at 5,000 x 20,000) survive
it: 380-440 ms of an idle watcher's time after every event, while the next edit waits. So
:func:`collect_idle` freezes what survives (``gc.freeze``: moved out of the collector's view,
still freed by reference counting as usual), and an event's run collects only what was
allocated since. A garbage cycle among frozen objects would outlive those collections, so the
runs that verify everything (the first, every periodic resync) unfreeze and collect all first:
such a cycle lives until the next resync at most.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["collect_idle", "collector_paused"]


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


def collect_idle(*, full: bool) -> None:
    """Collect after a run, then freeze what survived (see the module's docstring): the next
    collection looks only at the objects allocated since. ``full``: unfreeze first, so every
    object is looked at (and a garbage cycle among objects frozen earlier is freed)."""
    if full:
        gc.unfreeze()
    gc.collect()
    gc.freeze()
