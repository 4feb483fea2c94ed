"""The status document (SPEC §12): ``out/status.json`` and ``reconciler status``.

A pure function of what one reconcile computed: per node capacity / reserved / free of every
inventory, per instance where it runs and what the agents report, failures with their summaries,
raised alerts, and the invalid input files with their errors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .balancer import NodeSlot
from .inventory import Inventory
from .loader import Diagnostic, StateView
from .placement import BalanceResult
from .planner import failure_json
from .sharing import REGISTRY
from .sharing.shared_count import UNLIMITED

__all__ = ["STATUS_FORMAT_VERSION", "build_status"]

STATUS_FORMAT_VERSION = 1


def _inv(inv: Inventory | None) -> dict[str, int] | None:
    if inv is None:
        return None
    return {"capacity": inv.capacity, "reserved": inv.used, "free": inv.free}


def _node_status(slot: NodeSlot) -> dict[str, Any]:
    node = slot.node
    runtimes = {}
    for rt in slot.runtimes:
        runtimes[rt.runtime.id] = {
            "type": rt.runtime.type,
            "slots": _inv(rt.slots),  # None: unlimited
            "cpu": _inv(rt.cpu),
            "ram": _inv(rt.ram),
        }
    resources = {}
    for name, state in sorted(slot.resources.items()):
        unlimited = state.slots.capacity >= UNLIMITED
        resources[name] = {
            "sharedCount": 0 if unlimited else state.slots.capacity,
            "used": state.slots.used,
            "free": None if unlimited else state.slots.free,
        }
    devices = {}
    for resource, pool in sorted(slot.pools.items()):
        st = REGISTRY[pool.policy].status(pool)
        devices[resource] = {
            "policy": st.policy,
            "total": st.total,
            "healthy": st.healthy,
            "allocated": st.allocated,
            **({"devices": st.detail} if st.detail else {}),
        }
    return {
        "type": node.type,
        "state": node.state,
        "connected": node.connected,
        "priority": slot.priority,
        "labels": sorted(slot.labels),
        "cpu": _inv(slot.cpu),
        "ram": _inv(slot.ram),
        "partitions": {
            "storage": _inv(slot.partition("storages")),
            "state": _inv(slot.partition("states")),
        },
        "runtimes": runtimes,
        "resources": resources,
        "devices": devices,
        "instances": len(slot.placed),
    }


def build_status(
    view: StateView,
    result: BalanceResult,
    slots: Mapping[str, NodeSlot],
    diagnostics: Sequence[Diagnostic],
    *,
    alerts: Sequence[Mapping[str, Any]] = (),
    uids: Mapping[str, tuple[int, int]] | None = None,
) -> dict[str, Any]:
    nodes = {node_id: _node_status(slots[node_id]) for node_id in sorted(slots)}
    observed: dict[str, tuple[str, str]] = {}
    for node_id, doc in view.actual.items():
        for iid, inst in doc.instances.items():
            observed[iid] = (node_id, inst.state)
    instances = {}
    for p in result.placements:
        seen = observed.get(p.instance_id)
        record: dict[str, Any] = {
            "itemId": p.item_id,
            "subjectId": p.subject_id,
            "index": p.index,
            "version": p.version,
            "priority": p.priority,
            "nodeId": p.node_id,
            "runtimeId": p.runtime_id,
            "devices": {r: list(ids) for r, ids in p.devices},
            "resources": list(p.resources),
            "state": seen[1] if seen is not None and seen[0] == p.node_id else "pending",
        }
        if p.unhealthy_devices:
            record["unhealthyDevices"] = list(p.unhealthy_devices)
        if uids is not None and p.instance_id in uids:
            record["uid"], record["gid"] = uids[p.instance_id]
        instances[p.instance_id] = record
    invalid: dict[str, list[dict[str, Any]]] = {}
    for d in diagnostics:
        invalid.setdefault(d.path, []).append(d.to_json())
    return {
        "formatVersion": STATUS_FORMAT_VERSION,
        "nodes": nodes,
        "instances": instances,
        "failures": [failure_json(f) for f in result.failures],
        "alerts": list(alerts),
        "invalidInputs": {path: invalid[path] for path in sorted(invalid)},
    }
