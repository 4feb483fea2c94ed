"""JSON Schemas of every document kind (``reconciler schema``), generated from the models."""

from __future__ import annotations

from typing import Any

from .models import KINDS

__all__ = ["all_schemas", "schema_for"]

_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def schema_for(kind: str) -> dict[str, Any]:
    model = KINDS[kind]
    schema = model.model_json_schema(mode="validation")
    return {"$schema": _DIALECT, "$id": f"reconciler/v1/{kind}", **schema}


def all_schemas() -> dict[str, dict[str, Any]]:
    return {kind: schema_for(kind) for kind in sorted(KINDS)}
