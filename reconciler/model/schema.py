"""JSON Schemas of every document kind (``reconciler schema``), generated from the models.

Besides the four document kinds, the output holds ``ResourcesFile``: the schema of a node's
``resourcesFile`` (SPEC §6.2, a JSON array of resource entries), so that every input file of a
state directory has a schema an editor can check it against.
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from reconciler.model.documents import KINDS, HostResource
from reconciler.model.fielddocs import add_descriptions

__all__ = ["RESOURCES_FILE", "all_schemas", "schema_for"]

_DIALECT = "https://json-schema.org/draft/2020-12/schema"

RESOURCES_FILE = "ResourcesFile"
"""The name of the resources file's schema in :func:`all_schemas`."""


def schema_for(kind: str) -> dict[str, Any]:
    if kind == RESOURCES_FILE:
        schema = TypeAdapter(list[HostResource]).json_schema(mode="validation")
        add_descriptions(schema, HostResource)
    else:
        schema = KINDS[kind].model_json_schema(mode="validation")
        add_descriptions(schema, KINDS[kind])
    return {"$schema": _DIALECT, "$id": f"reconciler/v1/{kind}", **schema}


def all_schemas() -> dict[str, dict[str, Any]]:
    return {kind: schema_for(kind) for kind in sorted([*KINDS, RESOURCES_FILE])}
