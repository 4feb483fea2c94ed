"""The placement filters of SPEC §7.4, each a small unit with a stable name.

A filter answers one question about one candidate and returns ``None`` when it passes or a short
human reason when it does not. Filters never record anything: the pipeline in
:mod:`reconciler.placement.balancer` charges a dropped node to the filter that dropped it and counts
the charges per reason code (Nomad's ``scheduler/feasible``, the Kubernetes scheduler's "0/N nodes
are available").

Node-level filters see the node; runtime-level filters see one (node, runtime) pair, and a node
survives when at least one of its runtimes survives every runtime-level filter.

Each filter declares what it reads, as attribute paths:

- ``reads_node``: of the node's state (:class:`~reconciler.placement.nodestate.NodeSlot`, whose
  description :class:`~reconciler.placement.nodestate.NodeFacts` gives under the same names),
  besides its pools (CPU, RAM, partitions, instance slots, named resources, device pools);
- ``reads_runtime`` (runtime-level filters): of the runtime's ``Runtime`` document, besides its
  pools;
- ``reads_ask``: of the :class:`~reconciler.placement.balancer.Ask`.

A filter marked ``static`` reads nothing else: never what is reserved. The balancer derives its
caches from these declarations (:func:`node_reads`, :func:`runtime_reads`, :func:`ask_reads`):
nodes whose reads are equal form one class, whose static answers are computed once per class,
and services whose reads are equal share one group. A filter that reads something it does not
declare makes the fast path wrong; the tests check every filter's reads against its
declaration. ``id`` (:data:`IDENTITY`), of a node or a runtime, is read only when the ask names
one (``node_id``, ``keep_runtime``): the balancer serves those asks node by node, so ids are no
part of a class, only the order of a node's runtimes (by type, then id).

Dynamic filters call the integer rules of :mod:`reconciler.placement.nodestate`, the same ones
its ``claim`` and ``take`` call, and only add the reason.

A dynamic filter may also declare what it answers whatever is reserved (the failure summaries
of an unplaceable ask are then counted per class, not node by node; see
:func:`~reconciler.placement.pipeline.dynamic_bound`):

- ``idle(ask)`` (:class:`Idle`): True when the filter passes on every node whatever is
  reserved, for this ask (it asks nothing of what reservations change);
- ``need(slot, ask)`` and ``room(slot, runtime)`` (:class:`Bounded`, runtime-level filters):
  the filter compares an amount the ask needs (read from what it declares, so equal on the
  nodes of a class) with a pool that reservations only shrink, whose capacity is ``room``: it
  fails whatever is reserved when ``need > room``, and passes whatever is reserved when
  ``need`` is 0; ``empty_rooms(node, basics)`` gives ``room`` for each runtime of a node
  nothing is reserved on from its document, without building its state.

A dynamic node filter may also declare what its answer on a node nothing is reserved on reads
of the node's document (:class:`Unreserved`: ``unreserved_key(node)``): nodes with equal keys
get the same answer there for every ask, so an unplaceable ask's charges on the nodes the run
never touched are computed once per key, not node by node.

The tests check these declarations against ``check`` on random node states.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import TYPE_CHECKING, ClassVar, Protocol, runtime_checkable

from reconciler.model.human import human_bytes, plain_list
from reconciler.placement.nodestate import (
    device_pool,
    device_pool_key,
    partition_capacity,
    runtime_capacities,
    state_fits,
    state_need,
    storage_fits,
    units_reason,
)
from reconciler.placement.sharing import REGISTRY, Status, StatusCode
from reconciler.placement.sharing.base import SUCCESS

if TYPE_CHECKING:
    from reconciler.model.documents import Node
    from reconciler.placement.ask import Ask
    from reconciler.placement.nodestate import Basics, NodeSlot, RuntimeSlot

__all__ = [
    "FILTER_CODES",
    "IDENTITY",
    "NODE_FILTERS",
    "NO_NODES",
    "RUNTIME_FILTERS",
    "Bounded",
    "Idle",
    "NodeFilter",
    "RuntimeFilter",
    "Unreserved",
    "ask_reads",
    "node_reads",
    "runtime_reads",
]

NO_NODES = "NoNodes"
"""The reason code of an instance that fails because the unit has no nodes at all."""


IDENTITY = "id"
"""The id of a node or a runtime: read only for an ask that names one, never part of a class."""


class NodeFilter(Protocol):
    name: ClassVar[str]
    static: ClassVar[bool]  # depends only on the node's description, never on reservations
    reads_node: ClassVar[tuple[str, ...]]  # attribute paths of NodeSlot (and NodeFacts)
    reads_ask: ClassVar[tuple[str, ...]]  # attribute names of Ask

    def check(self, slot: NodeSlot, ask: Ask) -> str | None: ...


class RuntimeFilter(Protocol):
    name: ClassVar[str]
    static: ClassVar[bool]
    reads_node: ClassVar[tuple[str, ...]]
    reads_runtime: ClassVar[tuple[str, ...]]  # attribute paths of the Runtime document
    reads_ask: ClassVar[tuple[str, ...]]

    def check(self, slot: NodeSlot, runtime: RuntimeSlot, ask: Ask) -> str | None: ...


@runtime_checkable
class Idle(Protocol):
    """A dynamic filter that says when it passes whatever is reserved (see the module
    docstring)."""

    def idle(self, ask: Ask) -> bool: ...


@runtime_checkable
class Bounded(Protocol):
    """A dynamic runtime-level filter that compares one amount with one pool (see the module
    docstring): it fails whatever is reserved when ``need > room``, passes whatever is
    reserved when ``need`` is 0."""

    def need(self, slot: NodeSlot, ask: Ask) -> int: ...

    def room(self, slot: NodeSlot, runtime: RuntimeSlot) -> int: ...

    def empty_rooms(self, node: Node, basics: Basics) -> Sequence[int]:
        """``room`` of each runtime (in the state's order) of ``node`` with nothing reserved
        (``basics``: its :func:`~reconciler.placement.nodestate.node_basics`)."""
        ...


@runtime_checkable
class Unreserved(Protocol):
    """A dynamic node filter that says what its answer on a node nothing is reserved on reads
    of the node's document (see the module docstring)."""

    def unreserved_key(self, node: Node) -> Hashable:
        """Equal on two nodes whose states with nothing reserved this filter answers alike
        for every ask."""
        ...


@dataclass(frozen=True)
class NodeStateFilter:
    """The node is connected and provisioned."""

    name: ClassVar[str] = "NodeState"
    static: ClassVar[bool] = True
    reads_node: ClassVar[tuple[str, ...]] = ("node.connected", "node.no_report", "node.state")
    reads_ask: ClassVar[tuple[str, ...]] = ()

    def check(self, slot: NodeSlot, ask: Ask) -> str | None:
        node = slot.node
        if not node.connected:
            return node.no_report or "disconnected"
        if node.state != "provisioned":
            return f"state {node.state}"
        return None


@dataclass(frozen=True)
class NodeIdFilter:
    """The service names a node (``nodeId``) and this is not it."""

    name: ClassVar[str] = "NodeId"
    static: ClassVar[bool] = True
    reads_node: ClassVar[tuple[str, ...]] = ("id",)
    reads_ask: ClassVar[tuple[str, ...]] = ("node_id",)

    def check(self, slot: NodeSlot, ask: Ask) -> str | None:
        if ask.node_id is not None and ask.node_id != slot.id:
            return f"service wants node {ask.node_id}"
        return None


@dataclass(frozen=True)
class LabelsFilter:
    """Every label the service requires is among the node's labels (from unit.yaml)."""

    name: ClassVar[str] = "Labels"
    static: ClassVar[bool] = True
    reads_node: ClassVar[tuple[str, ...]] = ("labels",)
    reads_ask: ClassVar[tuple[str, ...]] = ("labels",)

    def check(self, slot: NodeSlot, ask: Ask) -> str | None:
        missing = ask.labels - slot.labels
        return f"missing labels {plain_list(sorted(missing))}" if missing else None


@dataclass(frozen=True)
class ResourcesFilter:
    """Every named host resource exists on the node with a free shared slot."""

    name: ClassVar[str] = "Resources"
    static: ClassVar[bool] = False
    reads_node: ClassVar[tuple[str, ...]] = ()
    reads_ask: ClassVar[tuple[str, ...]] = ("resources",)

    def check(self, slot: NodeSlot, ask: Ask) -> str | None:
        status = self.verdict(slot, ask)
        return None if status.ok else status.reason

    def idle(self, ask: Ask) -> bool:
        """No named resource asked: nothing to refuse."""
        return not ask.resources

    def unreserved_key(self, node: Node) -> Hashable:
        """With nothing reserved, each named resource's pool is its shared count."""
        return tuple([(r.name, r.sharedCount) for r in node.host_resources])

    def verdict(self, slot: NodeSlot, ask: Ask) -> Status:
        """The shared-count policy's verdict on the first named resource that refuses
        (``UnschedulableAndUnresolvable`` for one the node lacks), else Success."""
        for req in ask.resources:
            if slot.free_slots((req,)) is None:
                state = slot.resources.get(req.resource)
                if state is None:
                    return Status(StatusCode.UNRESOLVABLE, f"no resource {req.resource}")
                return REGISTRY["shared-count"].filter(state, req)
        return SUCCESS


@dataclass(frozen=True)
class DevicesFilter:
    """Every device request can be served by the node's pool of that resource."""

    name: ClassVar[str] = "Devices"
    static: ClassVar[bool] = False
    # which requests a pool serves at all (its resource and policy: ``has_request``): a node
    # without one for a request refuses it whatever is reserved, alike on its class's nodes
    reads_node: ClassVar[tuple[str, ...]] = ("node.device_kinds",)
    reads_ask: ClassVar[tuple[str, ...]] = ("devices", "keep_devices")

    def check(self, slot: NodeSlot, ask: Ask) -> str | None:
        status, pooled = self._first_failure(slot, ask)
        if status.ok:
            return None
        return f"{status.code}: {status.reason}" if pooled else status.reason

    def idle(self, ask: Ask) -> bool:
        """No device asked: nothing to refuse."""
        return not ask.devices

    def unreserved_key(self, node: Node) -> Hashable:
        """With nothing reserved, each pool is the state its key makes."""
        return tuple([device_pool_key(p) for p in node.devicePools])

    def verdict(self, slot: NodeSlot, ask: Ask) -> Status:
        """The policies' verdict on the first device request that fails (a request no pool of
        the node serves is ``UnschedulableAndUnresolvable``), else Success: its code says
        whether a preemption on this node could help (:attr:`Status.preemption_may_help`)."""
        return self._first_failure(slot, ask)[0]

    @staticmethod
    def _first_failure(slot: NodeSlot, ask: Ask) -> tuple[Status, bool]:
        """The verdict, and whether a pool gave it (else no pool serves the request)."""
        keep = dict(ask.keep_devices)
        for req in ask.devices:
            state = device_pool(slot.pools, req)
            if state is None:
                return Status(StatusCode.UNRESOLVABLE, f"no device pool {req.resource}"), False
            status = REGISTRY[state.policy].filter(state, req, keep.get(req.resource, ()))
            if not status.ok:
                return status, True
        return SUCCESS, True


@dataclass(frozen=True)
class RuntimeTypeFilter:
    """The runtime's type is one the service accepts."""

    name: ClassVar[str] = "RuntimeType"
    static: ClassVar[bool] = True
    reads_node: ClassVar[tuple[str, ...]] = ()
    reads_runtime: ClassVar[tuple[str, ...]] = ("id", "type")
    reads_ask: ClassVar[tuple[str, ...]] = ("keep_runtime", "runtimes")

    def check(self, slot: NodeSlot, runtime: RuntimeSlot, ask: Ask) -> str | None:
        if ask.keep_runtime is not None and runtime.runtime.id != ask.keep_runtime:
            return f"instance is kept on runtime {ask.keep_runtime}"
        if runtime.runtime.type not in ask.runtimes:
            return (
                f"type {runtime.runtime.type} not accepted "
                f"(the service accepts {plain_list(sorted(ask.runtimes))})"
            )
        return None


@dataclass(frozen=True)
class PlatformFilter:
    """Architecture equal; os, variant, osVersion compared only when the image sets them;
    every image osFeature present."""

    name: ClassVar[str] = "Platform"
    static: ClassVar[bool] = True
    reads_node: ClassVar[tuple[str, ...]] = ()
    reads_runtime: ClassVar[tuple[str, ...]] = (
        "platform.architecture",
        "platform.os",
        "platform.variant",
        "platform.osVersion",
        "platform.osFeatures",
    )
    reads_ask: ClassVar[tuple[str, ...]] = ("platform",)

    def check(self, slot: NodeSlot, runtime: RuntimeSlot, ask: Ask) -> str | None:
        want = ask.platform
        if want is None:
            return None
        have = runtime.runtime.platform
        if want.architecture != have.architecture:
            return f"architecture {have.architecture} is not {want.architecture}"
        for field in ("os", "variant", "osVersion"):
            wanted = getattr(want, field)
            if wanted is not None and wanted != getattr(have, field):
                return f"{field} {getattr(have, field)} is not {wanted}"
        missing = set(want.osFeatures) - set(have.osFeatures)
        return f"missing os features {plain_list(sorted(missing))}" if missing else None


@dataclass(frozen=True)
class CpuFilter:
    """The requested DMIPS respect the node's unit rules (``inventories.cpu``) and fit the free
    CPU of the runtime's pool (or the node's)."""

    name: ClassVar[str] = "Cpu"
    static: ClassVar[bool] = False
    reads_node: ClassVar[tuple[str, ...]] = ("request_key", "node.inventories.units")
    reads_runtime: ClassVar[tuple[str, ...]] = ()
    reads_ask: ClassVar[tuple[str, ...]] = ("amounts", "usage")

    def check(self, slot: NodeSlot, runtime: RuntimeSlot, ask: Ask) -> str | None:
        need = ask.requested(slot).cpu
        why = units_reason("cpu", slot.node.inventories.units[0], need)
        if why is not None:
            return f"needs {need} DMIPS: {why}"
        if runtime.fits(need, 0, 0):
            return None
        return f"needs {need} DMIPS, {runtime.cpu_from.free} free"

    def need(self, slot: NodeSlot, ask: Ask) -> int:
        return ask.requested(slot).cpu

    def room(self, slot: NodeSlot, runtime: RuntimeSlot) -> int:
        return runtime.cpu_from.capacity

    def empty_rooms(self, node: Node, basics: Basics) -> Sequence[int]:
        return [cpu for cpu, _ in runtime_capacities(node, basics)]


@dataclass(frozen=True)
class RamFilter:
    """The requested RAM respects the node's unit rules (``inventories.ram``) and fits the free
    RAM of the runtime's pool (or the node's)."""

    name: ClassVar[str] = "Ram"
    static: ClassVar[bool] = False
    reads_node: ClassVar[tuple[str, ...]] = ("request_key", "node.inventories.units")
    reads_runtime: ClassVar[tuple[str, ...]] = ()
    reads_ask: ClassVar[tuple[str, ...]] = ("amounts", "usage")

    def check(self, slot: NodeSlot, runtime: RuntimeSlot, ask: Ask) -> str | None:
        need = ask.requested(slot).ram
        why = units_reason("ram", slot.node.inventories.units[1], need)
        if why is not None:
            return f"needs {human_bytes(need)} of RAM: {why}"
        if runtime.fits(0, need, 0):
            return None
        return f"needs {human_bytes(need)} of RAM, {human_bytes(runtime.ram_from.free)} free"

    def need(self, slot: NodeSlot, ask: Ask) -> int:
        return ask.requested(slot).ram

    def room(self, slot: NodeSlot, runtime: RuntimeSlot) -> int:
        return runtime.ram_from.capacity

    def empty_rooms(self, node: Node, basics: Basics) -> Sequence[int]:
        return [ram for _, ram in runtime_capacities(node, basics)]


@dataclass(frozen=True)
class StorageFilter:
    """The requested storage respects the node's unit rules (``inventories.storage``) and fits
    the node's partition typed ``storages``."""

    name: ClassVar[str] = "Storage"
    static: ClassVar[bool] = False
    reads_node: ClassVar[tuple[str, ...]] = ("request_key", "node.inventories.units")
    reads_runtime: ClassVar[tuple[str, ...]] = ()
    reads_ask: ClassVar[tuple[str, ...]] = ("amounts", "usage")

    def check(self, slot: NodeSlot, runtime: RuntimeSlot, ask: Ask) -> str | None:
        need = ask.requested(slot).storage
        why = units_reason("storage", slot.node.inventories.units[2], need)
        if why is not None:
            return f"needs {human_bytes(need)}: {why}"
        if storage_fits(slot, need):
            return None
        pool = slot.storage_pool
        if pool is None:
            return "no partition typed storages"
        return f"needs {human_bytes(need)}, {human_bytes(pool.free)} free"

    def need(self, slot: NodeSlot, ask: Ask) -> int:
        return ask.requested(slot).storage

    def room(self, slot: NodeSlot, runtime: RuntimeSlot) -> int:
        pool = slot.storage_pool
        return 0 if pool is None else pool.capacity

    def empty_rooms(self, node: Node, basics: Basics) -> Sequence[int]:
        return [partition_capacity(node, "storages")] * len(node.runtimes)


@dataclass(frozen=True)
class StateFilter:
    """The requested state respects the node's unit rules (``inventories.state``) and fits the
    node's partition typed ``states``."""

    name: ClassVar[str] = "State"
    static: ClassVar[bool] = False
    reads_node: ClassVar[tuple[str, ...]] = ("request_key", "node.inventories.units")
    reads_runtime: ClassVar[tuple[str, ...]] = ()
    reads_ask: ClassVar[tuple[str, ...]] = ("amounts", "usage")

    def check(self, slot: NodeSlot, runtime: RuntimeSlot, ask: Ask) -> str | None:
        req = ask.requested(slot)
        why = units_reason("state", slot.node.inventories.units[3], req.state)
        if why is not None:
            return f"needs {human_bytes(req.state)} of state: {why}"
        if state_fits(slot, req.storage, req.state):
            return None
        pool = slot.state_pool
        if pool is None:
            return "no partition typed states"
        need = state_need(slot, req.storage, req.state)
        if need != req.state:  # one partition typed both: storage and state from one pool
            return (
                f"needs {human_bytes(need)} with storage ({human_bytes(req.state)} state), "
                f"{human_bytes(pool.free)} free"
            )
        return f"needs {human_bytes(need)}, {human_bytes(pool.free)} free"

    def need(self, slot: NodeSlot, ask: Ask) -> int:
        """The state asked (with one partition typed both, the storage asked is taken from the
        same pool too: this is the least that pool must give)."""
        return ask.requested(slot).state

    def room(self, slot: NodeSlot, runtime: RuntimeSlot) -> int:
        pool = slot.state_pool
        return 0 if pool is None else pool.capacity

    def empty_rooms(self, node: Node, basics: Basics) -> Sequence[int]:
        return [partition_capacity(node, "states")] * len(node.runtimes)


@dataclass(frozen=True)
class MaxInstancesFilter:
    """The runtime has a free instance slot (maxInstances 0 = unlimited)."""

    name: ClassVar[str] = "MaxInstances"
    static: ClassVar[bool] = False
    reads_node: ClassVar[tuple[str, ...]] = ()
    reads_runtime: ClassVar[tuple[str, ...]] = ()
    reads_ask: ClassVar[tuple[str, ...]] = ()

    def check(self, slot: NodeSlot, runtime: RuntimeSlot, ask: Ask) -> str | None:
        if runtime.fits(0, 0, 1):
            return None
        assert runtime.slot_pool is not None
        return f"all {runtime.slot_pool.capacity} instance slots in use"


NODE_FILTERS: tuple[NodeFilter, ...] = (
    NodeStateFilter(),
    NodeIdFilter(),
    LabelsFilter(),
    ResourcesFilter(),
    DevicesFilter(),
)
RUNTIME_FILTERS: tuple[RuntimeFilter, ...] = (
    RuntimeTypeFilter(),
    PlatformFilter(),
    CpuFilter(),
    RamFilter(),
    StorageFilter(),
    StateFilter(),
    MaxInstancesFilter(),
)
FILTER_CODES: tuple[str, ...] = tuple(f.name for f in NODE_FILTERS) + tuple(
    f.name for f in RUNTIME_FILTERS
)
"""Every reason code, in pipeline order."""

# What the registered filters read, derived from their declarations (read at call time, so a
# filter registered later is seen): deduplicated, in registry order, identities left out.


def _paths(declared: Iterable[tuple[str, ...]]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(p for p in chain.from_iterable(declared) if p != IDENTITY))


def _registered() -> tuple[NodeFilter | RuntimeFilter, ...]:
    return (*NODE_FILTERS, *RUNTIME_FILTERS)


def node_reads() -> tuple[str, ...]:
    """What any filter reads of a node, besides its pools and its id: the nodes of a class
    have these equal."""
    return _paths(f.reads_node for f in _registered())


def runtime_reads() -> tuple[str, ...]:
    """What any runtime-level filter reads of a runtime, besides its pools and its id."""
    return _paths(f.reads_runtime for f in RUNTIME_FILTERS)


def ask_reads(static: bool) -> tuple[str, ...]:
    """What the static (or the dynamic) filters read of an ask."""
    return tuple(
        dict.fromkeys(chain.from_iterable(f.reads_ask for f in _registered() if f.static is static))
    )
