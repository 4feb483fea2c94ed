"""Plain, fast text output for the CLI's large views (``plan``, ``status``, ``explain``).

rich measures every cell of every table: at 20,000 instances that is most of a command's time.
Here a table is laid out once over plain strings and styled only at the end (ANSI codes on a
terminal with colors, nothing otherwise). A table never drops or cuts its first column: when
it is too wide for the console, the other columns' headers take their short forms, then the
widest of the other columns are narrowed and their cells wrapped onto more lines."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # rich is imported only to paint: plain output does without it
    from rich.color import ColorSystem

    from reconciler.cli.plainconsole import TextConsole

__all__ = ["Cell", "Column", "Painter", "TextTable", "wrap", "wrap_marked", "write_lines"]

Cell = str | tuple[str, str]
"""A cell's text, or (text, rich style name)."""


def _color_system(name: str) -> ColorSystem | None:
    from rich.color import ColorSystem

    systems = {
        "standard": ColorSystem.STANDARD,
        "256": ColorSystem.EIGHT_BIT,
        "truecolor": ColorSystem.TRUECOLOR,
        "windows": ColorSystem.WINDOWS,
    }
    return systems.get(name)


class Painter:
    """Styles text for one console: ANSI codes when it shows colors, the bare text when not."""

    def __init__(self, console: TextConsole) -> None:
        name = console.color_system if not console.no_color else None
        self._system = _color_system(name) if name is not None else None
        self._styles: dict[str, tuple[str, str]] = {}

    @property
    def colored(self) -> bool:
        return self._system is not None

    def __call__(self, text: str, style: str) -> str:
        if self._system is None or not style or not text:
            return text
        codes = self._styles.get(style)
        if codes is None:
            from rich.style import Style

            marked = Style.parse(style).render("\0", color_system=self._system)
            before, _, after = marked.partition("\0")
            codes = self._styles[style] = (before, after)
        return f"{codes[0]}{text}{codes[1]}"


def write_lines(console: TextConsole, lines: Sequence[str]) -> None:
    """The lines to the console's file at once (no markup, no wrapping: already laid out)."""
    if not lines:
        return
    console.file.write("\n".join(lines) + "\n")
    console.file.flush()


_WRAP_SPACE = re.compile(r"[\t\n\x0b\x0c\r]")
"""The whitespace :mod:`textwrap` turns into spaces (and may drop at a line's ends)."""


def wrap(text: str, width: int, indent: str = "", hang: str = "    ") -> list[str]:
    """Plain ``text`` as lines of at most ``width`` (``indent`` first, ``hang`` after)."""
    if (
        len(indent) + len(text) <= max(width, 20)
        and text == text.rstrip()
        and text
        and _WRAP_SPACE.search(text) is None
    ):
        return [indent + text]  # what textwrap gives a line that fits (explain: 5,000 notes)
    return textwrap.wrap(
        text,
        max(width, 20),
        initial_indent=indent,
        subsequent_indent=indent + hang,
        break_on_hyphens=False,
    ) or [indent]


def wrap_marked(
    paint: Painter,
    text: str,
    width: int,
    indent: str = "",
    marker: str = "",
    style: str = "",
) -> list[str]:
    """:func:`wrap`, with the first ``marker`` of the first line painted in ``style``."""
    lines = wrap(text, width, indent)
    if marker and marker in lines[0]:
        lines[0] = lines[0].replace(marker, paint(marker, style), 1)
    return lines


@dataclass(frozen=True)
class Column:
    header: str
    short: str = ""  # the header when the table is too wide ("" : the header)
    min_width: int = 3
    right: bool = False


@dataclass
class TextTable:
    """Rows of cells under headers, laid out to a width (see the module's docstring)."""

    columns: Sequence[Column]
    sep: str = " │ "
    rows: list[Sequence[Cell]] = field(default_factory=list)

    def add_row(self, *cells: Cell) -> None:
        self.rows.append(cells)

    def render(self, width: int, paint: Painter) -> list[str]:
        texts = [[c if isinstance(c, str) else c[0] for c in row] for row in self.rows]
        headers = [c.header for c in self.columns]
        natural = _natural(headers, texts)
        if self._total(natural) > width and any(c.short for c in self.columns):
            headers = [c.short or c.header for c in self.columns]
            natural = _natural(headers, texts)
        widths = self._fit(headers, texts, natural, width)
        if widths is None:
            return self._stacked(headers, texts, natural[0], width, paint)
        out = self._lines(headers, widths, paint, header=True)
        out.append(paint("─" * min(self._total(widths), width), "dim"))
        for row, text in zip(self.rows, texts, strict=True):
            styles = ["" if isinstance(c, str) else c[1] for c in row]
            out.extend(self._lines(text, widths, paint, styles=styles))
        return out

    def _total(self, widths: Sequence[int]) -> int:
        return sum(widths) + len(self.sep) * (len(widths) - 1)

    def _fit(
        self, headers: Sequence[str], texts: Sequence[Sequence[str]], natural: list[int], width: int
    ) -> list[int] | None:
        """The first column at its natural width; the others capped at the largest common cap
        that makes the row fit, never under their longest word (no word is cut) nor their
        min_width. None: even so the row does not fit."""
        if self._total(natural) <= width or len(natural) == 1:
            return natural
        room = width - natural[0] - len(self.sep) * (len(natural) - 1)
        rest = natural[1:]
        mins = [
            min(w, max(c.min_width, _longest_word(headers[i + 1], texts, i + 1)))
            for i, (c, w) in enumerate(zip(self.columns[1:], rest, strict=True))
        ]
        if sum(mins) > room:
            return None

        def capped(cap: int) -> list[int]:
            return [max(lo, min(w, cap)) for w, lo in zip(rest, mins, strict=True)]

        lo, hi = 1, max(rest)
        while lo < hi:  # the largest cap that fits
            mid = (lo + hi + 1) // 2
            if sum(capped(mid)) <= room:
                lo = mid
            else:
                hi = mid - 1
        widths = capped(lo)
        spare = room - sum(widths)
        for i, w in enumerate(rest):  # what the common cap left over, to the widest first
            if spare <= 0:
                break
            if w > widths[i]:
                extra = min(spare, w - widths[i])
                widths[i] += extra
                spare -= extra
        return [natural[0], *widths]

    def _stacked(
        self,
        headers: Sequence[str],
        texts: Sequence[Sequence[str]],
        first: int,
        width: int,
        paint: Painter,
    ) -> list[str]:
        """Too narrow for the columns side by side: the first column, and beside it the
        others as "header value" pairs, wrapped under each other."""
        gap = "  "
        beside = width - first - len(gap) >= 20
        room = width - first - len(gap) if beside else max(10, width - len(gap))
        indent = " " * (first + len(gap)) if beside else gap
        rest = ", ".join(headers[1:])
        if beside:
            parts = textwrap.wrap(rest, room) or [""]
            out = [paint(headers[0].ljust(first) + gap + parts[0], "bold")]
            out.extend(paint(indent + part, "bold") for part in parts[1:])
        else:
            out = [paint(headers[0], "bold"), *(gap + c for c in textwrap.wrap(rest, room))]
        out.append(paint("─" * width, "dim"))
        for row, text in zip(self.rows, texts, strict=True):
            pairs = [
                f"{h} {t}" for h, t in zip(headers[1:], text[1:], strict=True) if t and t != "-"
            ]
            chunks = textwrap.wrap("; ".join(pairs), room, break_on_hyphens=False)
            style = "" if isinstance(row[0], str) else row[0][1]
            name = paint(text[0].ljust(first) if beside and chunks else text[0], style)
            if beside and chunks:
                out.append(name + gap + chunks.pop(0))
            else:
                out.append(name)
            out.extend(indent + chunk for chunk in chunks)
        return [line.rstrip() for line in out]

    def _lines(
        self,
        cells: Sequence[str],
        widths: Sequence[int],
        paint: Painter,
        *,
        header: bool = False,
        styles: Sequence[str] = (),
    ) -> list[str]:
        columns = self.columns
        wrapped: list[list[str]] = []
        for i, (text, w) in enumerate(zip(cells, widths, strict=True)):
            if len(text) <= w or i == 0:
                wrapped.append([text])
            else:
                chunks = textwrap.wrap(text, w, break_on_hyphens=False, break_long_words=False)
                wrapped.append(chunks or [""])
        height = max(len(parts) for parts in wrapped)
        lines = []
        sep = paint(self.sep, "dim")
        for k in range(height):
            parts = []
            for i, (chunks, w) in enumerate(zip(wrapped, widths, strict=True)):
                text = chunks[k] if k < len(chunks) else ""
                padded = text.rjust(w) if columns[i].right else text.ljust(w)
                style = "bold" if header else (styles[i] if i < len(styles) else "")
                parts.append(paint(padded, style) if text else padded)
            lines.append(sep.join(parts).rstrip())
        return lines


def _natural(headers: Sequence[str], texts: Sequence[Sequence[str]]) -> list[int]:
    return [max([len(h), *(len(t[i]) for t in texts)]) for i, h in enumerate(headers)]


def _longest_word(header: str, texts: Sequence[Sequence[str]], i: int) -> int:
    words = [len(w) for w in header.split()]
    for t in texts:
        words.extend(len(w) for w in t[i].split())
    return max(words, default=1)
