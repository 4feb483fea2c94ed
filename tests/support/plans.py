"""Placements, actual records and actual documents for the planner tests, with the defaults of a
plain instance."""

from __future__ import annotations

from typing import Any

from reconciler.model.values import instance_id
from reconciler.placement.instances import Placement, Requested


def placement(
    item: str,
    index: int,
    node: str,
    version: str = "1.0.0",
    runtime: str = "runc",
    devices: tuple[tuple[str, tuple[str, ...]], ...] = (),
) -> Placement:
    return Placement(
        instance_id(item, "default", index),
        item,
        "default",
        index,
        version,
        0,
        node,
        runtime,
        Requested(),
        (),
        devices,
    )


def record(
    item: str,
    index: int,
    version: str = "1.0.0",
    runtime: str = "runc",
    state: str = "active",
    devices: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    return {
        "itemId": item,
        "subjectId": "default",
        "index": index,
        "version": version,
        "runtimeId": runtime,
        "state": state,
        "devices": devices or {},
    }


def actual_doc(node: str, revision: int, records: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "reconciler/v1",
        "kind": "ActualState",
        "nodeId": node,
        "revision": revision,
        "instances": {instance_id(r["itemId"], r["subjectId"], r["index"]): r for r in records},
    }
