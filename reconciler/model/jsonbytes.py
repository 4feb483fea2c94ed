"""JSON output bytes: pretty (two-space indent, sorted keys, final newline) for files people
read and diff, with orjson (CPython's encoder falls back to pure Python whenever it indents).

A big document that changes little between runs (``status.json``, ``plan.json``) is put
together from fragments: :func:`fragment` is a value's pretty JSON as it appears nested at a
depth; :func:`member` / :func:`item` make an object's or array's pieces from them, and
:func:`join_object` / :func:`join_array` / :func:`document` join pieces into exactly the bytes
``pretty_json`` gives for the whole value, so a caller can keep each piece while its member is
unchanged (:class:`Joined` keeps a whole join)."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import orjson

__all__ = [
    "Joined",
    "document",
    "fragment",
    "item",
    "join_array",
    "join_object",
    "member",
    "pretty_json",
]

_PRETTY = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE
_NESTED = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS


def _tight(data: bytes) -> bytes:
    """``data`` in an allocation of its own size. orjson hands back bytes inside the buffer it
    grew while writing (measured with orjson 3.13: a 4 KB document holds 16 KB), and the
    controller keeps many of its outputs (20,000 configs, a patch per node) in memory."""
    return bytes(memoryview(data))


def pretty_json(value: Any) -> bytes:
    """Deterministic: the same value always gives the same bytes."""
    return _tight(orjson.dumps(value, option=_PRETTY))


def fragment(value: Any, depth: int) -> bytes:
    """``value`` as :func:`pretty_json` writes it as a member ``depth`` levels deep (its
    continuation lines indented by ``2 * depth`` more spaces; no final newline)."""
    data = orjson.dumps(value, option=_NESTED)
    return data.replace(b"\n", b"\n" + b"  " * depth) if depth else _tight(data)


def member(key: str, value: bytes, depth: int) -> bytes:
    """One member of an object at ``depth`` as :func:`join_object` joins it: ``value`` is the
    :func:`fragment` of its value at ``depth + 1``. Cache this piece to join it again later."""
    return b"\n" + b"  " * (depth + 1) + orjson.dumps(key) + b": " + value


def item(value: bytes, depth: int) -> bytes:
    """One item of an array at ``depth`` (``value``: its :func:`fragment` at ``depth + 1``)."""
    return b"\n" + b"  " * (depth + 1) + value


def join_object(members: Sequence[bytes], depth: int) -> bytes:
    """An object at ``depth`` from its :func:`member` pieces, sorted by key."""
    if not members:
        return b"{}"
    return b"{" + b",".join(members) + b"\n" + b"  " * depth + b"}"


def join_array(items: Sequence[bytes], depth: int) -> bytes:
    """An array at ``depth`` from its :func:`item` pieces."""
    if not items:
        return b"[]"
    return b"[" + b",".join(items) + b"\n" + b"  " * depth + b"]"


def document(members: Sequence[tuple[str, bytes]]) -> bytes:
    """A whole document (a top-level object, final newline) from its members (key,
    :func:`fragment` at depth 1) sorted by key, copying each fragment once (status and plan
    documents hold members of many megabytes)."""
    if not members:
        return b"{}\n"
    parts = [b"{"]
    for n, (key, frag) in enumerate(members):
        parts += [b",\n  " if n else b"\n  ", orjson.dumps(key), b": ", frag]
    parts.append(b"\n}\n")
    return b"".join(parts)


class Joined:
    """The last :func:`join_object` or :func:`join_array` of a caller's pieces, given again
    while the pieces are the same objects in the same order (a 20,000-member object is one
    15 MB copy to join)."""

    def __init__(self) -> None:
        self._pieces: list[bytes] = []
        self._bytes = b""
        self._array = False
        self._depth = -1

    def object(self, pieces: list[bytes], depth: int) -> bytes:
        return self._join(pieces, depth, False)

    def array(self, pieces: list[bytes], depth: int) -> bytes:
        return self._join(pieces, depth, True)

    def _join(self, pieces: list[bytes], depth: int, array: bool) -> bytes:
        old = self._pieces
        if (
            (array, depth) == (self._array, self._depth)
            and len(old) == len(pieces)
            and all(map(operator.is_, old, pieces))
        ):
            return self._bytes
        data = join_array(pieces, depth) if array else join_object(pieces, depth)
        self._pieces, self._bytes, self._array, self._depth = pieces, data, array, depth
        return data
