"""Synthetic units for benchmarks: N nodes with runtimes, labels, named resources, device pools
and usage; M instances over services with a realistic mix of requests. Deterministic per seed.

A *shape* names a kind of fleet (``SHAPES``), so that every benchmark can be run on more than
the generator's own favourite:

- ``homogeneous``: four node types sharing runtime ids (``runc``, ``crun``), one unit.yaml entry
  per type, a mix of services (the generator's original unit);
- ``heterogeneous``: as the demo and real fleets are: every node its own runtime ids
  (``runc-<n>``) and node type, a unit.yaml entry per node with labels drawn at random, usage
  on every node, named resources drawn at random;
- ``unplaceable-1`` and ``unplaceable-15``: ``homogeneous`` with that percentage of the
  instances unplaceable (alternately a label no node has and more CPU than any node has);
- ``preemption``: ``homogeneous`` plus one service in twenty of priority 1000, whose id starts
  with ``late-``, pinned to a node and asking all of its CPU but its system usage: it fits only
  by evicting every instance there. A stable run whose previous placements lack them (as if
  they had just been added) preempts;
- ``devices``: exclusive and fractional device pools on 30 % of the nodes, 20 % of the services
  asking one of them;
- ``many-small``: one instance per service (20,000 services for 20,000 instances);
- ``few-big``: ten services sharing the instances (10 services of 2,000 instances each).
"""

from __future__ import annotations

import argparse
import random
from typing import Any

from reconciler.model.documents import Node, Service, UnitConfig

__all__ = ["LATE_PREFIX", "SHAPES", "fleet_arguments", "synth_documents", "synth_unit"]

NODE_TYPES = ("edge", "compute", "gpu", "gateway")
SHAPES = (
    "homogeneous",
    "heterogeneous",
    "unplaceable-1",
    "unplaceable-15",
    "preemption",
    "devices",
    "many-small",
    "few-big",
)
LATE_PREFIX = "late-"
"""Services of the ``preemption`` shape that arrive after the others (see the module doc)."""
LABEL_POOL = ("compute", "ssd", "gpu", "can", "edge", "camera", "lidar-ready", "fast-net")


def synth_documents(
    n_nodes: int, n_instances: int, seed: int = 1, shape: str = "homogeneous"
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """Plain documents (as a person or an agent would write them): unit, nodes, services, of
    one of ``SHAPES``."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    if shape == "preemption":  # the nearly full unit, then the late arrivals
        late = max(1, n_instances // 20)
        unit, nodes, services = synth_documents(n_nodes, n_instances - late, seed, "homogeneous")
        return unit, nodes, services + _late_services(late, nodes)
    unit, nodes, services = _homogeneous(n_nodes, n_instances, seed, shape)
    rng = random.Random(seed + 7)
    if shape == "heterogeneous":
        _heterogeneous(unit, nodes, services, rng)
    elif shape.startswith("unplaceable-"):
        _unplaceable(services, int(shape.removeprefix("unplaceable-")), n_instances)
    elif shape == "devices":
        _devices(nodes, services, rng)
    return unit, nodes, services


def _homogeneous(
    n_nodes: int, n_instances: int, seed: int, shape: str
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    rng = random.Random(seed)
    unit: dict[str, Any] = {
        "apiVersion": "reconciler/v1",
        "kind": "UnitConfig",
        "version": "1.0.0",
        "placement": "stable",
        "nodes": [
            {"nodeType": "edge", "priority": 10, "labels": ["edge"]},
            {"nodeType": "compute", "priority": 50, "labels": ["compute", "ssd"]},
            {"nodeType": "gpu", "priority": 50, "labels": ["compute", "gpu"]},
            {"nodeType": "gateway", "priority": 0, "labels": ["can"]},
        ],
    }
    nodes: list[dict[str, Any]] = []
    for i in range(n_nodes):
        ntype = NODE_TYPES[i % len(NODE_TYPES)]
        node: dict[str, Any] = {
            "apiVersion": "reconciler/v1",
            "kind": "Node",
            "id": f"node-{i:05d}",
            "type": ntype,
            "maxDMIPS": rng.choice([4000, 8000, 16000, 32000]),
            "totalRAM": rng.choice(["4Gi", "8Gi", "16Gi", "32Gi"]),
            "numCores": rng.choice([2, 4, 8]),
            "partitions": [{"name": "data", "types": ["storages", "states"], "totalSize": "64Gi"}],
            "runtimes": [
                {
                    "id": "runc",
                    "type": "runc",
                    "platform": {"architecture": "x86_64", "os": "linux"},
                    "maxInstances": 64,
                },
                {
                    "id": "crun",
                    "type": "crun",
                    "platform": {"architecture": "x86_64", "os": "linux"},
                    "allowedDMIPS": 2000,
                    "allowedRAM": "2Gi",
                },
            ],
            "resources": [
                {"name": "can0", "sharedCount": 0},
                {"name": "camera", "sharedCount": 2},
            ],
            "usage": {"cpu": rng.randrange(0, 400), "ram": rng.randrange(0, 256) * 1024 * 1024},
        }
        if ntype == "gpu":
            node["devicePools"] = _device_pools()
        nodes.append(node)
    services: list[dict[str, Any]] = []
    placed = 0
    k = 0
    while placed < n_instances:
        count = min(rng.choice([1, 2, 3, 5, 10, 20]), n_instances - placed)
        if shape == "many-small":
            count = 1
        elif shape == "few-big":
            count = min(max(1, -(-n_instances // 10)), n_instances - placed)
        kind = rng.random()
        svc: dict[str, Any] = {
            "apiVersion": "reconciler/v1",
            "kind": "Service",
            "id": f"svc-{k:05d}",
        }
        if shape == "many-small":
            # five subjects per item: 4,000 items (a gid each, of the 5,000 gids there are)
            # for 20,000 services, as a fleet of many tenants of a few apps is
            svc["id"], svc["subject"] = f"svc-{k // 5:05d}", f"s{k % 5}"
        svc |= {
            "version": "1.0.0",
            "priority": rng.choice([0, 10, 50, 100]),
            "instances": count,
            "image": {"rootfs": "/srv/rootfs", "platform": {"architecture": "x86_64"}},
            "quotas": {
                "cpuDMIPSLimit": rng.choice([100, 200, 400, 800]),
                "ramLimit": rng.choice(["64Mi", "128Mi", "256Mi", "512Mi"]),
                "storageLimit": "1Gi",
            },
        }
        if kind < 0.3:
            svc["labels"] = ["compute"]
        elif kind < 0.4:
            svc["labels"] = ["can"]
            svc["resources"] = [{"name": "can0", "mode": "r"}]
        elif kind < 0.45:
            svc["labels"] = ["gpu"]
            svc["devices"] = [{"resource": "example.com/gpu", "memory": "2Gi"}]
        elif kind < 0.5:
            svc["resources"] = [{"name": "camera", "mode": "rw"}]
        elif kind < 0.55:
            svc["requestedResources"] = {"cpu": 50, "ram": "32Mi"}
            svc["runtimes"] = ["crun"]
        services.append(svc)
        placed += count
        k += 1
    return unit, nodes, services


def _device_pools() -> list[dict[str, Any]]:
    """A fractional pool of two 16 GiB GPUs and an exclusive pool of four NPUs, one unhealthy."""
    return [
        {
            "resource": "example.com/gpu",
            "policy": "fractional",
            "devices": [{"id": f"gpu{k}", "memory": "16Gi"} for k in range(2)],
        },
        {
            "resource": "example.com/npu",
            "policy": "exclusive",
            "devices": [{"id": f"npu{k}", "healthy": k != 3} for k in range(4)],
        },
    ]


def _heterogeneous(
    unit: dict[str, Any], nodes: list[dict[str, Any]], services: list[dict[str, Any]], rng: Any
) -> None:
    """Every node its own type, runtime ids and unit.yaml entry (labels drawn at random), usage
    on every node, named resources drawn at random."""
    entries = []
    for i, node in enumerate(nodes):
        node["type"] = f"model-{i:05d}"
        for rt in node["runtimes"]:
            rt["id"] = f"{rt['type']}-{i}"
        node["usage"] = {"cpu": rng.randrange(0, 800), "ram": rng.randrange(0, 512) * 1024 * 1024}
        pool = [{"name": "can0", "sharedCount": 0}, {"name": "camera", "sharedCount": 2}]
        pool += [{"name": "serial", "sharedCount": 1}, {"name": "gnss", "sharedCount": 4}]
        node["resources"] = rng.sample(pool, rng.randrange(1, len(pool) + 1))
        labels = sorted(rng.sample(LABEL_POOL, rng.randrange(0, 4)))
        entries.append(
            {
                "nodeType": node["type"],
                "nodeId": node["id"],
                "priority": rng.choice([0, 10, 50]),
                "labels": labels,
            }
        )
    unit["nodes"] = entries
    for svc in services:
        if "labels" in svc:
            svc["labels"] = [rng.choice(LABEL_POOL[:5])]


def _unplaceable(services: list[dict[str, Any]], percent: int, n_instances: int) -> None:
    """Make about ``percent`` % of the instances unplaceable, service by service: alternately a
    label no node has and more CPU than any node has."""
    want = n_instances * percent // 100
    made = 0
    for k, svc in enumerate(services):
        if made >= want:
            break
        if k % 2 == 0:
            svc["labels"] = ["no-such-label"]
        else:
            svc["requestedResources"] = {"cpu": 10_000_000}
            svc["quotas"] = {**svc["quotas"], "cpuDMIPSLimit": 10_000_000}
        made += int(svc["instances"])


def _devices(nodes: list[dict[str, Any]], services: list[dict[str, Any]], rng: Any) -> None:
    """Exclusive and fractional pools on 30 % of the nodes; 20 % of the services ask one."""
    for node in nodes:
        node.pop("devicePools", None)
        if rng.random() < 0.3:
            node["devicePools"] = _device_pools()
    for svc in services:
        svc.pop("devices", None)
        if svc.get("labels") == ["gpu"]:
            svc.pop("labels")
        if rng.random() < 0.2:
            if rng.random() < 0.5:
                svc["devices"] = [{"resource": "example.com/gpu", "memory": "2Gi"}]
            else:
                svc["devices"] = [{"resource": "example.com/npu", "count": 1}]


def _late_services(n: int, nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``n`` priority-1000 services of one instance, each pinned to a node (spread evenly) and
    asking its CPU but its system usage: it fits there only once every other instance left."""
    out: list[dict[str, Any]] = []
    step = max(1, len(nodes) // max(1, n))
    for k in range(n):
        node = nodes[(k * step) % len(nodes)]
        cpu = int(node["maxDMIPS"]) - int(node["usage"]["cpu"])
        out.append(
            {
                "apiVersion": "reconciler/v1",
                "kind": "Service",
                "id": f"{LATE_PREFIX}{k:05d}",
                "version": "1.0.0",
                "priority": 1000,
                "instances": 1,
                "nodeId": node["id"],
                "runtimes": ["runc"],
                "image": {"rootfs": "/srv/rootfs", "platform": {"architecture": "x86_64"}},
                "requestedResources": {"cpu": cpu, "ram": "64Mi"},
            }
        )
    return out


def synth_unit(
    n_nodes: int, n_instances: int, seed: int = 1, shape: str = "homogeneous"
) -> tuple[UnitConfig, list[Node], list[Service]]:
    unit, nodes, services = synth_documents(n_nodes, n_instances, seed, shape)
    return (
        UnitConfig.model_validate(unit),
        [Node.model_validate(n) for n in nodes],
        [Service.model_validate(s) for s in services],
    )


def fleet_arguments(parser: argparse.ArgumentParser) -> None:
    """``--nodes`` (5000), ``--instances`` (20000) and ``--shape`` (repeatable; all shapes
    when not given): the size and shapes of a benchmark that measures every shape."""
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--instances", type=int, default=20000)
    parser.add_argument("--shape", action="append", choices=SHAPES, help="(repeatable; all)")
