"""The `reconciler` command line: the commands (:mod:`.commands`) and their human output
(:mod:`.render`)."""

from __future__ import annotations

from collections.abc import Sequence

from reconciler.cli import commands, program

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """The ``reconciler`` program (its console script, ``python -m reconciler``): the command
    line of :func:`.commands.main` on ``sys.argv``, in a process that ends when it returns
    (:mod:`.program`: what that process leaves out); with ``argv``, the command line in a
    process that goes on (the tests)."""
    if argv is not None:
        return commands.main(argv)
    return program.run(commands.main)
