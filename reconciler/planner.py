"""The planner (SPEC §10): a pure diff of placements against the actual state.

The result is a list of start/stop actions with reasons and, per node, an RFC 6902 JSON Patch
built per instance — never by a generic list diff: a ``test`` of the revision the plan was
computed from, then ``remove /instances/<id>`` for each stop, then ``add /instances/<id>`` for
each start, each group sorted by id. Applying a node's patch to its actual document gives
exactly the desired document for that node.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .models import API_VERSION, ActualInstance, ActualState
from .placement import BalanceResult, Failure, Placement

__all__ = [
    "PLAN_FORMAT_VERSION",
    "Action",
    "Plan",
    "empty_actual_document",
    "make_plan",
    "pointer",
]

PLAN_FORMAT_VERSION = 1

Reason = Literal[
    "new", "moved", "version-changed", "not-desired", "node-lost", "preempted", "rebalanced"
]


@dataclass(frozen=True, slots=True)
class Action:
    action: Literal["start", "stop"]
    instance_id: str
    item_id: str
    subject_id: str
    index: int
    version: str
    node_id: str
    runtime_id: str
    reason: Reason

    def to_json(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "instanceId": self.instance_id,
            "itemId": self.item_id,
            "subjectId": self.subject_id,
            "index": self.index,
            "version": self.version,
            "nodeId": self.node_id,
            "runtimeId": self.runtime_id,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Plan:
    fingerprint: str
    actions: tuple[Action, ...]  # stops then starts, each sorted by (node, instance id)
    failures: tuple[Failure, ...]
    patches: Mapping[str, tuple[dict[str, Any], ...]]  # node id -> RFC 6902 operations

    @property
    def changes_present(self) -> bool:
        return bool(self.actions)

    @property
    def complete(self) -> bool:
        return not self.failures

    def starts(self) -> list[Action]:
        return [a for a in self.actions if a.action == "start"]

    def stops(self) -> list[Action]:
        return [a for a in self.actions if a.action == "stop"]

    def to_json(self) -> dict[str, Any]:
        return {
            "formatVersion": PLAN_FORMAT_VERSION,
            "inputs": {"fingerprint": self.fingerprint},
            "changesPresent": self.changes_present,
            "complete": self.complete,
            "actions": [a.to_json() for a in self.actions],
            "failures": [failure_json(f) for f in self.failures],
            "nodes": {n: {"patch": list(ops)} for n, ops in sorted(self.patches.items())},
        }


def failure_json(f: Failure) -> dict[str, Any]:
    return {
        "instanceId": f.instance_id,
        "itemId": f.item_id,
        "subjectId": f.subject_id,
        "index": f.index,
        "reason": f.reason,
        "summary": f.summary,
        "counts": {code: n for code, n in f.counts},
    }


def pointer(*parts: str) -> str:
    """An RFC 6901 JSON pointer: ``~`` is ``~0`` and ``/`` is ``~1`` in each part."""
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


def _instance_pointer(iid: str) -> str:
    """``/instances/<id>``; instance ids are uuids, so escaping is almost never needed."""
    if "~" in iid or "/" in iid:
        return pointer("instances", iid)
    return "/instances/" + iid


def empty_actual_document(node_id: str) -> dict[str, Any]:
    """What a missing ``actual/<node>.yaml`` stands for: revision 0, nothing running."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ActualState",
        "nodeId": node_id,
        "revision": 0,
        "instances": {},
    }


def started_record(p: Placement) -> dict[str, Any]:
    """The record a start adds to the node's actual document."""
    return {
        "itemId": p.item_id,
        "subjectId": p.subject_id,
        "index": p.index,
        "version": p.version,
        "runtimeId": p.runtime_id,
        "state": "activating",
        "devices": {resource: list(ids) for resource, ids in p.devices},
    }


def _devices_of(inst: ActualInstance) -> tuple[tuple[str, tuple[str, ...]], ...]:
    return tuple(sorted((r, tuple(sorted(ids))) for r, ids in inst.devices.items()))


def make_plan(
    result: BalanceResult,
    actual: Mapping[str, ActualState],
    nodes: frozenset[str] | set[str],
    *,
    fingerprint: str = "",
) -> Plan:
    """Diff ``result`` against ``actual`` (SPEC §10). ``nodes`` are the ids of the nodes that
    exist now; instances on any other node are lost with it."""
    desired = result.by_id
    stops: list[Action] = []
    starts: list[Action] = []
    kept: set[str] = set()
    moved_reason: dict[str, Reason] = {}

    get = desired.get
    # nodes in id order: an instance running on two nodes is kept on the first (the order
    # within a node does not matter: actions are sorted below)
    running: list[tuple[str, str, ActualInstance]] = []
    for node_id in sorted(actual):
        for iid, inst in actual[node_id].instances.items():
            p = get(iid)
            if (
                p is not None
                and p.node_id == node_id
                and p.version == inst.version
                and p.runtime_id == inst.runtimeId
                and (p.devices == _devices_of(inst) if inst.devices else not p.devices)
                and iid not in kept
            ):
                kept.add(iid)
            else:
                running.append((node_id, iid, inst))
    for node_id, iid, inst in running:
        p = get(iid)
        reason: Reason
        if node_id not in nodes:
            reason = "node-lost"
        elif p is None:
            reason = "not-desired"
        elif p.node_id == node_id and p.version != inst.version:
            reason = "version-changed"
        elif p.cause == "preempted":
            reason = "preempted"
        elif p.cause == "rebalanced":
            reason = "rebalanced"
        else:
            reason = "moved"
        if p is not None and reason != "not-desired":
            moved_reason.setdefault(iid, reason)
        stops.append(
            Action(
                "stop",
                iid,
                inst.itemId,
                inst.subjectId,
                inst.index,
                inst.version,
                node_id,
                inst.runtimeId,
                reason,
            )
        )
    for p in result.placements:
        if p.instance_id in kept:
            continue
        starts.append(
            Action(
                "start",
                p.instance_id,
                p.item_id,
                p.subject_id,
                p.index,
                p.version,
                p.node_id,
                p.runtime_id,
                moved_reason.get(p.instance_id, "new"),
            )
        )
    stops.sort(key=lambda a: (a.node_id, a.instance_id))
    starts.sort(key=lambda a: (a.node_id, a.instance_id))

    by_node: dict[str, tuple[list[Action], list[Action]]] = {}
    for a in stops:
        by_node.setdefault(a.node_id, ([], []))[0].append(a)
    for a in starts:
        by_node.setdefault(a.node_id, ([], []))[1].append(a)
    patches: dict[str, tuple[dict[str, Any], ...]] = {}
    for node_id in sorted(set(nodes) | set(actual) | set(by_node)):
        doc = actual.get(node_id)
        node_stops, node_starts = by_node.get(node_id, ([], []))
        ops: list[dict[str, Any]] = [
            {"op": "test", "path": "/revision", "value": doc.revision if doc else 0}
        ]
        ops += [{"op": "remove", "path": _instance_pointer(a.instance_id)} for a in node_stops]
        ops += [
            {
                "op": "add",
                "path": _instance_pointer(a.instance_id),
                "value": started_record(desired[a.instance_id]),
            }
            for a in node_starts
        ]
        patches[node_id] = tuple(ops)
    return Plan(fingerprint, tuple(stops + starts), result.failures, patches)
