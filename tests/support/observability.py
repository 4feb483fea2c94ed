"""Units for the observability tests (metrics, the status page): the demo made to show every
section, and a synthetic status report of any size."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

BROKEN_SERVICE = "desired/broken.yaml"


def troubled_demo(state: Path) -> Path:
    """The demo copy at ``state`` with something in every section of the report: edge-1's
    system usage above its CPU alert's maxThreshold with a minTimeout of 0 s (an alert raised
    at the first run), which leaves com.example.nav unplaceable, and an invalid input file."""
    unit = state / "unit.yaml"
    unit.write_text(unit.read_text().replace("minTimeout: 1m}", "minTimeout: 0s}"))
    node = state / "nodes" / "edge-1.yaml"
    text = node.read_text()
    assert "  cpu: 800\n" in text
    node.write_text(text.replace("  cpu: 800\n", "  cpu: 3900\n"))
    (state / BROKEN_SERVICE).write_text("apiVersion: reconciler/v1\nkind: Service\nid: [\n")
    return state


def synthetic_status(n_nodes: int, n_instances: int, n_failures: int = 50) -> dict[str, Any]:
    """A status report (out/status.json's shape) of ``n_nodes`` nodes with ``n_instances``
    instances spread over them, every fifth node with a GPU pool, and ``n_failures``
    unplaceable instances; ids ``node-00000``... and ``inst-00000000``..."""
    gib = 1 << 30
    nodes: dict[str, Any] = {}
    for n in range(n_nodes):
        inv = {"capacity": 16000, "reserved": (n * 37) % 16000, "free": 16000 - (n * 37) % 16000}
        entry: dict[str, Any] = {
            "type": "edge",
            "state": "provisioned",
            "connected": True,
            "priority": 10,
            "labels": [],
            "cpu": inv,
            "ram": {"capacity": 64 * gib, "reserved": n % 64 * gib, "free": (64 - n % 64) * gib},
            "partitions": {
                "storage": {"capacity": 512 * gib, "reserved": gib, "free": 511 * gib},
                "state": None,
            },
            "runtimes": {},
            "resources": {},
            "devices": {},
            "instances": 0,
            "systemUsage": {"cpu": 500, "ram": gib},
        }
        if n % 5 == 0:
            entry["devices"] = {
                "example.com/gpu": {"policy": "exclusive", "total": 4, "healthy": 3, "allocated": 2}
            }
        nodes[f"node-{n:05d}"] = entry
    states = ("active", "active", "active", "pending", "failed", "activating")
    instances: dict[str, Any] = {}
    for i in range(n_instances):
        node_id = f"node-{i % n_nodes:05d}"
        nodes[node_id]["instances"] += 1
        instances[f"inst-{i:08d}"] = {
            "itemId": f"svc-{i % 997}",
            "subjectId": "default",
            "index": i // 997,
            "version": "1.0.0",
            "priority": 10,
            "nodeId": node_id,
            "runtimeId": "runc",
            "devices": {},
            "resources": [],
            "state": states[i % len(states)],
        }
    failures = [
        {
            "instanceId": f"lost-{k:05d}",
            "itemId": "svc-big",
            "subjectId": "default",
            "index": k,
            "reason": "Cpu",
            "summary": f"0/{n_nodes} nodes feasible: {n_nodes} Cpu ({k})",
            "counts": {"Cpu": n_nodes},
        }
        for k in range(n_failures)
    ]
    return {
        "formatVersion": 1,
        "nodes": nodes,
        "instances": instances,
        "failures": failures,
        "alerts": [],
        "invalidInputs": {},
    }


_MADE = re.compile(rb'<time datetime="[^"]*">[^<]*</time>')


def without_made_time(page: bytes) -> bytes:
    """A status page with its time of making blanked: two runs at different times that make
    the same report make pages equal but for it."""
    return _MADE.sub(b"<time></time>", page)
