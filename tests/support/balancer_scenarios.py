"""Random small units for the balancer's property tests (hypothesis strategies): nodes with
runtimes, partitions, resources and device pools; a unit.yaml; services asking for them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.strategies import DrawFn

from reconciler.model.documents import Node, Service, UnitConfig
from reconciler.model.values import instance_id

Mi = 1024**2

Gi = 1024**3

SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

RUNTIME_TYPES = ("runc", "crun", "runx")

ARCHES = ("x86_64", "arm64")

LABELS = ("l1", "l2")

RESOURCES = ("res1", "res2", "res3")


@dataclass(frozen=True)
class Scenario:
    unit: UnitConfig
    node_docs: tuple[dict[str, Any], ...]
    services: tuple[Service, ...]

    def nodes(self) -> list[Node]:
        return [Node.model_validate(d) for d in self.node_docs]


def _subset(draw: DrawFn, items: tuple[str, ...]) -> list[str]:
    return [x for x in items if draw(st.booleans())]


@st.composite
def node_docs(draw: DrawFn, node_id: str) -> dict[str, Any]:
    runtime_ids = draw(
        st.lists(st.sampled_from(("r1", "r2", "r3")), min_size=1, max_size=2, unique=True)
    )
    runtimes: list[dict[str, Any]] = []
    for rid in runtime_ids:
        rt: dict[str, Any] = {
            "id": rid,
            "type": draw(st.sampled_from(("runc", "runc", *RUNTIME_TYPES))),
            "platform": {"architecture": draw(st.sampled_from(ARCHES)), "os": "linux"},
            "maxInstances": draw(st.integers(0, 3)),
        }
        if not draw(st.integers(0, 3)):  # a runtime with its own pools (SPEC §7.3)
            rt["allowedDMIPS"] = draw(st.sampled_from((0, 300, 600)) | st.integers(0, 1000))
            rt["allowedRAM"] = draw(st.sampled_from((0, 256, 512, 1024))) * Mi
        runtimes.append(rt)
    size = st.sampled_from((0, 512, 1024, 2048, 2048)).map(lambda m: m * Mi)
    layout = draw(st.sampled_from(("none", "both", "both", "storages", "states", "separate")))
    partitions: list[dict[str, Any]] = []
    if layout == "both":
        partitions.append({"name": "p", "types": ["storages", "states"], "totalSize": draw(size)})
    if layout in ("storages", "separate"):
        partitions.append({"name": "ps", "types": ["storages"], "totalSize": draw(size)})
    if layout in ("states", "separate"):
        partitions.append({"name": "pt", "types": ["states"], "totalSize": draw(size)})
    pools: list[dict[str, Any]] = []
    if draw(st.booleans()):
        n = draw(st.integers(0, 5))
        pools.append(
            {
                "resource": "gpu",
                "policy": "exclusive",
                "devices": [
                    {"id": f"d{i}", "healthy": draw(st.sampled_from((True, True, False)))}
                    for i in range(n)
                ],
            }
        )
    if draw(st.booleans()):
        n = draw(st.integers(1, 3))
        pools.append(
            {
                "resource": "example.com/vgpu",
                "policy": "fractional",
                "devices": [
                    {
                        "id": f"v{i}",
                        "healthy": draw(st.sampled_from((True, True, False))),
                        "memory": draw(st.sampled_from((1, 2, 4))) * Gi,
                    }
                    for i in range(n)
                ],
            }
        )
    doc: dict[str, Any] = {
        "apiVersion": "reconciler/v1",
        "kind": "Node",
        "id": node_id,
        "type": "edge",
        "state": draw(st.sampled_from(("provisioned",) * 9 + ("paused",))),
        "connected": draw(st.sampled_from((True,) * 9 + (False,))),
        "maxDMIPS": draw(st.sampled_from((1000, 2000, 500, 1500, 0)) | st.integers(0, 2000)),
        "totalRAM": draw(st.sampled_from((1024, 2048, 512, 4096, 0))) * Mi,
        "runtimes": runtimes,
        "partitions": partitions,
        "devicePools": pools,
    }
    if not draw(st.integers(0, 2)):  # measured usage; s0's first instance is the unit's own
        doc["usage"] = {
            "cpu": draw(st.integers(0, 1500)),
            "ram": draw(st.integers(0, 8)) * 128 * Mi,
            "instances": {
                instance_id("s0", "default", 0): {
                    "cpu": draw(st.integers(0, 500)),
                    "ram": draw(st.integers(0, 4)) * 128 * Mi,
                }
            }
            if draw(st.booleans())
            else {},
        }
    if draw(st.integers(0, 2)):
        doc["resources"] = [
            {"name": name, "sharedCount": draw(st.integers(0, 3))}
            for name in RESOURCES
            if draw(st.integers(0, 2))
        ]
    if not draw(st.integers(0, 3)):  # inventory settings (SPEC §6.1)
        doc["inventories"] = inventories(draw, doc)
    return doc


def inventories(draw: DrawFn, doc: dict[str, Any]) -> dict[str, Any]:
    """Some of ``inventories`` for a node document: reserved parts within what it has,
    ratios below and above 1, unit rules the services' amounts meet or break."""
    ratios = st.sampled_from((0.5, 1, 1.5, 2, 3))
    sizes = {t: p["totalSize"] for p in doc["partitions"] for t in p["types"]}
    shared = len(doc["partitions"]) == 1 and len(doc["partitions"][0]["types"]) == 2
    out: dict[str, Any] = {}
    for name, total, unit in (
        ("cpu", doc["maxDMIPS"], 100),
        ("ram", doc["totalRAM"], 128 * Mi),
        ("storage", sizes.get("storages"), 128 * Mi),
        ("state", sizes.get("states"), 128 * Mi),
    ):
        if not draw(st.booleans()):
            continue
        entry: dict[str, Any] = {}
        if total is not None and not (name == "state" and shared) and draw(st.booleans()):
            entry["reserved"] = draw(st.integers(0, total // unit)) * unit
            entry["allocationRatio"] = draw(ratios)
        if draw(st.booleans()):
            low = draw(st.sampled_from((1, 1, 2, 3))) * unit
            entry["minUnit"] = low
            if draw(st.booleans()):
                entry["maxUnit"] = low + draw(st.integers(0, 4)) * unit
            if draw(st.booleans()):
                entry["stepSize"] = draw(st.sampled_from((1, unit // 2, unit)))
        out[name] = entry
    return out


@st.composite
def unit_configs(draw: DrawFn, node_ids: list[str]) -> UnitConfig:
    entries: list[dict[str, Any]] = []
    for nid in node_ids:
        if not draw(st.integers(0, 4)):
            continue  # no entry: priority 0, no labels, default ratios
        entry: dict[str, Any] = {
            "nodeType": "edge",
            "nodeId": nid,
            "priority": draw(st.sampled_from((0, 10, 20))),
            "labels": _subset(draw, LABELS),
        }
        if draw(st.booleans()):
            entry["resourceRatios"] = {
                k: draw(st.integers(0, 100)) for k in ("cpu", "ram", "storage", "state")
            }
        entries.append(entry)
    if draw(st.booleans()):
        # an entry for the node type, somewhere in the list: nodes without their own entry
        # take it, an entry with the exact nodeId wins over it (SPEC §3.1)
        by_type = {
            "nodeType": "edge",
            "priority": draw(st.sampled_from((0, 10, 20))),
            "labels": _subset(draw, LABELS),
        }
        entries.insert(draw(st.integers(0, len(entries))), by_type)
    return UnitConfig.model_validate(
        {"apiVersion": "reconciler/v1", "kind": "UnitConfig", "version": "1.0.0", "nodes": entries}
    )


@st.composite
def services(draw: DrawFn, item_id: str, node_ids: list[str]) -> Service:
    def sometimes(one_in: int) -> bool:
        return draw(st.integers(0, one_in - 1)) == 0

    def amount(one_in: int, strategy: st.SearchStrategy[int]) -> int | None:
        return draw(strategy) if sometimes(one_in) else None

    mib128 = st.integers(0, 6).map(lambda m: m * 128 * Mi)
    pos_mib128 = st.integers(1, 6).map(lambda m: m * 128 * Mi)
    requested = {
        "cpu": amount(2, st.integers(0, 600)),
        "ram": amount(2, mib128),
        "storage": amount(4, mib128),
        "state": amount(5, mib128),
    }
    quotas = {
        "cpuDMIPSLimit": amount(3, st.integers(1, 800)),
        "ramLimit": amount(3, pos_mib128),
        "storageLimit": amount(5, pos_mib128),
        "stateLimit": amount(5, pos_mib128),
    }
    devices: list[dict[str, Any]] = []
    if sometimes(7):
        devices.append({"resource": "gpu", "count": draw(st.integers(1, 3))})
    if sometimes(7):
        memory = draw(st.sampled_from((512 * Mi, Gi, 2 * Gi)))
        devices.append({"resource": "example.com/vgpu", "memory": memory})
    doc: dict[str, Any] = {
        "apiVersion": "reconciler/v1",
        "kind": "Service",
        "id": item_id,
        "version": "1.0.0",
        "priority": draw(st.sampled_from((0, 1, 2))),
        "instances": draw(st.integers(0, 4)),
        "labels": [x for x in LABELS if sometimes(8)],
        "image": {"rootfs": "/r"},
        "requestedResources": {k: v for k, v in requested.items() if v is not None},
        "quotas": {k: v for k, v in quotas.items() if v is not None},
        "skipResourceLimits": sometimes(8),
        "resources": [{"name": r} for r in RESOURCES if sometimes(8)],
        "devices": devices,
    }
    if sometimes(3):
        doc["runtimes"] = draw(st.lists(st.sampled_from(RUNTIME_TYPES), min_size=1, unique=True))
    if sometimes(3):
        doc["image"]["platform"] = {"architecture": draw(st.sampled_from(ARCHES))}
    if sometimes(6):
        doc["nodeId"] = draw(st.sampled_from(node_ids))
    return Service.model_validate(doc)


@st.composite
def scenarios(draw: DrawFn) -> Scenario:
    node_ids = [f"n{i}" for i in range(draw(st.integers(2, 6)))]
    docs = tuple(draw(node_docs(nid)) for nid in node_ids)
    unit = draw(unit_configs(node_ids))
    n_services = draw(st.integers(1, 6))
    svcs = tuple(draw(services(f"s{i}", node_ids)) for i in range(n_services))
    return Scenario(unit, docs, svcs)
