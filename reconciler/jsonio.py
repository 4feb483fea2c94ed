"""JSON output bytes: pretty (two-space indent, sorted keys, final newline) for files people
read and diff, with orjson (CPython's encoder falls back to pure Python whenever it indents)."""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["pretty_json"]

_PRETTY = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE


def pretty_json(value: Any) -> bytes:
    """Deterministic: the same value always gives the same bytes."""
    return orjson.dumps(value, option=_PRETTY)
