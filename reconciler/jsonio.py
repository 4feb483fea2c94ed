"""JSON output bytes: pretty (two-space indent, sorted keys, final newline) for files people
read and diff, with orjson (CPython's encoder falls back to pure Python whenever it indents).

A big document that changes little between runs (``status.json``, ``plan.json``) is put
together from fragments: :func:`fragment` is a value's pretty JSON as it appears nested at a
depth, and :func:`pretty_object` / :func:`pretty_array` join fragments into exactly the bytes
``pretty_json`` gives for the whole value, so a caller can keep each member's fragment while the
member is unchanged."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

__all__ = ["fragment", "pretty_array", "pretty_json", "pretty_object"]

_PRETTY = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE
_NESTED = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS


def pretty_json(value: Any) -> bytes:
    """Deterministic: the same value always gives the same bytes."""
    return orjson.dumps(value, option=_PRETTY)


def fragment(value: Any, depth: int) -> bytes:
    """``value`` as :func:`pretty_json` writes it as a member ``depth`` levels deep (its
    continuation lines indented by ``2 * depth`` more spaces; no final newline)."""
    data = orjson.dumps(value, option=_NESTED)
    return data.replace(b"\n", b"\n" + b"  " * depth) if depth else data


def pretty_object(members: Iterable[tuple[str, bytes]], depth: int) -> bytes:
    """An object at ``depth`` from its members, (key, :func:`fragment` of the value at
    ``depth + 1``) sorted by key, as :func:`pretty_json` writes it (no final newline)."""
    pad = b"\n" + b"  " * (depth + 1)
    parts = [pad + orjson.dumps(key) + b": " + frag for key, frag in members]
    if not parts:
        return b"{}"
    return b"{" + b",".join(parts) + b"\n" + b"  " * depth + b"}"


def pretty_array(items: Iterable[bytes], depth: int) -> bytes:
    """An array at ``depth`` from its items' :func:`fragment` at ``depth + 1``."""
    pad = b"\n" + b"  " * (depth + 1)
    parts = [pad + frag for frag in items]
    if not parts:
        return b"[]"
    return b"[" + b",".join(parts) + b"\n" + b"  " * depth + b"]"
