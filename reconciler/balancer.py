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

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from sortedcontainers import SortedList

from .filters import (
    DYNAMIC_NODE_FILTERS,
    DYNAMIC_RUNTIME_FILTERS,
    FILTER_CODES,
    NO_NODES,
    NODE_FILTERS,
    RUNTIME_FILTERS,
    STATIC_NODE_FILTERS,
    STATIC_RUNTIME_FILTERS,
)
from .inventory import Inventory
from .models import (
    ImagePlatform,
    Node,
    NodeConfig,
    ResourceRatios,
    Runtime,
    Service,
    UnitConfig,
)
from .placement import (
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
)
from .sharing import REGISTRY, ShareRequest
from .sharing.base import Item, PoolState

__all__ = [
    "Ask",
    "Explanation",
    "NodeSlot",
    "Overload",
    "RuntimeSlot",
    "balance",
    "explain",
    "node_states",
    "requested_amounts",
]

_DEFAULT_RATIOS = ResourceRatios()
_DEFAULT_CONFIG_PRIORITY = 0

Overload = Mapping[str, frozenset[str]]
"""Per node id, the resources (``cpu``, ``ram``) whose alert is raised (SPEC §8)."""


def _round_half_up(numerator: int, denominator: int) -> int:
    return (2 * numerator + denominator) // (2 * denominator)


def requested_amounts(
    service: Service,
    ratios: ResourceRatios,
    measured: tuple[int, int] | None = None,
) -> Requested:
    """SPEC §7.2 for one candidate node's ratios; ``measured`` (cpu, ram) raises cpu and ram
    on an overloaded node during a rebalance."""
    if service.skipResourceLimits:
        return Requested()
    req, quotas = service.requestedResources, service.quotas
    limits = {
        "cpu": quotas.cpuDMIPSLimit,
        "ram": quotas.ramLimit,
        "storage": quotas.storageLimit,
        "state": quotas.stateLimit,
    }
    out: dict[str, int] = {}
    for key, limit in limits.items():
        asked: int | None = getattr(req, key)
        if asked is not None:
            out[key] = min(asked, limit) if limit is not None else asked
        elif limit is not None:
            out[key] = _round_half_up(limit * getattr(ratios, key), 100)
        else:
            out[key] = 0
    if measured is not None:
        out["cpu"] = max(out["cpu"], measured[0])
        out["ram"] = max(out["ram"], measured[1])
    return Requested(**out)


# ----------------------------------------------------------------------------- node state


@dataclass
class RuntimeSlot:
    runtime: Runtime
    slots: Inventory | None  # None: unlimited instances
    cpu: Inventory | None  # the runtime's own pool (allowedDMIPS), else None
    ram: Inventory | None


@dataclass
class Reservation:
    instance: Instance
    runtime_index: int
    requested: Requested
    resources: tuple[str, ...]
    devices: DeviceIds
    device_requests: tuple[ShareRequest, ...]
    cause: Cause | None = None


@dataclass
class NodeSlot:
    """One node's working state during a balance call."""

    node: Node
    id: str
    priority: int
    labels: frozenset[str]
    ratios: ResourceRatios
    cpu: Inventory
    ram: Inventory
    runtimes: list[RuntimeSlot]  # sorted by (type, id)
    partitions: dict[str, Inventory]
    partition_of: dict[str, str]  # "storages"/"states" -> partition name
    resources: dict[str, PoolState]
    pools: dict[str, PoolState]
    placed: dict[str, Reservation] = field(default_factory=dict)
    overloaded: frozenset[str] = frozenset()
    request_key: tuple[int, int, int, int, bool] = (50, 50, 50, 50, False)
    version: int = 0  # bumped by every reservation and release on this node

    def __post_init__(self) -> None:
        r = self.ratios
        self.request_key = (r.cpu, r.ram, r.storage, r.state, bool(self.overloaded))

    def partition_key(self, kind: str) -> str | None:
        return self.partition_of.get(kind)

    def partition(self, kind: str) -> Inventory | None:
        key = self.partition_of.get(kind)
        return self.partitions[key] if key is not None else None

    def clone(self) -> NodeSlot:
        new = copy.copy(self)
        new.runtimes = [copy.copy(r) for r in self.runtimes]
        new.partitions = dict(self.partitions)
        new.resources = dict(self.resources)
        new.pools = dict(self.pools)
        new.placed = dict(self.placed)
        return new


def _node_config(unit: UnitConfig | None, node: Node) -> NodeConfig | None:
    return unit.config_for(node.id, node.type) if unit is not None else None


def _make_slot(unit: UnitConfig | None, node: Node, overload: frozenset[str]) -> NodeSlot:
    cfg = _node_config(unit, node)
    usage = node.usage
    own_cpu = sum(u.cpu for u in usage.instances.values()) if usage else 0
    own_ram = sum(u.ram for u in usage.instances.values()) if usage else 0
    sys_cpu = max(0, usage.cpu - own_cpu) if usage else 0
    sys_ram = max(0, usage.ram - own_ram) if usage else 0
    cpu_base, ram_base = node.maxDMIPS, node.totalRAM
    rules = cfg.alertRules if cfg is not None else None
    if "cpu" in overload and rules is not None and rules.cpu is not None:
        cpu_base = node.maxDMIPS * rules.cpu.minThreshold // 100
    if "ram" in overload and rules is not None and rules.ram is not None:
        ram_base = node.totalRAM * rules.ram.minThreshold // 100
    runtimes = []
    for rt in sorted(node.runtimes, key=lambda r: (r.type, r.id)):
        runtimes.append(
            RuntimeSlot(
                rt,
                Inventory.simple(f"{rt.id}/instances", rt.maxInstances)
                if rt.maxInstances
                else None,
                Inventory.simple(f"{rt.id}/cpu", rt.allowedDMIPS)
                if rt.allowedDMIPS is not None
                else None,
                Inventory.simple(f"{rt.id}/ram", rt.allowedRAM)
                if rt.allowedRAM is not None
                else None,
            )
        )
    partitions: dict[str, Inventory] = {}
    partition_of: dict[str, str] = {}
    for part in node.partitions:
        for kind in ("storages", "states"):
            if kind in part.types and kind not in partition_of:
                partition_of[kind] = part.name
                partitions[part.name] = Inventory.simple(part.name, part.totalSize)
    shared = REGISTRY["shared-count"]
    resources = {
        r.name: shared.new_state(r.name, (Item(r.name),), r.sharedCount)
        for r in node.host_resources
    }
    pools = {
        p.resource: REGISTRY[p.policy].new_state(
            p.resource, tuple(Item(d.id, d.healthy, d.memory) for d in p.devices)
        )
        for p in node.devicePools
    }
    return NodeSlot(
        node=node,
        id=node.id,
        priority=cfg.priority if cfg is not None else _DEFAULT_CONFIG_PRIORITY,
        labels=frozenset(cfg.labels) if cfg is not None else frozenset(),
        ratios=cfg.resourceRatios if cfg is not None else _DEFAULT_RATIOS,
        cpu=Inventory.simple("cpu", max(0, cpu_base - sys_cpu)),
        ram=Inventory.simple("ram", max(0, ram_base - sys_ram)),
        runtimes=runtimes,
        partitions=partitions,
        partition_of=partition_of,
        resources=resources,
        pools=pools,
        overloaded=overload,
    )


# ----------------------------------------------------------------------------- what is asked


@dataclass
class Ask:
    """What one instance asks of a candidate node (the same for every instance of a service,
    except what pass 1 keeps)."""

    instance: Instance
    labels: frozenset[str]
    runtimes: frozenset[str]
    node_id: str | None
    platform: ImagePlatform | None
    resources: tuple[ShareRequest, ...]
    devices: tuple[ShareRequest, ...]
    keep_runtime: str | None = None
    keep_devices: dict[str, tuple[str, ...]] = field(default_factory=dict)
    usage: tuple[int, int] | None = None  # measured (cpu, ram) of this instance
    cause: Cause | None = None  # recorded with the reservation
    _cache: dict[tuple[int, int, int, int, bool], Requested] = field(default_factory=dict)

    def requested(self, slot: NodeSlot) -> Requested:
        """SPEC §7.2 on ``slot`` (cached per ratios and overload)."""
        key = slot.request_key
        got = self._cache.get(key)
        if got is None:
            measured = self.usage if key[4] else None
            got = requested_amounts(self.instance.service, slot.ratios, measured)
            self._cache[key] = got
        return got


def _ask_for(instance: Instance, usage: Mapping[str, tuple[int, int]]) -> Ask:
    s = instance.service
    return Ask(
        instance=instance,
        labels=frozenset(s.labels),
        runtimes=frozenset(s.runtimes),
        node_id=s.nodeId,
        platform=s.image.platform,
        resources=tuple(ShareRequest(r.name) for r in s.resources),
        devices=tuple(
            ShareRequest(d.resource, d.count or 1, d.memory)
            for d in sorted(s.devices, key=lambda d: d.resource)
        ),
        usage=usage.get(instance.id),
    )


# ----------------------------------------------------------------------------- the pipeline


@dataclass(frozen=True)
class Verdict:
    """The pipeline's answer for one node: survivors, or the code that dropped it."""

    runtimes: tuple[int, ...]  # indexes into slot.runtimes that survived
    dropped_by: str | None
    detail: str = ""


def evaluate(slot: NodeSlot, ask: Ask) -> Verdict:
    for nf in NODE_FILTERS:
        why = nf.check(slot, ask)
        if why is not None:
            return Verdict((), nf.name, why)
    alive = list(range(len(slot.runtimes)))
    if not alive:
        return Verdict((), RUNTIME_FILTERS[0].name, "the node has no runtimes")
    for rf in RUNTIME_FILTERS:
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
    return (-slot.priority, -slot.cpu.free, -slot.ram.free, slot.id)


def _reserve(slot: NodeSlot, ask: Ask, runtime_index: int) -> Reservation:
    """Take everything the instance needs on ``slot`` at once, or raise and change nothing."""
    req = ask.requested(slot)
    rt = slot.runtimes[runtime_index]
    new_rt = copy.copy(rt)
    if rt.cpu is not None:
        new_rt.cpu = rt.cpu.consume(req.cpu)
        new_cpu = slot.cpu
    else:
        new_cpu = slot.cpu.consume(req.cpu)
    if rt.ram is not None:
        new_rt.ram = rt.ram.consume(req.ram)
        new_ram = slot.ram
    else:
        new_ram = slot.ram.consume(req.ram)
    if rt.slots is not None:
        new_rt.slots = rt.slots.consume(1)
    partitions = dict(slot.partitions)
    for kind, amount in (("storages", req.storage), ("states", req.state)):
        key = slot.partition_of.get(kind)
        if amount and key is None:
            raise ValueError(f"no partition typed {kind}")
        if key is not None:
            partitions[key] = partitions[key].consume(amount)
    shared = REGISTRY["shared-count"]
    resources = dict(slot.resources)
    for r in ask.resources:
        resources[r.resource], _ = shared.allocate(resources[r.resource], r)
    pools = dict(slot.pools)
    devices: list[tuple[str, tuple[str, ...]]] = []
    for d in ask.devices:
        state = pools[d.resource]
        pools[d.resource], ids = REGISTRY[state.policy].allocate(
            state, d, ask.keep_devices.get(d.resource, ())
        )
        devices.append((d.resource, tuple(sorted(ids))))
    # everything succeeded: commit
    slot.cpu, slot.ram = new_cpu, new_ram
    slot.runtimes[runtime_index] = new_rt
    slot.partitions, slot.resources, slot.pools = partitions, resources, pools
    res = Reservation(
        ask.instance,
        runtime_index,
        req,
        tuple(r.resource for r in ask.resources),
        tuple(devices),
        ask.devices,
        ask.cause,
    )
    slot.placed[ask.instance.id] = res
    return res


def _release(slot: NodeSlot, iid: str) -> Reservation:
    res = slot.placed.pop(iid)
    req = res.requested
    rt = copy.copy(slot.runtimes[res.runtime_index])
    if rt.cpu is not None:
        rt.cpu = rt.cpu.release(req.cpu)
    else:
        slot.cpu = slot.cpu.release(req.cpu)
    if rt.ram is not None:
        rt.ram = rt.ram.release(req.ram)
    else:
        slot.ram = slot.ram.release(req.ram)
    if rt.slots is not None:
        rt.slots = rt.slots.release(1)
    slot.runtimes[res.runtime_index] = rt
    partitions = dict(slot.partitions)
    for kind, amount in (("storages", req.storage), ("states", req.state)):
        key = slot.partition_of.get(kind)
        if key is not None:
            partitions[key] = partitions[key].release(amount)
    slot.partitions = partitions
    shared = REGISTRY["shared-count"]
    resources = dict(slot.resources)
    for name in res.resources:
        resources[name] = shared.release(resources[name], ShareRequest(name), (name,))
    slot.resources = resources
    pools = dict(slot.pools)
    for d, (_, ids) in zip(res.device_requests, res.devices, strict=True):
        state = pools[d.resource]
        pools[d.resource] = REGISTRY[state.policy].release(state, d, ids)
    slot.pools = pools
    return res


def _best_runtime(slot: NodeSlot, verdict: Verdict) -> int:
    """Runtimes are sorted by (type, id), so the first survivor is the smallest."""
    return verdict.runtimes[0]


def _summarize(instance: Instance, n_nodes: int, charges: Iterable[str]) -> Failure:
    counts: dict[str, int] = {}
    for code in charges:
        counts[code] = counts.get(code, 0) + 1
    ordered = tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    reason = max(counts, key=FILTER_CODES.index) if counts else NO_NODES
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


def _class_key(slot: NodeSlot) -> tuple[object, ...]:
    """Nodes with equal keys answer every static filter alike (Nomad's computed class)."""
    node = slot.node
    return (
        slot.priority,
        node.state,
        node.connected,
        slot.labels,
        tuple((rt.runtime.id, rt.runtime.type, rt.runtime.platform) for rt in slot.runtimes),
        slot.request_key,
    )


def _entry(slot: NodeSlot) -> tuple[int, int, str]:
    """A node's position in its class index: most free CPU, then RAM, then smallest id."""
    return (-slot.cpu.free, -slot.ram.free, slot.id)


def _static_runtimes(slot: NodeSlot, ask: Ask) -> tuple[int, ...]:
    """Runtimes passing every static filter (empty when a static node filter fails)."""
    for nf in STATIC_NODE_FILTERS:
        if nf.check(slot, ask) is not None:
            return ()
    return tuple(
        i
        for i, rt in enumerate(slot.runtimes)
        if all(rf.check(slot, rt, ask) is None for rf in STATIC_RUNTIME_FILTERS)
    )


def _dynamic_runtime(slot: NodeSlot, ask: Ask, runtimes: tuple[int, ...]) -> int | None:
    """The smallest runtime (by type, id) among ``runtimes`` passing every dynamic filter."""
    for nf in DYNAMIC_NODE_FILTERS:
        if nf.check(slot, ask) is not None:
            return None
    for i in runtimes:
        rt = slot.runtimes[i]
        for rf in DYNAMIC_RUNTIME_FILTERS:
            if rf.check(slot, rt, ask) is not None:
                break
        else:
            return i
    return None


class _Run:
    """The working state of one balance call.

    Pass 2 does not scan every node for every instance: nodes are grouped in classes of equal
    static answers, each class keeps its nodes sorted by the choice order of SPEC §7.5, and a
    service remembers the nodes its dynamic filters refused. Reservations only shrink what is
    free, so a refused node stays refused until something is released (preemption), which
    forgets those memories. The result is exactly that of evaluating every node
    (:meth:`place_by_scan`, kept for tests and explanations).
    """

    def __init__(
        self,
        unit: UnitConfig | None,
        nodes: Sequence[Node],
        overload: Overload,
        cause: Cause | None = None,
    ) -> None:
        self.cause = cause  # recorded with every placement of pass 2 and 3
        self.slots = {
            n.id: _make_slot(unit, n, overload.get(n.id, frozenset()))
            for n in sorted(nodes, key=lambda n: n.id)
        }
        self.order = sorted(self.slots.values(), key=lambda s: s.id)
        self.usage: dict[str, tuple[int, int]] = {}
        for n in nodes:
            if n.usage is not None:
                for iid, u in n.usage.instances.items():
                    self.usage[iid] = (u.cpu, u.ram)
        self.where: dict[str, str] = {}  # instance id -> node id
        class_ids: dict[tuple[object, ...], int] = {}
        self.class_of: dict[str, int] = {}
        self.index: list[SortedList] = []
        self.class_slot: list[NodeSlot] = []  # a representative per class
        for slot in self.order:
            key = _class_key(slot)
            cid = class_ids.get(key)
            if cid is None:
                cid = class_ids[key] = len(self.index)
                self.index.append(SortedList())
                self.class_slot.append(slot)
            self.class_of[slot.id] = cid
            self.index[cid].add(_entry(slot))
        by_priority: dict[int, list[int]] = {}
        for cid, rep in enumerate(self.class_slot):
            by_priority.setdefault(rep.priority, []).append(cid)
        self.levels = [by_priority[p] for p in sorted(by_priority, reverse=True)]
        self.static: dict[tuple[tuple[str, str], int], tuple[int, ...]] = {}
        self.refused: dict[object, set[str]] = {}
        # the dynamic answer per (group, node) at a node version: a node that did not change
        # since it was last checked for this group answers the same
        self.answers: dict[tuple[object, str], tuple[int, int]] = {}
        self.failed: set[object] = set()  # groups that found no node (until a release)

    def ask(self, instance: Instance) -> Ask:
        ask = _ask_for(instance, self.usage)
        ask.cause = self.cause
        return ask

    def reserve(self, slot: NodeSlot, ask: Ask, runtime_index: int) -> None:
        index = self.index[self.class_of[slot.id]]
        index.remove(_entry(slot))
        try:
            _reserve(slot, ask, runtime_index)
        finally:
            index.add(_entry(slot))
            slot.version += 1
        self.where[ask.instance.id] = slot.id

    def release(self, slot: NodeSlot, iid: str) -> None:
        index = self.index[self.class_of[slot.id]]
        index.remove(_entry(slot))
        _release(slot, iid)
        index.add(_entry(slot))
        slot.version += 1
        del self.where[iid]
        self.refused.clear()  # something became free: forget what was refused
        self.failed.clear()

    def place(self, instance: Instance, cause: Cause | None = None) -> bool:
        """Pass 2: the best feasible node by SPEC §7.5; reserve on it. False: none fits."""
        ask = self.ask(instance)
        ask.cause = cause or self.cause
        group: object = (instance.service.key, ask.usage)
        if group in self.failed:
            return False
        found: tuple[tuple[int, int, str], int] | None = None
        if ask.node_id is not None:
            slot = self.slots.get(ask.node_id)
            if slot is not None:
                verdict = evaluate(slot, ask)
                if verdict.dropped_by is None:
                    found = (_entry(slot), verdict.runtimes[0])
        else:
            refused = self.refused.setdefault(group, set())
            for level in self.levels:
                for cid in level:
                    skey = (instance.service.key, cid)
                    runtimes = self.static.get(skey)
                    if runtimes is None:
                        runtimes = self.static[skey] = _static_runtimes(self.class_slot[cid], ask)
                    if not runtimes:
                        continue
                    for entry in self.index[cid]:
                        if found is not None and entry >= found[0]:
                            break
                        node_id = entry[2]
                        if node_id in refused:
                            continue
                        slot = self.slots[node_id]
                        known_answer = self.answers.get((group, node_id))
                        if known_answer is not None and known_answer[0] == slot.version:
                            found = (entry, known_answer[1])
                            break
                        answer = _dynamic_runtime(slot, ask, runtimes)
                        if answer is None:
                            refused.add(node_id)
                            continue
                        self.answers[(group, node_id)] = (slot.version, answer)
                        found = (entry, answer)
                        break
                if found is not None:
                    break
        if found is None:
            self.failed.add(group)
            return False
        self.reserve(self.slots[found[0][2]], ask, found[1])
        return True

    def place_by_scan(self, instance: Instance, cause: Cause | None = None) -> bool:
        """Pass 2 by evaluating every filter on every node (the reference for tests)."""
        ask = self.ask(instance)
        ask.cause = cause or self.cause
        best: tuple[tuple[int, int, int, str], NodeSlot, Verdict] | None = None
        for slot in self.order:
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

    def summarize(self, instance: Instance, ask: Ask) -> Failure:
        charges = [evaluate(slot, ask).dropped_by for slot in self.order]
        return _summarize(instance, len(self.order), (c for c in charges if c is not None))

    def failures(self, instances: Sequence[Instance]) -> tuple[Failure, ...]:
        """SPEC §7.7 for every instance left unplaced, against the final node states; the
        instances of one service (with equal measured usage) are charged alike."""
        charged: dict[object, tuple[str, tuple[tuple[str, int], ...]]] = {}
        out = []
        for inst in instances:
            if inst.id in self.where:
                continue
            ask = self.ask(inst)
            group: object = (inst.service.key, ask.usage)
            known = charged.get(group)
            if known is None:
                f = self.summarize(inst, ask)
                charged[group] = (f.reason, f.counts)
            else:
                f = _failure(inst, len(self.order), *known)
            out.append(f)
        return tuple(out)

    def keep(self, instance: Instance, prev: PreviousAllocation) -> bool:
        """Pass 1: keep the previous node, runtime and devices if the filters still pass."""
        slot = self.slots.get(prev.node_id)
        if slot is None:
            return False
        ask = self.ask(instance)
        ask.keep_runtime = prev.runtime_id
        ask.cause = prev.cause
        prev_devices = dict(prev.devices)
        if set(prev_devices) != {d.resource for d in ask.devices}:
            return False
        ask.keep_devices = prev_devices
        verdict = evaluate(slot, ask)
        if verdict.dropped_by is not None:
            return False
        self.reserve(slot, ask, verdict.runtimes[0])
        return True

    def preempt(self, instance: Instance) -> list[str] | None:
        """Pass 3: evict strictly lower-priority instances from the one node where that is
        cheapest; returns the victims' ids, or None when no node helps."""
        ask = self.ask(instance)
        best: tuple[tuple[int, tuple[int, ...], str], str, list[str]] | None = None
        for slot in self.order:
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
                _release(trial, r.instance.id)
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
                    _release(check, v.instance.id)
                if evaluate(check, ask).dropped_by is None:
                    victims = others
            prios = tuple(sorted((v.instance.priority for v in victims), reverse=True))
            key = (len(victims), prios, slot.id)
            if best is None or key < best[0]:
                best = (key, slot.id, [v.instance.id for v in victims])
        if best is None:
            return None
        _, node_id, victim_ids = best
        slot = self.slots[node_id]
        for iid in victim_ids:
            self.release(slot, iid)
        verdict = evaluate(slot, ask)
        assert verdict.dropped_by is None
        self.reserve(slot, ask, _best_runtime(slot, verdict))
        return victim_ids

    def placement(self, instance: Instance) -> Placement:
        slot = self.slots[self.where[instance.id]]
        res = slot.placed[instance.id]
        unhealthy = []
        for resource, ids in res.devices:
            pool = slot.pools[resource]
            unhealthy += [i for i in ids if not pool.by_id[i].healthy]
        return Placement(
            instance.id,
            instance.item_id,
            instance.subject_id,
            instance.index,
            instance.version,
            instance.priority,
            slot.id,
            slot.runtimes[res.runtime_index].runtime.id,
            res.requested,
            res.resources,
            res.devices,
            tuple(sorted(unhealthy)),
            res.cause,
        )


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
) -> BalanceResult:
    """Place every desired instance (SPEC §7); see the module docstring for the passes.

    ``exhaustive`` evaluates every filter on every node for every instance instead of using
    the class indexes: the same result, slowly (the reference the tests compare against).
    """
    if mode is None:
        mode = unit.placement if unit is not None else "stable"
    previous = previous or {}
    instances = expand_instances(sorted(services, key=lambda s: s.key))
    if mode == "rebalance":
        # the rebalance proper: pinned instances first, the rest afresh, on lowered capacity
        core = _Run(unit, nodes, overload or {}, "rebalanced")
        _passes(core, instances, previous, _pinned, preempt=False, exhaustive=exhaustive)
        after = dict(previous)  # what the rebalance could not place falls back to its old place
        for inst in instances:
            if inst.id in core.where:
                p = core.placement(inst)
                old = previous.get(inst.id)
                if old is not None and (old.node_id, old.runtime_id) == (p.node_id, p.runtime_id):
                    p = replace(p, cause=old.cause)  # it did not move
                after[inst.id] = p.previous()
        # ... then one stable run on the real capacities: the state the next run starts from
        run = _Run(unit, nodes, {}, "rebalanced")
        preempted = _passes(run, instances, after, _always, preempt=True, exhaustive=exhaustive)
    elif mode == "fresh":
        run = _Run(unit, nodes, {})
        preempted = _passes(run, instances, {}, _always, preempt=False, exhaustive=exhaustive)
    else:
        run = _Run(unit, nodes, {})
        preempted = _passes(run, instances, previous, _always, preempt=True, exhaustive=exhaustive)
    placements = tuple(run.placement(i) for i in instances if i.id in run.where)
    return BalanceResult(placements, run.failures(instances), frozenset(preempted))


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
    exhaustive: bool,
) -> set[str]:
    """Pass 1 (keep the previous place of the instances ``keeps`` selects), pass 2 (place the
    rest in instance order) and, with ``preempt``, pass 3; returns the evicted instances' ids.

    After evictions every instance still unplaced, victims and earlier failures alike, goes
    through pass 2 again in instance order: room a preemption left over is used now, as the
    next run's pass 2 would use it."""
    pending = []
    for inst in instances:
        prev = previous.get(inst.id)
        if prev is not None and keeps(inst) and run.keep(inst, prev):
            continue
        pending.append(inst)
    place = run.place_by_scan if exhaustive else run.place
    failed = [inst for inst in pending if not place(inst)]
    preempted: set[str] = set()
    if not (preempt and failed):
        return preempted
    by_id = {i.id: i for i in instances}
    unplaced = []
    for inst in failed:
        evicted = run.preempt(inst)
        if evicted is None:
            unplaced.append(inst)
            continue
        preempted.update(evicted)
        unplaced.extend(by_id[v] for v in evicted)
    if preempted:
        for inst in sorted(unplaced, key=Instance.order_key):
            place(inst, "preempted" if inst.id in preempted else None)
    return preempted


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
        if p.instance_id == skip or p.instance_id not in instances:
            continue
        ask = run.ask(instances[p.instance_id])
        ask.keep_devices = p.device_map()
        slot = run.slots[p.node_id]
        idx = next(i for i, r in enumerate(slot.runtimes) if r.runtime.id == p.runtime_id)
        run.reserve(slot, ask, idx)
    return run


def node_states(
    unit: UnitConfig | None,
    nodes: Sequence[Node],
    services: Sequence[Service],
    result: BalanceResult,
) -> dict[str, NodeSlot]:
    """Every node's inventories with the result's placements reserved (for status)."""
    return _replay(unit, nodes, services, result).slots


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
    for slot in run.order:
        cells: list[str | None] = [f.check(slot, ask) for f in NODE_FILTERS]
        for rf in RUNTIME_FILTERS:
            reasons = [rf.check(slot, rt, ask) for rt in slot.runtimes]
            ok = any(r is None for r in reasons)
            cells.append(None if ok else (reasons[-1] if reasons else "no runtimes"))
        rows.append((slot.id, tuple(cells), evaluate(slot, ask).dropped_by))
    failure = next((f for f in result.failures if f.instance_id == instance_id), None)
    return Explanation(instance, FILTER_CODES, tuple(rows), result.by_id.get(instance_id), failure)
