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

This module holds the semantics. Where pass 1 and 2 look for nodes is a
:class:`~reconciler.placement.search.CandidateSearch`: the exhaustive reference here, the class
index in :mod:`reconciler.accel` (the one the controller uses).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace

from reconciler.model.documents import (
    DeviceRequest,
    Node,
    Quotas,
    RequestedResources,
    ResourceRequest,
    Service,
    UnitConfig,
)
from reconciler.model.gcpause import collector_paused
from reconciler.placement import filters
from reconciler.placement.ask import Ask, RequestInputs, ask_for, request_inputs
from reconciler.placement.instances import (
    BalanceResult,
    Cause,
    Failure,
    Instance,
    Mode,
    Placement,
    PreviousAllocation,
    expand_instances,
    new_instance,
    new_placement,
)
from reconciler.placement.nodestate import (
    NO_KEEP,
    Basics,
    NodeConfigs,
    NodeSlot,
    Occupancy,
    RequestKey,
    Reservation,
    StateCache,
    basics_request_key,
    device_served,
    make_slot,
    node_basics,
    occupancy,
    occupy,
    release_reservation,
    restore_reservation,
    runtime_capacities,
    take,
)
from reconciler.placement.pipeline import (
    best_runtime,
    evaluate,
    failure,
    matrix_drop,
    ordered_counts,
    reason_and_counts,
    summarize,
    unresolvable,
)
from reconciler.placement.search import Exhaustive, SearchFactory

__all__ = [
    "Explanation",
    "Made",
    "Overload",
    "Run",
    "balance",
    "explain",
    "held_spec",
    "node_states",
    "replay",
    "run_balance",
]


Overload = Mapping[str, frozenset[str]]
"""Per node id, the resources (``cpu``, ``ram``) whose alert is raised (SPEC §8)."""

Made = dict[str, tuple[Reservation, Placement]]
"""Per instance id, a placement and the reservation it was made from (``Run.placements``)."""


def held_spec(service: Service, prev: PreviousAllocation, node: Node | None) -> Service | None:
    """``service`` as the instance was given its previous place, for a hold (see
    :meth:`Run.hold`): the recorded version, amounts (requested exactly), named resources and
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


class Run:
    """The working state of one balance call: the node states (built when first looked at),
    the reservations made on them, and the passes. Where pass 1 checks a node and pass 2 looks
    for one is the run's :class:`~reconciler.placement.search.CandidateSearch`; every search
    answers alike, so the result does not depend on which one a caller picks."""

    def __init__(
        self,
        unit: UnitConfig | None,
        nodes: Sequence[Node],
        overload: Overload,
        cause: Cause | None = None,
        *,
        search: SearchFactory = Exhaustive,
    ) -> None:
        self.cause = cause  # recorded with every placement of pass 2 and 3
        empty: frozenset[str] = frozenset()
        self.unit = unit
        self.overload = overload
        self.nodes = {n.id: n for n in sorted(nodes, key=_node_id)}
        # Node states are built on first use (most nodes of a big unit are never looked at);
        # until then a node's choice order and class come from its basics.
        self.slots: dict[str, NodeSlot] = {}
        self.empty_states: StateCache = {}  # shared by the nodes' slots
        self.basics: dict[str, Basics] = {}
        configs = NodeConfigs(unit)
        for node_id, node in self.nodes.items():
            overloaded = overload.get(node_id, empty) if overload else empty
            self.basics[node_id] = node_basics(unit, node, overloaded, configs)
        self.usage: dict[str, tuple[int, int]] = {}
        for n in nodes:
            if n.usage is not None:
                for iid, u in n.usage.instances.items():
                    self.usage[iid] = (u.cpu, u.ram)
        self.overloaded = bool(overload) and any(overload.get(n) for n in self.nodes)
        self.where: dict[str, NodeSlot] = {}  # instance id -> the state of its node
        # instances held where they were (see hold): id -> (the instance as it was given its
        # place, the previous allocation it keeps)
        self.held: dict[str, tuple[Instance, PreviousAllocation]] = {}
        self._tops: dict[RequestKey, tuple[int, int]] | None = None  # (_fits_somewhere_empty)
        self._fits: dict[tuple[RequestInputs, tuple[int, int] | None], bool] = {}
        self.on_slot: Callable[[NodeSlot], None] | None = None
        """Called with each node state built (a search may note what it keeps on it)."""
        self.search = search(self)

    # -- node states

    def slot(self, node_id: str) -> NodeSlot:
        """The state of a node of the unit (KeyError for another id), built on first use."""
        got = self.slots.get(node_id)
        if got is None:
            got = self.slots[node_id] = self.empty_slot(node_id)
            if self.on_slot is not None:
                self.on_slot(got)
        return got

    def empty_slot(self, node_id: str) -> NodeSlot:
        """The state of a node of the unit with nothing reserved, as :meth:`slot` first builds
        it, but not kept: an answer about a node this run has not touched, which leaves it
        untouched."""
        empty: frozenset[str] = frozenset()
        overloaded = self.overload.get(node_id, empty) if self.overload else empty
        node = self.nodes[node_id]
        return make_slot(None, node, overloaded, self.basics[node_id], self.empty_states)

    def all_slots(self) -> list[NodeSlot]:
        """Every node's state, by node id."""
        return [self.slot(node_id) for node_id in self.nodes]

    # -- what is asked

    def ask(self, instance: Instance) -> Ask:
        """What ``instance`` asks (with its measured usage, and the run's cause)."""
        ask = ask_for(instance, self.usage.get(instance.id) if self.usage else None)
        ask.cause = self.cause
        return ask

    def usage_of(self, instance: Instance) -> tuple[int, int] | None:
        """The measured usage that raises what ``instance`` asks in this run (an overloaded
        one), else None."""
        return self.usage.get(instance.id) if self.overloaded and self.usage else None

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
        self.search.moved(slot)

    def release_all(self, iids: Iterable[str]) -> None:
        """Give back the reservation of each of ``iids`` that has a place (the search told
        once per node it moved, and once that something became free)."""
        where, held, moved = self.where, self.held, {}
        for iid in iids:
            slot = where.pop(iid, None)
            if slot is not None:
                release_reservation(slot, iid)
                if held:
                    held.pop(iid, None)
                moved[slot.id] = slot
        for slot in moved.values():
            self.search.moved(slot)
        if moved:
            self.search.freed()

    def renew_usage(self, unit: UnitConfig | None, nodes: Sequence[Node]) -> bool:
        """Take in ``nodes`` that differ from this run's only in their measured usage (and
        report time): each one's CPU and RAM pools get the capacity the new usage leaves
        (SPEC §7.3) with its reservations kept. False (the run is then unusable) when that
        may change what the run's pass 1 kept: a node overloaded, its reservations over the
        new capacity, or a change the search cannot take in."""
        if self.overloaded:
            return False
        configs = NodeConfigs(unit)
        empty: frozenset[str] = frozenset()
        for node in nodes:
            nid = node.id
            old = self.nodes[nid]
            basics = node_basics(unit, node, empty, configs)
            if basics[0] != self.basics[nid][0] or basics[3] is not None:
                return False  # (a node with inventories of its own: a full run)
            if not self.search.renewed(basics):
                return False
            _, cpu, ram, _ = basics
            slot = self.slots.get(nid)
            if slot is not None:
                cpu_pool, ram_pool = slot.cpu_pool, slot.ram_pool
                used_cpu = cpu_pool.capacity - cpu_pool.free
                used_ram = ram_pool.capacity - ram_pool.free
                if used_cpu > cpu or used_ram > ram:
                    return False
                cpu_pool.capacity, cpu_pool.free = cpu, cpu - used_cpu
                ram_pool.capacity, ram_pool.free = ram, ram - used_ram
                slot.node = node
                self.search.moved(slot)
            self.basics[nid] = basics
            self.nodes[nid] = node
            if old.usage is not None:
                for iid in old.usage.instances:
                    self.usage.pop(iid, None)
            if node.usage is not None:
                for iid, u in node.usage.instances.items():
                    self.usage[iid] = (u.cpu, u.ram)
        self._tops = None
        self._fits.clear()
        self.search.freed()  # a node may have more room now
        return True

    # -- pass 1

    def keep(self, instance: Instance, prev: PreviousAllocation) -> bool:
        """Pass 1: keep the previous node, runtime and devices if the filters still pass."""
        if prev.node_id not in self.nodes:
            return False
        return self.search.keep(instance, prev, self.slot(prev.node_id))

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
        self.release_all((instance.id,))
        if self.place_all([instance], causes) and self.keep(held, prev):
            self.held[instance.id] = (held, prev)

    # -- pass 2

    # -- pass 2

    def place_all(
        self, instances: Sequence[Instance], causes: Mapping[str, Cause] | None = None
    ) -> list[Instance]:
        """Pass 2 for ``instances`` (in instance order), run by run of consecutive instances of
        one service with one cause and measured usage; ``causes`` overrides the run's cause per
        instance. Returns the failed."""
        failed: list[Instance] = []
        search = self.search
        usage = self.usage if self.overloaded else None
        i, n = 0, len(instances)
        while i < n:
            first = instances[i]
            service = first.service
            j = i + 1
            while j < n and instances[j].service is service:
                j += 1
            if causes or usage:
                cause = (causes.get(first.id) if causes else None) or self.cause
                measured = usage.get(first.id) if usage else None
                k = i + 1
                while (
                    k < j
                    and ((causes.get(instances[k].id) if causes else None) or self.cause) == cause
                    and (usage.get(instances[k].id) if usage else None) == measured
                ):
                    k += 1
                j = k
            else:
                cause = self.cause
            if self._tops is None or self._fits_empty(first):
                lost = search.place(instances[i:j], cause)
                if lost:
                    failed += lost
                    if self._tops is None:  # from now on, the bound is worth its one pass
                        self._fits_somewhere_empty(self.ask(first))
            else:  # too big for every node: no search
                failed += instances[i:j]
            i = j
        return failed

    # -- failures and pass 3

    def failures(
        self, instances: Sequence[Instance], before: Mapping[str, Failure] | None = None
    ) -> tuple[Failure, ...]:
        """SPEC §7.7 for every instance left unplaced, against the final node states; the
        instances the search knows to ask alike (those of one service, at least) are charged
        alike, from one pass over the nodes. ``before``: failures an earlier call on this
        run's nodes gave, by instance id; one equal to what this call makes (same instance
        id, version, priority, reason and counts, so the same summary) is given as that very
        object (a watcher's unplaceable instances fail alike from edit to edit)."""
        charged: dict[object, tuple[str, tuple[tuple[str, int], ...]]] = {}
        out = []
        held = self.held
        search = self.search
        where = self.where
        n = len(self.nodes)
        # (without an overloaded node the instances of one service ask alike: measured usage
        # raises what is asked on an overloaded node only)
        by_service = not self.overloaded
        service: Service | None = None
        alike: object = None
        for inst in instances:
            if inst.id in where:
                if held and inst.id in held:
                    out.append(self._held_failure(inst, held[inst.id][0]))
                continue
            if inst.service is not service or not by_service:
                service = inst.service
                alike = search.alike(inst)
            known = charged.get(alike)
            if known is None:
                known = charged[alike] = self.charge(inst)
            old = before.get(inst.id) if before else None
            if (
                old is not None
                and old.reason == known[0]
                and old.counts == known[1]
                and old.version == inst.version
                and old.priority == inst.priority
            ):
                out.append(old)
            else:
                out.append(failure(inst, n, *known))
        return tuple(out)

    def charge(self, instance: Instance) -> tuple[str, tuple[tuple[str, int], ...]]:
        """The reason and the counts (``Failure.reason``, ``Failure.counts``) of the failure
        :meth:`failures` gives ``instance`` (not held) against the node states now."""
        return reason_and_counts(self.search.charges(self.ask(instance)))

    def _held_failure(self, instance: Instance, held: Instance) -> Failure:
        """The failure of a held instance's current spec, against the final node states with
        its hold given back, said as a hold: ``item:subject:0: new spec unplaceable, keeping
        1.0.0 on edge-1: 0/3 nodes feasible: 3 Labels``."""
        home = self.where[instance.id]
        trial = home.clone()
        release_reservation(trial, instance.id)
        ask = self.ask(instance)
        charges = [evaluate(trial if s is home else s, ask).dropped_by for s in self.all_slots()]
        f = summarize(instance, len(self.nodes), (c for c in charges if c is not None))
        why = f.summary[len(instance.label) + 2 :]
        spec = "new spec" if held.version == instance.version else f"new spec {instance.version}"
        keeping = f"{spec} unplaceable, keeping {held.version} on {home.id}"
        return replace(f, summary=f"{instance.label}: {keeping}: {why}")

    def preempt(self, instance: Instance) -> list[str] | None:
        """Pass 3: evict strictly lower-priority instances from the one node where that is
        cheapest; returns the victims' ids, or None when no node helps."""
        ask = self.ask(instance)
        priority = instance.priority
        best: tuple[tuple[int, tuple[int, ...], str], str, list[str]] | None = None
        if not self._fits_somewhere_empty(ask):
            return None
        for slot, runtimes in self.search.static_candidates(ask):
            if not _could_fit(slot, ask, runtimes, None):
                continue  # not even on the empty node
            lower = [r for r in slot.placed.values() if r.instance.priority < priority]
            if not lower or not _could_fit(slot, ask, runtimes, lower):
                continue
            # lowest priority first, the latest in instance order first among equals (two
            # stable sorts: the second keeps the first's order within a priority)
            lower.sort(key=_reservation_order, reverse=True)
            lower.sort(key=_reservation_priority)
            trial = slot.clone()
            victims: list[Reservation] = []
            fits = False
            for r in lower:
                release_reservation(trial, r.instance.id)
                victims.append(r)
                # (the pipeline is asked once the CPU and RAM freed could be enough)
                if _could_fit(trial, ask, runtimes, []) and evaluate(trial, ask).dropped_by is None:
                    fits = True
                    break
            if not fits:
                continue
            # reprieve: give back every victim whose eviction turns out not to be needed (the
            # node with the others evicted: ``trial``, every victim evicted, with it back; it
            # is evicted from ``trial`` again when needed)
            for r in sorted(victims, key=lambda r: (-r.instance.priority, r.instance.order_key())):
                restore_reservation(trial, r)
                if _could_fit(trial, ask, runtimes, []) and evaluate(trial, ask).dropped_by is None:
                    victims = [v for v in victims if v is not r]
                else:
                    release_reservation(trial, r.instance.id)
            prios = tuple(sorted((v.instance.priority for v in victims), reverse=True))
            key = (len(victims), prios, slot.id)
            if best is None or key < best[0]:
                best = (key, slot.id, [v.instance.id for v in victims])
        if best is None:
            return None
        _, node_id, victim_ids = best
        slot = self.slot(node_id)
        self.release_all(victim_ids)
        verdict = evaluate(slot, ask)
        assert verdict.dropped_by is None
        self.reserve(slot, ask, best_runtime(slot, verdict))
        return victim_ids

    def too_big(self, instance: Instance) -> bool:
        """Whether what ``instance`` asks exceeds, on every node, the CPU or the RAM of every
        runtime even with nothing reserved: pass 2 fails it without a search, pass 3 without
        trying an eviction, whatever else is placed or released."""
        return not self._fits_empty(instance)

    def _fits_empty(self, instance: Instance) -> bool:
        """:meth:`_fits_somewhere_empty` for what ``instance`` asks, once per inputs of the
        amounts it requests (SPEC §7.2: what that bound reads of a service) and measured usage
        while the capacities stay: services asking the same amounts share the answer (a
        fleet of one-instance services asks only a few)."""
        key = (
            request_inputs(instance.service),
            self.usage.get(instance.id) if self.usage else None,
        )
        got = self._fits.get(key)
        if got is None:
            got = self._fits[key] = self._fits_somewhere_empty(self.ask(instance))
        return got

    def _fits_somewhere_empty(self, ask: Ask) -> bool:
        """False when what ``ask`` asks exceeds, on every node, the CPU or the RAM of every
        runtime's pools even with nothing reserved: no eviction anywhere can place it."""
        tops = self._tops
        if tops is None:  # (from the nodes' basics: no node state is built for it)
            tops = self._tops = {}
            empty: frozenset[str] = frozenset()
            for node_id, basics in self.basics.items():
                overloaded = self.overload.get(node_id, empty) if self.overload else empty
                key = basics_request_key(basics, overloaded)
                top = tops.get(key, (0, 0))
                for cpu, ram in runtime_capacities(self.nodes[node_id], basics):
                    top = (max(top[0], cpu), max(top[1], ram))
                tops[key] = top
        for key, (cpu, ram) in tops.items():
            need = ask.requested_on(key)
            if need.cpu <= cpu and need.ram <= ram:
                return True
        return False

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


def _could_fit(
    slot: NodeSlot, ask: Ask, runtimes: tuple[int, ...], lower: list[Reservation] | None
) -> bool:
    """Whether evicting ``lower`` (all of them; None: everything, up to the pools' whole
    capacity) could make ``ask`` fit one of ``runtimes`` of ``slot`` (those passing the static
    filters): a bound checked before any eviction is tried. False when no such runtime would
    have the CPU and RAM asked even with every one of those reservations given back (each
    gives back at most what it reserved), when a named resource or a device asked has no
    free slot or no pool serving it now and none of ``lower`` holds any of it (only its
    holders' eviction changes that), or when a sharing policy says a named resource or a
    device asked can never be served there. The nodes where a static filter fails are not
    asked (no eviction changes what they read): both are Volcano's
    *UnschedulableAndUnresolvable*."""
    need = ask.requested(slot)
    rts = slot.runtimes
    if lower is None:
        if (ask.resources or ask.devices) and unresolvable(slot, ask):
            return False
        return any(
            rts[i].cpu_from.capacity >= need.cpu and rts[i].ram_from.capacity >= need.ram
            for i in runtimes
        )
    cpu = sum([r.requested.cpu for r in lower])
    ram = sum([r.requested.ram for r in lower])
    if not any(
        rts[i].cpu_from.free + cpu >= need.cpu and rts[i].ram_from.free + ram >= need.ram
        for i in runtimes
    ):
        return False
    for wanted in ask.resources:
        if slot.free_slots((wanted,)) is None and not any(
            wanted.resource in r.resources for r in lower
        ):
            return False
    for d in ask.devices:
        if not device_served(slot, d) and not any(
            held == d.resource for r in lower for held, _ in r.devices
        ):
            return False
    return True


def _node_id(node: Node) -> str:
    return node.id


def _reservation_order(r: Reservation) -> tuple[int, str, str, int]:
    return r.instance.order_key()


def _reservation_priority(r: Reservation) -> int:
    return r.instance.priority


def balance(
    unit: UnitConfig | None,
    nodes: Sequence[Node],
    services: Sequence[Service],
    previous: Mapping[str, PreviousAllocation] | None = None,
    mode: Mode | None = None,
    overload: Overload | None = None,
    *,
    search: SearchFactory = Exhaustive,
) -> BalanceResult:
    """Place every desired instance (SPEC §7); see the module docstring for the passes.

    ``search`` is where the passes look for nodes; the result does not depend on it. The
    default, :class:`~reconciler.placement.search.Exhaustive`, evaluates every filter on every
    node for every instance: the reference, slow on a big unit
    (:func:`reconciler.accel.balance` is this function with the class index).

    Raises ``ValueError`` when two services have the same key (item and subject): their
    instances would have the same ids (the loader reports such a file and keeps one).
    """
    check_keys(services)
    with collector_paused():
        return run_balance(unit, nodes, services, previous, mode, overload, search)[0]


def check_keys(services: Sequence[Service]) -> None:
    """Raise ``ValueError`` naming the keys (item and subject) two services share."""
    if len({s.key for s in services}) != len(services):
        raise ValueError(twice(services))


def twice(services: Sequence[Service]) -> str:
    counts = Counter(s.key for s in services)
    twice = sorted(key for key, n in counts.items() if n > 1)
    return "services defined twice: " + ", ".join(f"{i}:{s}" for i, s in twice)


def run_balance(
    unit: UnitConfig | None,
    nodes: Sequence[Node],
    services: Sequence[Service],
    previous: Mapping[str, PreviousAllocation] | None,
    mode: Mode | None,
    overload: Overload | None,
    search: SearchFactory,
    instances: list[Instance] | None = None,
    made: Made | None = None,
) -> tuple[BalanceResult, Run]:
    """The balance, and the run whose final state it is (reservations on the real capacities
    and requests, in every mode). ``instances``: the services' instances in instance order,
    when the caller has them; ``made``: see :meth:`Run.placements`."""
    if mode is None:
        mode = unit.placement if unit is not None else "stable"
    previous = previous or {}
    if instances is None:
        instances = expand_instances(services)  # (which sorts them)
    if mode == "rebalance":
        # the rebalance proper: pinned instances first, the rest afresh, on lowered capacity
        core = Run(unit, nodes, overload or {}, "rebalanced", search=search)
        passes(core, instances, previous, _pinned, preempt=False)
        after = dict(previous)  # what the rebalance could not place falls back to its old place
        for inst in instances:
            if inst.id in core.where:
                p = core.placement(inst)
                old = previous.get(inst.id)
                if old is not None and (old.node_id, old.runtime_id) == (p.node_id, p.runtime_id):
                    p = replace(p, cause=old.cause)  # it did not move
                after[inst.id] = p.previous()
        # ... then one stable run on the real capacities: the state the next run starts from
        run = Run(unit, nodes, {}, "rebalanced", search=search)
        preempted = passes(run, instances, after, always, preempt=True)
    elif mode == "fresh":
        run = Run(unit, nodes, {}, search=search)
        preempted = passes(run, instances, {}, always, preempt=False)
    else:
        run = Run(unit, nodes, {}, search=search)
        preempted = passes(run, instances, previous, always, preempt=True)
    result = BalanceResult(
        run.placements(instances, made),
        run.failures(instances),
        frozenset(preempted),
        held=frozenset(run.held),
    )
    return result, run


def always(_instance: Instance) -> bool:
    return True


def _pinned(instance: Instance) -> bool:
    return instance.service.balancingPolicy == "disabled"


def passes(
    run: Run,
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
    failed = place_pending(run, pending)
    preempted: set[str] = set()
    if not (preempt and failed):
        return preempted
    by_id: dict[str, Instance] | None = None  # (made at the first eviction: most runs have none)
    unplaced = []
    # what failed to preempt since the node states last changed: an instance asking the same
    # (every filter answers it alike: the search's ``alike``, at least one service's with one
    # measured usage) at the same priority fails again on the same states
    hopeless: set[tuple[Hashable, int]] = set()
    alike = run.search.alike
    for inst in failed:
        same = (alike(inst), inst.priority)
        evicted = None if same in hopeless else run.preempt(inst)
        if evicted is None:
            hopeless.add(same)
            unplaced.append(inst)
            continue
        hopeless.clear()
        preempted.update(evicted)
        if by_id is None:
            by_id = {i.id: i for i in (everyone() if everyone is not None else instances)}
        unplaced.extend(by_id[v] for v in evicted)
    if preempted:
        causes: dict[str, Cause] = {iid: "preempted" for iid in preempted}
        place_pending(run, sorted(unplaced, key=Instance.order_key), causes)
    return preempted


def place_pending(
    run: Run, pending: Sequence[Instance], causes: Mapping[str, Cause] | None = None
) -> list[Instance]:
    """Pass 2 for ``pending`` (in instance order); a held instance among them tries its
    current spec at its turn (:meth:`Run.try_current`) and is not counted as failed."""
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


# ----------------------------------------------------------------------------- explain


def _instance_of(result: BalanceResult, services: Sequence[Service], instance_id: str) -> Instance:
    """The desired instance ``instance_id`` of ``services``, which ``result`` placed or failed
    (found through its service, without hashing every instance's id); KeyError when none."""
    got: Placement | Failure | None = result.by_id.get(instance_id)
    if got is None:
        got = next((f for f in result.failures if f.instance_id == instance_id), None)
    if got is not None:
        for s in services:
            if s.key == (got.item_id, got.subject_id) and got.index < s.instances:
                return new_instance(instance_id, got.item_id, got.subject_id, got.index, s)
    instances = {i.id: i for i in expand_instances(sorted(services, key=lambda s: s.key))}
    return instances[instance_id]


def replay(
    unit: UnitConfig | None,
    nodes: Sequence[Node],
    services: Sequence[Service],
    result: BalanceResult,
    skip: str | None = None,
    *,
    search: SearchFactory = Exhaustive,
    only: Set[str] | None = None,
) -> Run:
    """Node states with every placement of ``result`` (but ``skip``) reserved again: real
    capacities and requests, as every mode's final state is (a rebalance's too). A placement
    whose instance is not desired (its service gone, its index beyond the count) is left out.
    ``only``: the nodes to reserve on (the others' states are left as they are).
    """
    by_key = {s.key: s for s in services}
    run = Run(unit, nodes, {}, search=search)
    restore = run.search.restore
    for p in result.placements:
        if only is not None and p.node_id not in only:
            continue
        service = by_key.get((p.item_id, p.subject_id))
        if service is None or p.index >= service.instances or p.instance_id == skip:
            continue
        # (its id is the uuid5 of item:subject:index: the desired instance's, not hashed again)
        instance = new_instance(p.instance_id, p.item_id, p.subject_id, p.index, service)
        if result.held and p.instance_id in result.held:  # as it was given its place
            spec = held_spec(instance.service, p.previous(), run.nodes.get(p.node_id))
            if spec is not None:
                i = instance
                instance = new_instance(i.id, i.item_id, i.subject_id, i.index, spec)
        slot = run.slot(p.node_id)
        idx = slot.runtime_index(p.runtime_id)
        if idx < 0:
            raise KeyError(f"{p.label}: no runtime {p.runtime_id} on node {p.node_id}")
        restore(instance, slot, idx, p.device_map() if p.devices else NO_KEEP, run.cause)
    return run


def node_states(
    unit: UnitConfig | None,
    nodes: Sequence[Node],
    services: Sequence[Service],
    result: BalanceResult,
    *,
    search: SearchFactory = Exhaustive,
) -> dict[str, NodeSlot]:
    """Every node's inventories with the result's placements reserved (for status)."""
    with collector_paused():
        run = replay(unit, nodes, services, result, search=search)
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
    runtime_filters: tuple[str, ...] = ()
    runtimes: tuple[tuple[str, tuple[tuple[str, tuple[str | None, ...]], ...]], ...] = ()
    # per node: (node id, per runtime: (runtime id, per runtime filter None=pass or why not))
    result: BalanceResult | None = field(default=None, compare=False, repr=False)
    """The balance the matrix was evaluated after (for the phases after placement)."""
    occupancy: Mapping[str, Occupancy] | None = field(default=None, compare=False, repr=False)
    """What was free on each node but the instance's own (where its reservation was given
    back), when the nodes were replayed from the balance: ``explain``'s ``occupied`` for
    another instance of the same balance (None when that was given)."""

    def feasibility(self) -> tuple[int, int, tuple[tuple[str, int], ...]]:
        """(nodes feasible, nodes, how many nodes each code dropped: by count, then code)."""
        counts = Counter(dropped for _node, _cells, dropped in self.rows if dropped is not None)
        return len(self.rows) - counts.total(), len(self.rows), ordered_counts(counts)


def explain(
    unit: UnitConfig | None,
    nodes: Sequence[Node],
    services: Sequence[Service],
    instance_id: str,
    previous: Mapping[str, PreviousAllocation] | None = None,
    mode: Mode | None = None,
    overload: Overload | None = None,
    *,
    search: SearchFactory = Exhaustive,
    result: BalanceResult | None = None,
    occupied: Mapping[str, Occupancy] | None = None,
) -> Explanation:
    """Balance, then evaluate every filter on every node for one instance against the final
    state with the instance's own reservation given back: why it is where it is, or why it
    fails. Raises KeyError for an unknown instance. ``result``: that balance of these very
    arguments, already computed (it is not computed again). ``occupied``: the
    ``occupancy`` of an explanation of another instance after that very balance: the nodes
    it holds are not replayed (but this instance's own node)."""
    if result is None:
        result = balance(unit, nodes, services, previous, mode, overload, search=search)
    instance = _instance_of(result, services, instance_id)
    own = result.by_id.get(instance_id)
    own_node = None if own is None else own.node_id
    run = None
    if occupied is not None:
        run = _occupied(unit, nodes, services, result, instance_id, own_node, occupied, search)
    if run is None:
        run = replay(unit, nodes, services, result, instance_id, search=search)
    ask = run.ask(instance)
    rows = []
    per_runtime = []
    slots = run.all_slots()
    for slot in slots:
        cells: list[str | None] = [f.check(slot, ask) for f in filters.NODE_FILTERS]
        grid = [[rf.check(slot, rt, ask) for rf in filters.RUNTIME_FILTERS] for rt in slot.runtimes]
        dropped = matrix_drop(cells, grid)  # (what evaluate(slot, ask) would ask them again)
        for k in range(len(filters.RUNTIME_FILTERS)):
            reasons = [checks[k] for checks in grid]
            ok = any(r is None for r in reasons)
            cells.append(None if ok else (reasons[-1] if reasons else "no runtimes"))
        rows.append((slot.id, tuple(cells), dropped))
        ids = (rt.runtime.id for rt in slot.runtimes)
        per_runtime.append((slot.id, tuple(zip(ids, map(tuple, grid), strict=True))))
    failure = next((f for f in result.failures if f.instance_id == instance_id), None)
    codes = filters.FILTER_CODES
    return Explanation(
        instance,
        codes,
        tuple(rows),
        own,
        failure,
        tuple(f.name for f in filters.RUNTIME_FILTERS),
        tuple(per_runtime),
        result,
        occupied
        if occupied is not None
        else {slot.id: occupancy(slot) for slot in slots if slot.id != own_node},
    )


def _occupied(
    unit: UnitConfig | None,
    nodes: Sequence[Node],
    services: Sequence[Service],
    result: BalanceResult,
    instance_id: str,
    own_node: str | None,
    occupied: Mapping[str, Occupancy],
    search: SearchFactory,
) -> Run | None:
    """:func:`replay` of ``result`` without ``instance_id``, from ``occupied`` where it holds
    a node (but ``own_node``, the instance's: replayed without it); None when some node's
    pools do not take what ``occupied`` holds for it (then replay them all)."""
    replayed = {n.id for n in nodes if n.id not in occupied}
    if own_node is not None:
        replayed.add(own_node)
    # (the reference search: the class index would be built for the few nodes replayed)
    run = replay(unit, nodes, services, result, instance_id, search=Exhaustive, only=replayed)
    for node_id, held in occupied.items():
        if node_id not in replayed and node_id in run.nodes and not occupy(run.slot(node_id), held):
            return None
    return run
