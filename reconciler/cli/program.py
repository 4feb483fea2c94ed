"""The program's own process (the ``reconciler`` command, ``python -m reconciler``), which ends
when its command returns, unlike a process that calls :func:`reconciler.cli.commands.main` and
goes on (the tests): what the command line leaves out there to start and end sooner.

- At the end, :func:`gc.freeze` moves every object out of the cyclic collector's view: the
  interpreter's last collection at exit does not walk and free the whole heap one object at a
  time (the modules, classes and document schemas a command loaded: ~35 ms of a ``plan`` of the
  demo). At-exit handlers and the flush of standard output and error run as usual; only objects
  in reference cycles are left unfreed (Python does not promise to finalize objects that still
  exist at exit).
- A :func:`one_shot` command (``plan``, ``validate``, ``explain``, ``status``, ``reconcile``,
  ``apply``, ``rebalance``) runs with the cyclic collector off: its imports and reads make
  long-lived objects, not garbage cycles, and what it allocates is freed by reference counting
  (as ``reconcile()`` runs with the collector paused); ~12 ms of a ``plan`` of the demo. For
  the commands that write, it spares the collection that would follow the run's pause:
  ``reconcile()`` allocates a few million objects with the collector paused, and the first
  collection after the pause walks them all (~0.4 s at 20,000 instances) just before the
  process exits. A long-running command (``watch``, ``agent``) keeps the collector and collects
  while idle.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable
from typing import Any, TypeVar, cast

__all__ = ["one_shot", "run"]

F = TypeVar("F", bound=Callable[..., Any])

_running = False  # this process is the program: it ends when the command returns


def run(main: Callable[[], int]) -> int:
    """``main()`` as the program's process: see the module's docstring."""
    global _running
    _running = True
    try:
        return main()
    finally:
        gc.freeze()


def one_shot(f: F) -> F:
    """A command that runs once: as the program, the cyclic collector is off from its start to
    the process's end; in any other process it runs as it is."""

    @functools.wraps(f)
    def command(*args: Any, **kwargs: Any) -> Any:
        if _running:
            gc.disable()
        return f(*args, **kwargs)

    return cast(F, command)
