""" "Did you mean": the field names a document accepts at a place, and the close ones to a
misspelled name. Pure: reads the models' declared fields (their aliases, as written in files).
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

__all__ = ["close_names", "fields_at", "unknown_field_hint"]


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation can hold, through Optional, unions, Annotated, lists, tuples
    and dict values."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin is None:
        return []
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _models_in(args[0])
    if origin is dict or (isinstance(origin, type) and issubclass(origin, dict)):
        return _models_in(args[-1]) if args else []
    out: list[type[BaseModel]] = []
    if origin in (typing.Union, types.UnionType, list, tuple, set, frozenset) or isinstance(
        origin, type
    ):
        for a in args:
            if a is not Ellipsis:
                out.extend(m for m in _models_in(a) if m not in out)
    return out


def _field_names(model: type[BaseModel]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


def _field(model: type[BaseModel], key: str) -> Any:
    for name, f in model.model_fields.items():
        if key in (name, f.alias):
            return f.annotation
    return None


def fields_at(model: type[BaseModel], loc: Sequence[str | int]) -> list[str]:
    """The field names accepted at ``loc`` (a pydantic error location, without the unknown key)
    in a ``model`` document: those of every model that can be there, sorted."""
    current: list[type[BaseModel]] = [model]
    for part in loc:
        if isinstance(part, int):
            continue  # an item of a list: the same models
        step: list[type[BaseModel]] = []
        for m in current:
            annotation = _field(m, part)
            if annotation is not None:
                step.extend(x for x in _models_in(annotation) if x not in step)
        if step:
            current = step
            continue
        # a union member's tag in the location (e.g. the model's name): keep that member
        tagged = [m for m in current if m.__name__ == part]
        if tagged:
            current = tagged
    names: set[str] = set()
    for m in current:
        names.update(_field_names(m))
    return sorted(names)


def close_names(name: str, known: Sequence[str], n: int = 3) -> list[str]:
    """The names of ``known`` close to ``name`` (difflib's ratio ≥ 0.6), closest first; a case
    difference alone always counts."""
    same_case = [k for k in known if k.lower() == name.lower() and k != name]
    rest = difflib.get_close_matches(name, known, n=n)
    return [*same_case, *(k for k in rest if k not in same_case)][:n]


def unknown_field_hint(model: type[BaseModel], loc: Sequence[str | int]) -> str:
    """`` (did you mean 'maxDMIPS'?)`` for the unknown key at the end of ``loc``, or the
    fields accepted there when none is close and they are few; "" when nothing helps."""
    key = loc[-1] if loc else None
    if not isinstance(key, str):
        return ""
    known = fields_at(model, loc[:-1])
    close = close_names(key, known)
    if close:
        return " (did you mean " + " or ".join(repr(c) for c in close) + "?)"
    if 0 < len(known) <= 15:
        return f" (fields here: {', '.join(known)})"
    return ""
