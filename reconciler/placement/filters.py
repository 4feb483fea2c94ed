"""The placement filters of SPEC §7.4, each a small unit with a stable name.

A filter answers one question about one candidate and returns ``None`` when it passes or a short
human reason when it does not. Filters never record anything: the pipeline in
:mod:`reconciler.placement.balancer` charges a dropped node to the filter that dropped it and counts
the charges per reason code (Nomad's ``scheduler/feasible``, the Kubernetes scheduler's "0/N nodes
are available").

A filter marked ``static`` depends only on the node's description and the service, never on
what is reserved; the balancer evaluates static filters once per class of identical nodes.

Node-level filters see the node; runtime-level filters see one (node, runtime) pair, and a node
survives when at least one of its runtimes survives every runtime-level filter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

from reconciler.placement.sharing import REGISTRY

if TYPE_CHECKING:
    from reconciler.placement.balancer import Ask, NodeSlot, RuntimeSlot

__all__ = [
    "DYNAMIC_NODE_FILTERS",
    "DYNAMIC_RUNTIME_FILTERS",
    "FILTER_CODES",
    "NODE_FILTERS",
    "NO_NODES",
    "RUNTIME_FILTERS",
    "STATIC_NODE_FILTERS",
    "STATIC_RUNTIME_FILTERS",
    "NodeFilter",
    "RuntimeFilter",
]

NO_NODES = "NoNodes"
"""The reason code of an instance that fails because the unit has no nodes at all."""


class NodeFilter(Protocol):
    name: ClassVar[str]
    static: ClassVar[bool]  # depends only on the node's description, never on reservations

    def check(self, slot: NodeSlot, ask: Ask) -> str | None: ...


class RuntimeFilter(Protocol):
    name: ClassVar[str]
    static: ClassVar[bool]

    def check(self, slot: NodeSlot, runtime: RuntimeSlot, ask: Ask) -> str | None: ...


@dataclass(frozen=True)
class NodeStateFilter:
    """The node is connected and provisioned."""

    name: ClassVar[str] = "NodeState"
    static: ClassVar[bool] = True

    def check(self, slot: NodeSlot, ask: Ask) -> str | None:
        node = slot.node
        if not node.connected:
            return "disconnected"
        if node.state != "provisioned":
            return f"state {node.state}"
        return None


@dataclass(frozen=True)
class NodeIdFilter:
    """The service names a node (``nodeId``) and this is not it."""

    name: ClassVar[str] = "NodeId"
    static: ClassVar[bool] = True

    def check(self, slot: NodeSlot, ask: Ask) -> str | None:
        if ask.node_id is not None and ask.node_id != slot.id:
            return f"service wants node {ask.node_id}"
        return None


@dataclass(frozen=True)
class LabelsFilter:
    """Every label the service requires is among the node's labels (from unit.yaml)."""

    name: ClassVar[str] = "Labels"
    static: ClassVar[bool] = True

    def check(self, slot: NodeSlot, ask: Ask) -> str | None:
        missing = ask.labels - slot.labels
        return f"missing labels {sorted(missing)}" if missing else None


@dataclass(frozen=True)
class ResourcesFilter:
    """Every named host resource exists on the node with a free shared slot."""

    name: ClassVar[str] = "Resources"
    static: ClassVar[bool] = False

    def check(self, slot: NodeSlot, ask: Ask) -> str | None:
        shared = REGISTRY["shared-count"]
        for req in ask.resources:
            state = slot.resources.get(req.resource)
            if state is None:
                return f"no resource {req.resource}"
            status = shared.filter(state, req)
            if not status.ok:
                return status.reason
        return None


@dataclass(frozen=True)
class DevicesFilter:
    """Every device request can be served by the node's pool of that resource."""

    name: ClassVar[str] = "Devices"
    static: ClassVar[bool] = False

    def check(self, slot: NodeSlot, ask: Ask) -> str | None:
        for req in ask.devices:
            state = slot.pools.get(req.resource)
            if state is None:
                return f"no device pool {req.resource}"
            status = REGISTRY[state.policy].filter(
                state, req, ask.keep_devices.get(req.resource, ())
            )
            if not status.ok:
                return f"{status.code}: {status.reason}"
        return None


@dataclass(frozen=True)
class RuntimeTypeFilter:
    """The runtime's type is one the service accepts."""

    name: ClassVar[str] = "RuntimeType"
    static: ClassVar[bool] = True

    def check(self, slot: NodeSlot, runtime: RuntimeSlot, ask: Ask) -> str | None:
        if ask.keep_runtime is not None and runtime.runtime.id != ask.keep_runtime:
            return f"instance is kept on runtime {ask.keep_runtime}"
        if runtime.runtime.type not in ask.runtimes:
            return f"type {runtime.runtime.type} not accepted"
        return None


@dataclass(frozen=True)
class PlatformFilter:
    """Architecture equal; os, variant, osVersion compared only when the image sets them;
    every image osFeature present."""

    name: ClassVar[str] = "Platform"
    static: ClassVar[bool] = True

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
        return f"missing os features {sorted(missing)}" if missing else None


@dataclass(frozen=True)
class CpuFilter:
    """The requested DMIPS fit the free CPU of the runtime's pool (or the node's)."""

    name: ClassVar[str] = "Cpu"
    static: ClassVar[bool] = False

    def check(self, slot: NodeSlot, runtime: RuntimeSlot, ask: Ask) -> str | None:
        need = ask.requested(slot).cpu
        pool = runtime.cpu or slot.cpu
        return None if pool.can_provide(need) else f"needs {need} DMIPS, {pool.free} free"


@dataclass(frozen=True)
class RamFilter:
    """The requested RAM fits the free RAM of the runtime's pool (or the node's)."""

    name: ClassVar[str] = "Ram"
    static: ClassVar[bool] = False

    def check(self, slot: NodeSlot, runtime: RuntimeSlot, ask: Ask) -> str | None:
        need = ask.requested(slot).ram
        pool = runtime.ram or slot.ram
        return None if pool.can_provide(need) else f"needs {need} bytes of RAM, {pool.free} free"


@dataclass(frozen=True)
class StorageFilter:
    """The requested storage fits the node's partition typed ``storages``."""

    name: ClassVar[str] = "Storage"
    static: ClassVar[bool] = False

    def check(self, slot: NodeSlot, runtime: RuntimeSlot, ask: Ask) -> str | None:
        need = ask.requested(slot).storage
        if need == 0:
            return None
        pool = slot.partition("storages")
        if pool is None:
            return "no partition typed storages"
        return None if pool.can_provide(need) else f"needs {need} bytes, {pool.free} free"


@dataclass(frozen=True)
class StateFilter:
    """The requested state fits the node's partition typed ``states``."""

    name: ClassVar[str] = "State"
    static: ClassVar[bool] = False

    def check(self, slot: NodeSlot, runtime: RuntimeSlot, ask: Ask) -> str | None:
        req = ask.requested(slot)
        if req.state == 0:
            return None
        pool = slot.partition("states")
        if pool is None:
            return "no partition typed states"
        need = req.state
        if slot.partition_key("states") == slot.partition_key("storages"):
            need += req.storage  # one partition typed both is one shared pool
        return None if pool.can_provide(need) else f"needs {req.state} bytes, {pool.free} free"


@dataclass(frozen=True)
class MaxInstancesFilter:
    """The runtime has a free instance slot (maxInstances 0 = unlimited)."""

    name: ClassVar[str] = "MaxInstances"
    static: ClassVar[bool] = False

    def check(self, slot: NodeSlot, runtime: RuntimeSlot, ask: Ask) -> str | None:
        if runtime.slots is None or runtime.slots.can_provide(1):
            return None
        return f"all {runtime.slots.capacity} instance slots in use"


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
STATIC_NODE_FILTERS = tuple(f for f in NODE_FILTERS if f.static)
DYNAMIC_NODE_FILTERS = tuple(f for f in NODE_FILTERS if not f.static)
STATIC_RUNTIME_FILTERS = tuple(f for f in RUNTIME_FILTERS if f.static)
DYNAMIC_RUNTIME_FILTERS = tuple(f for f in RUNTIME_FILTERS if not f.static)
FILTER_CODES: tuple[str, ...] = tuple(f.name for f in NODE_FILTERS) + tuple(
    f.name for f in RUNTIME_FILTERS
)
"""Every reason code, in pipeline order."""
