"""The status document (SPEC §12): ``out/status.json`` and ``reconciler status``.

A pure function of what one reconcile computed: per node capacity / reserved / free of every
inventory, per instance where it runs and what the agents report, failures with their summaries,
raised alerts, and the invalid input files with their errors.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC
from typing import Any, TypeVar, overload

from reconciler.accel import node_states
from reconciler.io.loader import Diagnostic, StateView
from reconciler.model.documents import ActualInstance, Node, Service, UnitConfig
from reconciler.model.inventory import Inventory
from reconciler.model.jsonbytes import document, fragment, join_object, member
from reconciler.model.values import instance_ids
from reconciler.placement.instances import BalanceResult, Placement
from reconciler.placement.nodestate import NodeSlot, Pool, system_usage
from reconciler.placement.sharing import REGISTRY
from reconciler.placement.sharing.shared_count import UNLIMITED
from reconciler.planning.checkpoint import Allocation
from reconciler.planning.plans import failure_json

__all__ = [
    "STATUS_FORMAT_VERSION",
    "AllocationIds",
    "NodeStatusCache",
    "build_status",
    "cached_status",
    "node_statuses",
    "status_bytes",
]

STATUS_FORMAT_VERSION = 1

_D = TypeVar("_D")


class AllocationIds(Mapping[str, tuple[int, int]]):
    """Each instance's ``(uid, gid)`` in ``allocations``, read from its allocation when asked:
    the status report looks up the placed instances' ids, and a run does not build a map of
    every allocation for it (20,000 entries at that size)."""

    __slots__ = ("_allocations", "since")

    def __init__(
        self,
        allocations: Mapping[str, Allocation],
        since: tuple[Mapping[str, Allocation], frozenset[str]] | None = None,
    ) -> None:
        self._allocations = allocations
        self.since = since
        """``allocations`` is that mapping but at these ids (:attr:`Checkpoint.since`)."""

    @property
    def allocations(self) -> Mapping[str, Allocation]:
        return self._allocations

    def __getitem__(self, iid: str) -> tuple[int, int]:
        a = self._allocations[iid]
        return (a.uid, a.gid)

    @overload
    def get(self, iid: str, /) -> tuple[int, int] | None: ...

    @overload
    def get(self, iid: str, /, default: tuple[int, int] | _D) -> tuple[int, int] | _D: ...

    def get(self, iid: str, /, default: object = None) -> object:
        a = self._allocations.get(iid)
        return default if a is None else (a.uid, a.gid)

    def __iter__(self) -> Iterator[str]:
        return iter(self._allocations)

    def __len__(self) -> int:
        return len(self._allocations)


def _inv(inv: Inventory | None) -> dict[str, Any] | None:
    """``capacity``, ``reserved`` (what placements hold) and ``free``; for a pool whose node
    declares inventory settings (``inventories`` of the node file), also those settings under
    ``inventory`` (``total`` is what the node has, ``reserved`` its part held back), and
    ``overcommitted``: how much of the capacity lies beyond ``total - reserved`` (a ratio
    above 1), when any does."""
    if inv is None:
        return None
    out: dict[str, Any] = {"capacity": inv.capacity, "reserved": inv.used, "free": inv.free}
    if (
        inv.reserved
        or inv.allocation_ratio != 1
        or (inv.min_unit, inv.max_unit, inv.step_size) != (1, None, 1)
    ):
        out["inventory"] = {
            "total": inv.total,
            "reserved": inv.reserved,
            "allocationRatio": inv.allocation_ratio,
            "minUnit": inv.min_unit,
            "maxUnit": inv.max_unit,
            "stepSize": inv.step_size,
        }
        beyond = inv.capacity - (inv.total - inv.reserved)
        if beyond > 0:
            out["overcommitted"] = beyond
    return out


def _pool(pool: Pool | None) -> dict[str, Any] | None:
    """``_inv(pool.inventory)``, without making the inventory of a pool that has no settings
    (a plain :class:`Pool`: its capacity is its total, nothing held back, ratio 1)."""
    if pool is None:
        return None
    if type(pool) is Pool:
        capacity, free = pool.capacity, pool.free
        return {"capacity": capacity, "reserved": capacity - free, "free": free}
    return _inv(pool.inventory)


def _node_status(slot: NodeSlot) -> dict[str, Any]:
    node = slot.node
    runtimes = {}
    for rt in slot.runtimes:
        runtimes[rt.runtime.id] = {
            "type": rt.runtime.type,
            "slots": _pool(rt.slot_pool),  # None: unlimited
            "cpu": _pool(rt.cpu_pool),
            "ram": _pool(rt.ram_pool),
        }
    resources = {}
    for name, state in sorted(slot.resources.items()):
        unlimited = state.slots.capacity >= UNLIMITED
        resources[name] = {
            "sharedCount": 0 if unlimited else state.slots.capacity,
            "used": state.slots.used,
            "free": None if unlimited else state.slots.free,
        }
    devices = {}
    for resource, pool in sorted(slot.pools.items()):
        st = REGISTRY[pool.policy].status(pool)
        devices[resource] = {
            "policy": st.policy,
            "total": st.total,
            "healthy": st.healthy,
            "allocated": st.allocated,
            **({"devices": st.detail} if st.detail else {}),
        }
    return {
        "type": node.type,
        "state": node.state,
        "connected": node.connected,
        "priority": slot.priority,
        "labels": sorted(slot.labels),
        "cpu": _pool(slot.cpu_pool),
        "ram": _pool(slot.ram_pool),
        "partitions": {
            "storage": _partition(slot, "storages"),
            "state": _partition(slot, "states"),
        },
        "runtimes": runtimes,
        "resources": resources,
        "devices": devices,
        "instances": len(slot.placed),
        **_system_usage(node),
        **_reported_at(node),
    }


def _partition(slot: NodeSlot, kind: str) -> dict[str, Any] | None:
    key = slot.partition_of.get(kind)
    return _pool(slot.partition_pools[key]) if key is not None else None


def _reported_at(node: Node) -> dict[str, Any]:
    """When the node's agent last wrote its node file (SPEC §19), when it says."""
    at = node.reportedAt
    if at is None:
        return {}
    return {"reportedAt": at.astimezone(UTC).isoformat().replace("+00:00", "Z")}


def _system_usage(node: Node) -> dict[str, Any]:
    """``systemUsage``: what the node reports in use by anything but its instances (the cpu
    and ram taken off its capacity), only when it reports usage."""
    if node.usage is None:
        return {}
    cpu, ram = system_usage(node)
    return {"systemUsage": {"cpu": cpu, "ram": ram}}


Observed = tuple[str, ActualInstance | None]
"""An instance's state, and its agent's record when it reports it on its placed node."""

InstanceKey = tuple[Placement, Observed, tuple[int, int] | None]
"""What an instance's status record is made of: its placement, what is observed, uid/gid."""

_NodeKey = tuple[UnitConfig | None, Node, tuple[Placement, ...], tuple[Service | None, ...]]


class NodeStatusCache:
    """Per node, its status entry of the last :func:`node_statuses` call and what it was
    computed from: the unit, the node's document, the placements on the node (in result
    order) and their services. A node's inventories are its own capacities with its own
    placements reserved again, so while all of these are equal its entry is the same. When
    the next call's result says what changed since this call's (a watcher's balance memo),
    only the nodes :func:`_stale_nodes` names are compared; the others keep their entries."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[_NodeKey, dict[str, Any]]] = {}
        self.recomputed = 0  # in the last call: nodes whose entry was computed again
        self.looked = 0  # in the last call: nodes whose inputs were compared with the last
        # status_bytes: each node entry's and each instance record's pretty JSON
        self._node_fragments: dict[str, tuple[dict[str, Any], bytes]] = {}
        self._instance_fragments: dict[str, tuple[InstanceKey, bytes, dict[str, Any]]] = {}
        self._instance_order: list[str] = []  # the fragments' ids, sorted
        self._records: dict[str, dict[str, Any]] = {}  # each instance's record, result order
        # (the joined sections are not kept: 7 MB each at 20,000 instances, and a run that
        # changes nothing, the only one a kept join would serve, joins them in a few ms)
        # the actual states the last status_bytes call read (the view's mapping, which a load
        # replaces rather than edits) and what _observed made of them
        self._observed: tuple[Mapping[str, Any], dict[str, tuple[str, ActualInstance]]] | None
        self._observed = None
        # what the last node_statuses call was given, to tell which nodes the next one must
        # look at (_stale_nodes), and its entries' node ids in order
        self._basis: _Basis | None = None
        self._sorted: list[str] = []
        # what the last status_bytes call's instance records were made from: its result,
        # observed states and allocations (see _changed_instances)
        self._made_from: tuple[BalanceResult, object, object] | None = None
        self.remade = 0  # in the last call: instances whose inputs were compared


@dataclass(frozen=True, slots=True)
class _Basis:
    result: BalanceResult
    unit: UnitConfig | None
    services: Mapping[tuple[str, str], Service]  # the view's mapping itself
    revision: int  # the view's
    nodes: dict[str, Node]  # the nodes given, by id


def _stale_nodes(
    basis: _Basis, view: StateView, result: BalanceResult, by_id: Mapping[str, Node]
) -> set[str] | None:
    """The ids of the nodes whose entry may differ from the last call's (a superset), from
    what names the changes: the nodes whose object is not the last call's, the nodes of the
    instances the balance says changed (before and after) and of every instance of a service
    that is not the last call's object (told by the loads when their changes count from the
    last call's view, else found by identity). None when that cannot be told: another unit,
    another set of nodes, or a result that does not say what changed since the last one."""
    if view.unit is not basis.unit or by_id.keys() != basis.nodes.keys():
        return None
    changed = result.changed_since(basis.result)
    if changed is None:
        return None
    last_nodes = basis.nodes
    stale = {node_id for node_id, node in by_id.items() if last_nodes[node_id] is not node}
    before, now = basis.result.by_id, result.by_id

    def add_nodes_of(iids: Iterable[str]) -> None:  # (where each was and is)
        for iid in iids:
            for p in (before.get(iid), now.get(iid)):
                if p is not None:
                    stale.add(p.node_id)

    add_nodes_of(changed)
    services, last_services = view.services, basis.services
    if services is last_services:
        return stale
    told = view.changes
    if told is not None and told.counts_from(basis.revision):
        keys: Iterable[tuple[str, str]] = told.services
    else:
        keys = [
            k
            for k in services.keys() | last_services.keys()
            if services.get(k) is not last_services.get(k)
        ]
    for key in keys:
        both = (last_services.get(key), services.get(key))
        counts = [s.instances for s in both if s is not None]
        add_nodes_of(instance_ids(key[0], key[1], 0, max(counts, default=0)))
    return stale


def _changed_instances(
    made_from: tuple[BalanceResult, object, object],
    result: BalanceResult,
    observed: object,
    allocations: object,
    since: tuple[Mapping[str, Allocation], frozenset[str]] | None,
) -> set[str] | None:
    """The ids whose status record may differ from the last call's (a superset): those the
    balance says changed and those whose allocation is not the last call's object, while
    the observed states are the last call's very mapping. None when that cannot be told."""
    last_result, last_observed, last_allocations = made_from
    if observed is not last_observed:
        return None
    changed = result.changed_since(last_result)
    if changed is None:
        return None
    if allocations is last_allocations:
        return set(changed)
    if since is None or since[0] is not last_allocations:
        return None
    return set(changed) | since[1]


def node_statuses(
    view: StateView,
    result: BalanceResult,
    cache: NodeStatusCache | None = None,
    nodes: Sequence[Node] | None = None,
    states: Callable[[], Mapping[str, NodeSlot] | None] | None = None,
) -> dict[str, dict[str, Any]]:
    """The ``nodes`` section of the status: every node's inventories with the result's
    placements reserved, by node id. With ``cache``, only the nodes whose inputs changed since
    the cache's last call are replayed. ``nodes``: the nodes as the balancer saw them (one
    whose report is too old marked disconnected), else the view's. ``states``: gives the
    balance's own final node states (of these nodes, with the result reserved), or None; the
    nodes to compute are read from them instead of a replay of the result."""
    every = list(view.nodes.values()) if nodes is None else list(nodes)
    if cache is None:
        got = states() if states is not None else None
        slots = (
            got
            if got is not None
            else node_states(view.unit, every, view.services_sorted(), result)
        )
        return {node_id: _node_status(slots[node_id]) for node_id in sorted(slots)}
    by_id = {node.id: node for node in every}
    basis = cache._basis
    named = _stale_nodes(basis, view, result, by_id) if basis is not None else None
    cache._basis = _Basis(result, view.unit, view.services, view.revision, by_id)
    services = view.services  # (keyed by each service's key, as the loader makes it)
    on_node: dict[str, list[Placement]] = {}
    if named is None:
        for p in result.placements:
            on_node.setdefault(p.node_id, []).append(p)
    elif named:  # (only the nodes named: the others' keys and entries are the last call's)
        for p in result.placements:
            if p.node_id in named:
                on_node.setdefault(p.node_id, []).append(p)
    keys: dict[str, _NodeKey] = {}
    stale: list[Node] = []
    for node in every if named is None else [by_id[n] for n in sorted(named)]:
        placed = tuple(on_node.get(node.id, ()))
        key: _NodeKey = (
            view.unit,
            node,
            placed,
            tuple(services.get((p.item_id, p.subject_id)) for p in placed),
        )
        keys[node.id] = key
        old = cache._entries.get(node.id)
        if old is None or old[0] != key:
            stale.append(node)
    fresh: dict[str, dict[str, Any]] = {}
    final = states() if stale and states is not None else None
    if final is not None:
        fresh = {n.id: _node_status(final[n.id]) for n in stale}
    elif stale:
        stale_ids = {n.id for n in stale}
        placements = tuple(p for p in result.placements if p.node_id in stale_ids)
        needed = {(p.item_id, p.subject_id) for p in placements}
        slots = node_states(
            view.unit,
            stale,
            [s for s in view.services_sorted() if s.key in needed],
            BalanceResult(placements, (), frozenset(), held=result.held),
        )
        fresh = {node_id: _node_status(slot) for node_id, slot in slots.items()}
    made = {
        node_id: (key, fresh[node_id] if node_id in fresh else cache._entries[node_id][1])
        for node_id, key in keys.items()
    }
    if named is None:
        cache._entries = entries = made
        cache._sorted = sorted(entries)
    else:  # the same nodes: the last call's entries, those named made again
        entries = cache._entries
        entries.update(made)
    cache.recomputed, cache.looked = len(fresh), len(keys)
    return {node_id: entries[node_id][1] for node_id in cache._sorted}


def _observed(view: StateView) -> dict[str, tuple[str, ActualInstance]]:
    """Per instance id, the node an agent reports it on and its record there."""
    observed: dict[str, tuple[str, ActualInstance]] = {}
    for node_id, doc in view.actual.items():
        for iid, inst in doc.instances.items():
            observed[iid] = (node_id, inst)
    return observed


def _state(p: Placement, observed: Mapping[str, tuple[str, ActualInstance]]) -> Observed:
    seen = observed.get(p.instance_id)
    return (seen[1].state, seen[1]) if seen is not None and seen[0] == p.node_id else _PENDING


_PENDING: Observed = ("pending", None)


def _instance_record(p: Placement, seen: Observed, ids: tuple[int, int] | None) -> dict[str, Any]:
    state, inst = seen
    record: dict[str, Any] = {
        "itemId": p.item_id,
        "subjectId": p.subject_id,
        "index": p.index,
        "version": p.version,
        "priority": p.priority,
        "nodeId": p.node_id,
        "runtimeId": p.runtime_id,
        "devices": {r: list(ids) for r, ids in p.devices},
        "resources": list(p.resources),
        "state": state,
    }
    if inst is not None:  # what its agent reports beyond the state (only when there is any)
        if inst.restartCount:
            record["restartCount"] = inst.restartCount
        if inst.lastExit is not None:
            record["lastExit"] = inst.lastExit.model_dump(mode="json")
        if inst.reason is not None:
            record["reason"] = inst.reason
    if p.unhealthy_devices:
        record["unhealthyDevices"] = list(p.unhealthy_devices)
    if ids is not None:
        record["uid"], record["gid"] = ids
    return record


def _invalid(diagnostics: Sequence[Diagnostic]) -> dict[str, list[dict[str, Any]]]:
    invalid: dict[str, list[dict[str, Any]]] = {}
    for d in diagnostics:
        invalid.setdefault(d.path, []).append(d.to_json())
    return {path: invalid[path] for path in sorted(invalid)}


def build_status(
    view: StateView,
    result: BalanceResult,
    slots: Mapping[str, NodeSlot] | None,
    diagnostics: Sequence[Diagnostic],
    *,
    alerts: Sequence[Mapping[str, Any]] = (),
    uids: Mapping[str, tuple[int, int]] | None = None,
    cache: NodeStatusCache | None = None,
) -> dict[str, Any]:
    """The status document; ``slots`` None: the node states are derived here (see
    :func:`node_statuses`, which ``cache`` is given to)."""
    if slots is None:
        nodes = node_statuses(view, result, cache)
    else:
        nodes = {node_id: _node_status(slots[node_id]) for node_id in sorted(slots)}
    observed = _observed(view)
    ids = uids or {}
    instances = {
        p.instance_id: _instance_record(p, _state(p, observed), ids.get(p.instance_id))
        for p in result.placements
    }
    return {
        "formatVersion": STATUS_FORMAT_VERSION,
        "nodes": nodes,
        "instances": instances,
        "failures": [failure_json(f) for f in result.failures],
        "alerts": list(alerts),
        "invalidInputs": _invalid(diagnostics),
    }


def status_bytes(
    view: StateView,
    result: BalanceResult,
    diagnostics: Sequence[Diagnostic],
    *,
    alerts: Sequence[Mapping[str, Any]] = (),
    uids: Mapping[str, tuple[int, int]] | None = None,
    cache: NodeStatusCache,
    nodes: Sequence[Node] | None = None,
    states: Callable[[], Mapping[str, NodeSlot] | None] | None = None,
) -> bytes:
    """``pretty_json(build_status(view, result, None, diagnostics, ...))``, put together from
    the pieces (:func:`jsonio.member`) of the nodes and instances ``cache`` holds while their
    inputs are the same (a node's entry object, an instance's placement object, state, ids).
    ``nodes``, ``states``: see :func:`node_statuses`."""
    entries = node_statuses(view, result, cache, nodes, states)
    old_nodes, old_instances = cache._node_fragments, cache._instance_fragments
    node_frags: dict[str, tuple[dict[str, Any], bytes]] = {}
    for node_id, entry in entries.items():
        got = old_nodes.get(node_id)
        if got is None or got[0] is not entry:
            got = (entry, member(node_id, fragment(entry, 2), 1))
        node_frags[node_id] = got
    last = cache._observed
    if last is not None and last[0] is view.actual:
        observed = last[1]  # (read only)
    else:
        observed = _observed(view)
        cache._observed = (view.actual, observed)
    ids = uids or {}
    made_from = cache._made_from
    allocations = uids.allocations if isinstance(uids, AllocationIds) else uids
    since = uids.since if isinstance(uids, AllocationIds) else None
    named = (
        _changed_instances(made_from, result, observed, allocations, since)
        if made_from is not None
        else None
    )
    cache._made_from = (result, observed, allocations)
    if named is None:
        instance_frags: dict[str, tuple[InstanceKey, bytes, dict[str, Any]]] = {}
        records: dict[str, dict[str, Any]] = {}
        for p in result.placements:
            iid = p.instance_id
            key: InstanceKey = (p, _state(p, observed), ids.get(iid))
            known = old_instances.get(iid)
            if known is None or known[0][0] is not p or known[0][1:] != key[1:]:
                record = _instance_record(p, key[1], key[2])
                known = (key, member(iid, fragment(record, 2), 1), record)
            instance_frags[iid] = known
            records[iid] = known[2]
        if instance_frags.keys() != old_instances.keys():
            cache._instance_order = sorted(instance_frags)
        cache._records = records
        cache.remade = len(instance_frags)
    else:  # only the instances named: the others' records are the last call's
        instance_frags = dict(old_instances) if named else old_instances
        added: list[str] = []
        removed: list[str] = []
        by_id = result.by_id
        for iid in named:
            placed = by_id.get(iid)
            if placed is None:
                if instance_frags.pop(iid, None) is not None:
                    removed.append(iid)
                continue
            key = (placed, _state(placed, observed), ids.get(iid))
            known = old_instances.get(iid)
            if known is None:
                added.append(iid)
            if known is None or known[0][0] is not placed or known[0][1:] != key[1:]:
                record = _instance_record(placed, key[1], key[2])
                known = (key, member(iid, fragment(record, 2), 1), record)
            instance_frags[iid] = known
        if 64 * (len(added) + len(removed)) > len(instance_frags):
            cache._instance_order = sorted(instance_frags)
        elif added or removed:
            order = list(cache._instance_order)
            for iid in removed:
                del order[bisect_left(order, iid)]
            for iid in added:
                insort(order, iid)
            cache._instance_order = order
        if named:  # (the page's records in the result's order, as a full pass makes them)
            cache._records = {
                p.instance_id: instance_frags[p.instance_id][2] for p in result.placements
            }
        cache.remade = len(named)
    cache._node_fragments, cache._instance_fragments = node_frags, instance_frags
    instances = [instance_frags[i][1] for i in cache._instance_order]
    members = [
        ("alerts", fragment(list(alerts), 1)),
        ("failures", fragment([failure_json(f) for f in result.failures], 1)),
        ("formatVersion", fragment(STATUS_FORMAT_VERSION, 1)),
        ("instances", join_object(instances, 1)),
        ("invalidInputs", fragment(_invalid(diagnostics), 1)),
        ("nodes", join_object([node_frags[n][1] for n in sorted(node_frags)], 1)),
    ]
    return document(members)


def cached_status(
    cache: NodeStatusCache,
    result: BalanceResult,
    diagnostics: Sequence[Diagnostic],
    *,
    alerts: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The status document the last :func:`status_bytes` call with ``cache`` (and these
    arguments) wrote, as a value: ``build_status``'s, made of the node entries and instance
    records ``cache`` holds (the same objects while their inputs are the same, which lets the
    status page reuse what it made of them)."""
    return {
        "formatVersion": STATUS_FORMAT_VERSION,
        "nodes": {n: entry for n, (entry, _) in cache._node_fragments.items()},  # sorted
        "instances": cache._records,  # (in the result's order, not sorted)
        "failures": [failure_json(f) for f in result.failures],
        "alerts": list(alerts),
        "invalidInputs": _invalid(diagnostics),
    }
