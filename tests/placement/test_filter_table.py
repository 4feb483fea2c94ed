"""Every placement filter of SPEC §7.4 (``reconciler.placement.filters``), as a table of its own
verdicts: for one node and one service, ``None`` (passes) or the exact reason it gives.

Each row names the filter, the node (a plain node from ``tests.support.builders``: 1000 DMIPS,
1 GiB RAM, one ``runc`` runtime on x86_64/linux, provisioned and connected, with what the row
changes), the service (no requests, runtimes ``[crun, runc]``, with what the row changes), what
other services hold on the node first, and the expected answer, worked out by hand from the
numbers in the row (1 GiB = 1073741824 bytes; the unit's resource ratios default to 50 %).
The verdict is checked on the filter unit directly and, for rows without a kept previous
allocation (which only the balancer's pass 1 asks for), in ``explain``'s matrix too.

A filter added to ``NODE_FILTERS`` or ``RUNTIME_FILTERS`` fails
``test_every_filter_has_a_table`` until its rows are here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from reconciler.model.documents import Node, Service, UnitConfig
from reconciler.placement.filters import FILTER_CODES, NODE_FILTERS, RUNTIME_FILTERS
from tests.support.builders import make_node, make_service, make_unit, node_entry, runtime
from tests.support.filter_inputs import ask_of, explain_cell, slot_of

GI = 1024**3
MI = 1024**2


@dataclass(frozen=True)
class Row:
    filter: str
    case: str
    node: Node
    service: Service
    expected: str | None
    unit: UnitConfig | None = None
    others: tuple[Service, ...] = ()  # placed on the node first (they outrank the service)
    keep_runtime: str | None = None
    keep_devices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def node(**over: Any) -> Node:
    return make_node("n1", **over)


def svc(**over: Any) -> Service:
    return make_service("svc", **over)


def other(item: str, **over: Any) -> Service:
    return make_service(item, priority=100, **over)


def labelled(*labels: str) -> UnitConfig:
    return make_unit([node_entry("n1", labels=labels)])


GPU = {
    "resource": "gpu",
    "policy": "exclusive",
    "devices": [{"id": "g0"}, {"id": "g1", "healthy": False}, {"id": "g2"}],
}
VGPU = {
    "resource": "vgpu",
    "policy": "fractional",
    "devices": [{"id": "dev0", "memory": "16Gi"}, {"id": "dev1", "memory": "8Gi"}],
}
POOLS = [GPU, VGPU]
CAN = [{"name": "can0", "sharedCount": 1}, {"name": "bus", "sharedCount": 0}]


ROWS: tuple[Row, ...] = (
    # ------------------------------------------------------------ NodeState
    Row("NodeState", "provisioned and connected", node(), svc(), None),
    Row("NodeState", "disconnected", node(connected=False), svc(), "disconnected"),
    Row("NodeState", "unprovisioned", node(state="unprovisioned"), svc(), "state unprovisioned"),
    Row("NodeState", "paused", node(state="paused"), svc(), "state paused"),
    Row("NodeState", "error", node(state="error"), svc(), "state error"),
    Row(
        "NodeState",
        "disconnected is said first",
        node(connected=False, state="paused"),
        svc(),
        "disconnected",
    ),
    # ------------------------------------------------------------ NodeId
    Row("NodeId", "no nodeId", node(), svc(), None),
    Row("NodeId", "this node", node(), svc(node_id="n1"), None),
    Row("NodeId", "another node", node(), svc(node_id="n2"), "service wants node n2"),
    # ------------------------------------------------------------ Labels
    Row("Labels", "none required", node(), svc(), None, labelled("gpu")),
    Row("Labels", "all present", node(), svc(labels=["gpu"]), None, labelled("gpu", "x")),
    Row(
        "Labels",
        "one missing",
        node(),
        svc(labels=["gpu", "lidar"]),
        "missing labels lidar",
        labelled("gpu"),
    ),
    Row(
        "Labels",
        "no unit: all missing, sorted",
        node(),
        svc(labels=["zone-b", "zone-a"]),
        "missing labels zone-a, zone-b",
    ),
    # ------------------------------------------------------------ Resources
    Row("Resources", "none asked", node(resources=CAN), svc(), None),
    Row("Resources", "a free slot", node(resources=CAN), svc(resources=["can0"]), None),
    Row(
        "Resources",
        "not on the node",
        node(resources=CAN),
        svc(resources=["camera"]),
        "no resource camera",
    ),
    Row(
        "Resources",
        "the first missing one is named",
        node(resources=CAN),
        svc(resources=["can0", "camera"]),
        "no resource camera",
    ),
    Row(
        "Resources",
        "its one slot taken",
        node(resources=CAN),
        svc(resources=["can0"]),
        "can0: all 1 shared slots in use",
        others=(other("holder", resources=["can0"]),),
    ),
    Row(
        "Resources",
        "sharedCount 0 is unlimited",
        node(resources=CAN),
        svc(resources=["bus"]),
        None,
        others=(other("holder", instances=3, resources=["bus"]),),
    ),
    # ------------------------------------------------------------ Devices
    Row("Devices", "none asked", node(device_pools=POOLS), svc(), None),
    Row(
        "Devices",
        "no such pool",
        node(device_pools=POOLS),
        svc(devices=[{"resource": "lidar", "count": 1}]),
        "no device pool lidar",
    ),
    Row(
        "Devices",
        "exclusive: every healthy device",
        node(device_pools=POOLS),
        svc(devices=[{"resource": "gpu", "count": 2}]),
        None,
    ),
    Row(
        "Devices",
        "exclusive: more than the healthy devices",
        node(device_pools=POOLS),
        svc(devices=[{"resource": "gpu", "count": 3}]),
        "UnschedulableAndUnresolvable: gpu: 3 requested, 2 healthy devices",
    ),
    Row(
        "Devices",
        "exclusive: all taken",
        node(device_pools=POOLS),
        svc(devices=[{"resource": "gpu", "count": 1}]),
        "Unschedulable: gpu: 1 requested, 0 free",
        others=(other("holder", devices=[{"resource": "gpu", "count": 2}]),),
    ),
    Row(
        "Devices",
        "exclusive: memory asked",
        node(device_pools=POOLS),
        svc(devices=[{"resource": "gpu", "memory": "1Gi"}]),
        "Error: gpu is exclusive: request a count",
    ),
    Row(
        "Devices",
        "fractional: fits",
        node(device_pools=POOLS),
        svc(devices=[{"resource": "vgpu", "memory": "16Gi"}]),
        None,
    ),
    Row(
        "Devices",
        "fractional: bigger than any device",
        node(device_pools=POOLS),
        svc(devices=[{"resource": "vgpu", "memory": "32Gi"}]),
        "UnschedulableAndUnresolvable: vgpu: no healthy device with 32 GiB free",
    ),
    Row(
        "Devices",
        "fractional: not now (dev0 has 6Gi left, dev1 is too small)",
        node(device_pools=POOLS),
        svc(devices=[{"resource": "vgpu", "memory": "12Gi"}]),
        "Unschedulable: vgpu: no healthy device with 12 GiB free",
        others=(other("holder", devices=[{"resource": "vgpu", "memory": "10Gi"}]),),
    ),
    Row(
        "Devices",
        "fractional: a count asked",
        node(device_pools=POOLS),
        svc(devices=[{"resource": "vgpu", "count": 1}]),
        "Error: vgpu is fractional: request memory",
    ),
    Row(
        "Devices",
        "the first failing request is named (by resource)",
        node(device_pools=POOLS),
        svc(devices=[{"resource": "vgpu", "count": 1}, {"resource": "gpu", "count": 3}]),
        "UnschedulableAndUnresolvable: gpu: 3 requested, 2 healthy devices",
    ),
    Row(
        "Devices",
        "exclusive: a kept device",
        node(device_pools=POOLS),
        svc(devices=[{"resource": "gpu", "count": 1}]),
        None,
        keep_devices={"gpu": ("g2",)},
    ),
    Row(
        "Devices",
        "exclusive: a kept device that vanished",
        node(device_pools=POOLS),
        svc(devices=[{"resource": "gpu", "count": 1}]),
        "UnschedulableAndUnresolvable: gpu: g9 vanished",
        keep_devices={"gpu": ("g9",)},
    ),
    Row(
        "Devices",
        "exclusive: a kept device now taken",
        node(device_pools=POOLS),
        svc(devices=[{"resource": "gpu", "count": 1}]),
        "Unschedulable: gpu: g0 is taken",
        others=(other("holder", devices=[{"resource": "gpu", "count": 1}]),),
        keep_devices={"gpu": ("g0",)},
    ),
    Row(
        "Devices",
        "exclusive: the count changed since",
        node(device_pools=POOLS),
        svc(devices=[{"resource": "gpu", "count": 2}]),
        "Unschedulable: gpu: count changed",
        keep_devices={"gpu": ("g0",)},
    ),
    Row(
        "Devices",
        "fractional: a kept device that lacks memory now",
        node(device_pools=POOLS),
        svc(devices=[{"resource": "vgpu", "memory": "8Gi"}]),
        "Unschedulable: vgpu: dev0 lacks free memory",
        others=(other("holder", devices=[{"resource": "vgpu", "memory": "10Gi"}]),),
        keep_devices={"vgpu": ("dev0",)},
    ),
    # ------------------------------------------------------------ RuntimeType
    Row("RuntimeType", "an accepted type", node(), svc(runtimes=["runc"]), None),
    Row("RuntimeType", "the default [crun, runc]", node(), svc(), None),
    Row(
        "RuntimeType",
        "not accepted",
        node(runtimes=[runtime("r1", "runx")]),
        svc(),
        "type runx not accepted (the service accepts crun, runc)",
    ),
    Row("RuntimeType", "kept on this runtime", node(), svc(), None, keep_runtime="runc"),
    Row(
        "RuntimeType",
        "kept on another runtime",
        node(),
        svc(),
        "instance is kept on runtime crun-1",
        keep_runtime="crun-1",
    ),
    # ------------------------------------------------------------ Platform
    Row("Platform", "the image names none", node(), svc(), None),
    Row("Platform", "same architecture", node(), svc(platform={"architecture": "x86_64"}), None),
    Row(
        "Platform",
        "another architecture",
        node(),
        svc(platform={"architecture": "arm64"}),
        "architecture x86_64 is not arm64",
    ),
    Row(
        "Platform",
        "same os",
        node(),
        svc(platform={"architecture": "x86_64", "os": "linux"}),
        None,
    ),
    Row(
        "Platform",
        "another os",
        node(),
        svc(platform={"architecture": "x86_64", "os": "windows"}),
        "os linux is not windows",
    ),
    Row(
        "Platform",
        "a variant the runtime does not state",
        node(),
        svc(platform={"architecture": "x86_64", "variant": "v3"}),
        "variant None is not v3",
    ),
    Row(
        "Platform",
        "another osVersion",
        node(runtimes=[{**runtime(), "platform": {"architecture": "x86_64", "osVersion": "6.1"}}]),
        svc(platform={"architecture": "x86_64", "osVersion": "6.6"}),
        "osVersion 6.1 is not 6.6",
    ),
    Row(
        "Platform",
        "os features present",
        node(runtimes=[{**runtime(), "platform": {"architecture": "x86_64", "osFeatures": ["a"]}}]),
        svc(platform={"architecture": "x86_64", "osFeatures": ["a"]}),
        None,
    ),
    Row(
        "Platform",
        "os features missing, sorted",
        node(runtimes=[{**runtime(), "platform": {"architecture": "x86_64", "osFeatures": ["a"]}}]),
        svc(platform={"architecture": "x86_64", "osFeatures": ["c", "a", "b"]}),
        "missing os features b, c",
    ),
    # ------------------------------------------------------------ Cpu
    Row("Cpu", "nothing asked", node(), svc(), None),
    Row("Cpu", "exactly what is free", node(), svc(cpu=1000), None),
    Row("Cpu", "one DMIPS more", node(), svc(cpu=1001), "needs 1001 DMIPS, 1000 free"),
    Row(
        "Cpu",
        "after another service's 600",
        node(),
        svc(cpu=500),
        "needs 500 DMIPS, 400 free",
        others=(other("holder", cpu=600),),
    ),
    Row(
        "Cpu",
        "half the quota at the default ratio (3000 * 50 %)",
        node(),
        svc(quotas={"cpuDMIPSLimit": 3000}),
        "needs 1500 DMIPS, 1000 free",
    ),
    Row(
        "Cpu",
        "the request capped at the quota",
        node(),
        svc(cpu=5000, quotas={"cpuDMIPSLimit": 1000}),
        None,
    ),
    Row("Cpu", "skipResourceLimits asks nothing", node(), svc(cpu=5000, skip_limits=True), None),
    Row(
        "Cpu",
        "the runtime's own pool",
        node(runtimes=[{**runtime(), "allowedDMIPS": 300}]),
        svc(cpu=400),
        "needs 400 DMIPS, 300 free",
    ),
    Row(
        "Cpu",
        "allocationRatio 2: twice the DMIPS",
        node(inventories={"cpu": {"allocationRatio": 2}}),
        svc(cpu=2000),
        None,
    ),
    Row(
        "Cpu",
        "allocationRatio 2, one DMIPS more",
        node(inventories={"cpu": {"allocationRatio": 2}}),
        svc(cpu=2001),
        "needs 2001 DMIPS, 2000 free",
    ),
    Row(
        "Cpu",
        "reserved 300 of 1000",
        node(inventories={"cpu": {"reserved": 300}}),
        svc(cpu=701),
        "needs 701 DMIPS, 700 free",
    ),
    Row(
        "Cpu",
        "reserved, then the ratio: (1000 - 200) * 1.5",
        node(inventories={"cpu": {"reserved": 200, "allocationRatio": 1.5}}),
        svc(cpu=1200),
        None,
    ),
    Row(
        "Cpu",
        "below minUnit",
        node(inventories={"cpu": {"minUnit": 200}}),
        svc(cpu=150),
        "needs 150 DMIPS: below-min-unit (inventories.cpu.minUnit 200)",
    ),
    Row(
        "Cpu",
        "above maxUnit",
        node(inventories={"cpu": {"maxUnit": 400}}),
        svc(cpu=500),
        "needs 500 DMIPS: above-max-unit (inventories.cpu.maxUnit 400)",
    ),
    Row(
        "Cpu",
        "not a multiple of stepSize",
        node(inventories={"cpu": {"stepSize": 100}}),
        svc(cpu=250),
        "needs 250 DMIPS: step-size (inventories.cpu.stepSize 100)",
    ),
    Row(
        "Cpu",
        "units say nothing of a request of 0",
        node(inventories={"cpu": {"minUnit": 200}}),
        svc(),
        None,
    ),
    # ------------------------------------------------------------ Ram
    Row("Ram", "nothing asked", node(), svc(), None),
    Row("Ram", "exactly what is free", node(), svc(ram="1Gi"), None),
    Row("Ram", "twice that", node(), svc(ram="2Gi"), "needs 2 GiB of RAM, 1 GiB free"),
    Row(
        "Ram",
        "after another service's 768Mi",
        node(),
        svc(ram="512Mi"),
        "needs 512 MiB of RAM, 256 MiB free",
        others=(other("holder", ram="768Mi"),),
    ),
    Row(
        "Ram",
        "the runtime's own pool",
        node(runtimes=[{**runtime(), "allowedRAM": "256Mi"}]),
        svc(ram="512Mi"),
        "needs 512 MiB of RAM, 256 MiB free",
    ),
    Row(
        "Ram",
        "allocationRatio 1.5 of 1 GiB",
        node(inventories={"ram": {"allocationRatio": 1.5}}),
        svc(ram="1536Mi"),
        None,
    ),
    Row(
        "Ram",
        "not a multiple of a 256 MiB step",
        node(inventories={"ram": {"stepSize": "256Mi"}}),
        svc(ram="300Mi"),
        "needs 300 MiB of RAM: step-size (inventories.ram.stepSize 256 MiB)",
    ),
    # ------------------------------------------------------------ Storage
    Row("Storage", "nothing asked, no partition", node(), svc(), None),
    Row(
        "Storage",
        "no partition typed storages",
        node(partitions=[{"name": "p", "types": ["states"], "totalSize": "1Gi"}]),
        svc(storage="1Mi"),
        "no partition typed storages",
    ),
    Row(
        "Storage",
        "fits",
        node(partitions=[{"name": "p", "types": ["storages"], "totalSize": "1Gi"}]),
        svc(storage="1Gi"),
        None,
    ),
    Row(
        "Storage",
        "too big",
        node(partitions=[{"name": "p", "types": ["storages"], "totalSize": "1Gi"}]),
        svc(storage="2Gi"),
        "needs 2 GiB, 1 GiB free",
    ),
    Row(
        "Storage",
        "after another service's 700Mi",
        node(partitions=[{"name": "p", "types": ["storages"], "totalSize": "1Gi"}]),
        svc(storage="400Mi"),
        "needs 400 MiB, 324 MiB free",
        others=(other("holder", storage="700Mi"),),
    ),
    Row(
        "Storage",
        "reserved 1 GiB of the partition",
        node(
            partitions=[{"name": "p", "types": ["storages"], "totalSize": "2Gi"}],
            inventories={"storage": {"reserved": "1Gi"}},
        ),
        svc(storage="1025Mi"),
        "needs 1025 MiB, 1 GiB free",
    ),
    Row(
        "Storage",
        "above maxUnit",
        node(
            partitions=[{"name": "p", "types": ["storages"], "totalSize": "2Gi"}],
            inventories={"storage": {"maxUnit": "1Gi"}},
        ),
        svc(storage="2Gi"),
        "needs 2 GiB: above-max-unit (inventories.storage.maxUnit 1 GiB)",
    ),
    # ------------------------------------------------------------ State
    Row("State", "nothing asked, no partition", node(), svc(), None),
    Row(
        "State",
        "no partition typed states",
        node(partitions=[{"name": "p", "types": ["storages"], "totalSize": "1Gi"}]),
        svc(state="1Mi"),
        "no partition typed states",
    ),
    Row(
        "State",
        "fits its own partition",
        node(
            partitions=[
                {"name": "s", "types": ["storages"], "totalSize": "1Gi"},
                {"name": "t", "types": ["states"], "totalSize": "1Gi"},
            ]
        ),
        svc(storage="1Gi", state="1Gi"),
        None,
    ),
    Row(
        "State",
        "one partition typed both: state and storage share it",
        node(partitions=[{"name": "p", "types": ["storages", "states"], "totalSize": "1Gi"}]),
        svc(storage="600Mi", state="600Mi"),
        # the reason names what the shared pool must give: 600Mi of storage plus 600Mi of state
        "needs 1200 MiB with storage (600 MiB state), 1 GiB free",
    ),
    Row(
        "State",
        "one partition typed both: together they fit",
        node(partitions=[{"name": "p", "types": ["storages", "states"], "totalSize": "1Gi"}]),
        svc(storage="512Mi", state="512Mi"),
        None,
    ),
    Row(
        "State",
        "below minUnit",
        node(
            partitions=[{"name": "p", "types": ["states"], "totalSize": "2Gi"}],
            inventories={"state": {"minUnit": "1Mi"}},
        ),
        svc(state=4096),
        "needs 4 KiB of state: below-min-unit (inventories.state.minUnit 1 MiB)",
    ),
    Row(
        "State",
        "one partition typed both: inventories.storage shapes it",
        node(
            partitions=[{"name": "p", "types": ["storages", "states"], "totalSize": "2Gi"}],
            inventories={"storage": {"allocationRatio": 2}},
        ),
        svc(storage="2Gi", state="2Gi"),
        None,
    ),
    # ------------------------------------------------------------ MaxInstances
    Row("MaxInstances", "0 is unlimited", node(), svc(), None, others=(other("a", instances=3),)),
    Row(
        "MaxInstances",
        "a free slot",
        node(runtimes=[runtime(max_instances=2)]),
        svc(),
        None,
        others=(other("holder"),),
    ),
    Row(
        "MaxInstances",
        "every slot in use",
        node(runtimes=[runtime(max_instances=2)]),
        svc(),
        "all 2 instance slots in use",
        others=(other("holder", instances=2),),
    ),
)

FILTERS = {f.name: f for f in NODE_FILTERS} | {f.name: f for f in RUNTIME_FILTERS}


def verdict(row: Row) -> str | None:
    slot = slot_of(row.node, unit=row.unit, others=row.others)
    ask = ask_of(row.service, keep_runtime=row.keep_runtime, keep_devices=row.keep_devices)
    node_filter = next((f for f in NODE_FILTERS if f.name == row.filter), None)
    if node_filter is not None:
        return node_filter.check(slot, ask)
    runtime_filter = next(f for f in RUNTIME_FILTERS if f.name == row.filter)
    (only,) = slot.runtimes  # one runtime per row: its answer is the node's
    return runtime_filter.check(slot, only, ask)


@pytest.mark.parametrize("row", ROWS, ids=[f"{r.filter}: {r.case}" for r in ROWS])
def test_the_filter_gives_the_verdict(row: Row) -> None:
    assert verdict(row) == row.expected


EXPLAINED = [r for r in ROWS if r.keep_runtime is None and not r.keep_devices]


@pytest.mark.parametrize("row", EXPLAINED, ids=[f"{r.filter}: {r.case}" for r in EXPLAINED])
def test_explain_shows_the_verdict(row: Row) -> None:
    cell = explain_cell(row.node, row.service, row.filter, unit=row.unit, others=row.others)
    assert cell == row.expected


def test_every_filter_has_a_table() -> None:
    """Each registered filter has rows here, at least one passing and one refusing, and the
    table names no filter that is not registered."""
    assert set(FILTERS) == set(FILTER_CODES)
    assert {r.filter for r in ROWS} == set(FILTER_CODES)
    for name in FILTER_CODES:
        answers = [r.expected for r in ROWS if r.filter == name]
        assert None in answers, f"{name}: no row where it passes"
        assert any(a is not None for a in answers), f"{name}: no row where it refuses"


def test_the_rows_are_distinct() -> None:
    ids = [(r.filter, r.case) for r in ROWS]
    assert len(ids) == len(set(ids))
