"""Filters declare what they read; the balancer's caches are derived from those declarations.

- The class key holds what every registered filter reads of a node and of its runtimes: a filter
  registered later (here, only in the test) splits classes by the field it reads, and nodes
  differing only in their runtime ids share one class (the ids enter only as an order).
- Every filter reads only what it declares (checked by recording what it reads).
- The dynamic rules have one definition: ``claim`` and ``take`` (the fast path) and the filter
  units give the same verdicts on random node states and asks.
- What a dynamic filter declares it answers whatever is reserved (``idle``, ``need`` and
  ``room``) is what its ``check`` answers on random node states, and the per-class bound the
  pipeline derives from them (``dynamic_bound``) is the whole pipeline's answer on every node
  of a drawn class in random states.
- What a filter declares of a node nothing is reserved on (``empty_rooms``, the
  ``unreserved_key``) is what its state with nothing reserved holds and answers, so an
  unplaceable ask is charged on the nodes a run never touched without building their states.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.strategies import DrawFn
from pydantic import BaseModel, ValidationError

from reconciler.accel import ClassIndex, balance
from reconciler.model.documents import Node, Service
from reconciler.model.inventory import InventoryError
from reconciler.placement import filters
from reconciler.placement.ask import Ask, ask_for
from reconciler.placement.balancer import Run
from reconciler.placement.instances import expand_instances
from reconciler.placement.nodestate import (
    NO_KEEP,
    NodeSlot,
    Pool,
    Reservation,
    RuntimeSlot,
    basics_request_key,
    claim,
    make_slot,
    node_basics,
    release_reservation,
    restore_reservation,
    runtime_capacities,
    take,
)
from reconciler.placement.pipeline import (
    bounded_drop,
    dynamic_bound,
    evaluate,
    most_room,
    static_drop,
    static_runtime_verdict,
)
from reconciler.placement.search import all_charges
from tests.support.balancer_scenarios import inventories
from tests.support.builders import make_node, make_service, runtime

_NONE: frozenset[str] = frozenset()

SETTINGS = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _index(nodes: list[Node]) -> ClassIndex:
    index = Run(None, nodes, {}, search=ClassIndex).search
    assert isinstance(index, ClassIndex)
    return index


def _classes(nodes: list[Node]) -> dict[str, int]:
    return dict(_index(nodes).class_of)


# ---------------------------------------------------------------- the class key


@dataclass(frozen=True)
class NodeTypeFilter:
    """A static filter only this test registers: the node's type must be ``edge``. It reads a
    node field (``type``) no registered filter reads."""

    name: ClassVar[str] = "NodeType"
    static: ClassVar[bool] = True
    reads_node: ClassVar[tuple[str, ...]] = ("node.type",)
    reads_ask: ClassVar[tuple[str, ...]] = ()

    def check(self, slot: NodeSlot, ask: Ask) -> str | None:
        return None if slot.node.type == "edge" else f"type {slot.node.type}"


def test_a_filter_registered_later_splits_classes_by_the_field_it_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two nodes that differ only in their type share a class while no filter reads the type;
    once a filter reading it is registered, they fall in two classes, and the fast pass places
    where the exhaustive scan does. A hand-kept class key (which did not hold the type) would
    put both in one class and give the first one's static verdict to both."""
    # "a-gw" comes first in the choice order (more free CPU, then smaller id)
    nodes = [
        make_node("a-gw", dmips=2000, node_type="gateway"),
        make_node("b-edge", dmips=1000, node_type="edge"),
    ]
    services = [make_service("s", instances=2, cpu=100)]
    before = _classes(nodes)
    assert before["a-gw"] == before["b-edge"]
    assert {p.node_id for p in balance(None, nodes, services).placements} == {"a-gw"}

    monkeypatch.setattr(filters, "NODE_FILTERS", (*filters.NODE_FILTERS, NodeTypeFilter()))
    monkeypatch.setattr(filters, "FILTER_CODES", (*filters.FILTER_CODES, NodeTypeFilter.name))
    assert "node.type" in filters.node_reads()
    after = _classes(nodes)
    assert after["a-gw"] != after["b-edge"]
    fast = balance(None, nodes, services)
    assert fast == balance(None, nodes, services, exhaustive=True)
    assert [p.node_id for p in fast.placements] == ["b-edge", "b-edge"]
    assert not fast.failures


def test_a_filter_declaring_the_whole_node_document_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Reads of the node's document are declared field by field (``node.<field>``)."""

    @dataclass(frozen=True)
    class Vague(NodeTypeFilter):
        reads_node: ClassVar[tuple[str, ...]] = ("node",)

    monkeypatch.setattr(filters, "NODE_FILTERS", (*filters.NODE_FILTERS, Vague()))
    with pytest.raises(ValueError, match=r"node\.<field>"):
        _classes([make_node("a")])


def _own_ids(node_id: str, *specs: tuple[str, str, str]) -> Node:
    """A node whose runtimes are (id, type, architecture)."""
    return make_node(
        node_id, runtimes=[runtime(rid, rtype, arch=arch) for rid, rtype, arch in specs]
    )


def test_runtime_ids_do_not_split_classes() -> None:
    """A fleet where every node has its own runtime ids, its runtimes otherwise identical, is
    one class (each node was its own class when the ids were in the key)."""
    nodes = [
        _own_ids(f"n{i:03d}", (f"crun-{i}", "crun", "x86_64"), (f"runc-{i}", "runc", "x86_64"))
        for i in range(60)
    ]
    assert len(_index(nodes).members) == 1
    services = [make_service("s", instances=90, cpu=10, runtimes=["runc"])]
    fast = balance(None, nodes, services)
    assert fast == balance(None, nodes, services, exhaustive=True)
    assert len(fast.placements) == 90
    for p in fast.placements:  # each node's own id of the runtime the class's verdict chose
        assert p.runtime_id == f"runc-{p.node_id[1:].lstrip('0') or '0'}"


def test_runtime_ids_give_the_order_of_a_nodes_runtimes() -> None:
    """Runtimes are described in their order on the node (by type, then id): two nodes whose
    runtimes of one type come in another order by id are two classes, and each node gets the
    runtime that passes on it."""
    # p: x1 (arm64) before x2 (x86_64); q: y1 (x86_64) before y2 (arm64); r like p, other ids
    p = _own_ids("p", ("x1", "runc", "arm64"), ("x2", "runc", "x86_64"))
    q = _own_ids("q", ("y2", "runc", "arm64"), ("y1", "runc", "x86_64"))
    r = _own_ids("r", ("z7", "runc", "arm64"), ("z8", "runc", "x86_64"))
    classes = _classes([p, q, r])
    assert classes["p"] == classes["r"] != classes["q"]
    services = [make_service("s", instances=3, cpu=400, platform={"architecture": "x86_64"})]
    fast = balance(None, [p, q, r], services)
    assert fast == balance(None, [p, q, r], services, exhaustive=True)
    assert {(pl.node_id, pl.runtime_id) for pl in fast.placements} == {
        ("p", "x2"),
        ("q", "y1"),
        ("r", "z8"),
    }


# ---------------------------------------------------------------- filters read what they declare

_POOLS = frozenset(
    {
        # what dynamic filters read besides their declarations: pools and the rules on them
        "cpu_from",
        "ram_from",
        "slot_pool",
        "fits",
        "storage_pool",
        "state_pool",
        "shared_partition",
        "free_slots",
        "resources",
        "pools",
    }
)


class _Reads:
    """A read-only view of ``obj`` that records the attribute paths read through it: a path
    ends at a value that is not a node state, runtime state or document."""

    def __init__(self, obj: Any, prefix: str, log: set[str]) -> None:
        self._obj, self._prefix, self._log = obj, prefix, log

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._obj, name)
        path = self._prefix + name
        if isinstance(value, (BaseModel, NodeSlot, RuntimeSlot)):
            return _Reads(value, path + ".", self._log)
        self._log.add(path)
        return value


def _reads_of_check(
    f: Any, slot: NodeSlot, ask: Ask, runtime: RuntimeSlot | None
) -> tuple[set[str], set[str], set[str]]:
    node_log: set[str] = set()
    ask_log: set[str] = set()
    rt_log: set[str] = set()
    node_view: Any = _Reads(slot, "", node_log)
    ask_view: Any = _Reads(ask, "", ask_log)
    if runtime is None:
        f.check(node_view, ask_view)
    else:
        f.check(node_view, _Reads(runtime, "", rt_log), ask_view)
    # a runtime's document is RuntimeSlot.runtime; its pools are the RuntimeSlot's own
    rt_reads = {p.removeprefix("runtime.") for p in rt_log}
    return node_log, rt_reads, ask_log


# ---------------------------------------------------------------- random node states and asks

Mi = 1024**2


@st.composite
def node_docs(draw: DrawFn) -> Node:
    runtimes = []
    for rid in draw(
        st.lists(st.sampled_from(("r1", "r2", "r3")), min_size=1, max_size=3, unique=True)
    ):
        rt = runtime(
            rid,
            draw(st.sampled_from(("runc", "crun"))),
            arch=draw(st.sampled_from(("x86_64", "arm64"))),
            max_instances=draw(st.integers(0, 2)),
        )
        if draw(st.booleans()):
            rt["allowedDMIPS"] = draw(st.integers(0, 400))
        if draw(st.booleans()):
            rt["allowedRAM"] = draw(st.integers(0, 4)) * 128 * Mi
        runtimes.append(rt)
    size = st.integers(0, 8).map(lambda n: n * 128 * Mi)
    layout = draw(st.sampled_from(("none", "both", "storages", "states", "separate")))
    partitions: list[dict[str, Any]] = []
    if layout == "both":
        partitions.append({"name": "p", "types": ["storages", "states"], "totalSize": draw(size)})
    if layout in ("storages", "separate"):
        partitions.append({"name": "ps", "types": ["storages"], "totalSize": draw(size)})
    if layout in ("states", "separate"):
        partitions.append({"name": "pt", "types": ["states"], "totalSize": draw(size)})
    resources = [
        {"name": name, "sharedCount": draw(st.integers(0, 2))}
        for name in draw(st.lists(st.sampled_from(("can0", "usb")), unique=True))
    ]
    pools: list[dict[str, Any]] = []
    if draw(st.booleans()):
        pools.append(
            {
                "resource": "gpu",
                "policy": "exclusive",
                "devices": [
                    {"id": f"d{i}", "healthy": draw(st.booleans())}
                    for i in range(draw(st.integers(0, 3)))
                ],
            }
        )
    if draw(st.booleans()):
        pools.append(
            {
                "resource": "vgpu",
                "policy": "fractional",
                "devices": [
                    {"id": f"v{i}", "healthy": draw(st.booleans()), "memory": 2 * 1024 * Mi}
                    for i in range(draw(st.integers(1, 2)))
                ],
            }
        )
    dmips, ram = draw(st.integers(0, 1000)), draw(st.integers(0, 8)) * 128 * Mi
    doc = {"maxDMIPS": dmips, "totalRAM": ram, "partitions": partitions}
    return make_node(
        "n",
        dmips=dmips,
        ram=ram,
        inventories=inventories(draw, doc) if draw(st.booleans()) else None,
        runtimes=runtimes,
        partitions=partitions,
        resources=resources,
        device_pools=pools,
        connected=draw(st.booleans()),
        state=draw(st.sampled_from(("provisioned", "paused"))),
    )


platforms = st.fixed_dictionaries(
    {"architecture": st.sampled_from(("x86_64", "arm64"))},
    optional={
        "os": st.sampled_from(("linux", "windows")),
        "variant": st.just("v8"),
        "osVersion": st.just("1"),
        "osFeatures": st.lists(st.just("f1"), max_size=1),
    },
)


@st.composite
def services(draw: DrawFn, item: str) -> Service:
    amount = st.none() | st.integers(0, 6)
    cpu, ram, storage, state = (draw(amount) for _ in range(4))
    devices: list[dict[str, Any]] = []
    if draw(st.booleans()):
        devices.append({"resource": "gpu", "count": draw(st.integers(1, 2))})
    if draw(st.booleans()):
        devices.append({"resource": "vgpu", "memory": draw(st.integers(1, 3)) * 512 * Mi})
    return make_service(
        item,
        cpu=None if cpu is None else cpu * 100,
        ram=None if ram is None else ram * 128 * Mi,
        storage=None if storage is None else storage * 128 * Mi,
        state=None if state is None else state * 128 * Mi,
        runtimes=draw(st.sampled_from((["runc"], ["crun"], ["crun", "runc"]))),
        platform=draw(st.none() | platforms),
        labels=draw(st.sampled_from(((), ("l1",)))),
        node_id=draw(st.sampled_from((None, "n", "other"))),
        resources=draw(st.lists(st.sampled_from(("can0", "usb", "none")), unique=True)),
        devices=devices,
    )


@st.composite
def states(draw: DrawFn) -> tuple[NodeSlot, Ask]:
    """A node state with some of its capacity already reserved, and an ask."""
    slot = make_slot(None, draw(node_docs()), _NONE)
    for k in range(draw(st.integers(0, 4))):  # earlier reservations, where they fit
        earlier = _ask(draw(services(f"e{k}")))
        index = draw(st.integers(0, len(slot.runtimes) - 1))
        with contextlib.suppress(InventoryError, ValueError, KeyError):
            take(slot, index, earlier.requested(slot), earlier.resources, earlier.devices, NO_KEEP)
    ask = _ask(draw(services("s")))
    if draw(st.booleans()):
        ask.keep_runtime = draw(st.sampled_from(("r1", "r2", "r3")))
    return slot, ask


def _ask(service: Service) -> Ask:
    return ask_for(expand_instances([service])[0], None)


def _dynamic_verdicts(slot: NodeSlot, ask: Ask) -> list[bool]:
    """Per runtime, whether every dynamic filter unit passes (node-level ones included)."""
    node_ok = all(f.check(slot, ask) is None for f in filters.NODE_FILTERS if not f.static)
    return [
        node_ok
        and all(f.check(slot, rt, ask) is None for f in filters.RUNTIME_FILTERS if not f.static)
        for rt in slot.runtimes
    ]


@SETTINGS
@given(case=states())
def test_every_filter_reads_only_what_it_declares(case: tuple[NodeSlot, Ask]) -> None:
    """What a filter reads of the node, its runtimes and the ask is among its declarations
    (dynamic filters also read pools, and the ask's requested amounts, which are made of its
    ``amounts`` and ``usage`` and the node's ``request_key``). A read left out of a
    declaration would be left out of the class key or the service shape."""
    slot, ask = case
    for nf in filters.NODE_FILTERS:
        node, _, asked = _reads_of_check(nf, slot, ask, None)
        extra = set() if nf.static else _POOLS
        assert node <= set(nf.reads_node) | extra, nf.name
        assert asked <= set(nf.reads_ask), nf.name
    for rf in filters.RUNTIME_FILTERS:
        for rt in slot.runtimes:
            node, of_runtime, asked = _reads_of_check(rf, slot, ask, rt)
            extra = set() if rf.static else _POOLS
            assert node <= set(rf.reads_node) | extra, rf.name
            assert of_runtime <= set(rf.reads_runtime) | extra, rf.name
            if "requested" in asked:  # Ask.requested reads these (and slot.request_key)
                assert {"amounts", "usage"} <= set(rf.reads_ask), rf.name
                asked.discard("requested")
            assert asked <= set(rf.reads_ask), rf.name


@SETTINGS
@given(case=states())
def test_claim_and_take_agree_with_the_filter_units(case: tuple[NodeSlot, Ask]) -> None:
    """``claim`` takes the first runtime (of those given) on which every dynamic filter unit
    passes, and nothing when there is none; ``take`` on a runtime succeeds exactly where they
    all pass, and both take the same."""
    slot, ask = case
    req = ask.requested(slot)
    verdicts = _dynamic_verdicts(slot, ask)
    everywhere = tuple(range(len(slot.runtimes)))
    trial = slot.clone()
    at, ids = claim(trial, req, everywhere, ask.resources, ask.devices, NO_KEEP)
    assert at == next((i for i, ok in enumerate(verdicts) if ok), -1)
    if at < 0:  # nothing changed
        assert _free(trial) == _free(slot)
    for i, ok in enumerate(verdicts):
        one = slot.clone()
        got, _ = claim(one, req, (i,), ask.resources, ask.devices, NO_KEEP)
        assert (got == i) == ok
        other = slot.clone()
        try:
            given = take(other, i, req, ask.resources, ask.devices, NO_KEEP)
        except (InventoryError, ValueError, KeyError):
            assert not ok
            assert _free(other) == _free(slot)
        else:
            assert ok
            assert _free(other) == _free(one)
            if i == at:
                assert given == ids


def _free(slot: NodeSlot) -> tuple[object, ...]:
    return (
        slot.cpu_pool.free,
        slot.ram_pool.free,
        tuple((rt.cpu_from.free, rt.ram_from.free, rt.slots) for rt in slot.runtimes),
        tuple(sorted((k, p.free) for k, p in slot.partition_pools.items())),
        tuple(sorted(slot.resources.items())),
        tuple(sorted(slot.pools.items())),
    )


@SETTINGS
@given(case=states(), cpu=st.integers(0, 1200), ram=st.integers(0, 10), slots=st.integers(0, 1))
def test_each_filter_asks_its_own_part_of_the_runtime_rule(
    case: tuple[NodeSlot, Ask], cpu: int, ram: int, slots: int
) -> None:
    """``RuntimeSlot.fits`` with all three amounts is the three filters' parts together (an
    amount of 0 always fits)."""
    slot, _ = case
    for rt in slot.runtimes:
        parts = rt.fits(cpu, 0, 0), rt.fits(0, ram * 128 * Mi, 0), rt.fits(0, 0, slots)
        assert rt.fits(cpu, ram * 128 * Mi, slots) == all(parts)
        assert rt.fits(0, 0, 0)


# ---------------------------------------------------------------- what holds whatever is reserved


@SETTINGS
@given(case=states())
def test_an_idle_filter_passes_whatever_is_reserved(case: tuple[NodeSlot, Ask]) -> None:
    """A dynamic filter that says it is idle for an ask passes it on any node state; the
    named-resource and device filters say so exactly when nothing of theirs is asked."""
    slot, ask = case
    for nf in filters.NODE_FILTERS:
        if isinstance(nf, filters.Idle) and nf.idle(ask):
            assert not nf.static, nf.name
            assert nf.check(slot, ask) is None, nf.name
    by_name = {f.name: f for f in filters.NODE_FILTERS}
    resources, devices = by_name["Resources"], by_name["Devices"]
    assert isinstance(resources, filters.Idle) and isinstance(devices, filters.Idle)
    assert resources.idle(ask) == (not ask.resources)
    assert devices.idle(ask) == (not ask.devices)


@SETTINGS
@given(case=states())
def test_a_bounded_filter_fails_past_its_room_and_passes_needing_nothing(
    case: tuple[NodeSlot, Ask],
) -> None:
    """A runtime filter's declared bound holds on any node state: needing more than its room
    it fails, needing nothing it passes; its room is the node's with nothing reserved (so no
    release can make more room), and its need reads of the node only what the class key
    holds (the request key), so it is the same on every node of a class."""
    slot, ask = case
    empty = make_slot(None, slot.node, _NONE)
    bounded = [rf for rf in filters.RUNTIME_FILTERS if isinstance(rf, filters.Bounded)]
    assert {rf.name for rf in bounded} == {"Cpu", "Ram", "Storage", "State"}
    for rf in bounded:
        assert isinstance(rf, filters.Bounded)
        assert not rf.static
        log: set[str] = set()
        view: Any = _Reads(slot, "", log)
        need = rf.need(view, ask)
        assert log <= {"request_key"}, rf.name
        for rt, empty_rt in zip(slot.runtimes, empty.runtimes, strict=True):
            room = rf.room(slot, rt)
            assert room == rf.room(empty, empty_rt), rf.name
            if need > room:
                assert rf.check(slot, rt, ask) is not None, rf.name
                assert rf.check(empty, empty_rt, ask) is not None, rf.name
            if need == 0:
                assert rf.check(slot, rt, ask) is None, rf.name


_BOUNDED = {"cpu": "Cpu", "ram": "Ram", "storage": "Storage", "state": "State"}


_AMOUNTS = ("as drawn", "zero", "one", "about a room", "more than any")


@st.composite
def classes(draw: DrawFn) -> list[NodeSlot]:
    """Two to four nodes of one class (one class key: they differ only in their pools, that
    is their capacities, partition sizes, named resources, device pools' devices, runtimes'
    own pools and instance slots), each with some capacity already reserved."""
    shape = draw(node_docs())
    if draw(st.sampled_from((True, True, True, False))):  # mostly one the static filters pass
        shape = shape.model_copy(update={"connected": True, "state": "provisioned"})
    nodes = [shape.model_copy(update={"id": "n0"})]
    for k in range(1, draw(st.integers(2, 4))):
        other = draw(node_docs())
        n = len(shape.runtimes)
        runtimes = [
            rt.model_copy(
                update={
                    "allowedDMIPS": mine.allowedDMIPS,
                    "allowedRAM": mine.allowedRAM,
                    "maxInstances": mine.maxInstances,
                }
            )
            for rt, mine in zip(shape.runtimes, _cycle(other.runtimes, n), strict=True)
        ]
        partitions = [
            p.model_copy(update={"totalSize": draw(st.integers(0, 8)) * 128 * Mi})
            for p in shape.partitions
        ]
        update = {
            "id": f"n{k}",
            "maxDMIPS": other.maxDMIPS,
            "totalRAM": other.totalRAM,
            "runtimes": tuple(runtimes),
            "partitions": tuple(partitions),
            "resources": other.resources,
            # (the pools' resources and policies are part of the key: the other's devices
            # where they match, else the shape's pools)
            "devicePools": other.devicePools
            if other.device_kinds == shape.device_kinds
            else shape.devicePools,
        }
        try:
            node = Node.model_validate(shape.model_copy(update=update).model_dump())
        except ValidationError:  # its inventories reserve more than these totals: the shape's
            del update["maxDMIPS"], update["totalRAM"], update["partitions"]
            node = Node.model_validate(shape.model_copy(update=update).model_dump())
        nodes.append(node)
    run = Run(None, nodes, {}, search=ClassIndex)
    assert isinstance(run.search, ClassIndex)
    assert len(run.search.members) == 1  # (the premise: one class)
    slots = [run.slot(node.id) for node in nodes]
    for k, slot in enumerate(slots):
        for j in range(draw(st.integers(0, 4))):
            at = draw(st.integers(0, len(slot.runtimes) - 1))
            if draw(st.booleans()):
                earlier = _ask(draw(services(f"e{k}-{j}")))
            else:  # one that takes all that is left of an amount (a full pool)
                rt = slot.runtimes[at]
                amount = draw(st.sampled_from(sorted(_BOUNDED)))
                pools: dict[str, Pool | None] = {"cpu": rt.cpu_from, "ram": rt.ram_from}
                pools |= {"storage": slot.storage_pool, "state": slot.state_pool}
                pool = pools[amount]
                if pool is None:
                    continue
                amounts: dict[str, Any] = {amount: pool.free}
                earlier = _ask(make_service(f"e{k}-{j}", **amounts))
            with contextlib.suppress(InventoryError, ValueError, KeyError):
                take(slot, at, earlier.requested(slot), earlier.resources, earlier.devices, NO_KEEP)
    return slots


def _cycle(items: Any, n: int) -> list[Any]:
    return [items[i % len(items)] for i in range(n)]


@SETTINGS
@given(slots=classes(), data=st.data())
def test_the_bound_of_a_class_is_the_pipelines_on_each_of_its_nodes(
    slots: list[NodeSlot], data: st.DataObject
) -> None:
    """Where ``dynamic_bound`` answers for a class (from its representative, its static
    runtime verdict and the largest rooms of its nodes), each node's charge through it
    (``bounded_drop``) is the whole pipeline's on that node's own state. The asks drawn often
    need more than any node could ever give, or just about one node's room (one less, equal,
    one more), with and without named resources and devices."""
    service = data.draw(services("s"))
    if data.draw(st.sampled_from((True, True, True, False))):  # mostly one passing the
        anywhere = {"labels": (), "nodeId": None, "runtimes": ("crun", "runc")}  # static filters
        image = service.image.model_copy(update={"platform": None})
        service = service.model_copy(update={**anywhere, "image": image})
    n = len(slots[0].runtimes)
    rooms = {k: most_room(slots, k, n) for k in range(len(filters.RUNTIME_FILTERS))}
    asked: dict[str, int] = {}
    for amount, code in _BOUNDED.items():  # each amount on its own: filters pass or drop on
        which = data.draw(st.sampled_from(_AMOUNTS))  # their own, in any combination
        k = next(k for k, f in enumerate(filters.RUNTIME_FILTERS) if f.name == code)
        most = rooms[k]  # per runtime, the largest room of any node of the class
        if which == "more than any":
            asked[amount] = max(most, default=0) + 10**9
        elif which == "about a room" and most:
            room = data.draw(st.sampled_from((max(most), *most)))
            near = room + data.draw(st.sampled_from((-1, 0, 1)))
            asked[amount] = max(0, near)
        elif which in ("zero", "one"):
            asked[amount] = int(which == "one")
    if asked:
        requested = service.requestedResources.model_copy(update=asked)
        service = service.model_copy(update={"requestedResources": requested})
    ask = _ask(service)
    rep = slots[0]
    if static_drop(rep, ask) is not None:
        return
    static = static_runtime_verdict(rep, ask)
    for slot in slots:  # (the premise: one class answers the static filters alike)
        assert static_drop(slot, ask) is None
        assert static_runtime_verdict(slot, ask) == static
    bound = dynamic_bound(rep, ask, static, lambda k, i: rooms[k][i])
    if asked.get("cpu", 0) > 10**9:  # the first dynamic runtime filter: every node drops it
        assert bound is not None  # whatever is reserved (or no runtime is left to ask)
    if bound is None:
        return
    for slot in slots:
        assert bounded_drop(slot, ask, bound) == evaluate(slot, ask).dropped_by, slot.id


@st.composite
def held(draw: DrawFn) -> tuple[NodeSlot, list[Reservation]]:
    """A node state holding the reservations of a few instances (those that fit, on the
    runtime drawn), with named resources and devices."""
    slot = make_slot(None, draw(node_docs()), _NONE)
    made: list[Reservation] = []
    for k in range(draw(st.integers(1, 6))):
        service = draw(services(f"h{k}"))
        if draw(st.booleans()):  # devices (and named resources the node has) only: more fit
            have = [r.name for r in slot.node.host_resources]
            wanted = draw(st.lists(st.sampled_from(have), unique=True)) if have else []
            none = dict.fromkeys(_BOUNDED, 0)
            update = {"requestedResources": service.requestedResources.model_copy(update=none)}
            service = make_service(f"h{k}", resources=wanted, devices=[]).model_copy(
                update={**update, "devices": service.devices}
            )
        ask = _ask(service)
        at = draw(st.integers(0, len(slot.runtimes) - 1))
        req = ask.requested(slot)
        try:
            ids = take(slot, at, req, ask.resources, ask.devices, NO_KEEP)
        except (InventoryError, ValueError, KeyError):
            continue
        names = tuple([r.resource for r in ask.resources])
        res = Reservation(ask.instance, at, req, names, ids, ask.devices)
        slot.placed[ask.instance.id] = res
        made.append(res)
    return slot, made


@SETTINGS
@given(case=held(), data=st.data())
def test_a_reservation_held_again_gives_the_state_it_had(
    case: tuple[NodeSlot, list[Reservation]], data: st.DataObject
) -> None:
    """Releasing some reservations and holding one of them again (``restore_reservation``,
    what pass 3's reprieve does) leaves the node as releasing only the others does: the same
    free amounts, named-resource slots and device pools, and the same reservations held; and
    releasing it once more, as releasing them all does."""
    slot, made = case
    if not made:
        return
    victims = data.draw(st.lists(st.sampled_from(made), min_size=1, unique_by=id))
    back = data.draw(st.sampled_from(victims))
    again = slot.clone()
    for v in victims:
        release_reservation(again, v.instance.id)
    restore_reservation(again, back)
    others = slot.clone()
    for v in victims:
        if v is not back:
            release_reservation(others, v.instance.id)
    assert _free(again) == _free(others)
    assert again.placed == others.placed
    release_reservation(again, back.instance.id)
    every = slot.clone()
    for v in victims:
        release_reservation(every, v.instance.id)
    assert _free(again) == _free(every)
    assert again.placed == every.placed


@SETTINGS
@given(node=node_docs(), overloaded=st.sampled_from((_NONE, frozenset({"cpu"}))))
def test_runtime_capacities_are_the_empty_states(node: Node, overloaded: frozenset[str]) -> None:
    """What the bound of pass 2 and 3 (an ask too big for every empty node) reads of a node
    without building its state is what its state holds with nothing reserved: each runtime's
    CPU and RAM capacity, and the request key."""
    basics = node_basics(None, node, overloaded)
    slot = make_slot(None, node, overloaded, basics)
    got = runtime_capacities(node, basics)
    assert got == [(rt.cpu_from.capacity, rt.ram_from.capacity) for rt in slot.runtimes]
    assert basics_request_key(basics, overloaded) == slot.request_key


@SETTINGS
@given(node=node_docs(), overloaded=st.sampled_from((_NONE, frozenset({"cpu"}))))
def test_empty_rooms_are_the_rooms_of_the_empty_state(
    node: Node, overloaded: frozenset[str]
) -> None:
    """Each bounded filter's rooms on a node nothing is reserved on, read from its document
    (``empty_rooms``), are the rooms its state with nothing reserved declares, runtime by
    runtime in the state's order."""
    basics = node_basics(None, node, overloaded)
    slot = make_slot(None, node, overloaded, basics)
    for rf in filters.RUNTIME_FILTERS:
        if isinstance(rf, filters.Bounded):
            want = [rf.room(slot, rt) for rt in slot.runtimes]
            assert list(rf.empty_rooms(node, basics)) == want, rf.name


@SETTINGS
@given(slots=classes(), data=st.data())
def test_the_largest_rooms_count_the_nodes_not_built(
    slots: list[NodeSlot], data: st.DataObject
) -> None:
    """``most_room`` over a class whose nodes are partly given as documents (nodes nothing is
    reserved on, whose states a run did not build) is its answer over all their states."""
    fresh = [make_slot(None, slot.node, _NONE) for slot in slots]
    untouched = data.draw(st.sets(st.sampled_from(range(len(slots)))))
    built = [s for i, s in enumerate(fresh) if i not in untouched]
    empty = [(fresh[i].node, node_basics(None, fresh[i].node, _NONE)) for i in untouched]
    n = len(slots[0].runtimes)
    for k in range(len(filters.RUNTIME_FILTERS)):
        assert most_room(built, k, n, empty) == most_room(fresh, k, n), k


def _alike_unreserved(data: st.DataObject, node: Node) -> Node:
    """Another node (drawn) with ``node``'s named resources and device pools as far as the
    filters' ``unreserved_key`` reads them: everything else of them is changed (the groups,
    environment and devices of each resource; each device's host devices and annotations)."""
    other = data.draw(node_docs())
    resources = None
    if node.resources is not None:
        resources = tuple(
            [
                r.model_copy(update={"groups": ("g",), "envs": ("X=1",), "devices": ("/dev/x",)})
                for r in node.resources
            ]
        )
    pools = tuple(
        [
            p.model_copy(
                update={
                    "devices": tuple(
                        [
                            d.model_copy(update={"devices": ("/dev/y",), "annotations": {"a": "b"}})
                            for d in p.devices
                        ]
                    )
                }
            )
            for p in node.devicePools
        ]
    )
    update = {"id": "m", "resources": resources, "devicePools": pools}
    return Node.model_validate(other.model_copy(update=update).model_dump())


@SETTINGS
@given(node=node_docs(), data=st.data())
def test_an_unreserved_key_gives_the_answer_on_every_node_with_nothing_reserved(
    node: Node, data: st.DataObject
) -> None:
    """Two nodes with equal ``unreserved_key`` of a dynamic node filter (here, alike in their
    named resources and device pools, different in all else) get the same answer from it
    with nothing reserved, for any ask; and nodes whose named resources or device pools
    differ in what the filters read have different keys."""
    alike = _alike_unreserved(data, node)
    ask = _ask(data.draw(services("s")))
    one, two = make_slot(None, node, _NONE), make_slot(None, alike, _NONE)
    keyed = [nf for nf in filters.NODE_FILTERS if isinstance(nf, filters.Unreserved)]
    assert {nf.name for nf in keyed} == {"Resources", "Devices"}
    for nf in keyed:
        assert isinstance(nf, filters.Unreserved)
        assert not nf.static
        assert nf.unreserved_key(node) == nf.unreserved_key(alike), nf.name
        assert nf.check(one, ask) == nf.check(two, ask), nf.name
    other = data.draw(node_docs())
    resources, devices = keyed
    if {(r.name, r.sharedCount) for r in other.host_resources} != {
        (r.name, r.sharedCount) for r in node.host_resources
    }:
        assert resources.unreserved_key(other) != resources.unreserved_key(node)
    if other.devicePools != node.devicePools:
        assert devices.unreserved_key(other) != devices.unreserved_key(node)


def test_an_unplaceable_ask_is_charged_without_building_the_untouched_nodes() -> None:
    """A service asking more CPU than any node has and a named resource: each node is charged
    ``Resources`` where it lacks the resource (or its only slot is taken) and ``Cpu``
    elsewhere, as the exhaustive pipeline charges, and the index builds the state of no node
    it had not touched (it asks each named-resource layout once, on a state it does not
    keep)."""
    nodes = []
    for i in range(60):
        layout = i % 3  # no resource, can0 shared by 1, can0 unlimited
        resources = [] if layout == 0 else [{"name": "can0", "sharedCount": 2 - layout}]
        nodes.append(make_node(f"n{i:02d}", dmips=1000, resources=resources))
    holder = make_service("holder", cpu=10, resources=["can0"], node_id="n01")
    greedy = make_service("greedy", cpu=5000, resources=["can0"])
    run = Run(None, nodes, {}, search=ClassIndex)
    index = run.search
    assert isinstance(index, ClassIndex)
    assert len(index.members) == 1  # (one class: named resources are no part of the key)
    held = _ask(holder)
    run.reserve(run.slot("n01"), held, 0)  # n01's only can0 slot is taken
    built = set(run.slots)  # n01, and the class's representative
    assert len(built) <= 2
    counts = dict(index.charges(_ask(greedy)))
    # by hand: 20 nodes without can0, and n01 whose slot is held; the 39 others have room
    assert counts == {"Resources": 21, "Cpu": 39}
    assert set(run.slots) == built
    exhaustive = Run(None, nodes, {})
    exhaustive.reserve(exhaustive.slot("n01"), _ask(holder), 0)
    assert Counter(all_charges(exhaustive.all_slots(), _ask(greedy))) == counts
    # a node charged by its key, then reserved on: charged again on its own state
    other = make_service("other", cpu=10, resources=["can0"], node_id="n04")
    run.reserve(run.slot("n04"), _ask(other), 0)  # n04 (can0 shared by 1) is now full too
    again = dict(index.charges(_ask(greedy)))
    assert again == {"Resources": 22, "Cpu": 38}
    exhaustive.reserve(exhaustive.slot("n04"), _ask(other), 0)
    assert Counter(all_charges(exhaustive.all_slots(), _ask(greedy))) == again
