"""Small builders for balancer tests: nodes, services and unit configs that read like scenarios.

Every builder returns a validated model (``Model.model_validate``), so a test only states what
differs from a plain node (1000 DMIPS, 1 GiB RAM, one ``runc`` runtime on x86_64/linux) or a plain
service (one instance, no requests, runtimes ``[crun, runc]``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from reconciler.model.documents import ActualInstance, ActualState, Node, Service, UnitConfig
from reconciler.model.values import instance_id
from reconciler.placement.instances import BalanceResult, Failure, Placement, PreviousAllocation

__all__ = [
    "NODE_TYPE",
    "failure",
    "failures_of",
    "four_nodes",
    "make_node",
    "make_service",
    "make_unit",
    "node_entry",
    "nodes_of",
    "placement",
    "previous_of",
    "runtime",
]

NODE_TYPE = "edge"


def runtime(
    rid: str = "runc",
    rtype: str | None = None,
    *,
    arch: str = "x86_64",
    os: str = "linux",
    max_instances: int = 0,
) -> dict[str, Any]:
    """One runtime entry of a Node document; the type defaults to the id."""
    return {
        "id": rid,
        "type": rtype or rid,
        "platform": {"architecture": arch, "os": os},
        "maxInstances": max_instances,
    }


def make_node(
    node_id: str,
    *,
    dmips: int = 1000,
    ram: int | str = "1Gi",
    runtimes: Sequence[Mapping[str, Any]] | None = None,
    partitions: Sequence[Mapping[str, Any]] = (),
    resources: Sequence[Mapping[str, Any]] | None = None,
    device_pools: Sequence[Mapping[str, Any]] = (),
    state: str = "provisioned",
    connected: bool = True,
    node_type: str = NODE_TYPE,
    inventories: Mapping[str, Mapping[str, Any]] | None = None,
) -> Node:
    doc: dict[str, Any] = {
        "apiVersion": "reconciler/v1",
        "kind": "Node",
        "id": node_id,
        "type": node_type,
        "state": state,
        "connected": connected,
        "maxDMIPS": dmips,
        "totalRAM": ram,
        "runtimes": [dict(r) for r in (runtimes if runtimes is not None else [runtime()])],
        "partitions": [dict(p) for p in partitions],
        "devicePools": [dict(p) for p in device_pools],
    }
    if resources is not None:
        doc["resources"] = [dict(r) for r in resources]
    if inventories is not None:
        doc["inventories"] = {k: dict(v) for k, v in inventories.items()}
    return Node.model_validate(doc)


def make_service(
    item_id: str,
    *,
    priority: int = 0,
    instances: int = 1,
    subject: str = "default",
    cpu: int | None = None,
    ram: int | str | None = None,
    storage: int | str | None = None,
    state: int | str | None = None,
    quotas: Mapping[str, Any] | None = None,
    labels: Sequence[str] = (),
    node_id: str | None = None,
    runtimes: Sequence[str] | None = None,
    platform: Mapping[str, Any] | None = None,
    resources: Sequence[str] = (),
    devices: Sequence[Mapping[str, Any]] = (),
    skip_limits: bool = False,
    version: str = "1.0.0",
) -> Service:
    requested: dict[str, Any] = {
        k: v
        for k, v in (("cpu", cpu), ("ram", ram), ("storage", storage), ("state", state))
        if v is not None
    }
    image: dict[str, Any] = {"rootfs": "/r"}
    if platform is not None:
        image["platform"] = dict(platform)
    doc: dict[str, Any] = {
        "apiVersion": "reconciler/v1",
        "kind": "Service",
        "id": item_id,
        "version": version,
        "subject": subject,
        "priority": priority,
        "instances": instances,
        "labels": list(labels),
        "image": image,
        "quotas": dict(quotas or {}),
        "requestedResources": requested,
        "skipResourceLimits": skip_limits,
        "resources": [{"name": r} for r in resources],
        "devices": [dict(d) for d in devices],
    }
    if node_id is not None:
        doc["nodeId"] = node_id
    if runtimes is not None:
        doc["runtimes"] = list(runtimes)
    return Service.model_validate(doc)


def node_entry(
    node_id: str,
    priority: int = 0,
    labels: Sequence[str] = (),
    *,
    ratios: Mapping[str, int] | None = None,
    node_type: str = NODE_TYPE,
) -> dict[str, Any]:
    """One ``nodes:`` entry of a UnitConfig, bound to one node by its id."""
    entry: dict[str, Any] = {
        "nodeType": node_type,
        "nodeId": node_id,
        "priority": priority,
        "labels": list(labels),
    }
    if ratios is not None:
        entry["resourceRatios"] = dict(ratios)
    return entry


def make_unit(
    entries: Iterable[Mapping[str, Any]] = (), *, placement: str = "stable"
) -> UnitConfig:
    return UnitConfig.model_validate(
        {
            "apiVersion": "reconciler/v1",
            "kind": "UnitConfig",
            "version": "1.0.0",
            "placement": placement,
            "nodes": [dict(e) for e in entries],
        }
    )


def four_nodes(**per_node: Any) -> list[Node]:
    """Nodes A, B, C, D of 1000 DMIPS and 1 GiB RAM: ``runc`` on A, B, C; only ``runx`` on D.

    Keyword arguments ``A={...}`` etc. add builder arguments for that node.
    """
    out: list[Node] = []
    for nid in ("A", "B", "C", "D"):
        extra: dict[str, Any] = dict(per_node.get(nid, {}))
        extra.setdefault("runtimes", [runtime("runx")] if nid == "D" else [runtime("runc")])
        out.append(make_node(nid, **extra))
    return out


# ---------------------------------------------------------------- reading results


def placement(result: BalanceResult, item: str, index: int, subject: str = "default") -> Placement:
    return result.by_id[instance_id(item, subject, index)]


def nodes_of(result: BalanceResult, item: str, subject: str = "default") -> list[str]:
    """Node ids of an item's placed instances, by index."""
    found = [p for p in result.placements if p.item_id == item and p.subject_id == subject]
    return [p.node_id for p in sorted(found, key=lambda p: p.index)]


def failures_of(result: BalanceResult, item: str, subject: str = "default") -> list[Failure]:
    found = [f for f in result.failures if f.item_id == item and f.subject_id == subject]
    return sorted(found, key=lambda f: f.index)


def failure(result: BalanceResult, item: str, index: int, subject: str = "default") -> Failure:
    wanted = instance_id(item, subject, index)
    for f in result.failures:
        if f.instance_id == wanted:
            return f
    raise AssertionError(f"{item}:{subject}:{index} did not fail; failures: {result.failures}")


def previous_of(result: BalanceResult) -> dict[str, PreviousAllocation]:
    """The previous-allocation mapping a second (stable) reconcile gets from a first."""
    return {p.instance_id: p.previous() for p in result.placements}


def reported(p: Placement, node_id: str, state: str) -> ActualState:
    """An agent's actual state of ``node_id`` reporting the instance ``p`` in ``state``."""
    seen = ActualInstance(
        itemId=p.item_id,
        subjectId=p.subject_id,
        index=p.index,
        version=p.version,
        runtimeId=p.runtime_id,
        state=state,
    )
    return ActualState(
        apiVersion="reconciler/v1",
        kind="ActualState",
        nodeId=node_id,
        instances={p.instance_id: seen},
    )
