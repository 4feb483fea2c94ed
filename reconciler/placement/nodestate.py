r"""Node states during a balance call (SPEC §6, §7.3) and the integer core of reservations.

A :class:`NodeSlot` is one node's working state: its CPU, RAM, partition and runtime pools are
mutable integer :class:`Pool`\ s changed in place (no object per reservation); the filters,
``explain`` and status read them as immutable :class:`~reconciler.model.inventory.Inventory` values
(SPEC §6.1). Named host resources (SPEC §6.2, the shared-count policy: one slot per user)
are integer pools too, read as the policy's pool states; device pools are the sharing
policies' immutable pool states (SPEC §6.3), allocated through the policies. Both are built on
first use, from empty states shared by the nodes of the call.

:func:`claim` is the hot path of the balancer: the dynamic filters of SPEC §7.4 on integers and
the reservation at once. :func:`take` reserves on a given runtime (or raises, changing nothing),
:func:`release_reservation` gives a reservation back.

Each dynamic rule is defined once, here, on integers: a runtime's CPU, RAM and instance slot
(:meth:`RuntimeSlot.fits`, with the pools it takes CPU and RAM from: its own, else the node's),
storage and state (:func:`storage_fits`, :func:`state_fits`) and named resources
(:meth:`NodeSlot.free_slots`). The filter units of :mod:`reconciler.placement.filters` call them
and add the reason; :func:`claim` and :func:`take` call them and reserve. :class:`NodeFacts` is
what the filters read of a node's description before its state is built (the balancer's class
key).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from types import MappingProxyType
from typing import NamedTuple

from reconciler.model.documents import (
    DevicePool,
    Node,
    NodeConfig,
    ResourceRatios,
    Runtime,
    UnitConfig,
)
from reconciler.model.human import human_amount
from reconciler.model.inventory import (
    OVER_CAPACITY,
    RELEASE_BELOW_ZERO,
    CapacityError,
    InvalidAmountError,
    Inventory,
    ReleaseError,
)
from reconciler.model.nodeinventories import ByteInventory, CpuInventory, Units
from reconciler.placement.instances import Cause, DeviceIds, Instance, Requested
from reconciler.placement.sharing import REGISTRY, ShareRequest
from reconciler.placement.sharing.base import Item, PoolState

__all__ = [
    "NO_KEEP",
    "Basics",
    "InventoryPool",
    "NodeConfigs",
    "NodeFacts",
    "NodeSlot",
    "NodeUnits",
    "Occupancy",
    "Pool",
    "RequestKey",
    "Reservation",
    "RuntimeSlot",
    "Settings",
    "StateCache",
    "basics_request_key",
    "claim",
    "device_pool",
    "device_pool_key",
    "device_served",
    "make_slot",
    "node_basics",
    "node_facts",
    "occupancy",
    "occupy",
    "ordered_runtimes",
    "partition_capacity",
    "release_reservation",
    "restore_reservation",
    "runtime_capacities",
    "state_fits",
    "state_need",
    "storage_fits",
    "system_usage",
    "take",
    "units_reason",
]

_DEFAULT_RATIOS = ResourceRatios()
_DEFAULT_CONFIG_PRIORITY = 0

_SHARED = REGISTRY["shared-count"]

RequestKey = tuple[int, int, int, int, bool]
"""What requested amounts depend on besides the service: a node's ratios, and whether it is
overloaded (SPEC §7.2)."""


class Pool:
    """The mutable integer state behind one inventory (SPEC §6.1) during a balance call.

    Every inventory the balancer works with is ``Inventory.simple(name, capacity)``: no
    reserved part, allocation ratio 1, unit and step 1. For those, ``can_provide(amount)`` is
    ``amount == 0 or 0 < amount <= free``; requested amounts are never negative and ``free``
    never is either (nothing is taken beyond it), so that is ``amount <= free`` here.
    Reservations change ``free`` in place (no object per reservation); :attr:`inventory` is
    the immutable Inventory the filters, ``explain`` and status read.
    """

    __slots__ = ("capacity", "free", "name")

    def __init__(self, name: str, capacity: int) -> None:
        self.name = name
        self.capacity = capacity
        self.free = capacity

    def copy(self) -> Pool:
        new = Pool.__new__(Pool)
        new.name, new.capacity, new.free = self.name, self.capacity, self.free
        return new

    @property
    def inventory(self) -> Inventory:
        inv = Inventory.simple(self.name, self.capacity)
        used = self.capacity - self.free
        return inv.consume(used) if used else inv


class InventoryPool(Pool):
    """A pool whose inventory a node declares (``inventories`` of the node file, SPEC §6.1):
    its capacity is ``spec``'s (``(total - reserved) * allocationRatio``, rounded down), and
    :attr:`inventory` is ``spec`` with what is reserved, so status and ``explain`` show the
    declared total, reserved part, ratio and units. Reservations change ``free`` as in any
    pool; the unit rules are checked once per request (:class:`NodeUnits`)."""

    __slots__ = ("spec",)

    def __init__(self, spec: Inventory) -> None:
        super().__init__(spec.resource_class, spec.capacity)
        self.spec = spec

    def copy(self) -> InventoryPool:
        new = InventoryPool.__new__(InventoryPool)
        new.name, new.capacity, new.free, new.spec = self.name, self.capacity, self.free, self.spec
        return new

    @property
    def inventory(self) -> Inventory:
        used = self.capacity - self.free
        return self.spec.with_used(used) if used else self.spec


def _spec(name: str, total: int, settings: CpuInventory | ByteInventory) -> Inventory:
    """The inventory of ``total`` with ``settings`` (``reserved`` at most ``total``)."""
    low, high, step = settings.units
    return Inventory(
        name,
        total=total,
        reserved=min(settings.reserved, total),
        allocation_ratio=settings.allocationRatio,
        min_unit=low,
        max_unit=high,
        step_size=step,
    )


def _pool(name: str, total: int, settings: CpuInventory | ByteInventory) -> Pool:
    """The pool of ``total`` (a plain one unless the node declares settings for it)."""
    if _declares(settings):
        return InventoryPool(_spec(name, total, settings))
    return Pool(name, total)


def _declares(settings: CpuInventory | ByteInventory) -> bool:
    return settings.shapes_capacity or settings.units != _NO_UNITS


_NO_UNITS: Units = (1, None, 1)

_UNIT_FIELDS = {
    "below-min-unit": "minUnit",
    "above-max-unit": "maxUnit",
    "step-size": "stepSize",
}


def _rules(units: Units) -> Inventory:
    return _RULES.get(units) or _RULES.setdefault(
        units, Inventory("units", 0, min_unit=units[0], max_unit=units[1], step_size=units[2])
    )


_RULES: dict[Units, Inventory] = {}


def _unit_code(units: Units, amount: int) -> str | None:
    """The reason code of the first unit rule ``amount`` breaks (``Inventory.check_units``),
    or None; 0 breaks none."""
    if not amount or units == _NO_UNITS:
        return None
    return _rules(units).check_units(amount)


def _unit_words(resource: str, units: Units, code: str) -> str:
    field = _UNIT_FIELDS.get(code)
    if field is None:  # (a negative amount: requested amounts never are)
        return code
    value = {"minUnit": units[0], "maxUnit": units[1], "stepSize": units[2]}[field]
    shown = value if value is None else human_amount(resource, value)
    return f"{code} (inventories.{resource}.{field} {shown})"


def units_reason(resource: str, units: Units, amount: int) -> str | None:
    """``None`` when ``amount`` respects the unit rules ``units`` of ``inventories.<resource>``
    (SPEC §6.1: ``Inventory.check_units``), else why not, with the reason code and the field
    (``below-min-unit (inventories.cpu.minUnit 200)``). 0 always does."""
    code = _unit_code(units, amount)
    return None if code is None else _unit_words(resource, units, code)


class NodeUnits:
    """The unit rules (``minUnit``, ``maxUnit``, ``stepSize``) a node declares for cpu, ram,
    storage and state, checked on a request's amounts at once (:func:`claim`, :func:`take`);
    a node declaring none has no such object (``NodeSlot.units`` is None)."""

    __slots__ = ("rules",)

    def __init__(self, cpu: Units, ram: Units, storage: Units, state: Units) -> None:
        self.rules = tuple(
            (resource, units)
            for resource, units in (
                ("cpu", cpu),
                ("ram", ram),
                ("storage", storage),
                ("state", state),
            )
            if units != _NO_UNITS
        )

    def refusal(self, req: Requested) -> tuple[str, str] | None:
        """The first rule ``req`` breaks, as (reason code, the words :func:`units_reason`
        gives, after the resource and amount), or None."""
        for resource, units in self.rules:
            amount: int = getattr(req, resource)
            code = _unit_code(units, amount)
            if code is not None:
                words = _unit_words(resource, units, code)
                return code, f"{resource} {human_amount(resource, amount)}: {words}"
        return None


class SharedPool(Pool):
    """The slots of one named host resource (SPEC §6.2) during a balance call: the
    shared-count policy's pool state, whose only changing part is its slots inventory (each
    user takes one slot: ``allocate`` consumes 1, ``release`` gives 1 back, and ``filter``
    asks ``can_provide(1)``), kept as an integer pool like CPU and RAM. A reservation changes
    ``free`` instead of making two immutable objects (a state and its inventory) through the
    policy; :attr:`state` is the policy's state with the slots taken, equal to the one its
    ``allocate`` calls would have made (the tests compare)."""

    __slots__ = ("empty",)

    def __init__(self, empty: PoolState) -> None:
        super().__init__(empty.resource, empty.slots.capacity)
        self.empty = empty  # the policy's state with no slot taken (shared across nodes)

    def copy(self) -> SharedPool:
        new = SharedPool.__new__(SharedPool)
        new.name, new.capacity, new.free = self.name, self.capacity, self.free
        new.empty = self.empty
        return new

    @property
    def state(self) -> PoolState:
        used = self.capacity - self.free
        empty = self.empty
        return empty.evolve(empty.slots.consume(used)) if used else empty


def _over(pool: Pool, amount: int) -> CapacityError:
    return CapacityError(
        f"{pool.name}: cannot consume {amount} (free {pool.free} of capacity {pool.capacity})",
        OVER_CAPACITY,
    )


class RuntimeSlot:
    """One runtime of a node: its instance slots (None: unlimited), its own CPU and RAM
    pools (``allowedDMIPS``/``allowedRAM``; None: the node's pools), and the pools its
    instances take CPU and RAM from (``cpu_from``, ``ram_from``: its own, else the node's)."""

    __slots__ = ("cpu_from", "cpu_pool", "id", "ram_from", "ram_pool", "runtime", "slot_pool")

    def __init__(
        self,
        runtime: Runtime,
        slot_pool: Pool | None,
        cpu_pool: Pool | None,
        ram_pool: Pool | None,
        node_cpu: Pool,
        node_ram: Pool,
    ) -> None:
        self.runtime = runtime
        self.id = runtime.id
        self.slot_pool = slot_pool
        self.cpu_pool = cpu_pool
        self.ram_pool = ram_pool
        # SPEC §7.3: a runtime with its own pool has that instead of the node's
        self.cpu_from = node_cpu if cpu_pool is None else cpu_pool
        self.ram_from = node_ram if ram_pool is None else ram_pool

    def fits(self, cpu: int, ram: int, instances: int) -> bool:
        """The rules ``Cpu``, ``Ram`` and ``MaxInstances`` on integers: ``cpu`` fits the pool
        the runtime takes CPU from, ``ram`` the one it takes RAM from, and ``instances`` (0 or
        1) its free instance slots (``maxInstances`` 0: unlimited). Each of those filters asks
        its own part, the others 0 (which always fit: nothing is taken beyond what is free);
        :func:`claim` and :func:`take` ask all three at once."""
        slots = self.slot_pool
        return (
            cpu <= self.cpu_from.free
            and ram <= self.ram_from.free
            and (slots is None or instances <= slots.free)
        )

    @property
    def slots(self) -> Inventory | None:
        return self.slot_pool.inventory if self.slot_pool is not None else None

    @property
    def cpu(self) -> Inventory | None:
        return self.cpu_pool.inventory if self.cpu_pool is not None else None

    @property
    def ram(self) -> Inventory | None:
        return self.ram_pool.inventory if self.ram_pool is not None else None

    def copy(self, node_cpu: Pool, node_ram: Pool) -> RuntimeSlot:
        """A copy for a copy of its node, whose pools are ``node_cpu`` and ``node_ram``."""
        return RuntimeSlot(
            self.runtime,
            self.slot_pool.copy() if self.slot_pool is not None else None,
            self.cpu_pool.copy() if self.cpu_pool is not None else None,
            self.ram_pool.copy() if self.ram_pool is not None else None,
            node_cpu,
            node_ram,
        )


@dataclass(slots=True)
class Reservation:
    """What one instance holds on a node: the runtime (index in ``NodeSlot.runtimes``), the
    requested amounts, named resources, device ids with the requests that got them, and why
    it was last moved there (``cause``)."""

    instance: Instance
    runtime_index: int
    requested: Requested
    resources: tuple[str, ...]
    devices: DeviceIds
    device_requests: tuple[ShareRequest, ...]
    cause: Cause | None = None


StateCache = dict[tuple[object, ...], PoolState]
"""Empty pool states by what they are built from, shared by the nodes of one balance call:
they are immutable, and the nodes of a unit mostly declare the same named resources and
device pools, so each is built once rather than once per node."""


def device_pool_key(
    pool: DevicePool,
) -> tuple[str, str, tuple[tuple[str, bool, int | None], ...]]:
    """What the state of a device pool with nothing allocated is made of: its policy, its
    resource and each device's id, health and memory (equal keys, equal states)."""
    return (pool.policy, pool.resource, tuple([(d.id, d.healthy, d.memory) for d in pool.devices]))


class NodeSlot:
    """One node's working state during a balance call.

    Amounts are integer pools changed in place; ``cpu``, ``ram``, ``partition(kind)`` and each
    runtime's ``slots``/``cpu``/``ram`` give them as immutable Inventories. Named resources
    are integer pools too (:class:`SharedPool`), read as the shared-count policy's states
    through ``resources``; device pools are the sharing policies' immutable pool states. Both
    are built on first use.
    """

    __slots__ = (
        "_empty",
        "_pools",
        "_resource_pools",
        "_resources",
        "cpu_pool",
        "id",
        "labels",
        "node",
        "order_base",
        "overloaded",
        "partition_of",
        "partition_pools",
        "placed",
        "priority",
        "ram_pool",
        "ratios",
        "request_key",
        "runtimes",
        "shared_partition",
        "state_pool",
        "storage_pool",
        "units",
    )

    def __init__(
        self,
        node: Node,
        settings: Settings,
        cpu_pool: Pool,
        ram_pool: Pool,
        runtimes: list[RuntimeSlot],  # sorted by (type, id)
        partition_pools: dict[str, Pool],
        partition_of: dict[str, str],  # "storages"/"states" -> partition name
        overloaded: frozenset[str] = frozenset(),
        empty_states: StateCache | None = None,  # shared with the call's other nodes
        units: NodeUnits | None = None,  # the node's unit rules, if it declares any
    ) -> None:
        self.node = node
        self.units = units
        self.id = node.id
        self.priority, self.labels, self.ratios, ratios = settings
        self.cpu_pool = cpu_pool
        self.ram_pool = ram_pool
        self.runtimes = runtimes
        self.partition_pools = partition_pools
        self.partition_of = partition_of
        storages, states = partition_of.get("storages"), partition_of.get("states")
        self.storage_pool = partition_pools[storages] if storages is not None else None
        self.state_pool = partition_pools[states] if states is not None else None
        self.shared_partition = storages == states
        self._resource_pools: dict[str, SharedPool] | None = None
        self._resources: dict[str, PoolState] | None = None  # their states, until one changes
        self._pools: dict[str, PoolState] | None = None
        self._empty: StateCache = {} if empty_states is None else empty_states
        self.placed: dict[str, Reservation] = {}
        self.overloaded = overloaded
        self.request_key: RequestKey = _request_key(ratios, overloaded)
        self.order_base = 0  # set by the balancer's run: its place in the choice order

    @property
    def cpu(self) -> Inventory:
        return self.cpu_pool.inventory

    @property
    def ram(self) -> Inventory:
        return self.ram_pool.inventory

    @property
    def partitions(self) -> dict[str, Inventory]:
        return {name: pool.inventory for name, pool in self.partition_pools.items()}

    def partition_key(self, kind: str) -> str | None:
        return self.partition_of.get(kind)

    def partition(self, kind: str) -> Inventory | None:
        key = self.partition_of.get(kind)
        return self.partition_pools[key].inventory if key is not None else None

    @property
    def resource_pools(self) -> dict[str, SharedPool]:
        """Named host resources, by name, as integer pools (change them with
        :meth:`take_slots` and :meth:`give_resources`)."""
        if self._resource_pools is None:
            empty = self._empty
            pools = {}
            for r in self.node.host_resources:
                key = (_SHARED.name, r.name, r.sharedCount)
                state = empty.get(key)
                if state is None:
                    state = empty[key] = _SHARED.new_state(r.name, (Item(r.name),), r.sharedCount)
                pools[r.name] = SharedPool(state)
            self._resource_pools = pools
        return self._resource_pools

    @property
    def resources(self) -> dict[str, PoolState]:
        """Named host resources (the shared-count policy's states), by name."""
        if self._resources is None:
            self._resources = {name: p.state for name, p in self.resource_pools.items()}
        return self._resources

    def free_slots(self, requests: Iterable[ShareRequest]) -> list[SharedPool] | None:
        """The pools of the named resources asked, when each has a free slot (the shared-count
        policy's ``filter``), else None (also for a resource the node lacks)."""
        pools = self._resource_pools
        if pools is None:
            pools = self.resource_pools
        held = []
        for r in requests:
            pool = pools.get(r.resource)
            if pool is None or pool.free < 1:
                return None
            held.append(pool)
        return held

    def take_slots(self, pools: Iterable[SharedPool]) -> None:
        """Take a slot of each of ``pools`` (:meth:`free_slots`' answer)."""
        for pool in pools:
            pool.free -= 1
        self._resources = None

    def give_resources(self, names: Iterable[str]) -> None:
        """Give back a slot of each named resource (raises ReleaseError if none is taken)."""
        pools = self.resource_pools
        for name in names:
            _give(pools[name], 1)
        self._resources = None

    @property
    def pools(self) -> dict[str, PoolState]:
        """Device pools, by resource."""
        if self._pools is None:
            empty = self._empty
            pools = {}
            for p in self.node.devicePools:
                key = device_pool_key(p)
                state = empty.get(key)
                if state is None:
                    items = tuple([Item(*device) for device in key[2]])
                    state = empty[key] = REGISTRY[p.policy].new_state(p.resource, items)
                pools[p.resource] = state
            self._pools = pools
        return self._pools

    def clone(self) -> NodeSlot:
        new = NodeSlot.__new__(NodeSlot)
        copies = {name: pool.copy() for name, pool in self.partition_pools.items()}
        new.node, new.id, new.priority = self.node, self.id, self.priority
        new.units = self.units
        new.labels, new.ratios = self.labels, self.ratios
        new.cpu_pool, new.ram_pool = self.cpu_pool.copy(), self.ram_pool.copy()
        new.runtimes = [rt.copy(new.cpu_pool, new.ram_pool) for rt in self.runtimes]
        new.partition_pools, new.partition_of = copies, self.partition_of
        storages, states = self.partition_of.get("storages"), self.partition_of.get("states")
        new.storage_pool = copies[storages] if storages is not None else None
        new.state_pool = copies[states] if states is not None else None
        new.shared_partition = self.shared_partition
        pools = self._resource_pools
        new._resource_pools = (
            {name: pool.copy() for name, pool in pools.items()} if pools is not None else None
        )
        new._resources = self._resources  # never changed in place: replaced on a change
        new._pools = dict(self._pools) if self._pools is not None else None
        new._empty = self._empty
        new.placed = dict(self.placed)
        new.overloaded, new.request_key = self.overloaded, self.request_key
        new.order_base = self.order_base
        return new

    def runtime_index(self, runtime_id: str) -> int:
        """The place of the runtime ``runtime_id`` in :attr:`runtimes`, or -1."""
        for i, rt in enumerate(self.runtimes):
            if rt.id == runtime_id:
                return i
        return -1


def _node_config(unit: UnitConfig | None, node: Node) -> NodeConfig | None:
    return unit.config_for(node.id, node.type) if unit is not None else None


_runtime_order = attrgetter("type", "id")


def ordered_runtimes(node: Node) -> Sequence[Runtime]:
    """A node's runtimes in the order of its state's (``NodeSlot.runtimes``): by type, then id
    (ids are unique on a node)."""
    listed = node.runtimes
    if len(listed) == 2:  # the most common case, without a sort
        first, second = listed
        return listed if _runtime_order(first) < _runtime_order(second) else (second, first)
    return sorted(listed, key=_runtime_order) if len(listed) > 1 else listed


Settings = tuple[int, frozenset[str], ResourceRatios, tuple[int, int, int, int]]
"""What a node takes from its unit.yaml entry: priority, labels, ratios (and as a tuple)."""

_DEFAULT_SETTINGS: Settings = (
    _DEFAULT_CONFIG_PRIORITY,
    frozenset(),
    _DEFAULT_RATIOS,
    (_DEFAULT_RATIOS.cpu, _DEFAULT_RATIOS.ram, _DEFAULT_RATIOS.storage, _DEFAULT_RATIOS.state),
)


def _settings(cfg: NodeConfig | None) -> Settings:
    if cfg is None:
        return _DEFAULT_SETTINGS
    r = cfg.resourceRatios
    return (cfg.priority, frozenset(cfg.labels), r, (r.cpu, r.ram, r.storage, r.state))


class NodeConfigs:
    """The unit.yaml entry of each node of one balance call (``UnitConfig.config_for``) and its
    settings, made once per entry."""

    __slots__ = ("_settings", "unit")

    def __init__(self, unit: UnitConfig | None) -> None:
        self.unit = unit
        self._settings: dict[int, Settings] = {}  # by the entry's identity

    def entry(self, node: Node) -> tuple[NodeConfig | None, Settings]:
        unit = self.unit
        if unit is None:
            return None, _DEFAULT_SETTINGS
        cfg = unit.config_for(node.id, node.type)  # (two lookups, see UnitConfig.entry_index)
        settings = self._settings.get(id(cfg))
        if settings is None:
            settings = self._settings[id(cfg)] = _settings(cfg)
        return cfg, settings


def _request_key(ratios: tuple[int, int, int, int], overloaded: frozenset[str]) -> RequestKey:
    return (*ratios, bool(overloaded))


class NodeFacts(NamedTuple):
    """What the filters and the choice order read of a node's description, under the names of
    the same attributes of its :class:`NodeSlot`, before that state is built (the balancer's
    class key reads these). Every field but ``node`` and ``id`` comes from the node's unit.yaml
    entry (its settings) and whether it is overloaded."""

    node: Node
    id: str
    priority: int
    labels: frozenset[str]
    ratios: ResourceRatios
    overloaded: frozenset[str]
    request_key: RequestKey


def node_facts(node: Node, settings: Settings, overloaded: frozenset[str]) -> NodeFacts:
    priority, labels, ratios, as_tuple = settings
    key = _request_key(as_tuple, overloaded)
    return NodeFacts(node, node.id, priority, labels, ratios, overloaded, key)


Basics = tuple[Settings, int, int, tuple[Inventory, Inventory] | None]
"""What the choice order and the node classes need of a node: its settings and the capacity
of its CPU and RAM pools (SPEC §7.3), with the inventories of those pools when the node
declares settings for them (``inventories.cpu``/``.ram``; else None: capacity = total)."""


def system_usage(node: Node) -> tuple[int, int]:
    """The cpu and ram a node reports in use by anything but its instances (its reported
    usage less its instances' own), taken off its capacity; (0, 0) without a usage report."""
    usage = node.usage
    if usage is None:
        return 0, 0
    own_cpu = own_ram = 0
    for u in usage.instances.values():
        own_cpu += u.cpu
        own_ram += u.ram
    return max(0, usage.cpu - own_cpu), max(0, usage.ram - own_ram)


def node_basics(
    unit: UnitConfig | None,
    node: Node,
    overload: frozenset[str],
    configs: NodeConfigs | None = None,
) -> Basics:
    """``configs``: the call's lookup of unit.yaml entries (``unit``'s), shared across nodes."""
    if configs is None:
        cfg = _node_config(unit, node)
        settings = _settings(cfg)
    else:
        cfg, settings = configs.entry(node)
    sys_cpu, sys_ram = system_usage(node)
    cpu_base, ram_base = node.maxDMIPS, node.totalRAM
    if overload and cfg is not None and cfg.alertRules is not None:
        rules = cfg.alertRules
        if "cpu" in overload and rules.cpu is not None:
            cpu_base = node.maxDMIPS * rules.cpu.minThreshold // 100
        if "ram" in overload and rules.ram is not None:
            ram_base = node.totalRAM * rules.ram.minThreshold // 100
    cpu, ram = max(0, cpu_base - sys_cpu), max(0, ram_base - sys_ram)
    inventories = node.inventories
    if not inventories.declared:
        return (settings, cpu, ram, None)
    cpu_spec = _spec("cpu", cpu, inventories.cpu)
    ram_spec = _spec("ram", ram, inventories.ram)
    return (settings, cpu_spec.capacity, ram_spec.capacity, (cpu_spec, ram_spec))


def basics_request_key(basics: Basics, overloaded: frozenset[str]) -> RequestKey:
    """The request key of the state of a node with ``basics`` (``NodeSlot.request_key``)."""
    return _request_key(basics[0][3], overloaded)


def runtime_capacities(node: Node, basics: Basics) -> list[tuple[int, int]]:
    """The CPU and RAM capacity of the pools each runtime of ``node`` takes from (its own,
    else the node's; SPEC §7.3), in the order of its state's runtimes: what :func:`make_slot`
    gives them, known without building the state."""
    _, cpu, ram, _ = basics
    return [
        (
            cpu if rt.allowedDMIPS is None else rt.allowedDMIPS,
            ram if rt.allowedRAM is None else rt.allowedRAM,
        )
        for rt in ordered_runtimes(node)
    ]


def _partition_pools(node: Node) -> tuple[dict[str, Pool], dict[str, str]]:
    """A node's partition pools (the first partition typed ``storages`` and the first typed
    ``states``), by name, and which partition each kind takes from."""
    inventories = node.inventories
    partitions: dict[str, Pool] = {}
    partition_of: dict[str, str] = {}
    declared = inventories.declared
    for part in node.partitions:
        for kind in ("storages", "states"):
            if kind in part.types and kind not in partition_of:
                partition_of[kind] = part.name
                if not declared:
                    partitions[part.name] = Pool(part.name, part.totalSize)
                    continue
                # one partition typed both is one pool: inventories.storage shapes it
                settings_of = inventories.storage if kind == "storages" else inventories.state
                if kind == "states" and part.name in partitions:
                    continue
                partitions[part.name] = _pool(part.name, part.totalSize, settings_of)
    return partitions, partition_of


def partition_capacity(node: Node, kind: str) -> int:
    """The capacity of the partition pool ``kind`` (``storages`` or ``states``) takes from on
    ``node``, 0 when none is typed so: what :func:`make_slot` gives it, known without building
    the state."""
    partitions, partition_of = _partition_pools(node)
    name = partition_of.get(kind)
    return 0 if name is None else partitions[name].capacity


def make_slot(
    unit: UnitConfig | None,
    node: Node,
    overload: frozenset[str],
    basics: Basics | None = None,
    empty_states: StateCache | None = None,
) -> NodeSlot:
    settings, cpu, ram, specs = basics if basics is not None else node_basics(unit, node, overload)
    inventories = node.inventories
    node_cpu: Pool
    node_ram: Pool
    if specs is None:
        node_cpu, node_ram = Pool("cpu", cpu), Pool("ram", ram)
    else:
        cpu_spec, ram_spec = specs
        node_cpu = InventoryPool(cpu_spec) if _declares(inventories.cpu) else Pool("cpu", cpu)
        node_ram = InventoryPool(ram_spec) if _declares(inventories.ram) else Pool("ram", ram)
    runtimes = []
    for rt in ordered_runtimes(node):
        most, own_cpu, own_ram = rt.maxInstances, rt.allowedDMIPS, rt.allowedRAM
        runtimes.append(
            RuntimeSlot(
                rt,
                Pool(f"{rt.id}/instances", most) if most else None,
                Pool(f"{rt.id}/cpu", own_cpu) if own_cpu is not None else None,
                Pool(f"{rt.id}/ram", own_ram) if own_ram is not None else None,
                node_cpu,
                node_ram,
            )
        )
    partitions, partition_of = _partition_pools(node)
    units = None
    if inventories.declared:
        all_units = (
            inventories.cpu.units,
            inventories.ram.units,
            inventories.storage.units,
            inventories.state.units,
        )
        if any(u != _NO_UNITS for u in all_units):
            units = NodeUnits(*all_units)
    return NodeSlot(
        node,
        settings,
        node_cpu,
        node_ram,
        runtimes,
        partitions,
        partition_of,
        overload,
        empty_states,
        units,
    )


NO_KEEP: Mapping[str, tuple[str, ...]] = MappingProxyType({})


# ----------------------------------------------------------------------------- the dynamic rules
# Each rule of SPEC §7.4 that depends on reservations, once, on integers: the filter units call
# these and say why they fail; claim and take call them and reserve.


def storage_fits(slot: NodeSlot, storage: int) -> bool:
    """Nothing is asked, or the partition typed ``storages`` provides it."""
    if not storage:
        return True
    pool = slot.storage_pool
    return pool is not None and storage <= pool.free


def state_need(slot: NodeSlot, storage: int, state: int) -> int:
    """What a state request takes of the partition typed ``states``: the storage request too
    when one partition is typed both (one shared pool)."""
    return state + storage if slot.shared_partition else state


def state_fits(slot: NodeSlot, storage: int, state: int) -> bool:
    """Nothing is asked, or the partition typed ``states`` provides it."""
    if not state:
        return True
    pool = slot.state_pool
    return pool is not None and state_need(slot, storage, state) <= pool.free


_NOTHING: tuple[int, DeviceIds] = (-1, ())


def device_pool(pools: Mapping[str, PoolState], request: ShareRequest) -> PoolState | None:
    """The device pool that serves ``request`` among a node's ``pools``: the pool of its
    resource, when that pool's policy says the request is its own (``has_request``, SPEC
    §6.3), else None."""
    pool = pools.get(request.resource)
    if pool is None or not REGISTRY[pool.policy].has_request(pool, request):
        return None
    return pool


def device_served(slot: NodeSlot, request: ShareRequest) -> bool:
    """Whether a device pool of ``slot`` serves ``request`` now: the pool :func:`device_pool`
    finds, and its policy's ``filter`` (what the ``Devices`` filter asks) with what is free."""
    pool = device_pool(slot.pools, request)
    return pool is not None and REGISTRY[pool.policy].filter(pool, request, ()).ok


def claim(
    slot: NodeSlot,
    req: Requested,
    runtimes: tuple[int, ...],
    resources: tuple[ShareRequest, ...],
    devices: tuple[ShareRequest, ...],
    keep: Mapping[str, tuple[str, ...]],
) -> tuple[int, DeviceIds]:
    """The dynamic filters of SPEC §7.4 (``Resources``, ``Devices``, ``Cpu``, ``Ram``,
    ``Storage``, ``State``, ``MaxInstances``) and, where they pass, the reservation: the
    smallest of ``runtimes`` (indexes that passed the static filters, ascending) on which
    everything fits is taken at once, and returned with the device ids given; ``(-1, ())`` and
    nothing changed when nothing fits.

    The rules are the ones the filter units call (above; :meth:`NodeSlot.free_slots` for named
    resources), so the answers are theirs (the property tests compare with ``exhaustive=True``,
    which runs the units). A device request is served by its policy's ``allocate``, which
    refuses (ValueError) exactly when its ``filter``, which the ``Devices`` unit asks, does.
    The node's unit rules (``minUnit``, ``maxUnit``, ``stepSize``), which the ``Cpu``,
    ``Ram``, ``Storage`` and ``State`` units ask with :func:`units_reason`, come first.
    """
    units = slot.units
    if units is not None and units.refusal(req) is not None:
        return _NOTHING
    held = None
    if resources:
        held = slot.free_slots(resources)
        if held is None:
            return _NOTHING
    given: list[tuple[str, PoolState, tuple[str, ...]]] | None = None
    if devices:
        given = []
        pools = slot.pools
        for d in devices:
            pool = device_pool(pools, d)
            if pool is None:
                return _NOTHING
            try:
                new, got = REGISTRY[pool.policy].allocate(pool, d, keep.get(d.resource, ()))
            except ValueError:
                return _NOTHING
            given.append((d.resource, new, tuple(sorted(got))))
    storage, state = req.storage, req.state
    if (storage or state) and not (
        storage_fits(slot, storage) and state_fits(slot, storage, state)
    ):
        return _NOTHING
    cpu, ram = req.cpu, req.ram
    all_runtimes = slot.runtimes
    for i in runtimes:
        rt = all_runtimes[i]
        if not rt.fits(cpu, ram, 1):
            continue
        # everything fits here: take it
        _commit(slot, rt, req, held, [(r, new) for r, new, _ in given] if given else ())
        if given:
            return i, tuple([(resource, ids) for resource, _, ids in given])
        return i, ()
    return _NOTHING


def take(
    slot: NodeSlot,
    runtime_index: int,
    req: Requested,
    resources: tuple[ShareRequest, ...],
    devices: tuple[ShareRequest, ...],
    keep: Mapping[str, tuple[str, ...]],
) -> DeviceIds:
    """Take everything the instance needs on ``slot`` at once, or raise and change nothing;
    returns the device ids given, per resource. The rules are :func:`claim`'s."""
    rt = slot.runtimes[runtime_index]
    cpu, ram = rt.cpu_from, rt.ram_from
    storage, state = req.storage, req.state
    units = slot.units
    if units is not None:
        refused = units.refusal(req)
        if refused is not None:
            raise InvalidAmountError(f"{slot.id}: {refused[1]}", refused[0])
    if not rt.fits(req.cpu, 0, 0):
        raise _over(cpu, req.cpu)
    if not rt.fits(0, req.ram, 0):
        raise _over(ram, req.ram)
    if not rt.fits(0, 0, 1):
        assert rt.slot_pool is not None
        raise _over(rt.slot_pool, 1)
    storage_pool = slot.storage_pool
    if not storage_fits(slot, storage):
        if storage_pool is None:
            raise ValueError("no partition typed storages")
        raise _over(storage_pool, storage)
    state_pool = slot.state_pool
    if not state_fits(slot, storage, state):
        if state_pool is None:
            raise ValueError("no partition typed states")
        raise _over(state_pool, state_need(slot, storage, state))
    held = slot.free_slots(resources) if resources else None
    if held is None and resources:
        for r in resources:
            short = slot.resource_pools[r.resource]  # (KeyError for a resource the node lacks)
            if short.free < 1:
                raise _over(short, 1)
    given: list[tuple[str, PoolState]] = []
    ids: list[tuple[str, tuple[str, ...]]] = []
    if devices:
        pools = slot.pools
        for d in devices:
            pool = device_pool(pools, d)
            if pool is None:
                raise KeyError(f"no device pool serves {d.resource}")
            new, got = REGISTRY[pool.policy].allocate(pool, d, keep.get(d.resource, ()))
            given.append((d.resource, new))
            ids.append((d.resource, tuple(sorted(got))))
    _commit(slot, rt, req, held, given)  # everything succeeded
    return tuple(ids)


def _commit(
    slot: NodeSlot,
    rt: RuntimeSlot,
    req: Requested,
    held: list[SharedPool] | None,
    given: Sequence[tuple[str, PoolState]],
) -> None:
    """Reserve what :func:`claim` or :func:`take` found to fit on ``rt`` of ``slot``: the
    amounts, a runtime slot, a slot of each named resource (``held``) and the device pools'
    new states (``given``)."""
    rt.cpu_from.free -= req.cpu
    rt.ram_from.free -= req.ram
    if rt.slot_pool is not None:
        rt.slot_pool.free -= 1
    if slot.storage_pool is not None:
        slot.storage_pool.free -= req.storage
    if slot.state_pool is not None:
        slot.state_pool.free -= req.state
    if held:
        slot.take_slots(held)
    if given:
        pools = slot.pools
        for resource, after in given:
            pools[resource] = after


def _give(pool: Pool, amount: int) -> None:
    if amount < 0 or amount > pool.capacity - pool.free:
        raise ReleaseError(
            f"{pool.name}: cannot release {amount} ({pool.capacity - pool.free} used)",
            RELEASE_BELOW_ZERO,
        )
    pool.free += amount


def restore_reservation(slot: NodeSlot, res: Reservation) -> None:
    """Hold ``res`` again on ``slot``, from which it was released (:func:`release_reservation`):
    its runtime, amounts, a slot of each named resource and its very device ids. The state is
    then the one it had with ``res`` held (the tests compare)."""
    keep = dict(res.devices) if res.devices else NO_KEEP
    asked = tuple([ShareRequest(name) for name in res.resources])
    take(slot, res.runtime_index, res.requested, asked, res.device_requests, keep)
    slot.placed[res.instance.id] = res


Occupancy = tuple[tuple[int, ...], tuple[int, ...] | None, tuple[tuple[str, PoolState], ...] | None]
"""What is free on a node, pool by pool (:func:`occupancy`): each integer pool's free amount
(the node's CPU and RAM, each runtime's instance slots and own CPU and RAM, the partitions),
each named resource's free slots, and the device pools' states (None: as the node declares
them, untouched)."""


def _integer_pools(slot: NodeSlot) -> list[Pool]:
    """The integer pools of ``slot`` but its named resources', in one fixed order."""
    pools = [slot.cpu_pool, slot.ram_pool]
    for rt in slot.runtimes:
        pools.extend([p for p in (rt.slot_pool, rt.cpu_pool, rt.ram_pool) if p is not None])
    pools.extend(slot.partition_pools.values())
    return pools


def occupancy(slot: NodeSlot) -> Occupancy:
    """What is free on ``slot`` now, enough for :func:`occupy` to give the same free amounts,
    named-resource slots and device pools to a state of the same node with nothing reserved
    (the filters read nothing else of a state: which reservations hold them is not kept)."""
    resources = slot._resource_pools
    devices = slot._pools
    return (
        tuple([p.free for p in _integer_pools(slot)]),
        None if resources is None else tuple([p.free for p in resources.values()]),
        None if devices is None else tuple(devices.items()),
    )


def occupy(slot: NodeSlot, held: Occupancy) -> bool:
    """Make ``slot``, a state with nothing reserved, hold what :func:`occupancy` read of a
    state of the same node. False (``slot`` then unusable) when ``held`` does not fit its
    pools: another node's, or another version of it."""
    frees, resources, devices = held
    pools = _integer_pools(slot)
    if len(pools) != len(frees) or any(
        not 0 <= free <= p.capacity for p, free in zip(pools, frees, strict=True)
    ):
        return False
    for p, free in zip(pools, frees, strict=True):
        p.free = free
    if resources is not None:
        shared = list(slot.resource_pools.values())
        if len(shared) != len(resources):
            return False
        for pool, free in zip(shared, resources, strict=True):
            if not 0 <= free <= pool.capacity:
                return False
            pool.free = free
        slot._resources = None
    if devices is not None:
        if {r for r, _ in devices} != set(slot.pools):
            return False
        slot._pools = dict(devices)
    return True


def release_reservation(slot: NodeSlot, iid: str) -> Reservation:
    res = slot.placed.pop(iid)
    req = res.requested
    rt = slot.runtimes[res.runtime_index]
    _give(rt.cpu_from, req.cpu)
    _give(rt.ram_from, req.ram)
    if rt.slot_pool is not None:
        _give(rt.slot_pool, 1)
    if slot.storage_pool is not None:
        _give(slot.storage_pool, req.storage)
    if slot.state_pool is not None:
        _give(slot.state_pool, req.state)
    if res.resources:
        slot.give_resources(res.resources)
    if res.device_requests:
        pools = slot.pools
        for d, (_, ids) in zip(res.device_requests, res.devices, strict=True):
            state = pools[d.resource]
            pools[d.resource] = REGISTRY[state.policy].release(state, d, ids)
    return res
