"""The `reconciler` command line: the commands (:mod:`.commands`) and their human output
(:mod:`.render`)."""

from reconciler.cli.commands import main

__all__ = ["main"]
