"""Field descriptions for the JSON Schemas, read from the models' attribute docstrings.

Every field of a document model is followed by a docstring (``name: T`` then ``\"\"\"what it
means\"\"\"``). pydantic could read them itself (``use_attribute_docstrings``), but that parses
the source of every model at import time, a cost every command would pay; here the source is
read only when a schema is made (``reconciler schema``, the field reference).
"""

from __future__ import annotations

import ast
import inspect
import itertools
import textwrap
from functools import cache
from typing import Any

from pydantic import BaseModel

__all__ = ["add_descriptions", "field_docs", "models_by_name"]


@cache
def field_docs(cls: type[BaseModel]) -> dict[str, str]:
    """``{field: docstring}`` of the fields of ``cls`` (its own and its bases'), whitespace
    collapsed to single spaces."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not (isinstance(klass, type) and issubclass(klass, BaseModel)) or klass is BaseModel:
            continue
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):  # no source (a frozen build): no descriptions
            continue
        body = ast.parse(source).body[0]
        assert isinstance(body, ast.ClassDef)
        stmts = body.body
        for stmt, after in itertools.pairwise(stmts):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[stmt.target.id] = " ".join(after.value.value.split())
    return {name: doc for name, doc in docs.items() if name in cls.model_fields}


def models_by_name(root: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """Every model reachable from ``root`` through its fields' types, by class name (the names
    pydantic gives the schemas' ``$defs``)."""
    found: dict[str, type[BaseModel]] = {}

    def visit(tp: Any) -> None:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            if tp.__name__ in found:
                return
            found[tp.__name__] = tp
            for info in tp.model_fields.values():
                visit(info.annotation)
            return
        for arg in getattr(tp, "__args__", ()) or ():
            visit(arg)
        origin = getattr(tp, "__origin__", None)
        if origin is not None and origin is not tp:
            visit(origin)

    visit(root)
    return found


def _describe(prop: dict[str, Any], doc: str) -> None:
    """Set the property's description to ``doc``, keeping the type's own (e.g. what a byte
    quantity looks like) after it."""
    own = prop.get("description")
    if own and own != doc:
        doc = f"{doc} {own[0].upper()}{own[1:]}{'' if own.endswith('.') else '.'}"
    prop["description"] = doc


def add_descriptions(schema: dict[str, Any], root: type[BaseModel]) -> dict[str, Any]:
    """``schema`` (made from ``root``) with every documented field's description filled in;
    changed in place and returned."""
    models = models_by_name(root)
    targets = [(root.__name__, schema), *schema.get("$defs", {}).items()]
    for name, sub in targets:
        model = models.get(name)
        if model is None:
            continue
        for field, doc in field_docs(model).items():
            prop = sub.get("properties", {}).get(field)
            if prop is not None:
                _describe(prop, doc)
    return schema
