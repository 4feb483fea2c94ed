"""A YAML reader for untrusted input (SPEC §5).

It never constructs objects from tags and never expands aliases: it walks ruamel.yaml's
pure-Python *event* stream (no C parser, so deep nesting cannot crash the process) and builds
plain dicts, lists and scalars itself, with YAML 1.2 core-schema scalars. Every rejection carries
a 1-based line and column. Alongside the data it returns where each value and key started, so a
validation error deep in a document can be reported as ``file:line:col``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Literal

from reconciler.model.human import human_bytes
from reconciler.model.values import INT64_MAX, INT64_MIN

_LIBYAML: ModuleType | None
try:  # PyYAML with its C extension: used for events only
    import yaml as _pyyaml

    _LIBYAML = _pyyaml if hasattr(_pyyaml, "CSafeLoader") else None
except ImportError:  # pragma: no cover - PyYAML is a dependency
    _LIBYAML = None

__all__ = [
    "DEFAULT_MAX_BYTES",
    "MAX_DEPTH",
    "Engine",
    "Parsed",
    "Path",
    "YamlRejected",
    "decode_strict",
    "json_int",
    "parse_yaml",
    "reject_duplicate_keys",
]

DEFAULT_MAX_BYTES = 1024 * 1024
MAX_DEPTH = 64

Path = tuple[str | int, ...]


class YamlRejected(Exception):
    """A file that is not acceptable input; ``line`` and ``col`` are 1-based."""

    def __init__(self, line: int, col: int, message: str) -> None:
        super().__init__(f"{line}:{col}: {message}")
        self.line = line
        self.col = col
        self.message = message


@dataclass(frozen=True)
class Parsed:
    data: Any
    value_pos: dict[Path, tuple[int, int]] = field(default_factory=dict)
    key_pos: dict[Path, tuple[int, int]] = field(default_factory=dict)
    source: bytes | None = None  # set when positions are computed only on demand

    def position(self, path: Path, *, prefer_key: bool = False) -> tuple[int, int]:
        """The position of the longest prefix of ``path`` that is known."""
        if self.source is not None and not self.value_pos:
            located = parse_yaml(self.source, max_bytes=len(self.source), engine="ruamel")
            self.value_pos.update(located.value_pos)
            self.key_pos.update(located.key_pos)
        for n in range(len(path), -1, -1):
            prefix = path[:n]
            if prefer_key and prefix in self.key_pos:
                return self.key_pos[prefix]
            if prefix in self.value_pos:
                return self.value_pos[prefix]
            if prefix in self.key_pos:
                return self.key_pos[prefix]
        return (1, 1)


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def _line_col(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    col = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return line, col


def decode_strict(raw: bytes, max_bytes: int = DEFAULT_MAX_BYTES) -> str:
    """Size cap, strict UTF-8 (a UTF-8 BOM is dropped), no control characters."""
    if len(raw) > max_bytes:
        size, limit = human_bytes(len(raw)), human_bytes(max_bytes)
        raise YamlRejected(1, 1, f"file is {size}, over the limit of {limit}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        good = raw[: e.start].decode("utf-8", "replace")
        line, col = _line_col(good, len(good))
        utf16 = raw[:2] in (b"\xff\xfe", b"\xfe\xff")
        hint = " (a UTF-16 byte-order mark: save the file as UTF-8)" if utf16 else ""
        raise YamlRejected(line, col, f"not valid UTF-8{hint}") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    m = _CONTROL.search(text)
    if m:
        line, col = _line_col(text, m.start())
        raise YamlRejected(line, col, f"control character {m.group()!r} is not allowed")
    return text


# YAML 1.2 core schema (https://yaml.org/spec/1.2.2/#1032-tag-resolution)
_INT10 = re.compile(r"^[-+]?[0-9]+$")
_INT8 = re.compile(r"^0o[0-7]+$")
_INT16 = re.compile(r"^0x[0-9a-fA-F]+$")
_FLOAT = re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$")
_INF = re.compile(r"^[-+]?\.(?:inf|Inf|INF)$")
_NAN = re.compile(r"^\.(?:nan|NaN|NAN)$")


_WORDS: dict[str, Any] = {
    **dict.fromkeys(("", "~", "null", "Null", "NULL")),
    **dict.fromkeys(("true", "True", "TRUE"), True),
    **dict.fromkeys(("false", "False", "FALSE"), False),
}
"""The core schema's null and bool words, matched whole (its patterns are anchored at both
ends, and a plain scalar never ends in a line break)."""

_NUMERIC_START = frozenset("0123456789+-.")
"""Every int, float, inf and nan of the core schema starts with one of these."""


class _OutOfRange(ValueError):
    """An integer scalar beyond 64 bits; the composer reports it at the scalar's position."""


def _int(value: str, digits: str, base: int) -> int:
    """The integer ``digits`` (in ``base``, sign in ``value``) when it fits in 64 bits signed.
    Leading zeros are dropped and the length is checked before any conversion: a huge literal
    is refused at once, never handed to ``int()`` (whose 4300-digit limit raises)."""
    significant = digits.lstrip("+-").lstrip("0")
    if len(significant) <= _MAX_DIGITS[base]:
        n = int(significant or "0", base)
        n = -n if value.startswith("-") else n
        if INT64_MIN <= n <= INT64_MAX:
            return n
    shown = value if len(value) <= 30 else value[:27] + "..."
    raise _OutOfRange(
        f"integer {shown} is out of range: integers lie within {INT64_MIN}..{INT64_MAX} (64 bits)"
    )


_MAX_DIGITS = {10: len(str(2**63)), 8: len(f"{2**63:o}"), 16: len(f"{2**63:x}")}


def _resolve_plain(value: str) -> Any:
    if value in _WORDS:
        return _WORDS[value]
    if value[0] not in _NUMERIC_START:
        return value  # most scalars (ids, names, paths): no pattern can match
    if _INT10.match(value):
        return _int(value, value, 10)
    if _INT8.match(value):
        return _int(value, value[2:], 8)
    if _INT16.match(value):
        return _int(value, value[2:], 16)
    if _FLOAT.match(value):
        return float(value)
    if _INF.match(value):
        return -math.inf if value.startswith("-") else math.inf
    if _NAN.match(value):
        return math.nan
    return value


def _pos(event: Any) -> tuple[int, int]:
    mark = event.start_mark
    return (mark.line + 1, mark.column + 1)


class _Container:
    __slots__ = ("is_map", "key", "key_at", "path", "value")

    def __init__(self, is_map: bool, path: Path) -> None:
        self.is_map = is_map
        self.path = path
        self.value: Any = {} if is_map else []
        self.key: str | None = None
        self.key_at: dict[str, tuple[int, int]] = {}


Engine = Literal["auto", "ruamel", "libyaml", "json"]


def parse_yaml(
    raw: bytes, *, max_bytes: int = DEFAULT_MAX_BYTES, engine: Engine = "auto"
) -> Parsed:
    """Parse one untrusted YAML document; raise :class:`YamlRejected` for anything unsafe.

    Engines, all with the same rules and results (the tests run every case on each):
    ``json`` for a document that is JSON (machine-written files: ``json`` with duplicate-key
    detection, positions computed only when an error needs them); ``libyaml``, PyYAML's C
    parser, used for its *event stream* only and only when a bracket pre-scan shows nesting within
    the limit (its loaders crash on deep nesting, its event parser does not recurse);
    ``ruamel``, the pure-Python parser, the reference. ``auto`` picks the fastest that applies.
    """
    text = decode_strict(raw, max_bytes)
    if engine == "auto":
        engine = _choose_engine(text)
    if engine == "json":
        data = _parse_json(text)
        if data is not _NOT_JSON:
            if data is None:
                raise YamlRejected(1, 1, "the document is empty (null)")
            return Parsed(data, source=raw)
        engine = "libyaml" if _LIBYAML is not None and _shallow(text) else "ruamel"
    if engine == "libyaml":
        if _LIBYAML is None:
            engine = "ruamel"
        elif not _shallow(text):
            engine = "ruamel"  # only the pure-Python parser sees deeply nested input
    if engine == "libyaml":
        data = _plain_libyaml(text)
        if data is _LOOK_CLOSER:  # not plainly acceptable: the reference composer says why
            data = _compose_libyaml(text)
        return Parsed(data, source=raw)  # positions are found again only if an error needs them
    from ruamel.yaml.error import MarkedYAMLError, YAMLError  # (only here: start-up)

    value_pos: dict[Path, tuple[int, int]] = {}
    key_pos: dict[Path, tuple[int, int]] = {}
    data = _compose(text, _ruamel_events(text), MarkedYAMLError, YAMLError, (value_pos, key_pos))
    return Parsed(data, value_pos, key_pos)


def _choose_engine(text: str) -> Engine:
    head = text.lstrip()[:1]
    if head in ("{", "["):
        return "json"
    return "libyaml" if _LIBYAML is not None else "ruamel"


def _shallow(text: str) -> bool:
    """A cheap upper bound of flow nesting: every bracket counts, quoted or not."""
    depth = peak = 0
    for ch in _NOT_BRACKET.sub("", text):
        if ch in "[{":
            depth += 1
            if depth > peak:
                peak = depth
                if peak > MAX_DEPTH:
                    return False
        elif ch in "]}":
            depth -= 1
    return True


_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_NOT_JSON: Any = object()


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def json_int(text: str) -> int:
    """A JSON integer, within the same 64 bits as a YAML one (else the YAML engine reads the
    document again and reports the scalar with its position)."""
    return _int(text, text, 10)


def reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` for ``json.loads``: a duplicate key is an error, not last-wins."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _parse_json(text: str) -> Any:
    """The document as JSON, or ``_NOT_JSON`` when it is not plain, safe JSON (then a YAML
    engine reads it and reports any problem with its position)."""
    if not _shallow(text):
        return _NOT_JSON
    try:
        return json.loads(
            text,
            object_pairs_hook=reject_duplicate_keys,
            parse_constant=_reject_constant,
            parse_int=json_int,
        )
    except (ValueError, RecursionError):
        return _NOT_JSON


def _ruamel_events(text: str) -> Iterator[Any]:
    # ruamel.yaml is imported where used: a unit's clean YAML never needs it (libyaml reads
    # it), and importing it costs a command's start-up ~10 ms
    from ruamel.yaml import YAML

    yield from YAML(typ="rt", pure=True).parse(text)


def _libyaml_events(text: str) -> Iterator[Any]:
    assert _LIBYAML is not None
    loader = _LIBYAML.CSafeLoader(text)
    try:
        while loader.check_event():
            yield loader.get_event()
    finally:
        loader.dispose()


def _compose_libyaml(text: str) -> Any:
    """:func:`_compose` over libyaml's events, without positions."""
    assert _LIBYAML is not None
    return _compose(text, _libyaml_events(text), _LIBYAML.MarkedYAMLError, _LIBYAML.YAMLError, None)


_LOOK_CLOSER: Any = object()


def _plain_libyaml(text: str) -> Any:
    """The value :func:`_compose_libyaml` gives for a document that breaks no rule, by a
    tighter loop over the same events and scalar resolution (no positions, no per-event
    closures; about a third less time over a unit's machine-written YAML). Anything else (an
    anchor, alias or tag, a directive, a duplicate or merge key, a key that is not a scalar,
    nesting deeper than ``MAX_DEPTH``, a second or no document, a null document, a parser
    error, a scalar that cannot be resolved) returns ``_LOOK_CLOSER``: the reference composer
    then reads the file again and gives its verdict, so every rejection is its own, message
    and position included."""
    assert _LIBYAML is not None
    events = _LIBYAML.events
    scalar = events.ScalarEvent
    map_start, seq_start = events.MappingStartEvent, events.SequenceStartEvent
    map_end, seq_end = events.MappingEndEvent, events.SequenceEndEvent
    resolve = _resolve_plain
    loader = _LIBYAML.CSafeLoader(text)
    try:
        get = loader.get_event
        if type(get()) is not events.StreamStartEvent:
            return _LOOK_CLOSER
        start = get()
        if type(start) is not events.DocumentStartEvent or start.version or start.tags:
            return _LOOK_CLOSER
        parents: list[tuple[Any, bool, str | None]] = []  # the open containers but the last
        current: Any = None  # the innermost open container (None: the root is not open yet)
        is_map = False
        key: str | None = None  # the current mapping's key waiting for its value
        result: Any = None
        while True:
            event = get()
            kind = type(event)
            if kind is scalar:
                if event.anchor is not None or event.tag is not None:
                    return _LOOK_CLOSER
                style = event.style
                if is_map and key is None:
                    name = event.value
                    if name in current or (name == "<<" and not style):
                        return _LOOK_CLOSER  # a duplicate key, a merge key
                    key = name
                    continue
                value = event.value if style else resolve(event.value)
                if current is None:
                    result = value  # a scalar document
                    break
                if is_map:
                    current[key] = value
                    key = None
                else:
                    current.append(value)
            elif kind is map_start or kind is seq_start:
                if event.anchor is not None or event.tag is not None:
                    return _LOOK_CLOSER
                if current is not None:
                    if is_map and key is None:
                        return _LOOK_CLOSER  # a mapping or sequence as a key
                    if len(parents) + 1 >= MAX_DEPTH:
                        return _LOOK_CLOSER
                    parents.append((current, is_map, key))
                current, is_map, key = ({}, True, None) if kind is map_start else ([], False, None)
            elif kind is map_end or kind is seq_end:
                done = current
                if not parents:
                    result = done
                    break
                current, is_map, key = parents.pop()
                if is_map:
                    current[key] = done
                    key = None
                else:
                    current.append(done)
            else:  # an alias, or an event out of place
                return _LOOK_CLOSER
        if type(get()) is not events.DocumentEndEvent or type(get()) is not events.StreamEndEvent:
            return _LOOK_CLOSER  # a second document
        return _LOOK_CLOSER if result is None else result
    except Exception:  # a parser error, a scalar int() refuses: the reference reports it
        return _LOOK_CLOSER
    finally:
        loader.dispose()


def _compose(
    text: str,
    events: Iterator[Any],
    marked_error: type[Exception],
    yaml_error: type[Exception],
    positions: tuple[dict[Path, tuple[int, int]], dict[Path, tuple[int, int]]] | None,
) -> Any:
    """Build plain values from an event stream, enforcing every rule of SPEC §5; record where
    every value and key starts when ``positions`` is given."""
    track = positions is not None
    value_pos, key_pos = positions if positions is not None else ({}, {})
    stack: list[_Container] = []
    result: Any = None
    documents = 0
    have_root = False

    def child_path() -> Path:
        top = stack[-1]
        if top.is_map:
            assert top.key is not None
            return (*top.path, top.key)
        return (*top.path, len(top.value))

    def attach(value: Any) -> None:
        nonlocal result, have_root
        if not stack:
            result = value
            have_root = True
            return
        top = stack[-1]
        if top.is_map:
            assert top.key is not None
            top.value[top.key] = value
            top.key = None
        else:
            top.value.append(value)

    def check_node(event: Any) -> None:
        if getattr(event, "anchor", None) is not None:
            raise YamlRejected(*_pos(event), "anchors and aliases are not allowed")
        if getattr(event, "tag", None) is not None:
            raise YamlRejected(*_pos(event), f"explicit tags are not allowed ({event.tag})")

    try:
        for event in events:
            kind = type(event).__name__
            if kind == "DocumentStartEvent":
                if event.version is not None or event.tags:
                    line = next(
                        (n for n, t in enumerate(text.splitlines(), 1) if t.startswith("%")), 1
                    )
                    raise YamlRejected(line, 1, "%YAML and %TAG directives are not allowed")
                documents += 1
                if documents > 1:
                    raise YamlRejected(*_pos(event), "more than one document in the file")
                continue
            if kind == "AliasEvent":
                raise YamlRejected(*_pos(event), "anchors and aliases are not allowed")
            is_key = bool(stack) and stack[-1].is_map and stack[-1].key is None
            if kind == "ScalarEvent":
                check_node(event)
                if is_key:
                    top = stack[-1]
                    key = event.value
                    if event.style in (None, "") and key == "<<":
                        raise YamlRejected(*_pos(event), "merge keys (<<) are not allowed")
                    if key in top.key_at:
                        first = top.key_at[key]
                        raise YamlRejected(
                            *_pos(event), f"duplicate key {key!r} (first at line {first[0]})"
                        )
                    top.key_at[key] = _pos(event)
                    top.key = key
                    if track:
                        key_pos[(*top.path, key)] = _pos(event)
                    continue
                if track:
                    value_pos[child_path() if stack else ()] = _pos(event)
                plain = event.style is None or event.style == ""
                try:
                    attach(_resolve_plain(event.value) if plain else event.value)
                except _OutOfRange as e:
                    raise YamlRejected(*_pos(event), str(e)) from None
            elif kind in ("MappingStartEvent", "SequenceStartEvent"):
                check_node(event)
                if is_key:
                    raise YamlRejected(*_pos(event), "mapping keys must be plain strings")
                if len(stack) >= MAX_DEPTH:
                    raise YamlRejected(*_pos(event), f"nesting deeper than {MAX_DEPTH} levels")
                path = child_path() if (stack and track) else ()
                if track:
                    value_pos[path] = _pos(event)
                stack.append(_Container(kind == "MappingStartEvent", path))
            elif kind in ("MappingEndEvent", "SequenceEndEvent"):
                done = stack.pop()
                attach(done.value)
    except YamlRejected:
        raise
    except marked_error as e:
        raise _syntax_error(text, e) from None
    except yaml_error as e:
        raise YamlRejected(1, 1, f"invalid YAML: {e}") from None
    except (RecursionError, MemoryError, ValueError, TypeError) as e:
        raise YamlRejected(1, 1, f"cannot parse: {type(e).__name__}") from None
    if not have_root or documents == 0:
        raise YamlRejected(1, 1, "the file holds no document (empty or only comments)")
    if result is None:
        raise YamlRejected(1, 1, "the document is empty (null)")
    return result


# ---------------------------------------------------------------- where a syntax error is

_Pos = tuple[int, int]  # 0-based line and column, as the parsers' marks give them


def _syntax_error(text: str, error: Any) -> YamlRejected:
    """A parser's error as a rejection at the place to fix, the parser's own words kept.

    The parsers report where they noticed the problem: for a bracket or a quote that is never
    closed that is often several lines later, where the next token turned out not to fit (or at
    the end of the file). The error is then moved to the end of the content on the last line
    that still belongs to the unclosed bracket or quote, where the closing character is
    missing; the parser's words follow with the place it noticed. A tab where the parser
    stopped is named as such. The parser's context ("while parsing a flow sequence") is kept
    with the place it started."""
    problem_mark = getattr(error, "problem_mark", None)
    context_mark = getattr(error, "context_mark", None)
    problem = getattr(error, "problem", None)
    context = getattr(error, "context", None)
    mark = problem_mark or context_mark
    if mark is None:
        return YamlRejected(1, 1, f"invalid YAML: {problem or context or error}")
    noticed: _Pos = (mark.line, mark.column)
    words = str(problem or context)
    notes: list[str] = []
    if context and context_mark is not None and (context_mark.line, context_mark.column) != noticed:
        notes.append(f"{context} started at {context_mark.line + 1}:{context_mark.column + 1}")
    lines = text.split("\n")
    quote_at = (
        (context_mark.line, context_mark.column)
        if context == "while scanning a quoted scalar" and context_mark is not None
        else None
    )
    moved = _unclosed(lines, noticed, quote_at)
    if moved is not None:
        at, what = moved
        notes.insert(0, f"noticed at {noticed[0] + 1}:{noticed[1] + 1}")
        message = f"{what} ({words}; {', '.join(notes)})"
    else:
        at = noticed
        if _char_at(lines, at) == "\t":
            message = f"a tab character: YAML indents with spaces, never tabs ({words}"
            message += f"; {', '.join(notes)})" if notes else ")"
        else:
            message = f"{words} ({', '.join(notes)})" if notes else words
    return YamlRejected(at[0] + 1, at[1] + 1, f"invalid YAML: {message}")


def _char_at(lines: list[str], at: _Pos) -> str:
    line = lines[at[0]] if at[0] < len(lines) else ""
    return line[at[1]] if at[1] < len(line) else ""


_COMMENT = re.compile(r"(?:^|\s)#.*$")
_OPENERS = {"FlowSequenceStartToken": "'['", "FlowMappingStartToken": "'{'"}
_CLOSERS = frozenset(("FlowSequenceEndToken", "FlowMappingEndToken"))


def _unclosed(lines: list[str], noticed: _Pos, quote_at: _Pos | None) -> tuple[_Pos, str] | None:
    """Where the bracket or quote that a syntax error noticed at ``noticed`` really lacks its
    closing character, and what is unclosed; None when no such construct explains it.

    A bracket or quote opened on line L must be closed before the next line that is indented
    no deeper than L (YAML requires its continuation lines to be indented under it), and
    before the end of the file. The place is the end of the content of the last line before
    that: right after its last character, a trailing comment left out for a bracket."""
    spans: list[tuple[_Pos, _Pos, str]] = []  # (opened at, last place it reaches, what)
    open_flows: list[tuple[_Pos, str]] = []
    for token in _tokens_until(lines, noticed):
        kind = type(token).__name__
        start: _Pos = (token.start_mark.line, token.start_mark.column)
        if kind in _OPENERS:
            open_flows.append((start, _OPENERS[kind]))
        elif kind in _CLOSERS and open_flows:
            opened, what = open_flows.pop()
            spans.append((opened, start, what))
        elif kind == "ScalarToken" and getattr(token, "style", None) in ("'", '"'):
            spans.append((start, (token.end_mark.line, token.end_mark.column), "the quote"))
    spans.extend((opened, noticed, what) for opened, what in open_flows)
    if quote_at is not None:
        spans.append((quote_at, noticed, "the quote"))
    at_end = not "\n".join(lines)[_offset(lines, noticed) :].strip()
    found: list[tuple[_Pos, str]] = []
    for opened, reach, what in spans:
        flow = what != "the quote"
        dedent = next(
            (
                n
                for n in range(opened[0] + 1, min(reach[0], len(lines) - 1) + 1)
                if _is_content(lines[n], flow) and _indent(lines[n]) <= _indent(lines[opened[0]])
            ),
            None,
        )
        if dedent is not None:
            stop: _Pos = (dedent, 0)
        elif at_end and reach == noticed:
            stop = noticed
        else:
            continue
        fix = _content_end(lines, opened, stop, flow)
        if fix is not None:
            found.append((fix, f"{what} opened at {opened[0] + 1}:{opened[1] + 1} is not closed"))
    if not found and at_end:
        fix = _content_end(lines, (0, 0), noticed, True)
        if fix is not None:
            found.append((fix, "the file ends too early"))
    best = min(found, default=None)
    return best if best is not None and best[0] < noticed else None


def _tokens_until(lines: list[str], noticed: _Pos) -> Iterator[Any]:
    """ruamel's tokens of the text that start before ``noticed``, up to the scanner's error."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    tokens = YAML(typ="rt", pure=True).scan("\n".join(lines))
    try:
        for token in tokens:
            mark = token.start_mark
            if (mark.line, mark.column) >= noticed:
                return
            yield token
    except YAMLError:
        return


def _offset(lines: list[str], at: _Pos) -> int:
    return sum(len(line) + 1 for line in lines[: at[0]]) + at[1]


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _is_content(line: str, flow: bool) -> bool:
    """Whether a line holds anything (in a bracket, a comment is nothing; in a quote, text)."""
    return bool((_COMMENT.sub("", line) if flow else line).strip())


def _content_end(lines: list[str], start: _Pos, stop: _Pos, flow: bool) -> _Pos | None:
    """The place right after the last content character from ``start`` to before ``stop``."""
    for n in range(min(stop[0], len(lines) - 1), start[0] - 1, -1):
        line = lines[n][: stop[1]] if n == stop[0] else lines[n]
        if n == start[0]:
            head, line = line[: start[1]], line[start[1] :]
        else:
            head = ""
        body = (_COMMENT.sub("", line) if flow else line).rstrip()
        if body:
            return (n, len(head) + len(body))
    return None
