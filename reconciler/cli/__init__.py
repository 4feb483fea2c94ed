"""The `reconciler` command line: the commands (:mod:`.commands`) and their human output
(:mod:`.render`)."""

from __future__ import annotations

import gc
from collections.abc import Sequence

from reconciler.cli import commands

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """The ``reconciler`` program (its console script, ``python -m reconciler``): the command
    line of :func:`.commands.main` on ``sys.argv``, or on ``argv`` when given (in-process).

    The program's process ends when this returns, so it hands what it holds to the operating
    system: :func:`gc.freeze` moves every object out of the cyclic collector's view, and the
    interpreter's last collection at exit does not walk and free the whole heap one object
    at a time (the modules, classes and document schemas a command loaded: ~15 ms of a
    ``plan`` of the demo). At-exit handlers and the flush of standard output and error run
    as usual; only objects in reference cycles are left unfreed (Python does not promise to
    finalize objects that still exist at exit).
    """
    if argv is not None:  # in-process (tests): the caller's process goes on
        return commands.main(argv)
    try:
        return commands.main()
    finally:
        gc.freeze()
