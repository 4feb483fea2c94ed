"""The model-based test's small universe (tests/system/test_model.py) and independent oracles.

Everything here is computed from the documents the test itself wrote, never from the balancer,
the planner or the status code: requested amounts come from ``requestedResources``, capacities
from the node documents, instance ids from uuid5, the desired actual document from the
placements listed in ``out/status.json``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import jsonpatch

from reconciler.io.checkpoint_files import (
    CURRENT,
    LINEAGE,
    PREVIOUS,
)
from reconciler.model.documents import Node, Service, UnitConfig
from reconciler.planning.checkpoint import (
    decode_checkpoint,
)
from reconciler.planning.plans import empty_actual_document
from tests.support.agent_sim import read_actual

__all__ = [
    "GARBAGE",
    "GI",
    "GPU",
    "LABELS",
    "MI",
    "NODE_IDS",
    "SERVICE_IDS",
    "START",
    "VGPU",
    "NodeSpec",
    "ServiceSpec",
    "UnitSpec",
    "actual_documents",
    "agent_apply_refusing",
    "all_devices",
    "check_capacity",
    "check_outputs_parse",
    "decoded_checkpoint",
    "desired_actual",
    "empty_actual",
    "garbage_bytes",
    "instance_uuid",
    "node_doc",
    "running_instances",
    "service_doc",
    "snapshot",
    "temp_files",
    "to_bytes",
    "unit_doc",
]

MI = 1 << 20
GI = 1 << 30
NODE_TYPE = "edge"
NODE_IDS = ("n1", "n2", "n3", "n4")
SERVICE_IDS = ("svc-a", "svc-b", "svc-c", "svc-d")
LABELS = ("fast", "gpu", "edge")
START = 1_700_000_000.0  # the fake clock's first reading (seconds since the epoch)
GPU = "example.com/gpu"  # exclusive pool
VGPU = "example.com/vgpu"  # fractional pool
ALERT_NODES = ("n1", "n2")  # nodes with a cpu alert rule in unit.yaml


def _runtime(rid: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": rid,
        "type": rid,
        "platform": {"architecture": "x86_64", "os": "linux"},
        **extra,
    }


# The fixed hardware of each node id: what a node agent reports and never changes here.
HARDWARE: dict[str, dict[str, Any]] = {
    "n1": {
        "maxDMIPS": 1000,
        "totalRAM": GI,
        "partitions": [{"name": "data", "types": ["storages", "states"], "totalSize": 256 * MI}],
        "runtimes": [_runtime("runc", maxInstances=3)],
        "resources": [{"name": "can", "sharedCount": 2}],
        "pools": {GPU: ("exclusive", {"gpu0": None, "gpu1": None})},
    },
    "n2": {
        "maxDMIPS": 800,
        "totalRAM": 512 * MI,
        "partitions": [
            {"name": "disk", "types": ["storages"], "totalSize": 512 * MI},
            {"name": "st", "types": ["states"], "totalSize": 64 * MI},
        ],
        "runtimes": [
            _runtime("runc"),
            _runtime("crun", maxInstances=2, allowedDMIPS=300, allowedRAM=128 * MI),
        ],
        "resources": [{"name": "can", "sharedCount": 1}, {"name": "bus", "sharedCount": 0}],
        "pools": {VGPU: ("fractional", {"v0": 2 * GI, "v1": GI})},
    },
    "n3": {
        "maxDMIPS": 1200,
        "totalRAM": 2 * GI,
        "partitions": [{"name": "disk", "types": ["storages"], "totalSize": 256 * MI}],
        "runtimes": [_runtime("crun")],
        "resources": [],
        "pools": {
            GPU: ("exclusive", {"gpu0": None, "gpu1": None, "gpu2": None}),
            VGPU: ("fractional", {"v0": GI}),
        },
    },
    "n4": {
        "maxDMIPS": 600,
        "totalRAM": GI,
        "partitions": [{"name": "data", "types": ["storages", "states"], "totalSize": 128 * MI}],
        "runtimes": [_runtime("runc", maxInstances=2)],
        "resources": [{"name": "bus", "sharedCount": 2}],
        "pools": {},
    },
}


def all_devices() -> list[tuple[str, str, str]]:
    """(node, resource, device id) of every device of the universe."""
    return [
        (n, r, d)
        for n, hw in HARDWARE.items()
        for r, (_, devs) in hw["pools"].items()
        for d in devs
    ]


@dataclass(frozen=True)
class NodeSpec:
    id: str
    connected: bool = True
    unhealthy: frozenset[tuple[str, str]] = frozenset()  # (resource, device id)
    usage_cpu: int | None = None  # None: no usage reading


@dataclass(frozen=True)
class ServiceSpec:
    id: str
    version: str = "1.0.0"
    priority: int = 0
    instances: int = 1
    labels: tuple[str, ...] = ()
    cpu: int = 0
    ram: int = 0
    storage: int = 0
    state: int = 0
    resources: tuple[str, ...] = ()
    device: tuple[str, int] | None = None  # (GPU, count) or (VGPU, memory)
    runtimes: tuple[str, ...] | None = None  # None: the default [crun, runc]
    balancing: str = "enabled"

    def bumped(self) -> ServiceSpec:
        major, minor, patch = (int(x) for x in self.version.split("."))
        return replace(self, version=f"{major}.{minor}.{patch + 1}")


@dataclass(frozen=True)
class UnitSpec:
    priority: Mapping[str, int] = field(default_factory=dict)
    labels: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def node_doc(spec: NodeSpec) -> dict[str, Any]:
    hw = HARDWARE[spec.id]
    pools = []
    for resource, (policy, devices) in sorted(hw["pools"].items()):
        entries = []
        for dev_id, memory in sorted(devices.items()):
            entry: dict[str, Any] = {
                "id": dev_id,
                "healthy": (resource, dev_id) not in spec.unhealthy,
            }
            if memory is not None:
                entry["memory"] = memory
            entries.append(entry)
        pools.append({"resource": resource, "policy": policy, "devices": entries})
    doc: dict[str, Any] = {
        "apiVersion": "reconciler/v1",
        "kind": "Node",
        "id": spec.id,
        "type": NODE_TYPE,
        "connected": spec.connected,
        "maxDMIPS": hw["maxDMIPS"],
        "totalRAM": hw["totalRAM"],
        "partitions": hw["partitions"],
        "runtimes": hw["runtimes"],
        "resources": hw["resources"],
        "devicePools": pools,
    }
    if spec.usage_cpu is not None:
        doc["usage"] = {"cpu": spec.usage_cpu, "ram": 0}
    return doc


def service_doc(spec: ServiceSpec) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "apiVersion": "reconciler/v1",
        "kind": "Service",
        "id": spec.id,
        "version": spec.version,
        "priority": spec.priority,
        "instances": spec.instances,
        "labels": list(spec.labels),
        "balancingPolicy": spec.balancing,
        "image": {"rootfs": "/", "cmd": ["/bin/true"]},
        "requestedResources": {
            "cpu": spec.cpu,
            "ram": spec.ram,
            "storage": spec.storage,
            "state": spec.state,
        },
        "resources": [{"name": r} for r in spec.resources],
    }
    if spec.device is not None:
        resource, amount = spec.device
        key = "count" if resource == GPU else "memory"
        doc["devices"] = [{"resource": resource, key: amount}]
    if spec.runtimes is not None:
        doc["runtimes"] = list(spec.runtimes)
    return doc


def unit_doc(spec: UnitSpec) -> dict[str, Any]:
    entries = []
    for node_id in NODE_IDS:
        entry: dict[str, Any] = {
            "nodeType": NODE_TYPE,
            "nodeId": node_id,
            "priority": spec.priority.get(node_id, 0),
            "labels": list(spec.labels.get(node_id, ())),
        }
        if node_id in ALERT_NODES:
            entry["alertRules"] = {
                "cpu": {"minThreshold": 50, "maxThreshold": 80, "minTimeout": "60s"}
            }
        entries.append(entry)
    return {
        "apiVersion": "reconciler/v1",
        "kind": "UnitConfig",
        "version": "1.0.0",
        "placement": "stable",
        "nodes": entries,
    }


def to_bytes(doc: Mapping[str, Any]) -> bytes:
    """JSON is YAML 1.2: the documents are written as indented JSON."""
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


# ----------------------------------------------------------------------------- garbage

GARBAGE: tuple[str, ...] = (
    "not-utf8",
    "unclosed-flow",
    "empty",
    "alias",
    "duplicate-key",
    "unknown-field",
    "wrong-kind",
    "truncated",
    "bad-value",
)


def garbage_bytes(variant: str, rel: str, intended: bytes | None) -> bytes:
    """A file content that the loader must reject (SPEC §5)."""
    kind = "UnitConfig" if rel == "unit.yaml" else "Node" if rel.startswith("nodes/") else "Service"
    plain = intended or to_bytes(
        {"apiVersion": "reconciler/v1", "kind": kind, "id": "x", "version": "1.0.0"}
    )
    doc = json.loads(plain)
    if variant == "not-utf8":
        return b"apiVersion: reconciler/v1\nkind: \xff\xfe\n"
    if variant == "unclosed-flow":
        return b"apiVersion: reconciler/v1\nkind: " + kind.encode() + b"\nid: [broken\n"
    if variant == "empty":
        return b""
    if variant == "alias":
        return b"apiVersion: &v reconciler/v1\nkind: " + kind.encode() + b"\nother: *v\n"
    if variant == "duplicate-key":
        return b"apiVersion: reconciler/v1\napiVersion: reconciler/v1\nkind: " + kind.encode()
    if variant == "unknown-field":
        return to_bytes({**doc, "bogusField": 1})
    if variant == "wrong-kind":
        return to_bytes({**doc, "kind": "ActualState"})
    if variant == "truncated":
        return plain[: len(plain) // 2]
    if variant == "bad-value":
        return to_bytes({**doc, "apiVersion": "reconciler/v0"})
    raise ValueError(variant)


# ----------------------------------------------------------------------------- helpers


def instance_uuid(item: str, index: int, subject: str = "default") -> str:
    """SPEC §4, computed with the standard library (not reconciler.model.values)."""
    return str(uuid.uuid5(uuid.NAMESPACE_OID, f"{item}:{subject}:{index}"))


def snapshot(state: Path, *, with_mtime: bool = False) -> dict[str, tuple[bytes, int]]:
    """Relative path → (bytes, mtime_ns or 0) of every file under the state directory."""
    out: dict[str, tuple[bytes, int]] = {}
    for p in sorted(state.rglob("*")):
        if p.is_file() and not p.is_symlink() and p.name != ".lock":
            out[str(p.relative_to(state))] = (
                p.read_bytes(),
                p.stat().st_mtime_ns if with_mtime else 0,
            )
    return out


def temp_files(state: Path) -> list[str]:
    return [
        str(p.relative_to(state)) for p in state.rglob("*") if ".tmp-" in p.name and p.is_file()
    ]


def check_outputs_parse(state: Path) -> None:
    """Every output file is whole: JSON that parses, a checkpoint whose checksum and lineage
    verify (SPEC §9, §10, §12)."""
    out = state / "out"
    for path in [out / "plan.json", out / "status.json", *sorted((out / "nodes").glob("*.json"))]:
        if path.exists():
            json.loads(path.read_bytes())
    for path in sorted((out / "instances").glob("*/config.json")):
        json.loads(path.read_bytes())
    cpdir = state / "checkpoint"
    lineage_path = cpdir / LINEAGE
    lineage = lineage_path.read_text().strip() if lineage_path.exists() else None
    for name in (CURRENT, PREVIOUS):
        if (cpdir / name).exists():
            assert lineage is not None, f"checkpoint/{name} exists without checkpoint/LINEAGE"
            decode_checkpoint((cpdir / name).read_bytes(), lineage)
    lastgood = cpdir / "last-good"
    if lastgood.is_dir():
        for entry in sorted(lastgood.glob("*.json")):
            json.loads(entry.read_bytes())


# ----------------------------------------------------------------------------- capacity oracle


def _node_cpu_capacity(node: Node) -> tuple[int, int]:
    """(cpu, ram) of the node pool: base minus the system's own usage (SPEC §7.3)."""
    sys_cpu = sys_ram = 0
    if node.usage is not None:
        own_cpu = sum(u.cpu for u in node.usage.instances.values())
        own_ram = sum(u.ram for u in node.usage.instances.values())
        sys_cpu = max(0, node.usage.cpu - own_cpu)
        sys_ram = max(0, node.usage.ram - own_ram)
    return max(0, node.maxDMIPS - sys_cpu), max(0, node.totalRAM - sys_ram)


def check_capacity(
    status: Mapping[str, Any],
    services: Mapping[str, Service],
    nodes: Mapping[str, Node],
    unit: UnitConfig | None,
    previous_devices: Mapping[str, Mapping[str, tuple[str, ...]]],
    held: Mapping[str, Mapping[str, int]] | None = None,
) -> None:
    """No node is over capacity in anything and no device is held twice (SPEC §6, §7).

    ``held``: per instance kept where it runs while its current spec places nowhere, the
    amounts the checkpoint recorded for it; it is checked with those (and its recorded named
    resources and devices), not against its current spec, which it does not run.

    ``status`` is ``out/status.json``; the requests are summed here from the service documents
    and compared with capacities computed here from the node documents. ``previous_devices``
    (instance id → resource → ids, of the previous decision) justifies an unhealthy device
    still held: only a device held before may be unhealthy (SPEC §6.3)."""
    per_node: dict[str, list[tuple[str, dict[str, Any], Service]]] = {}
    holds = held or {}
    for iid, rec in status["instances"].items():
        svc = services.get(rec["itemId"])
        assert svc is not None, f"{iid} is placed but {rec['itemId']} is not desired"
        if iid not in holds:
            assert rec["version"] == svc.version, (iid, rec["version"], svc.version)
        assert iid == instance_uuid(rec["itemId"], rec["index"], rec["subjectId"])
        assert 0 <= rec["index"] < svc.instances, (iid, rec["index"], svc.instances)
        per_node.setdefault(rec["nodeId"], []).append((iid, rec, svc))
    for node_id, placed in sorted(per_node.items()):
        node = nodes.get(node_id)
        assert node is not None, f"instances placed on {node_id}, which does not exist"
        assert node.connected and node.state == "provisioned", f"{node_id} is not usable"
        cfg = unit.config_for(node.id, node.type) if unit is not None else None
        node_labels = set(cfg.labels) if cfg is not None else set()
        runtimes = {r.id: r for r in node.runtimes}
        cpu_cap, ram_cap = _node_cpu_capacity(node)
        cpu = ram = 0
        rt_cpu: dict[str, int] = {}
        rt_ram: dict[str, int] = {}
        rt_count: dict[str, int] = {}
        part_use: dict[str, int] = {}
        part_size = {p.name: p.totalSize for p in node.partitions}
        part_of: dict[str, str] = {}
        for p in node.partitions:
            for kind in ("storages", "states"):
                if kind in p.types:
                    part_of.setdefault(kind, p.name)
        resource_use: dict[str, int] = {}
        exclusive_holders: dict[tuple[str, str], list[str]] = {}
        memory_use: dict[tuple[str, str], int] = {}
        pools = {p.resource: p for p in node.devicePools}
        for iid, rec, svc in placed:
            hold = holds.get(iid)
            rt = runtimes.get(rec["runtimeId"])
            assert rt is not None, f"{iid}: runtime {rec['runtimeId']} not on {node_id}"
            if hold is None:
                assert set(svc.labels) <= node_labels, (iid, svc.labels, node_labels)
                assert rt.type in svc.runtimes, (iid, rt.type, svc.runtimes)
                req = svc.requestedResources
                want_cpu, want_ram = req.cpu or 0, req.ram or 0
                want_storage, want_state = req.storage or 0, req.state or 0
            else:
                want_cpu, want_ram = hold["cpu"], hold["ram"]
                want_storage, want_state = hold["storage"], hold["state"]
            if rt.allowedDMIPS is not None:
                rt_cpu[rt.id] = rt_cpu.get(rt.id, 0) + want_cpu
            else:
                cpu += want_cpu
            if rt.allowedRAM is not None:
                rt_ram[rt.id] = rt_ram.get(rt.id, 0) + want_ram
            else:
                ram += want_ram
            rt_count[rt.id] = rt_count.get(rt.id, 0) + 1
            for kind, amount in (("storages", want_storage), ("states", want_state)):
                if amount:
                    assert kind in part_of, f"{iid} asks {kind} on {node_id}, which has none"
                    part_use[part_of[kind]] = part_use.get(part_of[kind], 0) + amount
            if hold is None:
                assert rec["resources"] == [r.name for r in svc.resources], iid
            for name in rec["resources"]:
                resource_use[name] = resource_use.get(name, 0) + 1
            asked = {d.resource: d for d in svc.devices}
            if hold is None:
                assert set(rec["devices"]) == set(asked), (iid, rec["devices"], asked)
            for resource, ids in rec["devices"].items():
                pool = pools.get(resource)
                assert pool is not None, f"{iid}: no pool {resource} on {node_id}"
                by_id = {d.id: d for d in pool.devices}
                d_req = asked.get(resource)
                if pool.policy == "exclusive":
                    count = d_req.count if d_req is not None and hold is None else len(ids)
                    assert len(ids) == count == len(set(ids)), (iid, ids, d_req)
                else:
                    assert len(ids) == 1, (iid, ids)
                for dev in ids:
                    assert dev in by_id, f"{iid} holds {dev}, which {node_id} does not have"
                    if not by_id[dev].healthy:
                        before = previous_devices.get(iid, {}).get(resource, ())
                        assert dev in before, f"{iid} was given unhealthy {dev} on {node_id}"
                    if pool.policy == "exclusive":
                        exclusive_holders.setdefault((resource, dev), []).append(iid)
                    else:
                        key = (resource, dev)
                        # (a hold keeps its share: its current spec asks the same by memory)
                        assert d_req is not None, (iid, resource)
                        memory_use[key] = memory_use.get(key, 0) + (d_req.memory or 0)
        where = f"node {node_id}"
        assert cpu <= cpu_cap, f"{where}: cpu {cpu} > {cpu_cap}"
        assert ram <= ram_cap, f"{where}: ram {ram} > {ram_cap}"
        for rid, used in rt_cpu.items():
            cap = runtimes[rid].allowedDMIPS
            assert cap is not None and used <= cap, f"{where}/{rid}: cpu {used} > {cap}"
        for rid, used in rt_ram.items():
            cap = runtimes[rid].allowedRAM
            assert cap is not None and used <= cap, f"{where}/{rid}: ram {used} > {cap}"
        for rid, n in rt_count.items():
            limit = runtimes[rid].maxInstances
            assert limit == 0 or n <= limit, f"{where}/{rid}: {n} instances > {limit}"
        for name, used in part_use.items():
            assert used <= part_size[name], f"{where}: partition {name} {used} > {part_size[name]}"
        shared = {r.name: r.sharedCount for r in node.host_resources}
        for name, used in resource_use.items():
            assert name in shared, f"{where}: resource {name} missing"
            assert shared[name] == 0 or used <= shared[name], f"{where}: {name} {used} users"
        for (resource, dev), holders in exclusive_holders.items():
            assert len(holders) == 1, f"{where}: {resource} {dev} held by {holders}"
        for (resource, dev), used in memory_use.items():
            size = next(d.memory for d in pools[resource].devices if d.id == dev)
            assert size is not None and used <= size, f"{where}: {dev} memory {used} > {size}"
    # the controller's own inventories agree: nothing reserved over capacity
    for node_id, ns in status["nodes"].items():
        invs = [ns["cpu"], ns["ram"], *ns["partitions"].values()]
        for rt in ns["runtimes"].values():
            invs += [rt["slots"], rt["cpu"], rt["ram"]]
        for inv in invs:
            if inv is not None:
                assert inv["reserved"] <= inv["capacity"], (node_id, inv)
        for name, res in ns["resources"].items():
            assert res["free"] is None or res["free"] >= 0, (node_id, name, res)


# ----------------------------------------------------------------------------- actual state


def desired_actual(
    node_id: str, actual: Mapping[str, Any], placements: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """The actual document after the node applied its patch, computed independently of the
    planner (SPEC §10): kept instances keep their observed record, the others are added as
    ``activating``. ``placements`` are ``out/status.json``'s instances."""
    doc = dict(actual, instances={})
    for iid, p in sorted(placements.items()):
        if p["nodeId"] != node_id:
            continue
        seen = actual["instances"].get(iid)
        devices = {r: sorted(ids) for r, ids in p["devices"].items()}
        same = (
            seen is not None
            and seen["version"] == p["version"]
            and seen["runtimeId"] == p["runtimeId"]
            and {r: sorted(ids) for r, ids in seen.get("devices", {}).items()} == devices
        )
        doc["instances"][iid] = (
            seen
            if same
            else {
                "itemId": p["itemId"],
                "subjectId": p["subjectId"],
                "index": p["index"],
                "version": p["version"],
                "runtimeId": p["runtimeId"],
                "state": "activating",
                "devices": {r: list(ids) for r, ids in p["devices"].items()},
            }
        )
    return doc


def actual_documents(state: Path) -> dict[str, dict[str, Any]]:
    docs: dict[str, dict[str, Any]] = {}
    if (state / "actual").is_dir():
        for path in sorted((state / "actual").glob("*.yaml")):
            docs[path.stem] = read_actual(state, path.stem)
    return docs


def agent_apply_refusing(state: Path) -> tuple[int, list[str]]:
    """Like tests/support/agent_sim.apply_all, but as the real agent (SPEC §15) a node whose patch's
    ``test`` fails (a stale patch, e.g. one left by a crashed run) refuses it and goes on.
    Returns the operations applied and the nodes that refused."""
    applied = 0
    refused: list[str] = []
    (state / "actual").mkdir(exist_ok=True)
    for patch_file in sorted((state / "out" / "nodes").glob("*.json")):
        node_id = patch_file.stem
        ops = json.loads(patch_file.read_text())
        if len(ops) <= 1:
            continue
        doc = read_actual(state, node_id)
        try:
            new = jsonpatch.apply_patch(doc, ops)
        except (jsonpatch.JsonPatchTestFailed, jsonpatch.JsonPatchConflict):
            refused.append(node_id)
            continue
        new["revision"] = doc["revision"] + 1
        for record in new["instances"].values():
            record["state"] = "active"
        text = json.dumps(new, indent=2, sort_keys=True) + "\n"
        (state / "actual" / f"{node_id}.yaml").write_text(text)
        applied += len(ops) - 1
    return applied, refused


def empty_actual(node_id: str) -> dict[str, Any]:
    return empty_actual_document(node_id)


def running_instances(state: Path) -> dict[str, tuple[str, dict[str, Any]]]:
    """Instance id → (node id, record) of everything the agents report."""
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for node_id, doc in actual_documents(state).items():
        for iid, rec in doc["instances"].items():
            out[iid] = (node_id, rec)
    return out


def decoded_checkpoint(state: Path, name: str = CURRENT) -> dict[str, Any] | None:
    """``{generation, data}`` of a checkpoint file, or None when there is none."""
    path = state / "checkpoint" / name
    if not path.exists():
        return None
    env: dict[str, Any] = json.loads(path.read_bytes())
    return {"generation": env["generation"], "data": env["data"]}
