"""A console for plain text, without rich, when rich would print plain text anyway.

The text views (:mod:`.textout`, :mod:`.render`) lay their lines out themselves: of a console
they need only its width, whether it shows colors, and its file. When standard output is not a
terminal (a pipe, a file, a CI log) rich's console shows no colors and its width is fixed, so
``plan`` can print the same bytes without importing rich (about 18 ms of its start-up).
:func:`plain_console` gives such a console only when rich would certainly treat the stream as
no terminal, from the same rules rich uses (``TTY_COMPATIBLE``, ``FORCE_COLOR``, ``isatty``);
anything else (a terminal, a forced color, Jupyter, Windows) is left to rich.
"""

from __future__ import annotations

import builtins
import os
import sys
from typing import IO, Any, Protocol, TextIO

__all__ = ["PlainConsole", "TextConsole", "no_terminal", "plain_console"]


class TextConsole(Protocol):
    """What the text views need of a console (a rich ``Console`` is one)."""

    @property
    def width(self) -> int: ...

    @property
    def color_system(self) -> str | None: ...

    @property
    def no_color(self) -> bool: ...

    @property
    def file(self) -> IO[str]: ...

    def print(self, *objects: Any) -> None: ...


class PlainConsole:
    """Standard output as plain text, ``width`` columns wide: no colors, as rich's console
    for a stream that is no terminal."""

    def __init__(self, width: int) -> None:
        self._width = width

    @property
    def width(self) -> int:
        return self._width

    @property
    def color_system(self) -> str | None:
        return None

    @property
    def no_color(self) -> bool:
        return os.environ.get("NO_COLOR", "") != ""

    @property
    def file(self) -> IO[str]:
        """Standard output as it is now (as rich's console: a test may have replaced it)."""
        out: IO[str] = sys.stdout
        return getattr(out, "rich_proxied_file", out)

    def print(self, *objects: Any) -> None:
        """As rich's ``Console.print``: plain printable text is written as it is; anything
        rich could render otherwise (markup, emoji codes, tabs, control characters, objects
        that are not text) is handed to a rich console of the same kind."""
        if all(type(o) is str and o.isprintable() and not _RICH_SYNTAX & set(o) for o in objects):
            self.file.write(" ".join(objects) + "\n")
            return
        from rich.console import Console

        console = Console(width=self._width, highlight=False, soft_wrap=True, file=self.file)
        console.print(*objects)


_RICH_SYNTAX = frozenset("[:")  # markup, emoji codes


def no_terminal(stream: TextIO | None) -> bool:
    """Whether rich would certainly see ``stream`` as no terminal (so: no colors, no
    spinner). False when rich's own answer could differ: ask rich then."""
    if stream is None or sys.platform == "win32" or hasattr(builtins, "get_ipython"):
        return False
    tty_compatible = os.environ.get("TTY_COMPATIBLE", "")
    if tty_compatible in ("0", "1"):
        return tty_compatible == "0"
    force_color = os.environ.get("FORCE_COLOR")
    if force_color is not None:
        return force_color == ""
    isatty = getattr(stream, "isatty", None)
    try:
        return isatty is None or not isatty()
    except ValueError:  # closed
        return True


def plain_console(min_width: int) -> PlainConsole | None:
    """A console for standard output as ``reconciler.cli.commands`` makes it with rich when
    stdout is no terminal (``COLUMNS`` wide when that is set, else the terminal's width, at
    least ``min_width``), or None when stdout may be a terminal (or ``COLUMNS`` is 0)."""
    if not no_terminal(sys.stdout):
        return None
    columns = os.environ.get("COLUMNS")
    if columns is not None and columns.isdigit():
        # (rich prints an empty line as nothing at width 0: left to rich)
        return PlainConsole(int(columns)) if int(columns) > 0 else None
    return PlainConsole(max(_terminal_width(), min_width))


def _terminal_width() -> int:
    """rich's width of a console with no terminal: the first of the process's standard
    streams (by their original descriptors) that is a terminal, else 80."""
    width = 0
    for stream, default in ((sys.__stdin__, 0), (sys.__stdout__, 1), (sys.__stderr__, 2)):
        try:
            width = os.get_terminal_size(_fileno(stream, default)).columns
        except (AttributeError, ValueError, OSError):
            continue
        break
    return width or 80


def _fileno(stream: TextIO | None, default: int) -> int:
    try:
        return stream.fileno() if stream is not None else default
    except Exception:  # as rich: a stream without a descriptor counts as the default one
        return default
