"""The balancer (SPEC §7): a pure, deterministic function from (unit config, nodes, services,
previous allocations, mode) to placements and failures.

Inside one call the node states are mutable working copies built from the inputs; nothing
outside the call is touched, and the same inputs give the same result whatever their order.

Passes:

- ``fresh``: every instance, in instance order, goes through the full pipeline (pass 2).
- ``stable``: pass 1 keeps each previously placed instance on its node, runtime and devices while
  the filters still pass there; pass 2 places the others; pass 3 lets an instance that still
  fails evict strictly lower-priority instances from one node, and the victims go back
  through pass 2.
- ``rebalance``: a fresh run in which ``balancingPolicy: disabled`` instances are pinned first
  (pass 1 for them only); overloaded nodes are lowered and requests raised (SPEC §8). Its
  placements then go through one ``stable`` run on the real capacities and requests, in which
  an instance the lowered capacity could place nowhere keeps its previous place when it still
  fits there. So a rebalance never stops an instance that the very next run would start again,
  and the next run with the same inputs changes nothing.

Failures are summarized at the end, against the final node states (the state ``explain``
shows), so the next run with the same inputs reports the same reasons.
"""

from __future__ import annotations

import weakref
from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from heapq import heappop, heappush, heapreplace
from itertools import chain, compress, groupby
from operator import attrgetter, is_, is_not
from typing import Any, NamedTuple

from reconciler.model.documents import (
    DeviceRequest,
    ImagePlatform,
    Node,
    Quotas,
    RequestedResources,
    ResourceRatios,
    ResourceRequest,
    Service,
    UnitConfig,
)
from reconciler.model.gcpause import collector_paused
from reconciler.placement import filters
from reconciler.placement.filters import NO_NODES
from reconciler.placement.instances import (
    BalanceResult,
    Cause,
    DeviceIds,
    Failure,
    Instance,
    Mode,
    Placement,
    PreviousAllocation,
    Requested,
    expand_instances,
    new_instance,
    new_placement,
    new_requested,
    service_order,
)
from reconciler.placement.nodestate import (
    NO_KEEP,
    Basics,
    NodeConfigs,
    NodeSlot,
    RequestKey,
    Reservation,
    RuntimeSlot,
    Settings,
    StateCache,
    claim,
    make_slot,
    node_basics,
    node_facts,
    ordered_runtimes,
    release_reservation,
    take,
)
from reconciler.placement.sharing import ShareRequest

__all__ = [
    "Ask",
    "BalanceMemo",
    "Explanation",
    "NodeSlot",
    "Overload",
    "RuntimeSlot",
    "ask_for",
    "balance",
    "explain",
    "node_states",
    "requested_amounts",
]


Overload = Mapping[str, frozenset[str]]
"""Per node id, the resources (``cpu``, ``ram``) whose alert is raised (SPEC §8)."""

Entry = int
"""A node's place in the choice order of SPEC §7.5 (smallest is best): one integer that orders
like (-priority, -free CPU, -free RAM, node id), and whose remainder by the number of nodes is
the rank of the node id (see ``_Run.__init__``)."""


def _amount(asked: int | None, limit: int | None, ratio: int) -> int:
    """SPEC §7.2 for one resource: the request capped at the quota, else the quota's share at
    the node's ratio (limit * ratio / 100, rounded half up), else 0."""
    if asked is not None:
        return asked if limit is None or asked <= limit else limit
    if limit is not None:
        return (2 * limit * ratio + 100) // 200
    return 0


RequestInputs = tuple[
    bool,
    int | None,
    int | None,
    int | None,
    int | None,
    int | None,
    int | None,
    int | None,
    int | None,
]
"""What SPEC §7.2 reads of a service: ``skipResourceLimits``, then the request and the quota of
cpu, ram, storage and state."""


def _request_inputs(service: Service) -> RequestInputs:
    req, quotas = service.requestedResources, service.quotas
    return (
        service.skipResourceLimits,
        req.cpu,
        quotas.cpuDMIPSLimit,
        req.ram,
        quotas.ramLimit,
        req.storage,
        quotas.storageLimit,
        req.state,
        quotas.stateLimit,
    )


def requested_amounts(
    service: Service,
    ratios: ResourceRatios,
    measured: tuple[int, int] | None = None,
) -> Requested:
    """SPEC §7.2 for one candidate node's ratios; ``measured`` (cpu, ram) raises cpu and ram
    on an overloaded node during a rebalance."""
    key = (ratios.cpu, ratios.ram, ratios.storage, ratios.state, measured is not None)
    return _requested(_request_inputs(service), key, measured)


def _requested(
    inputs: RequestInputs, key: RequestKey, measured: tuple[int, int] | None
) -> Requested:
    """SPEC §7.2 on a node whose request key (its ratios, first) is ``key``."""
    skip, cpu, cpu_quota, ram, ram_quota, storage, storage_quota, state, state_quota = inputs
    if skip:
        return Requested()
    cpu = _amount(cpu, cpu_quota, key[0])
    ram = _amount(ram, ram_quota, key[1])
    if measured is not None:
        cpu = max(cpu, measured[0])
        ram = max(ram, measured[1])
    return new_requested(
        cpu,
        ram,
        _amount(storage, storage_quota, key[2]),
        _amount(state, state_quota, key[3]),
    )


# ----------------------------------------------------------------------------- what is asked


class Platform(NamedTuple):
    """The image platform a service asks for (``ImagePlatform``'s fields, as plain values)."""

    architecture: str
    os: str | None
    variant: str | None
    osVersion: str | None
    osFeatures: tuple[str, ...]


def _platform(p: ImagePlatform | None) -> Platform | None:
    if p is None:
        return None
    # (tuple.__new__: as Platform(...) without its Python-level __new__, once per service)
    return tuple.__new__(Platform, (p.architecture, p.os, p.variant, p.osVersion, p.osFeatures))


@dataclass(slots=True)
class Ask:
    """What one instance asks of a candidate node (the same for every instance of a service,
    except what pass 1 keeps)."""

    instance: Instance
    labels: frozenset[str]
    runtimes: frozenset[str]
    node_id: str | None
    platform: Platform | None
    resources: tuple[ShareRequest, ...]
    devices: tuple[ShareRequest, ...]
    amounts: RequestInputs  # what its requested amounts are made from (SPEC §7.2)
    keep_runtime: str | None = None
    keep_devices: DeviceIds = ()  # device ids kept, per resource (pass 1)
    usage: tuple[int, int] | None = None  # measured (cpu, ram) of this instance
    cause: Cause | None = None  # recorded with the reservation
    _cache: dict[RequestKey, Requested] = field(default_factory=dict)

    def requested(self, slot: NodeSlot) -> Requested:
        """SPEC §7.2 on ``slot`` (cached per ratios and overload)."""
        key = slot.request_key
        got = self._cache.get(key)
        if got is None:
            measured = self.usage if key[4] else None
            got = self._cache[key] = _requested(self.amounts, key, measured)
        return got


def _device_order(d: DeviceRequest) -> str:
    return d.resource


def ask_for(instance: Instance, usage: tuple[int, int] | None) -> Ask:
    """What ``instance`` asks (``usage``: its measured cpu and ram, where known)."""
    s = instance.service
    resources, devices = s.resources, s.devices
    return Ask(
        instance,
        frozenset(s.labels),
        frozenset(s.runtimes),
        s.nodeId,
        _platform(s.image.platform),
        tuple([ShareRequest(r.name) for r in resources]) if resources else (),
        tuple(
            [
                ShareRequest(d.resource, d.count or 1, d.memory)
                for d in sorted(devices, key=_device_order)
            ]
        )
        if devices
        else (),
        _request_inputs(s),
        usage=usage,
    )


# ----------------------------------------------------------------------------- the pipeline


@dataclass(frozen=True)
class Verdict:
    """The pipeline's answer for one node: survivors, or the code that dropped it."""

    runtimes: tuple[int, ...]  # indexes into slot.runtimes that survived
    dropped_by: str | None
    detail: str = ""


def evaluate(slot: NodeSlot, ask: Ask) -> Verdict:
    for nf in filters.NODE_FILTERS:
        why = nf.check(slot, ask)
        if why is not None:
            return Verdict((), nf.name, why)
    alive = list(range(len(slot.runtimes)))
    runtime_filters = filters.RUNTIME_FILTERS
    if not alive:
        return Verdict((), runtime_filters[0].name, "the node has no runtimes")
    for rf in runtime_filters:
        why = ""
        survivors = []
        for i in alive:
            reason = rf.check(slot, slot.runtimes[i], ask)
            if reason is None:
                survivors.append(i)
            else:
                why = reason
        if not survivors:
            return Verdict((), rf.name, why)
        alive = survivors
    return Verdict(tuple(alive), None)


def _choice_key(slot: NodeSlot) -> tuple[int, int, int, str]:
    """SPEC §7.5, smallest is best: priority, free CPU, free RAM (node pools), node id."""
    return (-slot.priority, -slot.cpu_pool.free, -slot.ram_pool.free, slot.id)


def _best_runtime(slot: NodeSlot, verdict: Verdict) -> int:
    """Runtimes are sorted by (type, id), so the first survivor is the smallest."""
    return verdict.runtimes[0]


def _summarize(instance: Instance, n_nodes: int, charges: Iterable[str]) -> Failure:
    counts: dict[str, int] = {}
    for code in charges:
        counts[code] = counts.get(code, 0) + 1
    ordered = tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    reason = max(counts, key=filters.FILTER_CODES.index) if counts else NO_NODES
    return _failure(instance, n_nodes, reason, ordered)


def _failure(
    instance: Instance, n_nodes: int, reason: str, ordered: tuple[tuple[str, int], ...]
) -> Failure:
    """A failure with the one-line summary of SPEC §7.7."""
    if ordered:
        detail = ", ".join(f"{n} {code}" for code, n in ordered)
        summary = f"{instance.label}: 0/{n_nodes} nodes feasible: {detail}"
    else:
        summary = f"{instance.label}: 0/0 nodes feasible: the unit has no nodes"
    return Failure(
        instance.id,
        instance.item_id,
        instance.subject_id,
        instance.index,
        instance.version,
        instance.priority,
        reason,
        summary,
        ordered,
    )


def _getter(paths: tuple[str, ...]) -> Callable[[Any], tuple[object, ...]]:
    """The values at attribute ``paths`` of an object, as a tuple."""
    if len(paths) > 1:
        return attrgetter(*paths)
    if paths:
        one = attrgetter(paths[0])
        return lambda obj: (one(obj),)
    return lambda obj: ()


_CHOICE_READS = ("priority",)
"""What the choice order reads of a class besides the filters' reads: its priority level."""


ClassKey = Callable[[Node, Settings, frozenset[str]], tuple[object, ...]]


def _class_key() -> ClassKey:
    """The class key of the registered filters (Nomad's computed class): what every filter
    reads of a node (``filters.node_reads``: for the dynamic ones, what their requested
    amounts depend on) and of each runtime (``filters.runtime_reads``), from their
    declarations, with the priority the choice order reads. Nodes with equal keys answer every
    static filter alike, and are asked the same amounts.

    The runtimes are listed in their order in the node state (by type, then id) without their
    ids, so nodes whose runtimes differ only in ids share a class, and a runtime's index (its
    place in that order) means the same on every node of the class: a static verdict by index
    holds for each of them."""
    paths = (*_CHOICE_READS, *filters.node_reads())
    if "node" in paths:
        raise ValueError("a filter reads fields of a node's document: declare node.<field>")
    # reads of the node's document ("node.<path>") are read per node; the other facts come from
    # its unit.yaml entry and overload alone, so they are read once per entry and overload
    of_document = _getter(tuple([p[5:] for p in paths if p.startswith("node.")]))
    of_facts = _getter(tuple([p for p in paths if not p.startswith("node.")]))
    of_runtime = _getter(filters.runtime_reads())
    by_entry: dict[tuple[int, frozenset[str]], tuple[object, ...]] = {}

    def key(node: Node, settings: Settings, overload: frozenset[str]) -> tuple[object, ...]:
        entry = (id(settings), overload)  # (the call's basics hold every settings value)
        facts = by_entry.get(entry)
        if facts is None:
            facts = by_entry[entry] = of_facts(node_facts(node, settings, overload))
        runtimes = tuple(map(of_runtime, ordered_runtimes(node)))
        return (facts, of_document(node), runtimes)

    return key


def _static_runtimes(slot: NodeSlot, ask: Ask) -> tuple[int, ...]:
    """Runtimes passing every static filter (empty when a static node filter fails)."""
    for nf in filters.NODE_FILTERS:
        if nf.static and nf.check(slot, ask) is not None:
            return ()
    static = [rf for rf in filters.RUNTIME_FILTERS if rf.static]
    return tuple(
        i
        for i, rt in enumerate(slot.runtimes)
        if all(rf.check(slot, rt, ask) is None for rf in static)
    )


Shape = tuple[tuple[object, ...], tuple[object, ...]]
"""What the static filters, then the dynamic ones, read of an ask (``_shape``)."""


def _shape() -> Callable[[Ask], Shape]:
    """The shape of an ask for the registered filters: what the static filters read of it
    (``filters.ask_reads``; the class index computes their answers once per class and static
    part), then what the dynamic ones read (named resources, device requests, the inputs of
    its requested amounts, the measured usage where it matters), from their declarations. A
    :class:`_Group` is made from one ask of its shape, so asks with equal shapes share one."""
    of_static = _getter(filters.ask_reads(True))
    of_dynamic = _getter(filters.ask_reads(False))

    def shape(ask: Ask) -> Shape:
        return (of_static(ask), of_dynamic(ask))

    return shape


def held_spec(service: Service, prev: PreviousAllocation, node: Node | None) -> Service | None:
    """``service`` as the instance was given its previous place, for a hold (see
    :meth:`_Run.hold`): the recorded version, amounts (requested exactly), named resources and
    devices, on the recorded runtime's type, with no condition of its own (labels, node id,
    platform). None when the allocation did not record them or its node or runtime is gone, or
    when a fractional device's share is not known (the current spec must ask the same pool by
    memory)."""
    if node is None or prev.version is None or prev.requested is None:
        return None
    runtime = next((rt for rt in node.runtimes if rt.id == prev.runtime_id), None)
    if runtime is None:
        return None
    policies = {pool.resource: pool.policy for pool in node.devicePools}
    asked = {d.resource: d for d in service.devices}
    devices: list[DeviceRequest] = []
    for resource, ids in prev.devices:
        policy = policies.get(resource)
        if policy is None:
            return None
        if policy == "fractional":
            memory = asked[resource].memory if resource in asked else None
            if memory is None:
                return None
            devices.append(DeviceRequest(resource=resource, memory=memory))
        else:
            devices.append(DeviceRequest(resource=resource, count=len(ids)))
    modes = {r.name: r.mode for r in service.resources}
    r = prev.requested
    return service.model_copy(
        update={
            "version": prev.version,
            "labels": (),
            "nodeId": None,
            "runtimes": (runtime.type,),
            "image": service.image.model_copy(update={"platform": None}),
            "quotas": Quotas(),
            "requestedResources": RequestedResources(
                cpu=r.cpu, ram=r.ram, storage=r.storage, state=r.state
            ),
            "skipResourceLimits": False,
            "resources": tuple(
                ResourceRequest(name=name, mode=modes.get(name, "rwm")) for name in prev.resources
            ),
            "devices": tuple(devices),
        }
    )


class _Group:
    """What the instances of every service with one :func:`_shape` ask, made once from the
    shape and shared by them all (services mostly differ only in name, priority and number
    of instances, so most share a group with others)."""

    __slots__ = (
        "_requested",
        "ask",
        "device_resources",
        "devices",
        "inputs",
        "instance",
        "levels",
        "names",
        "node_id",
        "passed",
        "per_class",
        "pinned",
        "refused",
        "resources",
        "static_key",
        "usage",
    )

    def __init__(self, ask: Ask, shape: Shape) -> None:
        self.ask = ask  # the first one's, for the filter units (no keep_*: valid for them all)
        self.instance = ask.instance
        self.usage = ask.usage  # the measured (cpu, ram) of its instances where that matters
        self.resources = ask.resources
        self.names = tuple([r.resource for r in ask.resources])
        self.devices = ask.devices
        self.device_resources = frozenset([d.resource for d in ask.devices])
        self.node_id = ask.node_id
        self.static_key = shape[0]  # everything the static filters read
        self.inputs = ask.amounts
        self._requested: dict[RequestKey, Requested] = {}
        self.per_class: list[tuple[int, ...]] | None = None  # static runtimes per class
        self.levels: list[Level] | None = None  # the classes with any, by priority level
        self.pinned: tuple[int, ...] | None = None  # static runtimes on the node it names
        self.refused: set[int] | None = None  # shared by groups asking the same (_Run._refused)
        self.passed: dict[int, Entry] = {}  # (shared as refused is, see _Run._refused)

    def requested(self, slot: NodeSlot) -> Requested:
        """SPEC §7.2 on ``slot`` (cached per ratios and overload), as ``Ask.requested``."""
        key = slot.request_key
        got = self._requested.get(key)
        if got is None:
            measured = self.usage if key[4] else None
            got = self._requested[key] = _requested(self.inputs, key, measured)
        return got


Level = list[tuple[int, tuple[int, ...]]]
"""The classes of one priority level a service may use, each with its static runtimes."""

Made = dict[str, tuple[Reservation, Placement]]
"""Per instance id, a placement and the reservation it was made from (``_Run.placements``)."""


PreviousSince = tuple[Mapping[str, PreviousAllocation], frozenset[str]]
"""A mapping of previous placements and the ids at which another one (a copy of it, edited)
may differ from it."""

_STALE_MAX = 256  # nodes moved since the index was built beyond which it is built again


class _Run:
    """The working state of one balance call.

    Pass 2 does not scan every node for every instance. Nodes are grouped in classes of equal
    static answers (the static filter units run once per class and service shape), and each
    class keeps its nodes sorted in the choice order of SPEC §7.5, one integer per node. The
    consecutive instances of one service are placed together: a heap merges the classes' best
    nodes, each class read from the front past the nodes known to refuse the service, plus the
    nodes the service already took (with their new place in the order); a lower priority
    level joins only when the higher ones have no node left. Within the group only the nodes
    it takes change, and only by shrinking, so a node refused stays refused and the first
    node of the heap that passes the dynamic filters (``claim``, on integers) is the best one.
    The nodes refused are remembered until something is released, shared by the services
    that ask the same everywhere (with, per class, an entry before which all its nodes refuse,
    where the next walk of the class starts), and a node without a free slot of a named
    resource refuses every service needing it. Services with one shape (``_shape``) share a
    group, made once. Node states are built when first looked at.

    The result is exactly that of evaluating every filter unit on every node for every
    instance (:meth:`place_by_scan` and the filter units in pass 1, used with
    ``exhaustive=True``; the property tests compare).
    """

    def __init__(
        self,
        unit: UnitConfig | None,
        nodes: Sequence[Node],
        overload: Overload,
        cause: Cause | None = None,
        *,
        exhaustive: bool = False,
    ) -> None:
        self.cause = cause  # recorded with every placement of pass 2 and 3
        self.exhaustive = exhaustive
        empty: frozenset[str] = frozenset()
        self.overload = overload
        self.nodes = {n.id: n for n in sorted(nodes, key=_node_id)}
        # Node states are built on first use (most nodes of a big unit are never looked at);
        # until then a node's choice order and class come from its basics.
        self.slots: dict[str, NodeSlot] = {}
        self.empty_states: StateCache = {}  # shared by the nodes' slots
        self.basics: dict[str, Basics] = {}
        self.usage: dict[str, tuple[int, int]] = {}
        for n in nodes:
            if n.usage is not None:
                for iid, u in n.usage.instances.items():
                    self.usage[iid] = (u.cpu, u.ram)
        self.where: dict[str, NodeSlot] = {}  # instance id -> the state of its node
        class_ids: dict[tuple[object, ...], int] = {}
        self.class_of: dict[str, int] = {}
        self.members: list[list[str]] = []
        configs = NodeConfigs(unit)
        basics_of, class_of, members = self.basics, self.class_of, self.members
        class_key = _class_key()
        for node_id, node in self.nodes.items():
            overloaded = overload.get(node_id, empty) if overload else empty
            basics = basics_of[node_id] = node_basics(unit, node, overloaded, configs)
            key = class_key(node, basics[0], overloaded)
            cid = class_ids.get(key)
            if cid is None:
                cid = class_ids[key] = len(members)
                members.append([])
            class_of[node_id] = cid
            members[cid].append(node_id)
        self.overloaded = bool(overload) and any(overload.get(n) for n in self.nodes)
        # a representative per class: its first node
        self.order_base: dict[str, int] = {}
        self.class_slot = [self.slot(members[0]) for members in self.members]
        # The choice order as one integer per node: priority rank, then CPU below the most any
        # node has, then RAM below the most any node has, then rank of the id, each in a range
        # of its own (free amounts stay within their capacity and are never negative).
        cpu_top = max((b[1] for b in self.basics.values()), default=0)
        self.ram_top = max((b[2] for b in self.basics.values()), default=0)
        priorities = sorted({b[0][0] for b in self.basics.values()}, reverse=True)
        rank = {p: r for r, p in enumerate(priorities)}
        # entry = ((high - cpu) * ram_span + ram_top - ram) * count + i
        #       = base - cpu * cpu_step - ram * ram_step, and entry % count = i
        self.count = count = len(self.nodes)
        self.ids = list(self.nodes)  # by rank
        self.class_at = [self.class_of[node_id] for node_id in self.ids]  # by rank
        ram_span = self.ram_top + 1
        self.cpu_step, self.ram_step = ram_span * count, count
        self.order_base = {
            node_id: ((rank[b[0][0]] * (cpu_top + 1) + cpu_top) * ram_span + self.ram_top) * count
            + i
            for i, (node_id, b) in enumerate(self.basics.items())
        }
        self.slot_at: list[NodeSlot | None] = [None] * count  # the states built, by rank
        for slot in self.class_slot:
            slot.order_base = self.order_base[slot.id]
            self.slot_at[slot.order_base % count] = slot
        # per class, its nodes' entries sorted; rebuilt after reservations made elsewhere
        self.index: list[list[Entry]] = [[] for _ in self.members]
        self.entries: list[Entry] = [0] * count  # each node's entry in the index, by rank
        self.index_valid = False
        # while the index is valid: the nodes reserved on or released since it was built (or
        # last brought up to date), by rank; _ensure_index moves these only
        self.stale: dict[int, NodeSlot] = {}
        # per static key (a service's labels, runtime types and platform): each class's static
        # runtimes, and the classes with any by priority level, highest first
        self.static: dict[object, tuple[list[tuple[int, ...]], list[Level]]] = {}
        # one node per distinct request key: what a service asks anywhere is known from these
        by_key: dict[RequestKey, NodeSlot] = {}
        for rep in self.class_slot:
            by_key.setdefault(rep.request_key, rep)
        self.key_slots = list(by_key.values())
        self.groups: dict[object, _Group] = {}  # by service (see group)
        self.shape = _shape()
        self.shapes: dict[Shape, _Group] = {}
        # per key of dynamic answers (see _refused), the nodes that refused it: reservations
        # only shrink what is free, so they stay refused until something is released
        self.refused: dict[object, set[int]] = {}  # (node ranks)
        # and per class, an entry below which all its nodes are in that set: where a walk of
        # the class for another group of the key starts (see _place_group)
        self.passed: dict[object, dict[int, Entry]] = {}
        self.exhausted: dict[str, set[int]] = {}  # per named resource, nodes with no free slot
        # instances held where they were (see hold): id -> (the instance as it was given its
        # place, the previous allocation it keeps)
        self.held: dict[str, tuple[Instance, PreviousAllocation]] = {}

    # -- node states

    def slot(self, node_id: str) -> NodeSlot:
        """The state of a node of the unit (KeyError for another id), built on first use."""
        got = self.slots.get(node_id)
        if got is None:
            empty: frozenset[str] = frozenset()
            overloaded = self.overload.get(node_id, empty) if self.overload else empty
            node = self.nodes[node_id]
            got = self.slots[node_id] = make_slot(
                None, node, overloaded, self.basics[node_id], self.empty_states
            )
            if self.order_base:  # once the run is set up
                got.order_base = self.order_base[node_id]
                self.slot_at[got.order_base % self.count] = got
        return got

    def all_slots(self) -> list[NodeSlot]:
        """Every node's state, by node id."""
        return [self.slot(node_id) for node_id in self.nodes]

    # -- what is asked

    def ask(self, instance: Instance) -> Ask:
        ask = ask_for(instance, self.usage.get(instance.id) if self.usage else None)
        ask.cause = self.cause
        return ask

    def group(self, instance: Instance) -> _Group:
        """The group of ``instance``: one per shape, found once per service (and measured
        usage, in an overloaded run)."""
        usage = self.usage.get(instance.id) if self.overloaded and self.usage else None
        key: object = (id(instance.service), usage) if self.overloaded else id(instance.service)
        group = self.groups.get(key)
        if group is None:
            ask = ask_for(instance, usage)
            shape = self.shape(ask)
            group = self.shapes.get(shape)
            if group is None:
                group = self.shapes[shape] = _Group(ask, shape)
            self.groups[key] = group
        return group

    def _classes(self, group: _Group) -> list[tuple[int, ...]]:
        """Each class's static runtimes for ``group`` (and ``group.levels``)."""
        if group.per_class is None:
            got = self.static.get(group.static_key)
            if got is None:
                ask = group.ask
                per_class = [_static_runtimes(rep, ask) for rep in self.class_slot]
                levels: dict[int, Level] = {}
                for cid, runtimes in enumerate(per_class):
                    if runtimes:
                        priority = self.class_slot[cid].priority
                        levels.setdefault(priority, []).append((cid, runtimes))
                got = (per_class, [levels[p] for p in sorted(levels, reverse=True)])
                self.static[group.static_key] = got
            group.per_class, group.levels = got
        return group.per_class

    def static_for(self, group: _Group, slot: NodeSlot) -> tuple[int, ...]:
        """The runtimes of ``slot`` passing the static filters for ``group``."""
        node_id = group.node_id
        if node_id is None:
            return (group.per_class or self._classes(group))[self.class_of[slot.id]]
        if node_id != slot.id:
            return ()
        if group.pinned is None:
            group.pinned = _static_runtimes(slot, group.ask)
        return group.pinned

    # -- reservations

    def reserve(self, slot: NodeSlot, ask: Ask, runtime_index: int) -> None:
        """Reserve what ``ask`` asks on one runtime of ``slot`` (raises if it does not fit)."""
        req = ask.requested(slot)
        keep = dict(ask.keep_devices) if ask.keep_devices else NO_KEEP
        ids = take(slot, runtime_index, req, ask.resources, ask.devices, keep)
        names = tuple([r.resource for r in ask.resources])
        slot.placed[ask.instance.id] = Reservation(
            ask.instance, runtime_index, req, names, ids, ask.devices, ask.cause
        )
        self.where[ask.instance.id] = slot
        self._moved(slot)

    def release(self, slot: NodeSlot, iid: str) -> None:
        release_reservation(slot, iid)
        del self.where[iid]
        if self.held:
            self.held.pop(iid, None)
        self._moved(slot)
        self.forget_refusals()  # something became free

    def _moved(self, slot: NodeSlot) -> None:
        """``slot``'s entry may have moved: noted while few have, else the index is rebuilt."""
        if self.index_valid:
            stale = self.stale
            if len(stale) < _STALE_MAX:
                stale[self.order_base[slot.id] % self.count] = slot
            else:
                self.index_valid = False
                stale.clear()

    def forget_refusals(self) -> None:
        """Forget which nodes refused what (after a release)."""
        for refused in self.refused.values():
            refused.clear()
        for passed in self.passed.values():
            passed.clear()
        self.exhausted.clear()

    def entry(self, slot: NodeSlot) -> Entry:
        """A node's place in the choice order now (see ``Entry``)."""
        cpu, ram = slot.cpu_pool.free, slot.ram_pool.free
        return slot.order_base - cpu * self.cpu_step - ram * self.ram_step

    def _ensure_index(self) -> None:
        if self.index_valid:
            if self.stale:  # a few nodes moved since: each to its place (as a rebuild puts it)
                for moved in self.stale.values():
                    self._reposition(moved)
                self.stale.clear()
                for passed in self.passed.values():  # as after a rebuild (a reserve only
                    passed.clear()  # moves a node later; a release cleared these already)
            return
        entries, slots, basics, base = self.entries, self.slots, self.basics, self.order_base
        cpu_step, ram_step = self.cpu_step, self.ram_step
        for cid, members in enumerate(self.members):
            keys = []
            for node_id in members:
                slot = slots.get(node_id)
                if slot is None:  # not built yet: all free
                    _, cpu, ram, _ = basics[node_id]
                    key = base[node_id] - cpu * cpu_step - ram * ram_step
                else:
                    key = self.entry(slot)
                entries[key % self.count] = key
                keys.append(key)
            keys.sort()
            self.index[cid] = keys
        for passed in self.passed.values():  # entries are places in the index just rebuilt
            passed.clear()
        self.stale.clear()
        self.index_valid = True

    def _reposition(self, slot: NodeSlot) -> None:
        """Move ``slot`` to its new place in its class index after reservations."""
        entries = self.index[self.class_of[slot.id]]
        old = self.entries[self.order_base[slot.id] % self.count]
        del entries[bisect_left(entries, old)]
        new = self.entry(slot)
        self.entries[new % self.count] = new
        insort(entries, new)

    # -- pass 1

    def keep(self, instance: Instance, prev: PreviousAllocation) -> bool:
        """Pass 1: keep the previous node, runtime and devices if the filters still pass."""
        if prev.node_id not in self.nodes:
            return False
        group = self.group(instance)
        prev_devices: Mapping[str, tuple[str, ...]] = NO_KEEP
        if prev.devices:
            prev_devices = dict(prev.devices)
            if prev_devices.keys() != group.device_resources:
                return False
        elif group.device_resources:
            return False
        slot = self.slot(prev.node_id)
        if self.exhaustive:  # every filter unit, on the node
            ask = self.ask(instance)
            ask.keep_runtime = prev.runtime_id
            ask.cause = prev.cause
            ask.keep_devices = tuple(prev_devices.items())
            verdict = evaluate(slot, ask)
            if verdict.dropped_by is not None:
                return False
            self.reserve(slot, ask, verdict.runtimes[0])
            return True
        index = _runtime_index(slot, prev.runtime_id)
        if index < 0 or index not in self.static_for(group, slot):
            return False
        req = group.requested(slot)
        devices = group.devices
        at, ids = claim(slot, req, (index,), group.resources, devices, prev_devices)
        if at < 0:
            return False
        iid = instance.id
        slot.placed[iid] = Reservation(instance, at, req, group.names, ids, devices, prev.cause)
        self.where[iid] = slot
        self._moved(slot)
        return True

    def hold(self, instance: Instance, prev: PreviousAllocation) -> bool:
        """Pass 1 for an instance whose current spec cannot keep its previous place: keep it
        there as it was given that place (its version, reserved amounts, named resources and
        devices, as the checkpoint recorded them), a *hold*. The hold passes the filters the
        place needs (node state, runtime, capacity, slots, resources, devices) but not the
        spec's own conditions (labels, node id, runtime types, platform), which its last spec
        met there. The current spec is tried at the instance's turn in pass 2
        (:meth:`try_current`)."""
        spec = held_spec(instance.service, prev, self.nodes.get(prev.node_id))
        if spec is None:
            return False
        held = new_instance(
            instance.id, instance.item_id, instance.subject_id, instance.index, spec
        )
        if not self.keep(held, prev):
            return False
        self.held[instance.id] = (held, prev)
        return True

    def try_current(self, instance: Instance, causes: Mapping[str, Cause] | None) -> None:
        """Pass 2 for a held instance: its current spec with the hold given back; held again
        when that places nowhere (the capacity it gave back is free again, so it fits)."""
        held, prev = self.held.pop(instance.id)
        self.release(self.where[instance.id], instance.id)
        if self.place_all([instance], causes) and self.keep(held, prev):
            self.held[instance.id] = (held, prev)

    # -- pass 2

    def place_all(
        self, instances: Sequence[Instance], causes: Mapping[str, Cause] | None = None
    ) -> list[Instance]:
        """Pass 2 for ``instances`` (in instance order), run by run of consecutive instances of
        one group; ``causes`` overrides the run's cause per instance. Returns the failed."""
        failed: list[Instance] = []
        i, n = 0, len(instances)
        while i < n:
            first = instances[i]
            service = first.service
            group = self.group(first)
            cause = (causes.get(first.id) if causes else None) or self.cause
            j = i + 1
            if causes or self.overloaded:
                while (
                    j < n
                    and self.group(instances[j]) is group
                    and ((causes.get(instances[j].id) if causes else None) or self.cause) == cause
                ):
                    j += 1
            else:  # one group per service
                while j < n and instances[j].service is service:
                    j += 1
            if self.exhaustive:
                for inst in instances[i:j]:
                    if not self.place_by_scan(inst, cause):
                        failed.append(inst)
            elif group.node_id is not None:
                failed += self._place_pinned(group, instances[i:j], cause)
            else:
                failed += self._place_group(group, instances[i:j], cause)
            i = j
        return failed

    def _place_pinned(
        self, group: _Group, instances: Sequence[Instance], cause: Cause | None
    ) -> list[Instance]:
        """Pass 2 for a service that names its node: only that node is a candidate."""
        assert group.node_id is not None
        if group.node_id not in self.nodes:
            return list(instances)
        slot = self.slot(group.node_id)
        self._ensure_index()
        req = group.requested(slot)
        runtimes = self.static_for(group, slot)
        resources, devices = group.resources, group.devices
        failed: list[Instance] = []
        for inst in instances:
            at, ids = claim(slot, req, runtimes, resources, devices, NO_KEEP)
            if at < 0:
                failed.append(inst)
                continue
            iid = inst.id
            slot.placed[iid] = Reservation(inst, at, req, group.names, ids, devices, cause)
            self.where[iid] = slot
        if len(failed) < len(instances):
            self._reposition(slot)
        return failed

    def _refused(self, group: _Group) -> set[int]:
        """The nodes known to refuse ``group``. Groups asking the same everywhere (same static
        answers, requested amounts, resources and devices) are refused by the same nodes, so
        they share one set."""
        if group.refused is None:
            amounts = []
            for rep in self.key_slots:
                r = group.requested(rep)
                amounts.append((r.cpu, r.ram, r.storage, r.state))
            key = (group.static_key, group.names, group.devices, tuple(amounts))
            refused = self.refused.get(key)
            if refused is None:
                refused = self.refused[key] = set()
                self.passed[key] = {}
            group.refused, group.passed = refused, self.passed[key]
        if group.names:  # nodes without a free slot of a resource it needs refuse it too
            for name in group.names:
                exhausted = self.exhausted.get(name)
                if exhausted:
                    group.refused |= exhausted
        return group.refused

    def _note_exhausted(
        self, slot: NodeSlot, rank: int, resources: tuple[ShareRequest, ...]
    ) -> None:
        """Remember the named resources ``slot`` has no free slot of (or lacks): they refuse
        every group that needs them, until something is released."""
        for r in resources:
            if slot.free_slots((r,)) is None:
                self.exhausted.setdefault(r.resource, set()).add(rank)

    def _place_group(
        self, group: _Group, instances: Sequence[Instance], cause: Cause | None
    ) -> list[Instance]:
        """Pass 2 for consecutive instances of one group (see the class docstring). A lower
        priority level's classes join the heap only when the higher ones have no node left."""
        self._ensure_index()
        resources, devices, names = group.resources, group.devices, group.names
        if group.levels is None:
            self._classes(group)
        assert group.levels is not None
        levels = group.levels
        refused = self._refused(group)
        passed = group.passed
        index, class_slot, slot_at = self.index, self.class_slot, self.slot_at
        class_at, count, by_rank = self.class_at, self.count, self.ids
        cpu_step, ram_step = self.cpu_step, self.ram_step
        # per class opened: what the group asks there, its runtimes passing the static filters,
        # and the place of its head (its next node in the order) in its index
        needs: dict[int, Requested] = {}
        allowed: dict[int, tuple[int, ...]] = {}
        cursors: dict[int, int] = {}
        heap: list[Entry] = []  # the heads of the classes opened, and the nodes taken
        opened = 0
        touched: dict[int, Entry] = {}  # nodes taken: their entries now (the index's are stale)
        failed: list[Instance] = []
        where = self.where
        # The node last taken, at its new place, is held out of the heap: the next instance
        # takes it again without a heap operation (nor looking up its rank, class, state and
        # what is asked there) while it stays the best, as a big node often does; otherwise
        # it is swapped for the heap's best in one operation.
        last: Entry | None = None
        rank = cid = 0
        for n, inst in enumerate(instances):
            placed = False
            while True:
                if last is not None and not (heap and heap[0] < last):
                    last = None  # the node just taken, still the best: no class head
                    head = False
                else:
                    if last is not None:
                        key = heapreplace(heap, last)
                        last = None
                    elif heap:
                        key = heappop(heap)
                    else:
                        if opened == len(levels):
                            break
                        for cid, runtimes in levels[opened]:
                            entries = index[cid]
                            end = len(entries)
                            known = passed.get(cid)
                            p = 0 if known is None else bisect_left(entries, known)
                            while p < end and entries[p] % count in refused:
                                p += 1
                            passed[cid] = entries[p] if p < end else entries[-1] + 1
                            if p < end:
                                heappush(heap, entries[p])
                                needs[cid] = group.requested(class_slot[cid])
                                allowed[cid] = runtimes
                                cursors[cid] = p
                        opened += 1
                        continue
                    rank = key % count
                    cid = class_at[rank]
                    slot = slot_at[rank] or self.slot(by_rank[rank])
                    need, runtimes = needs[cid], allowed[cid]
                    entries = index[cid]
                    p, end = cursors[cid], len(entries)
                    head = p < end and entries[p] == key
                at, ids = claim(slot, need, runtimes, resources, devices, NO_KEEP)
                if head:  # its class's head: push the next one, past the ones refused (the
                    # ones taken were heads, so they are behind it)
                    p += 1
                    while p < end and entries[p] % count in refused:
                        p += 1
                    cursors[cid] = p
                    if p < end:
                        heappush(heap, entries[p])
                if at < 0:
                    refused.add(rank)
                    if resources:
                        self._note_exhausted(slot, rank, resources)
                    continue
                iid = inst.id
                slot.placed[iid] = Reservation(inst, at, need, names, ids, devices, cause)
                where[iid] = slot
                last = touched[rank] = (
                    slot.order_base - slot.cpu_pool.free * cpu_step - slot.ram_pool.free * ram_step
                )
                placed = True
                break
            if not placed:
                failed.extend(instances[n:])
                break
        # the nodes taken move to their new place in their class's order
        entry_of = self.entries
        for rank, key in touched.items():
            entries = index[class_at[rank]]
            del entries[bisect_left(entries, entry_of[rank])]
            entry_of[rank] = key
            insort(entries, key)
        return failed

    def place_by_scan(self, instance: Instance, cause: Cause | None = None) -> bool:
        """Pass 2 by evaluating every filter on every node (the reference for tests)."""
        ask = self.ask(instance)
        ask.cause = cause or self.cause
        best: tuple[tuple[int, int, int, str], NodeSlot, Verdict] | None = None
        for slot in self.all_slots():
            verdict = evaluate(slot, ask)
            if verdict.dropped_by is not None:
                continue
            key = _choice_key(slot)
            if best is None or key < best[0]:
                best = (key, slot, verdict)
        if best is None:
            return False
        _, slot, verdict = best
        self.reserve(slot, ask, _best_runtime(slot, verdict))
        return True

    # -- failures and pass 3

    def summarize(self, instance: Instance, ask: Ask) -> Failure:
        charges = [evaluate(slot, ask).dropped_by for slot in self.all_slots()]
        return _summarize(instance, len(self.nodes), (c for c in charges if c is not None))

    def failures(self, instances: Sequence[Instance]) -> tuple[Failure, ...]:
        """SPEC §7.7 for every instance left unplaced, against the final node states; the
        instances of one service (with equal measured usage) are charged alike."""
        charged: dict[object, tuple[str, tuple[tuple[str, int], ...]]] = {}
        out = []
        held = self.held
        for inst in instances:
            if inst.id in self.where:
                if held and inst.id in held:
                    out.append(self._held_failure(inst, held[inst.id][0]))
                continue
            ask = self.ask(inst)
            group: object = (inst.service.key, ask.usage)
            known = charged.get(group)
            if known is None:
                f = self.summarize(inst, ask)
                charged[group] = (f.reason, f.counts)
            else:
                f = _failure(inst, len(self.nodes), *known)
            out.append(f)
        return tuple(out)

    def _held_failure(self, instance: Instance, held: Instance) -> Failure:
        """The failure of a held instance's current spec, against the final node states with
        its hold given back, said as a hold: ``item:subject:0: new spec unplaceable, keeping
        1.0.0 on edge-1: 0/3 nodes feasible: 3 Labels``."""
        home = self.where[instance.id]
        trial = home.clone()
        release_reservation(trial, instance.id)
        ask = self.ask(instance)
        charges = [evaluate(trial if s is home else s, ask).dropped_by for s in self.all_slots()]
        f = _summarize(instance, len(self.nodes), (c for c in charges if c is not None))
        why = f.summary[len(instance.label) + 2 :]
        spec = "new spec" if held.version == instance.version else f"new spec {instance.version}"
        keeping = f"{spec} unplaceable, keeping {held.version} on {home.id}"
        return replace(f, summary=f"{instance.label}: {keeping}: {why}")

    def preempt(self, instance: Instance) -> list[str] | None:
        """Pass 3: evict strictly lower-priority instances from the one node where that is
        cheapest; returns the victims' ids, or None when no node helps."""
        ask = self.ask(instance)
        best: tuple[tuple[int, tuple[int, ...], str], str, list[str]] | None = None
        for slot in self.all_slots():
            lower = sorted(
                (r for r in slot.placed.values() if r.instance.priority < instance.priority),
                key=lambda r: (r.instance.priority, _neg_order(r.instance)),
            )
            if not lower:
                continue
            trial = slot.clone()
            victims: list[Reservation] = []
            fits = False
            for r in lower:
                release_reservation(trial, r.instance.id)
                victims.append(r)
                if evaluate(trial, ask).dropped_by is None:
                    fits = True
                    break
            if not fits:
                continue
            # reprieve: give back every victim whose eviction turns out not to be needed
            for r in sorted(victims, key=lambda r: (-r.instance.priority, r.instance.order_key())):
                others = [v for v in victims if v is not r]
                check = slot.clone()
                for v in others:
                    release_reservation(check, v.instance.id)
                if evaluate(check, ask).dropped_by is None:
                    victims = others
            prios = tuple(sorted((v.instance.priority for v in victims), reverse=True))
            key = (len(victims), prios, slot.id)
            if best is None or key < best[0]:
                best = (key, slot.id, [v.instance.id for v in victims])
        if best is None:
            return None
        _, node_id, victim_ids = best
        slot = self.slot(node_id)
        for iid in victim_ids:
            self.release(slot, iid)
        verdict = evaluate(slot, ask)
        assert verdict.dropped_by is None
        self.reserve(slot, ask, _best_runtime(slot, verdict))
        return victim_ids

    def placements(
        self, instances: Sequence[Instance], made: Made | None = None
    ) -> tuple[Placement, ...]:
        """The placements of the placed ``instances``, in their order. ``made``: per instance,
        the reservation a placement was made from and that placement; one whose reservation is
        the same object is taken from there (the node is unchanged, the run is the same), and
        ``made`` is left holding this call's."""
        into: Made = made if made is not None else {}
        old = dict(into)
        into.clear()
        return self._placements(instances, old, into)

    def placements_of(self, instances: Sequence[Instance], made: Made) -> tuple[Placement, ...]:
        """:meth:`placements` for some instances only: ``made`` keeps every other entry, and
        loses the entries of those of ``instances`` left without a place."""
        return self._placements(instances, made, made)

    def _placements(
        self, instances: Sequence[Instance], old: Made, into: Made
    ) -> tuple[Placement, ...]:
        out = []
        where = self.where
        service: Service | None = None
        version, priority = "", 0
        for inst in instances:
            iid = inst.id
            slot = where.get(iid)
            if slot is None:
                into.pop(iid, None)
                continue
            res = slot.placed[iid]
            got = old.get(iid)
            if got is not None and got[0] is res:
                out.append(got[1])
                into[iid] = got
                continue
            if res.instance.service is not service:  # (a held one's: the spec it was placed by)
                service = res.instance.service
                version, priority = service.version, service.priority
            p = new_placement(
                iid,
                inst.item_id,
                inst.subject_id,
                inst.index,
                version,
                priority,
                slot.id,
                slot.runtimes[res.runtime_index].id,
                res.requested,
                res.resources,
                res.devices,
                _unhealthy(slot, res) if res.devices else (),
                res.cause,
            )
            out.append(p)
            into[iid] = (res, p)
        return tuple(out)

    def placement(self, instance: Instance) -> Placement:
        slot = self.where[instance.id]
        res = slot.placed[instance.id]
        return Placement(
            instance.id,
            instance.item_id,
            instance.subject_id,
            instance.index,
            res.instance.version,  # (a held one's: the spec it was placed by)
            instance.priority,
            slot.id,
            slot.runtimes[res.runtime_index].id,
            res.requested,
            res.resources,
            res.devices,
            _unhealthy(slot, res),
            res.cause,
        )


def _unhealthy(slot: NodeSlot, res: Reservation) -> tuple[str, ...]:
    """The devices a reservation holds that the node now reports unhealthy, sorted."""
    unhealthy = []
    for resource, ids in res.devices:
        pool = slot.pools[resource]
        unhealthy += [i for i in ids if not pool.by_id[i].healthy]
    return tuple(sorted(unhealthy))


def _node_id(node: Node) -> str:
    return node.id


def _runtime_index(slot: NodeSlot, runtime_id: str) -> int:
    for i, rt in enumerate(slot.runtimes):
        if rt.id == runtime_id:
            return i
    return -1


def _neg_order(instance: Instance) -> tuple[int, tuple[int, ...], tuple[int, ...], int]:
    """Reverse instance order (the last placed is evicted first among equal priorities)."""
    p, item, subject, index = instance.order_key()
    return (-p, tuple(-ord(c) for c in item), tuple(-ord(c) for c in subject), -index)


def balance(
    unit: UnitConfig | None,
    nodes: Sequence[Node],
    services: Sequence[Service],
    previous: Mapping[str, PreviousAllocation] | None = None,
    mode: Mode | None = None,
    overload: Overload | None = None,
    *,
    exhaustive: bool = False,
    memo: BalanceMemo | None = None,
    previous_since: PreviousSince | None = None,
) -> BalanceResult:
    """Place every desired instance (SPEC §7); see the module docstring for the passes.

    ``exhaustive`` evaluates every filter on every node for every instance instead of using
    the class indexes: the same result, slowly (the reference the tests compare against).

    ``memo`` (a long-running caller's, see :class:`BalanceMemo`) lets a stable run whose inputs
    differ from the memo's last call only in some services re-place only those services'
    instances; the result is the same as without it. ``previous_since`` (with a memo): a
    mapping ``previous`` is a copy of and the ids at which it may differ from it (what the
    checkpoint's memo tells, see
    :attr:`~reconciler.planning.checkpoint.CheckpointMemo.previous_since`),
    so that the memo checks those only when that mapping is the one it checked last call.

    Raises ``ValueError`` when two services have the same key (item and subject): their
    instances would have the same ids (the loader reports such a file and keeps one).
    """
    with collector_paused():
        if memo is None:
            if len({s.key for s in services}) != len(services):
                raise ValueError(_twice(services))
            return _balance_run(unit, nodes, services, previous, mode, overload, exhaustive)[0]
        return memo.balance(
            unit, nodes, services, previous, mode, overload, exhaustive, previous_since
        )


def _twice(services: Sequence[Service]) -> str:
    counts = Counter(s.key for s in services)
    twice = sorted(key for key, n in counts.items() if n > 1)
    return "services defined twice: " + ", ".join(f"{i}:{s}" for i, s in twice)


def _balance_run(
    unit: UnitConfig | None,
    nodes: Sequence[Node],
    services: Sequence[Service],
    previous: Mapping[str, PreviousAllocation] | None,
    mode: Mode | None,
    overload: Overload | None,
    exhaustive: bool,
    instances: list[Instance] | None = None,
    made: Made | None = None,
) -> tuple[BalanceResult, _Run]:
    """The balance, and the run whose final state it is (reservations on the real capacities
    and requests, in every mode)."""
    if mode is None:
        mode = unit.placement if unit is not None else "stable"
    previous = previous or {}
    if instances is None:
        instances = expand_instances(services)  # (which sorts them)
    if mode == "rebalance":
        # the rebalance proper: pinned instances first, the rest afresh, on lowered capacity
        core = _Run(unit, nodes, overload or {}, "rebalanced", exhaustive=exhaustive)
        _passes(core, instances, previous, _pinned, preempt=False)
        after = dict(previous)  # what the rebalance could not place falls back to its old place
        for inst in instances:
            if inst.id in core.where:
                p = core.placement(inst)
                old = previous.get(inst.id)
                if old is not None and (old.node_id, old.runtime_id) == (p.node_id, p.runtime_id):
                    p = replace(p, cause=old.cause)  # it did not move
                after[inst.id] = p.previous()
        # ... then one stable run on the real capacities: the state the next run starts from
        run = _Run(unit, nodes, {}, "rebalanced", exhaustive=exhaustive)
        preempted = _passes(run, instances, after, _always, preempt=True)
    elif mode == "fresh":
        run = _Run(unit, nodes, {}, exhaustive=exhaustive)
        preempted = _passes(run, instances, {}, _always, preempt=False)
    else:
        run = _Run(unit, nodes, {}, exhaustive=exhaustive)
        preempted = _passes(run, instances, previous, _always, preempt=True)
    result = BalanceResult(
        run.placements(instances),
        run.failures(instances),
        frozenset(preempted),
        held=frozenset(run.held),
    )
    return result, run


def _always(_instance: Instance) -> bool:
    return True


def _pinned(instance: Instance) -> bool:
    return instance.service.balancingPolicy == "disabled"


def _passes(
    run: _Run,
    instances: Sequence[Instance],
    previous: Mapping[str, PreviousAllocation],
    keeps: Callable[[Instance], bool],
    *,
    preempt: bool,
    everyone: Callable[[], Sequence[Instance]] | None = None,
) -> set[str]:
    """Pass 1 (keep the previous place of the instances ``keeps`` selects), pass 2 (place the
    rest in instance order) and, with ``preempt``, pass 3; returns the evicted instances' ids.

    After evictions every instance still unplaced, victims and earlier failures alike, goes
    through pass 2 again in instance order: room a preemption left over is used now, as the
    next run's pass 2 would use it. ``everyone``: every instance of the run, when
    ``instances`` holds only those that may lack a place (a victim can be any of them)."""
    where = run.where
    if not where and not previous:  # nothing placed, nothing to keep (a fresh run)
        pending = list(instances)
    else:
        pending = []
        for inst in instances:
            if inst.id in where:  # placed before this call (BalanceMemo)
                continue
            prev = previous.get(inst.id)
            if prev is not None and keeps(inst) and (run.keep(inst, prev) or run.hold(inst, prev)):
                if inst.id in run.held:
                    pending.append(inst)  # its current spec is tried at its turn
                continue
            pending.append(inst)
    failed = _place_pending(run, pending)
    preempted: set[str] = set()
    if not (preempt and failed):
        return preempted
    by_id = {i.id: i for i in (everyone() if everyone is not None else instances)}
    unplaced = []
    for inst in failed:
        evicted = run.preempt(inst)
        if evicted is None:
            unplaced.append(inst)
            continue
        preempted.update(evicted)
        unplaced.extend(by_id[v] for v in evicted)
    if preempted:
        causes: dict[str, Cause] = {iid: "preempted" for iid in preempted}
        _place_pending(run, sorted(unplaced, key=Instance.order_key), causes)
    return preempted


def _place_pending(
    run: _Run, pending: Sequence[Instance], causes: Mapping[str, Cause] | None = None
) -> list[Instance]:
    """Pass 2 for ``pending`` (in instance order); a held instance among them tries its
    current spec at its turn (:meth:`_Run.try_current`) and is not counted as failed."""
    held = run.held
    if not held:
        return run.place_all(pending, causes)
    failed: list[Instance] = []
    start = 0
    for k, inst in enumerate(pending):
        if inst.id in held and inst.id in run.where:
            failed += run.place_all(pending[start:k], causes)
            run.try_current(inst, causes)
            start = k + 1
    failed += run.place_all(pending[start:], causes)
    return failed


# ----------------------------------------------------------------------------- memo


_NODE_ID = attrgetter("id")


class BalanceMemo:
    """What a long-running caller (``watch``) carries from one :func:`balance` call to the
    next: the last call's inputs (by identity: the loader hands out the same objects for
    unchanged files), its instances per service, its result and the run in its final state.

    A ``stable`` call whose unit and nodes are the memo's, whose ``previous`` is exactly the
    memo's result (the checkpoint the last run wrote) and with no overload is answered from the
    memo: the instances of the services that changed (edited, added, removed) are released,
    those that had a place keep it (pass 1), and pass 2 and 3 run for every instance without a
    place, in instance order. That is the full run's result: in a full run every unchanged
    instance keeps its place (it fits beside every other reservation of the last result, so
    beside any subset of them: the filters are monotone in what is reserved), and so pass 2 and
    3 see the same instances on the same reservations. When a changed service's instance cannot
    keep its place, the memo cannot tell what the full run's pass 1 would do, so the call runs
    in full. Any other call runs in full and leaves its run in the memo (``fresh`` and
    ``stable`` ones: a rebalance's run records a cause with its placements).

    The memo's run is mutated by the next call: a memo belongs to one caller."""

    def __init__(self) -> None:
        self._unit: UnitConfig | None = None
        self._nodes: dict[str, Node] = {}
        self._services: dict[tuple[str, str], Service] = {}
        self._expanded: dict[tuple[str, str], tuple[Service, list[Instance]]] = {}
        self._run: _Run | None = None
        self._result: BalanceResult | None = None
        self._made: Made = {}
        self._order: list[tuple[str, str]] = []  # the services' keys in instance order
        self._segments: dict[tuple[str, str], tuple[Placement, ...]] = {}
        """Per service, its placements in the memo's result (consecutive there, in instance
        order); empty until an incremental call needs them."""
        self._validated: dict[str, PreviousAllocation] | None = None
        """The last ``previous`` found to be exactly ``_result`` (see _incremental), but for the
        instances in ``_dirty``: placed anew, or removed, by the calls since."""
        self._validated_from: Mapping[str, PreviousAllocation] | None = None
        """The mapping ``_validated`` is a copy of (what a ``previous_since`` names)."""
        self._dirty: set[str] = set()
        self._node_list: list[Node] = []  # the nodes of the call that set _nodes, in order
        self._service_list: list[Service] = []  # the services of the call that set _services
        self.incremental = False  # whether the last call was answered from the memo
        self.replaced = 0  # instances the last call released and placed again (incremental)

    def balance(
        self,
        unit: UnitConfig | None,
        nodes: Sequence[Node],
        services: Sequence[Service],
        previous: Mapping[str, PreviousAllocation] | None,
        mode: Mode | None,
        overload: Overload | None,
        exhaustive: bool,
        previous_since: PreviousSince | None = None,
    ) -> BalanceResult:
        if mode is None:
            mode = unit.placement if unit is not None else "stable"
        by_key, changed = self._keyed(services)
        if len(by_key) != len(services):
            raise ValueError(_twice(services))
        if mode == "stable" and not overload and not exhaustive:
            got = self._incremental(unit, nodes, by_key, previous or {}, changed, previous_since)
            if got is not None:
                self._service_list = list(services)
                return got
        instances = self._instances(by_key)
        made: Made = {}
        result, run = _balance_run(
            unit, nodes, services, previous, mode, overload, exhaustive, instances, made
        )
        self.incremental = False
        self.replaced = len(instances)
        if mode == "rebalance" or overload or exhaustive or result.held:
            # not a state the next stable call may start from (a held instance tries its
            # current spec in every full run)
            self._run = None
            return result
        self._unit, self._nodes, self._services = unit, {n.id: n for n in nodes}, by_key
        self._node_list, self._service_list = list(nodes), list(services)
        self._run, self._result, self._made = run, result, made
        self._segments = {}
        self._validated = self._validated_from = None
        return result

    def _keyed(
        self, services: Sequence[Service]
    ) -> tuple[dict[tuple[str, str], Service], set[tuple[str, str]] | None]:
        """The services by key, and the keys whose service is not the memo's object (None:
        not known). When ``services`` are the memo's last ones position by position but for
        a few, each with the same key there (no key added, removed or repeated), the memo's
        mapping is copied and those few put in: no pass over every service's key."""
        last, old = self._service_list, self._services
        if last and len(services) == len(last) and len(old) == len(last):
            differ = list(compress(range(len(last)), map(is_not, services, last)))
            if 8 * len(differ) <= len(last):
                by_key = dict(old)
                changed: set[tuple[str, str]] = set()
                for k in differ:
                    key = services[k].key
                    if key != last[k].key:
                        break
                    by_key[key] = services[k]
                    changed.add(key)
                else:
                    return by_key, changed
        return {s.key: s for s in services}, None

    def _instances(self, by_key: Mapping[tuple[str, str], Service]) -> list[Instance]:
        """Every instance in instance order (the instances of one service are consecutive),
        each service's expanded once while it is the same object."""
        self._expand(by_key)
        return self._flat()

    def _expand(
        self,
        by_key: Mapping[tuple[str, str], Service],
        changed: set[tuple[str, str]] | None = None,
    ) -> None:
        """``_expanded`` and ``_order`` for these services. ``changed``: the keys whose
        service is not the one in ``_expanded`` (every other is the same object); when none of
        them was added, removed or given another priority, the order is the last one."""
        old = self._expanded
        if changed is not None and all(
            k in old and k in by_key and old[k][0].priority == by_key[k].priority for k in changed
        ):
            patched = dict(old)
            for k in changed:
                patched[k] = (by_key[k], expand_instances([by_key[k]]))
            self._expanded = patched
            return
        expanded: dict[tuple[str, str], tuple[Service, list[Instance]]] = {}
        for service in sorted(by_key.values(), key=service_order):
            key = service.key
            got = old.get(key)
            if got is None or got[0] is not service:
                got = (service, expand_instances([service]))
            expanded[key] = got
        self._expanded = expanded
        self._order = list(expanded)

    def _flat(self) -> list[Instance]:
        expanded = self._expanded
        return list(chain.from_iterable(expanded[key][1] for key in self._order))

    def _previous_is_result(
        self,
        result: BalanceResult,
        previous: Mapping[str, PreviousAllocation],
        previous_since: PreviousSince | None = None,
    ) -> bool:
        """Whether ``previous`` holds exactly the node, runtime, devices and cause of each of
        ``result``'s placements (the checkpoint the last run wrote). Only the instances whose
        previous is not the object found right last time (by identity), or whose placement
        was made or removed since, are compared: every other pair was compared then, and
        neither side changed (a PreviousAllocation is frozen). ``previous_since`` naming the
        mapping checked last time tells the first ones without a pass over every entry."""
        placements = result.placements
        if len(previous) != len(placements):
            return False
        by_id = result.by_id
        validated = self._validated
        if validated is None:
            suspects: Iterable[str] = by_id.keys()
        elif previous_since is not None and previous_since[0] is self._validated_from:
            suspects = self._dirty | previous_since[1]
        else:
            ids = previous.keys()
            suspects = set(compress(ids, map(is_not, map(validated.get, ids), previous.values())))
            suspects |= self._dirty
        for iid in suspects:
            p = by_id.get(iid)
            prev = previous.get(iid)
            if p is None and prev is None:  # removed, or unplaced, and not in previous
                continue
            if (
                p is None
                or prev is None
                or (prev.node_id, prev.runtime_id, prev.devices, prev.cause)
                != (p.node_id, p.runtime_id, p.devices, p.cause)
            ):
                return False
        # (with equal sizes, every placement's id is in previous: a key of previous not in
        # result is a suspect, found above)
        self._validated, self._validated_from = dict(previous), previous
        self._dirty = set()
        return True

    def _incremental(
        self,
        unit: UnitConfig | None,
        nodes: Sequence[Node],
        by_key: Mapping[tuple[str, str], Service],
        previous: Mapping[str, PreviousAllocation],
        changed_keys: set[tuple[str, str]] | None = None,
        previous_since: PreviousSince | None = None,
    ) -> BalanceResult | None:
        run, result = self._run, self._result
        if run is None or result is None or run.cause is not None:
            return None
        if not (unit is self._unit or unit == self._unit) or len(nodes) != len(self._nodes):
            return None
        listed = self._node_list
        if len(nodes) != len(listed) or not all(map(is_, nodes, listed)):
            known = self._nodes  # (the same nodes in another order will do)
            if not all(map(is_, map(known.get, map(_NODE_ID, nodes)), nodes)):
                return None
        if not self._previous_is_result(result, previous, previous_since):
            return None
        old = self._services
        if changed_keys is not None:
            changed = changed_keys
        else:
            changed = {k for k, s in by_key.items() if old.get(k) is not s}
            changed.update(k for k in old if k not in by_key)
        if not changed and not result.failures:
            # the full run keeps every instance where it is (pass 1) and evicts nobody
            self.incremental, self.replaced = True, 0
            if not result.preempted:
                return result
            again = replace(result, preempted=frozenset(), since=(weakref.ref(result), frozenset()))
            self._result = again
            return again
        # (With nothing changed but instances unplaced, those go through pass 2 and 3 again,
        # as in the full run: one evicted by the last run's pass 3 may now evict another.)
        self._run = None  # mutated below: a failure leaves no usable state
        # release every instance of the services as they were
        where = run.where
        gone = set()
        replaced = 0
        made = self._made
        segments = self._segments or _segments_of(result)
        for key in sorted(changed):  # the same order every time (device pools keep holders)
            got = self._expanded.get(key)
            if got is None:
                continue
            gone.add(id(got[0]))
            for inst in got[1]:
                made.pop(inst.id, None)
                slot = where.get(inst.id)
                if slot is not None:
                    run.release(slot, inst.id)
        for g in [g for g in run.groups if g in gone]:
            del run.groups[g]
        run.forget_refusals()
        self._expand(by_key, changed)
        expanded = self._expanded
        # pass 1 for the services as they are now
        for key in sorted(k for k in changed if k in by_key):
            for inst in expanded[key][1]:
                replaced += 1
                prev = previous.get(inst.id)
                if prev is not None and not run.keep(inst, prev):
                    return None
        # pass 2 and 3: only the changed services and those with an instance unplaced last
        # time can have an instance without a place (in instance order, as in the full run)
        unplaced = changed | {(f.item_id, f.subject_id) for f in result.failures}
        pending = [
            inst
            for key in self._order
            if key in unplaced
            for inst in expanded[key][1]
            if inst.id not in where
        ]
        preempted = _passes(run, pending, {}, _always, preempt=True, everyone=self._flat)
        # Only these services' placements can differ from the last result's: the changed ones,
        # those with an instance unplaced before the passes (pass 2 may place it) and those of
        # an evicted instance; every other instance kept its very reservation.
        affected = set(changed)
        affected.update((f.item_id, f.subject_id) for f in result.failures)
        old_by_id = result.by_id
        for iid in preempted:
            was = old_by_id.get(iid)
            if was is not None:
                affected.add((was.item_id, was.subject_id))
        parts: list[tuple[Placement, ...]] = []
        new_segments: dict[tuple[str, str], tuple[Placement, ...]] = {}
        by_id = dict(old_by_id)
        redone: list[Instance] = []  # the affected services' instances, in instance order
        dirty = self._dirty  # (emptied by the check of previous above)
        for key in self._order:
            old_seg = segments.get(key, ())
            if key in affected:
                insts = expanded[key][1]
                redone += insts
                seg = _same_where_equal(run.placements_of(insts, made), old_seg)
                now = {p.instance_id: p for p in seg}
                for p in old_seg:
                    if now.get(p.instance_id) is not p:  # (else placed again exactly so)
                        del by_id[p.instance_id]
                        dirty.add(p.instance_id)
                for p in seg:
                    if by_id.get(p.instance_id) is not p:
                        by_id[p.instance_id] = p
                        dirty.add(p.instance_id)
            else:
                seg = old_seg
            new_segments[key] = seg
            parts.append(seg)
        for key in changed - set(self._order):  # services gone
            for p in segments.get(key, ()):
                del by_id[p.instance_id]
                dirty.add(p.instance_id)
        placements = tuple(chain.from_iterable(parts))
        result = BalanceResult(
            placements,
            run.failures(redone),
            frozenset(preempted),
            by_id,
            since=(weakref.ref(result), frozenset(dirty)),
        )
        self._services, self._run, self._result = dict(by_key), run, result
        self._segments = new_segments
        self.incremental, self.replaced = True, replaced
        return result


def _same_where_equal(
    seg: tuple[Placement, ...], old_seg: tuple[Placement, ...]
) -> tuple[Placement, ...]:
    """``seg`` with each placement equal to the last result's for the same instance replaced
    by that very object: an affected service's instances are released and placed again, most
    of them where they were, and every later stage takes an object it has seen as unchanged
    (``BalanceResult.since`` need not name it). (``made`` keeps the new, equal object: it is
    only consulted for a reservation that was not released since.)"""
    if not old_seg:
        return seg
    before = {p.instance_id: p for p in old_seg}
    out = []
    for p in seg:
        q = before.get(p.instance_id)
        out.append(q if q is not None and q == p else p)
    return tuple(out)


def _segments_of(result: BalanceResult) -> dict[tuple[str, str], tuple[Placement, ...]]:
    """The placements of ``result`` per service (each service's are consecutive)."""
    return {
        key: tuple(group)
        for key, group in groupby(result.placements, key=lambda p: (p.item_id, p.subject_id))
    }


# ----------------------------------------------------------------------------- explain


def _replay(
    unit: UnitConfig | None,
    nodes: Sequence[Node],
    services: Sequence[Service],
    result: BalanceResult,
    skip: str | None = None,
) -> _Run:
    """Node states with every placement of ``result`` (but ``skip``) reserved again: real
    capacities and requests, as every mode's final state is (a rebalance's too)."""
    instances = {i.id: i for i in expand_instances(sorted(services, key=lambda s: s.key))}
    run = _Run(unit, nodes, {})
    for p in result.placements:
        instance = instances.get(p.instance_id)
        if instance is None or p.instance_id == skip:
            continue
        if result.held and p.instance_id in result.held:  # as it was given its place
            spec = held_spec(instance.service, p.previous(), run.nodes.get(p.node_id))
            if spec is not None:
                i = instance
                instance = new_instance(i.id, i.item_id, i.subject_id, i.index, spec)
        group = run.group(instance)
        slot = run.slot(p.node_id)
        idx = _runtime_index(slot, p.runtime_id)
        if idx < 0:
            raise KeyError(f"{p.label}: no runtime {p.runtime_id} on node {p.node_id}")
        # as run.reserve with the instance's ask, its devices kept
        req, devices = group.requested(slot), group.devices
        keep = p.device_map() if p.devices else NO_KEEP
        ids = take(slot, idx, req, group.resources, devices, keep)
        slot.placed[instance.id] = Reservation(
            instance, idx, req, group.names, ids, devices, run.cause
        )
        run.where[instance.id] = slot
    return run


def node_states(
    unit: UnitConfig | None,
    nodes: Sequence[Node],
    services: Sequence[Service],
    result: BalanceResult,
) -> dict[str, NodeSlot]:
    """Every node's inventories with the result's placements reserved (for status)."""
    with collector_paused():
        run = _replay(unit, nodes, services, result)
        return {slot.id: slot for slot in run.all_slots()}


@dataclass(frozen=True)
class Explanation:
    """The node-by-filter matrix for one instance (``reconciler explain``)."""

    instance: Instance
    filters: tuple[str, ...]
    rows: tuple[tuple[str, tuple[str | None, ...], str | None], ...]
    # per node: (node id, per filter None=pass or the reason it fails, code that dropped it)
    placement: Placement | None
    failure: Failure | None


def explain(
    unit: UnitConfig | None,
    nodes: Sequence[Node],
    services: Sequence[Service],
    instance_id: str,
    previous: Mapping[str, PreviousAllocation] | None = None,
    mode: Mode | None = None,
    overload: Overload | None = None,
) -> Explanation:
    """Balance, then evaluate every filter on every node for one instance against the final
    state with the instance's own reservation given back: why it is where it is, or why it
    fails. Raises KeyError for an unknown instance."""
    result = balance(unit, nodes, services, previous, mode, overload)
    instances = {i.id: i for i in expand_instances(sorted(services, key=lambda s: s.key))}
    instance = instances[instance_id]
    run = _replay(unit, nodes, services, result, skip=instance_id)
    ask = run.ask(instance)
    rows = []
    for slot in run.all_slots():
        cells: list[str | None] = [f.check(slot, ask) for f in filters.NODE_FILTERS]
        for rf in filters.RUNTIME_FILTERS:
            reasons = [rf.check(slot, rt, ask) for rt in slot.runtimes]
            ok = any(r is None for r in reasons)
            cells.append(None if ok else (reasons[-1] if reasons else "no runtimes"))
        rows.append((slot.id, tuple(cells), evaluate(slot, ask).dropped_by))
    failure = next((f for f in result.failures if f.instance_id == instance_id), None)
    codes = filters.FILTER_CODES
    return Explanation(instance, codes, tuple(rows), result.by_id.get(instance_id), failure)
