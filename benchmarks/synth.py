"""Synthetic units for benchmarks: N nodes with runtimes, labels, named resources, device pools
and usage; M instances over services with a realistic mix of requests. Deterministic per seed."""

from __future__ import annotations

import random
from typing import Any

from reconciler.model.documents import Node, Service, UnitConfig

__all__ = ["synth_documents", "synth_unit"]

NODE_TYPES = ("edge", "compute", "gpu", "gateway")


def synth_documents(
    n_nodes: int, n_instances: int, seed: int = 1
) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """Plain documents (as a person or an agent would write them): unit, nodes, services."""
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
            node["devicePools"] = [
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
        nodes.append(node)
    services: list[dict[str, Any]] = []
    placed = 0
    k = 0
    while placed < n_instances:
        count = min(rng.choice([1, 2, 3, 5, 10, 20]), n_instances - placed)
        kind = rng.random()
        svc: dict[str, Any] = {
            "apiVersion": "reconciler/v1",
            "kind": "Service",
            "id": f"svc-{k:05d}",
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


def synth_unit(
    n_nodes: int, n_instances: int, seed: int = 1
) -> tuple[UnitConfig, list[Node], list[Service]]:
    unit, nodes, services = synth_documents(n_nodes, n_instances, seed)
    return (
        UnitConfig.model_validate(unit),
        [Node.model_validate(n) for n in nodes],
        [Service.model_validate(s) for s in services],
    )
