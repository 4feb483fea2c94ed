"""The planner (SPEC §10): a pure diff of placements against the actual state.

The result is a list of start/stop actions with reasons and, per node, an RFC 6902 JSON Patch
built per instance — never by a generic list diff: a ``test`` of the revision the plan was
computed from, then ``remove /instances/<id>`` for each stop, then ``add /instances/<id>`` for
each start, each group sorted by id. Applying a node's patch to its actual document gives
exactly the desired document for that node.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Literal

from reconciler.model.documents import API_VERSION, ActualInstance, ActualState
from reconciler.model.jsonbytes import document, fragment, item, join_array, join_object, member
from reconciler.placement.instances import BalanceResult, Failure, Placement

__all__ = [
    "PLAN_FORMAT_VERSION",
    "Action",
    "Plan",
    "Reason",
    "action_piece",
    "arrivals",
    "by_node_and_id",
    "empty_actual_document",
    "failure_json",
    "failure_piece",
    "make_plan",
    "match_node",
    "node_patch",
    "node_piece",
    "plan_bytes",
    "plan_document",
    "pointer",
    "start_action",
    "started_record",
    "stop_action",
    "stop_reason",
]

PLAN_FORMAT_VERSION = 1

Reason = Literal[
    "new",
    "moved",
    "version-changed",
    "not-desired",
    "node-lost",
    "preempted",
    "rebalanced",
    "unplaceable",
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


def instance_pointer(iid: str) -> str:
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


def started_record(p: Placement, ip: str | None = None) -> dict[str, Any]:
    """The record a start adds to the node's actual document (``ip``: the instance's address
    in its network, SPEC §17, recorded when it has one)."""
    record: dict[str, Any] = {
        "itemId": p.item_id,
        "subjectId": p.subject_id,
        "index": p.index,
        "version": p.version,
        "runtimeId": p.runtime_id,
        "state": "activating",
        "devices": {resource: list(ids) for resource, ids in p.devices},
    }
    if ip is not None:
        record["ip"] = ip
    return record


def devices_of(inst: ActualInstance) -> tuple[tuple[str, tuple[str, ...]], ...]:
    return tuple(sorted((r, tuple(sorted(ids))) for r, ids in inst.devices.items()))


def match_node(
    node_id: str, doc: ActualState, get: Callable[[str], Placement | None]
) -> tuple[list[str], list[tuple[str, ActualInstance]]]:
    """The instances running on ``node_id`` as they are placed (same node, version, runtime
    and devices), and the others: each of those is stopped there."""
    matches: list[str] = []
    others: list[tuple[str, ActualInstance]] = []
    for iid, inst in doc.instances.items():
        p = get(iid)
        if (
            p is not None
            and p.node_id == node_id
            and p.version == inst.version
            and p.runtime_id == inst.runtimeId
            and (p.devices == devices_of(inst) if inst.devices else not p.devices)
        ):
            matches.append(iid)
        else:
            others.append((iid, inst))
    return matches, others


def by_node_and_id(a: Action) -> tuple[str, str]:
    return (a.node_id, a.instance_id)


def arrivals(result: BalanceResult, actual: Mapping[str, ActualState]) -> dict[str, int]:
    """Per node, the highest priority of the instances placed there that do not run there
    yet (one pass over the placements, made only when a plan stops a desired instance that
    has no place: :func:`stop_reason` asks for it)."""
    top: dict[str, int] = {}
    for p in result.placements:
        there = actual.get(p.node_id)
        arriving = there is None or p.instance_id not in there.instances
        if arriving and p.priority > top.get(p.node_id, p.priority - 1):
            top[p.node_id] = p.priority
    return top


def node_piece(node_id: str, ops: tuple[dict[str, Any], ...]) -> bytes:
    return member(node_id, fragment({"patch": list(ops)}, 2), 1)


def stop_reason(
    node_id: str,
    inst: ActualInstance,
    p: Placement | None,
    nodes: frozenset[str] | set[str],
    unplaced: Mapping[str, int],
    arrivals_of: Callable[[], Mapping[str, int]],
    iid: str,
) -> Reason:
    """Why the instance ``iid`` running on ``node_id`` as ``inst`` is stopped there (it does
    not run as placed: see :func:`match_node`). ``p``: its placement, None when it has none;
    ``unplaced``: the priority of each desired instance without a place; ``arrivals_of``:
    :func:`arrivals` of the plan, asked for only when needed."""
    if node_id not in nodes:
        return "node-lost"
    if p is None:
        if iid not in unplaced:
            return "not-desired"
        # displaced: an instance of higher priority is placed on its node and does not run
        # there yet. That is what a preemption leaves behind, and it stays so in every run
        # until the agents act, so the reason does not change between runs (the balancer's
        # record of an eviction lives for one run only)
        priority = unplaced[iid]
        return "preempted" if arrivals_of().get(node_id, priority) > priority else "unplaceable"
    if p.node_id == node_id and p.version != inst.version:
        return "version-changed"
    if p.cause == "preempted":
        return "preempted"
    if p.cause == "rebalanced":
        return "rebalanced"
    return "moved"


def stop_action(node_id: str, iid: str, inst: ActualInstance, reason: Reason) -> Action:
    return Action(
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


def start_action(p: Placement, reason: Reason) -> Action:
    return Action(
        "start",
        p.instance_id,
        p.item_id,
        p.subject_id,
        p.index,
        p.version,
        p.node_id,
        p.runtime_id,
        reason,
    )


def node_patch(
    revision: int,
    stops: Sequence[Action],
    starts: Sequence[Action],
    desired: Mapping[str, Placement],
    ips: Sequence[str | None] = (),
) -> tuple[dict[str, Any], ...]:
    """A node's RFC 6902 patch: a ``test`` of the revision its actual document had, a
    ``remove`` per stop, then an ``add`` of the record of each start (:func:`started_record`;
    ``ips``: each start's address, when the plan has addresses)."""
    ops: list[dict[str, Any]] = [{"op": "test", "path": "/revision", "value": revision}]
    ops += [{"op": "remove", "path": instance_pointer(a.instance_id)} for a in stops]
    ops += [
        {
            "op": "add",
            "path": instance_pointer(a.instance_id),
            "value": started_record(desired[a.instance_id], ip),
        }
        for a, ip in zip(starts, ips or repeat(None), strict=False)
    ]
    return tuple(ops)


def action_piece(a: Action) -> bytes:
    """An action as an item of the plan document's ``actions`` array."""
    return item(fragment(a.to_json(), 2), 1)


def failure_piece(f: Failure) -> bytes:
    """A failure as an item of the plan document's ``failures`` array."""
    return item(fragment(failure_json(f), 2), 1)


def plan_document(
    plan: Plan,
    inputs: Mapping[str, Any],
    actions_array: bytes,
    nodes_object: bytes,
    failures_array: bytes,
) -> bytes:
    """The plan document's bytes, given its ``actions`` array (joined :func:`action_piece`
    items), its ``nodes`` object (joined :func:`node_piece` members, by node id) and its
    ``failures`` array (joined :func:`failure_piece` items)."""
    members = [
        ("actions", actions_array),
        ("changesPresent", fragment(plan.changes_present, 1)),
        ("complete", fragment(plan.complete, 1)),
        ("failures", failures_array),
        ("formatVersion", fragment(PLAN_FORMAT_VERSION, 1)),
        ("inputs", fragment(dict(inputs), 1)),
        ("nodes", nodes_object),
    ]
    return document(members)


def make_plan(
    result: BalanceResult,
    actual: Mapping[str, ActualState],
    nodes: frozenset[str] | set[str],
    *,
    fingerprint: str = "",
    addresses: Mapping[str, str] | None = None,
) -> Plan:
    """Diff ``result`` against ``actual`` (SPEC §10). ``nodes`` are the ids of the nodes that
    exist now; instances on any other node are lost with it. ``addresses``: per instance id,
    its address in its network (SPEC §17), recorded by the start that adds it.

    Every instance running where it is placed (:func:`match_node`) is kept; every other
    running instance is stopped where it runs (:func:`stop_reason` says why); every placement
    not running where it is placed is started, with the reason of its stop when it is moved
    (else ``new``). Actions are sorted by node, then instance id; every node that exists,
    has an actual document or has an action gets a patch (:func:`node_patch`).

    This is the reference: a watcher plans through
    :class:`reconciler.accel.plans.PlanMemo` instead, which gives the same plan at the cost of
    what changed since its last one."""
    desired = result.by_id
    get = desired.get
    kept: set[str] = set()
    running: list[tuple[str, str, ActualInstance]] = []
    for node_id in sorted(actual):
        matched, others = match_node(node_id, actual[node_id], get)
        kept.update(matched)  # (an id matches on the node it is placed on only)
        running += [(node_id, iid, inst) for iid, inst in others]
    unplaced = {f.instance_id: f.priority for f in result.failures}
    arrived: list[Mapping[str, int]] = []

    def arrivals_of() -> Mapping[str, int]:
        if not arrived:
            arrived.append(arrivals(result, actual))
        return arrived[0]

    stops: list[Action] = []
    moved: dict[str, Reason] = {}
    for node_id, iid, inst in running:
        p = get(iid)
        reason = stop_reason(node_id, inst, p, nodes, unplaced, arrivals_of, iid)
        if p is not None and reason != "not-desired":
            moved.setdefault(iid, reason)
        stops.append(stop_action(node_id, iid, inst, reason))
    starts = [
        start_action(p, moved.get(p.instance_id, "new"))
        for p in result.placements
        if p.instance_id not in kept
    ]
    stops.sort(key=by_node_and_id)
    starts.sort(key=by_node_and_id)
    by_node: dict[str, tuple[list[Action], list[Action]]] = {}
    for a in stops:
        by_node.setdefault(a.node_id, ([], []))[0].append(a)
    for a in starts:
        by_node.setdefault(a.node_id, ([], []))[1].append(a)
    patches: dict[str, tuple[dict[str, Any], ...]] = {}
    addresses = addresses or {}
    for node_id in sorted({*nodes, *actual, *by_node}):
        doc = actual.get(node_id)
        revision = doc.revision if doc else 0
        acts = by_node.get(node_id)
        if acts is None:  # (most nodes of a steady unit: the test alone)
            patches[node_id] = ({"op": "test", "path": "/revision", "value": revision},)
            continue
        node_stops, node_starts = acts
        ips = [addresses.get(a.instance_id) for a in node_starts] if addresses else []
        patches[node_id] = node_patch(revision, node_stops, node_starts, desired, ips)
    return Plan(fingerprint, tuple(stops + starts), result.failures, patches)


def plan_bytes(plan: Plan, inputs: Mapping[str, Any]) -> bytes:
    """``pretty_json(doc)`` of the plan document ``doc = plan.to_json()`` with ``inputs`` as
    its ``inputs`` (:meth:`reconciler.accel.plans.PlanMemo.plan_bytes` gives the same bytes,
    reusing the last call's pieces)."""
    actions = join_array([action_piece(a) for a in plan.actions], 1)
    nodes = join_object([node_piece(n, plan.patches[n]) for n in sorted(plan.patches)], 1)
    failures = join_array([failure_piece(f) for f in plan.failures], 1)
    return plan_document(plan, inputs, actions, nodes, failures)
