"""The class index: a fast :class:`~reconciler.placement.search.CandidateSearch` that answers
exactly as the exhaustive one does.

Pass 2 does not scan every node for every instance. Nodes are grouped in classes of equal
static answers (the static filter units run once per class and service shape, see
:mod:`~reconciler.accel.classes`), and each class keeps its nodes sorted in the choice order of
SPEC §7.5, one integer per node. The consecutive instances of one service are placed together:
a heap merges the classes' best nodes, each class read from the front past the nodes known to
refuse the service, plus the nodes the service already took (with their new place in the
order). A class joins the heap only when its first node (the classes are kept sorted by their
first nodes, SPEC §7.5's order putting a higher priority level first) comes before every node
in the heap: a service of a few instances on a fleet of hundreds of classes looks at a few of
them, not at every class that may take it. Within the
group only the nodes it takes change, and only by shrinking, so a node refused stays refused
and the first node of the heap that passes the dynamic filters (``claim``, on integers: the
same rules the dynamic filter units call) is the best one. The nodes refused are remembered
until something is released, shared by the services that ask the same everywhere (with, per
class, an entry before which all its nodes refuse, where the next walk of the class starts),
and a node without a free slot of a named resource refuses every service needing it. Services
with one shape share a group, made once.
"""

from __future__ import annotations

import weakref
from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from heapq import heappop, heappush, heapreplace
from itertools import chain, islice
from typing import TYPE_CHECKING

from reconciler.accel.classes import (
    Entry,
    Group,
    Shape,
    class_key,
    shape_of,
)
from reconciler.model.documents import Service
from reconciler.placement.ask import Ask, AskKey, ask_for, ask_key
from reconciler.placement.filters import NodeFilter, Unreserved
from reconciler.placement.instances import Cause, Instance, PreviousAllocation, Requested
from reconciler.placement.nodestate import (
    NO_KEEP,
    Basics,
    NodeSlot,
    RequestKey,
    Reservation,
    claim,
    device_pool,
    device_served,
    take,
)
from reconciler.placement.pipeline import (
    STATIC_NODE_PREFIX,
    Bound,
    dynamic_bound,
    dynamic_drop,
    most_room,
    static_drop,
    static_runtime_verdict,
    static_runtimes,
)
from reconciler.placement.search import all_charges, kept_devices
from reconciler.placement.sharing import ShareRequest

if TYPE_CHECKING:
    from reconciler.placement.balancer import Run

__all__ = ["ClassIndex"]

_STALE_MAX = 256  # nodes moved since the index was built beyond which it is built again
MOVES_MAX = 1 << 20
"""The length of ``ClassIndex.moves`` beyond which :meth:`ClassIndex.compacted` starts it
again (a watcher's run lives for many calls: see ``BalanceMemo``)."""

_PER_NODE = "(per node)"
"""In a group's charges, the class entry of a class whose nodes each have their own."""

Keyed = tuple[dict[str, tuple[Hashable, ...]], dict[tuple[Hashable, ...], str | None]]
"""The charges of a class's nodes per key (``ClassIndex._bounded_charges``): each node's key
(the ``unreserved_key`` of each dynamic node filter asked), and the charge of each key."""

_Alike = tuple[dict[str, tuple[Hashable, ...]], dict[tuple[Hashable, ...], tuple[int, str]]]
"""Each node of a class with its keys, and per keys how many nodes have them and the first
(``ClassIndex._alike``)."""

Charged = tuple[int, list[str | None], dict[str, str | None], "Counter[str]", dict[int, Keyed]]
"""A group's failure charges at some length of ``ClassIndex.moves``: per class, the charge of
every node of the class (or ``_PER_NODE``); per node of the other classes, its own (in a class
charged per key, the nodes the run had built when charged, and each node moved since); per
class charged per key, the charges of its other nodes; and how many nodes each code
charges."""


class ClassIndex:
    """The class index of one balance run (see the module docstring)."""

    name = "index"

    @property
    def run(self) -> Run:
        run = self._run()
        assert run is not None, "a search outlived its run"
        return run

    def __init__(self, run: Run, services: Iterable[Service] = ()) -> None:
        """``services``: the run's services, when the caller has them (``functools.partial``):
        their ask keys are read up front, in the caller's order (usually the order they were
        made in, so near each other in memory; read in instance order, their fields come from
        all over the heap, which takes about twice as long)."""
        self._run = weakref.ref(run)  # the run owns its search: no cycle for the collector
        self.overloaded = run.overloaded  # (fixed for the run: see Run.renew_usage)
        self.where = run.where  # (the run's, which it never replaces)
        # by id, with the service: held here, so no other object has its id meanwhile
        self.ask_keys: dict[int, tuple[Service, AskKey]] = {
            id(s): (s, ask_key(s)) for s in services
        }
        empty: frozenset[str] = frozenset()
        overload = run.overload
        class_ids: dict[tuple[object, ...], int] = {}
        self.class_of: dict[str, int] = {}
        self.members: list[list[str]] = []
        class_of, members = self.class_of, self.members
        key_of = class_key()
        for node_id, basics in run.basics.items():
            overloaded = overload.get(node_id, empty) if overload else empty
            key = key_of(run.nodes[node_id], basics[0], overloaded)
            cid = class_ids.get(key)
            if cid is None:
                cid = class_ids[key] = len(members)
                members.append([])
            class_of[node_id] = cid
            members[cid].append(node_id)
        # a representative per class: its first node
        self.class_slot = [run.slot(members[0]) for members in self.members]
        # The choice order as one integer per node: priority rank, then CPU below the most any
        # node has, then RAM below the most any node has, then rank of the id, each in a range
        # of its own (free amounts stay within their capacity and are never negative).
        basics_of = run.basics
        self.cpu_top = cpu_top = max((b[1] for b in basics_of.values()), default=0)
        self.ram_top = max((b[2] for b in basics_of.values()), default=0)
        priorities = sorted({b[0][0] for b in basics_of.values()}, reverse=True)
        rank = {p: r for r, p in enumerate(priorities)}
        # entry = ((high - cpu) * ram_span + ram_top - ram) * count + i
        #       = base - cpu * cpu_step - ram * ram_step, and entry % count = i
        self.count = count = len(run.nodes)
        self.ids = list(run.nodes)  # by rank
        self.class_at = [self.class_of[node_id] for node_id in self.ids]  # by rank
        ram_span = self.ram_top + 1
        self.cpu_step, self.ram_step = ram_span * count, count
        self.order_base = {
            node_id: ((rank[b[0][0]] * (cpu_top + 1) + cpu_top) * ram_span + self.ram_top) * count
            + i
            for i, (node_id, b) in enumerate(basics_of.items())
        }
        self.slot_at: list[NodeSlot | None] = [None] * count  # the states built, by rank
        # per class, the nodes whose states the run has built, in the order it built them
        self.built_members: dict[int, list[str]] = {}
        for slot in run.slots.values():
            self._built(slot)
        run.on_slot = self._built
        # per class, its nodes' entries sorted; rebuilt after reservations made elsewhere
        self.index: list[list[Entry]] = [[] for _ in self.members]
        self.entries: list[Entry] = [0] * count  # each node's entry in the index, by rank
        self.index_valid = False
        # while the index is valid: the nodes reserved on or released since it was built (or
        # last brought up to date), by rank; _ensure_index moves these only
        self.stale: dict[int, NodeSlot] = {}
        # every class's first entry, sorted: the classes in the order of their best nodes,
        # which pass 2 walks (see _place_group); kept with the index
        self.heads: list[Entry] = []
        # per static key (a service's labels, runtime types and platform): each class's static
        # runtimes
        self.static: dict[object, list[tuple[int, ...]]] = {}
        # per static key and device requests: those without the classes whose device pools
        # serve none of the requests (see _served)
        self.served: dict[object, list[tuple[int, ...]]] = {}
        # one node per distinct request key: what a service asks anywhere is known from these
        by_key: dict[RequestKey, NodeSlot] = {}
        for rep in self.class_slot:
            by_key.setdefault(rep.request_key, rep)
        self.key_slots = list(by_key.values())
        self.groups: dict[object, Group] = {}  # by service (see group)
        self.shape = shape_of()
        self.shapes: dict[Shape, Group] = {}
        self.asked: dict[tuple[AskKey, tuple[int, int] | None], Group] = {}  # (see group)
        # per key of dynamic answers (see _refused), the nodes that refused it: reservations
        # only shrink what is free, so they stay refused until something is released
        self.refused: dict[object, set[int]] = {}  # (node ranks)
        # and per class, an entry below which all its nodes are in that set: where a walk of
        # the class for another group of the key starts (see _place_group)
        self.passed: dict[object, dict[int, Entry]] = {}
        # per named resource (its name), nodes with no free slot of it; per device request
        # (the ShareRequest), nodes whose pool cannot serve it, in the order found (see
        # _note_exhausted); and per key of dynamic answers, how many of each list are in its
        # refused set (so each group adds only the ones found since: see _refused)
        self.exhausted: dict[str | ShareRequest, list[int]] = {}
        self.merged: dict[object, dict[str | ShareRequest, int]] = {}
        # the nodes reserved on or released from, in order (with repeats): what the failure
        # charges of a group computed at some length of it must look at again (see charges)
        self.moves: list[str] = []
        self.moves_before = 0  # the moves ``compacted`` emptied the log of
        self.charged: dict[Group, Charged] = {}
        # the groups whose every node's charge no reservation or release changes (see settled),
        # and those of them that owe it to the capacities (a usage renewal unsettles them)
        self.settled_groups: set[Group] = set()
        self.bound_settled: set[Group] = set()
        # per (class, runtime filter), the largest room it declares per runtime on the class's
        # nodes (pipeline.most_room): what bounds an ask's charges there (see charges)
        self.rooms: dict[tuple[int, int], list[int]] = {}
        # per dynamic node filter and what it reads of an ask (its declaration), whether each
        # node it was asked of refuses, while no node moves (at that length of moves)
        self.refusals: dict[tuple[str, tuple[object, ...]], tuple[int, dict[str, bool]]] = {}
        # per dynamic node filter that declares its unreserved_key (filters.Unreserved) and
        # what it reads of an ask, whether it refuses on a node nothing is reserved on, per
        # that key: its answer on the nodes the run has not touched, whatever else moves
        self.unreserved: dict[tuple[str, tuple[object, ...]], dict[Hashable, bool]] = {}
        # per class and dynamic node filters (by name), each node's keys, and per keys how
        # many nodes have them and the first of those (see _alike)
        self.keyed_nodes: dict[tuple[int, tuple[str, ...]], _Alike] = {}

    def _built(self, slot: NodeSlot) -> None:
        slot.order_base = self.order_base[slot.id]
        self.slot_at[slot.order_base % self.count] = slot
        cid = self.class_of[slot.id]
        built = self.built_members.get(cid)
        if built is None:
            self.built_members[cid] = [slot.id]
        else:
            built.append(slot.id)

    # -- what is asked

    def group(self, instance: Instance) -> Group:
        """The group of ``instance``: one per shape, found once per service (and measured
        usage, in an overloaded run)."""
        service = instance.service
        key: object
        if not self.overloaded:  # (most runs: by service alone)
            key, usage = id(service), None
        else:
            usage = self.run.usage_of(instance)
            key = (id(service), usage)
        group = self.groups.get(key)
        if group is None:
            # services asking the same (most of a fleet of one-instance services) share one
            # ask key: its shape, and so its group, is found once
            known = self.ask_keys.get(id(service))
            asks = known[1] if known is not None and known[0] is service else ask_key(service)
            group = self.asked.get((asks, usage))
            if group is None:
                ask = ask_for(instance, usage, asks)
                shape = self.shape(ask)
                group = self.shapes.get(shape)
                if group is None:
                    group = self.shapes[shape] = Group(ask, shape)
                self.asked[asks, usage] = group
            self.groups[key] = group
        return group

    def static_candidates(self, ask: Ask) -> list[tuple[NodeSlot, tuple[int, ...]]]:
        """From the static answers per class (a service naming its node: that node only)."""
        group = self.group(ask.instance)
        run = self.run
        if group.node_id is not None:
            if group.node_id not in run.nodes:
                return []
            slot = run.slot(group.node_id)
            runtimes = self.static_for(group, slot)
            return [(slot, runtimes)] if runtimes else []
        per_class = self._classes(group)
        chosen = [cid for cid, runtimes in enumerate(per_class) if runtimes]
        if not chosen:
            return []
        if len(chosen) == len(per_class):
            node_ids: Iterable[str] = run.nodes
        else:  # the members of those classes, by node id (each class's are)
            node_ids = sorted(chain.from_iterable([self.members[cid] for cid in chosen]))
        class_of = self.class_of
        return [(run.slot(node_id), per_class[class_of[node_id]]) for node_id in node_ids]

    def nowhere(self, instance: Instance) -> bool:
        """Whether no node can serve ``instance`` whatever is reserved: none passes the static
        filters for it, or none of those has a device pool serving each device it asks. Pass
        2 then fails it without a claim, and pass 3 finds no node where an eviction could
        help (its static candidates are those nodes, each refused by ``_could_fit``). A
        service naming its node is not looked into (False)."""
        group = self.group(instance)
        if group.node_id is not None:
            return False
        self._classes(group)
        return not group.walkable

    def settled(self, instance: Instance) -> bool:
        """Whether :meth:`charges` for what ``instance`` asks, once computed, stays what it
        was while this run lasts: every class is answered whole, by a static node filter
        (which no reservation, release or new usage changes; a node whose class would change
        ends the run) or by what the filters' declarations bound whatever is reserved (an ask
        more than any of its nodes could ever give: until a usage renewal changes the
        capacities, which unsettles it). False until its charges were asked."""
        return self.group(instance) in self.settled_groups

    def alike(self, instance: Instance) -> Hashable:
        """The group: instances of one shape are answered alike by every filter."""
        return self.group(instance)

    def charges(self, ask: Ask) -> Mapping[str, int]:
        """As the exhaustive search's, with the static node filters that come first answered
        once per class (their answer is the class's: the class key holds what they read, but
        a node's id, so a service naming its node is charged node by node), and the dynamic
        ones too where the filters' declarations bound them whatever is reserved
        (``pipeline.dynamic_bound``). Each node's charge is kept per group (a class's when it
        is the same on all its nodes), and computed again only for the nodes reserved on or
        released from since (the charge depends on the node's state and the ask's shape
        only): a watcher's run after an edit charges its failing services on the nodes it
        changed. The counts returned are the index's: read them before the next call."""
        run = self.run
        if ask.node_id is not None:
            return Counter(all_charges(run.all_slots(), ask))
        group = self.group(ask.instance)
        known = self.charged.get(group)
        # per class, its static runtime verdict for this ask: each node of a class passing the
        # static node filters is then asked its dynamic filters only
        verdicts: dict[int, tuple[tuple[int, ...], str | None]] = {}

        def verdict(cid: int) -> tuple[tuple[int, ...], str | None]:
            got = verdicts.get(cid)
            if got is None:
                got = verdicts[cid] = static_runtime_verdict(self.class_slot[cid], ask)
            return got

        if known is None:
            known = self._charge_classes(ask, verdict)
            codes = known[1]
            if all(code is not _PER_NODE for code in codes):  # every class answered whole
                self.settled_groups.add(group)
                if not all(code in STATIC_NODE_PREFIX for code in codes):
                    self.bound_settled.add(group)  # (a bound: while the capacities stay)
        else:
            at, uniform, own, counts, keyed = known
            class_of = self.class_of
            for node_id in set(self.moves[at:]):
                cid = class_of[node_id]
                if node_id in own:
                    old = own[node_id]
                elif cid in keyed:
                    keys, charge_of = keyed[cid]
                    old = charge_of[keys[node_id]]
                else:
                    old = uniform[cid]
                if old in STATIC_NODE_PREFIX:
                    continue
                new = own[node_id] = dynamic_drop(run.slot(node_id), ask, verdict(cid))
                if new != old:
                    if old is not None:
                        counts[old] -= 1
                        if not counts[old]:
                            del counts[old]
                    if new is not None:
                        counts[new] += 1
            known = (len(self.moves), uniform, own, counts, keyed)
        self.charged[group] = known
        return known[3]

    def _charge_classes(
        self, ask: Ask, verdict: Callable[[int], tuple[tuple[int, ...], str | None]]
    ) -> Charged:
        """Every node's charge for ``ask`` now, class by class: the class's own when it is the
        same for all its nodes, else each node's."""
        run = self.run
        uniform: list[str | None] = []  # per class: its nodes' charge (_PER_NODE: see own)
        own: dict[str, str | None] = {}  # per node of the others, its charge
        keyed: dict[int, Keyed] = {}  # per class charged per key, those charges
        counts: Counter[str] = Counter()
        for cid, members in enumerate(self.members):
            code = static_drop(self.class_slot[cid], ask)
            if code is None:
                static = verdict(cid)
                # what the filters' declarations tell of every node of the class whatever is
                # reserved (an ask more than any of its nodes could ever give, say): then only
                # the dynamic node filters the ask needs are asked node by node, if any
                bound = self._bound(cid, ask, static)
                if bound is None:
                    for node_id in members:
                        own[node_id] = dynamic_drop(run.slot(node_id), ask, static)
                    code = _PER_NODE
                elif bound[0]:
                    by_key = self._bounded_charges(cid, ask, bound, own, counts)
                    if by_key is not None:
                        keyed[cid] = by_key
                    code = _PER_NODE
                else:
                    code = bound[1]
            uniform.append(code)
            if code is not None and code is not _PER_NODE:
                counts[code] += len(members)
        counts.update([code for code in own.values() if code is not None])
        return (len(self.moves), uniform, own, counts, keyed)

    def _bounded_charges(
        self,
        cid: int,
        ask: Ask,
        bound: Bound,
        own: dict[str, str | None],
        counts: Counter[str],
    ) -> Keyed | None:
        """``pipeline.bounded_drop`` on each node of class ``cid``: the node filters it asks,
        each once per node and what the filter reads of an ask while no node moves (failing
        asks alike in what it reads share its answers), into ``own``.

        When each of those filters declares its
        :class:`~reconciler.placement.filters.Unreserved` key, the nodes the run has not
        built (nothing is reserved on them) are charged per key instead: each filter is asked
        once per key it has not answered for an ask alike, on a state built for the question
        and not kept, and ``counts`` gets each key's charge once per node having it; only the
        nodes the run built are charged one by one (into ``own``). An ask no node can take is
        then charged in time that grows with the keys and the nodes it touched, not with the
        unit. Returns the charges per key (None when charged node by node)."""
        asked, code = bound
        run = self.run
        at = len(self.moves)
        answers: list[tuple[NodeFilter, dict[str, bool], tuple[str, tuple[object, ...]]]] = []
        for nf in asked:
            key = (nf.name, tuple([getattr(ask, name) for name in nf.reads_ask]))
            got = self.refusals.get(key)
            if got is None or got[0] != at:
                got = self.refusals[key] = (at, {})
            answers.append((nf, got[1], key))

        def charge_of_node(node_id: str) -> str | None:
            slot = run.slot(node_id)
            for nf, refuses, _ in answers:
                refused = refuses.get(node_id)
                if refused is None:
                    refused = refuses[node_id] = nf.check(slot, ask) is not None
                if refused:
                    return nf.name
            return code

        alike = self._alike(cid, asked)
        if alike is None:
            for node_id in self.members[cid]:
                own[node_id] = charge_of_node(node_id)
            return None
        keys, sizes = alike
        charge_of: dict[tuple[Hashable, ...], str | None] = {}
        for parts, (size, first) in sizes.items():
            charge = code
            empty: NodeSlot | None = None
            for (nf, _, key), part in zip(answers, parts, strict=True):
                known = self.unreserved.get(key)
                if known is None:
                    known = self.unreserved[key] = {}
                refused = known.get(part)
                if refused is None:
                    if empty is None:
                        empty = run.empty_slot(first)
                    refused = known[part] = nf.check(empty, ask) is not None
                if refused:
                    charge = nf.name
                    break
            charge_of[parts] = charge
            if charge is not None:
                counts[charge] += size
        for node_id in self.built_members.get(cid, ()):  # (own's counts are added by the caller)
            old = charge_of[keys[node_id]]
            if old is not None:
                counts[old] -= 1
                if not counts[old]:
                    del counts[old]
            own[node_id] = charge_of_node(node_id)
        return keys, charge_of

    def _alike(self, cid: int, asked: tuple[NodeFilter, ...]) -> _Alike | None:
        """Each node of class ``cid`` with its keys (the ``unreserved_key`` of each of
        ``asked``, in order), and per keys how many nodes have them and the first; None when
        one of ``asked`` declares no key. Made once per class and filters: the keys read the
        nodes' documents, which a run never changes but for their measured usage."""
        names = tuple([nf.name for nf in asked])
        got = self.keyed_nodes.get((cid, names))
        if got is None:
            key_ofs = [nf.unreserved_key for nf in asked if isinstance(nf, Unreserved)]
            if len(key_ofs) < len(asked):
                return None
            nodes = self.run.nodes
            keys: dict[str, tuple[Hashable, ...]] = {}
            sizes: dict[tuple[Hashable, ...], tuple[int, str]] = {}
            for node_id in self.members[cid]:
                node = nodes[node_id]
                parts = keys[node_id] = tuple([key_of(node) for key_of in key_ofs])
                seen = sizes.get(parts)
                sizes[parts] = (1, node_id) if seen is None else (seen[0] + 1, seen[1])
            got = self.keyed_nodes[cid, names] = (keys, sizes)
        return got

    def _bound(
        self, cid: int, ask: Ask, static: tuple[tuple[int, ...], str | None]
    ) -> Bound | None:
        """``pipeline.dynamic_bound`` for class ``cid``, with the largest rooms of its nodes."""
        rooms = self.rooms
        members = self.members[cid]
        rep = self.class_slot[cid]

        def room(k: int, i: int) -> int:
            most = rooms.get((cid, k))
            if most is None:  # (the nodes not touched yet from their documents)
                run = self.run
                built, nodes, basics = run.slots, run.nodes, run.basics
                slots = [built[node_id] for node_id in members if node_id in built]
                empty = [(nodes[n], basics[n]) for n in members if n not in built]
                most = rooms[cid, k] = most_room(slots, k, len(rep.runtimes), empty)
            return most[i]

        return dynamic_bound(rep, ask, static, room)

    def forget_services(self, services: set[int]) -> None:
        """Forget the groups of the services (by ``id``) that are gone or edited."""
        groups = self.groups
        if self.overloaded:  # keyed (id(service), usage): each group looked at
            for g in [g for g in groups if isinstance(g, tuple) and g[0] in services]:
                del groups[g]
            return
        for sid in services:  # keyed id(service)
            groups.pop(sid, None)

    def _classes(self, group: Group) -> list[tuple[int, ...]]:
        """Each class's static runtimes for ``group`` (and ``group.walk``)."""
        if group.per_class is None:
            per_class = self.static.get(group.static_key)
            if per_class is None:
                ask = group.ask
                per_class = [static_runtimes(rep, ask) for rep in self.class_slot]
                self.static[group.static_key] = per_class
            group.per_class = group.walk = per_class
            if group.devices:
                group.walk = self._served(group, per_class)
            group.walkable = any(group.walk)
        return group.per_class

    def _served(self, group: Group, per_class: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """``per_class`` without (as no runtime) the classes on whose nodes no device pool
        serves one of ``group``'s device requests: the ``Devices`` filter refuses it there
        whatever is reserved (*UnschedulableAndUnresolvable*), alike on every node of the
        class (their pools' resources and policies are part of its key, and a policy's
        ``has_request`` reads nothing else), so pass 2 never walks them. The static runtimes
        per class are left as they are (the static filters' answers, which pass 1 and the
        failure charges read)."""
        key = (group.static_key, group.devices)
        got = self.served.get(key)
        if got is None:
            reps, devices = self.class_slot, group.devices
            got = self.served[key] = [
                runtimes
                if runtimes and all(device_pool(reps[cid].pools, d) is not None for d in devices)
                else ()
                for cid, runtimes in enumerate(per_class)
            ]
        return got

    def static_for(self, group: Group, slot: NodeSlot) -> tuple[int, ...]:
        """The runtimes of ``slot`` passing the static filters for ``group``."""
        node_id = group.node_id
        if node_id is None:
            return (group.per_class or self._classes(group))[self.class_of[slot.id]]
        if node_id != slot.id:
            return ()
        if group.pinned is None:
            group.pinned = static_runtimes(slot, group.ask)
        return group.pinned

    # -- reservations

    # -- changes to node states

    def moved(self, slot: NodeSlot) -> None:
        """``slot``'s entry may have moved: noted while few have, else the index is rebuilt."""
        self.moves.append(slot.id)
        if self.index_valid:
            stale = self.stale
            if len(stale) < _STALE_MAX:
                stale[self.order_base[slot.id] % self.count] = slot
            else:
                self.index_valid = False
                stale.clear()

    def compacted(self) -> None:
        """``moves`` emptied when it has grown past :data:`MOVES_MAX`, with what was computed
        at some length of it (the failure charges, the refusals): a memo's run is given every
        call's moves, and its log must not grow with the watcher's lifetime."""
        if len(self.moves) > MOVES_MAX:
            self.moves_before += len(self.moves)
            self.moves = []
            self.charged.clear()
            self.refusals.clear()

    def moved_count(self) -> int:
        """How many moves this run has seen (``moves`` and those it was emptied of)."""
        return self.moves_before + len(self.moves)

    def moved_for(self, instance: Instance, since: int) -> bool:
        """Whether a node reserved on or released from after the first ``since`` moves (see
        :meth:`moved_count`) passes the static filters for ``instance`` (True when those
        moves are no longer in ``moves``)."""
        at = since - self.moves_before
        if at < 0:
            return True
        group, slot = self.group(instance), self.run.slot
        return any(self.static_for(group, slot(node_id)) for node_id in set(self.moves[at:]))

    def freed(self) -> None:
        """Forget which nodes refused what (after a release)."""
        for refused in self.refused.values():
            refused.clear()
        for passed in self.passed.values():
            passed.clear()
        self.exhausted.clear()
        for merged in self.merged.values():
            merged.clear()

    def renewed(self, basics: Basics) -> bool:
        """A node's capacity changed: its place in the choice order moves (the index is built
        again at its next use). Refused when the capacity is above the largest of the run:
        the order's integer encoding has no room for it."""
        _, cpu, ram, _ = basics
        if cpu > self.cpu_top or ram > self.ram_top:
            return False
        self.rooms.clear()  # (capacities change)
        self.settled_groups -= self.bound_settled
        self.bound_settled.clear()
        self.index_valid = False
        self.stale.clear()
        return True

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
        entries, slots, basics, base = (
            self.entries,
            self.run.slots,
            self.run.basics,
            self.order_base,
        )
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
        self.heads = sorted([keys[0] for keys in self.index])
        for passed in self.passed.values():  # entries are places in the index just rebuilt
            passed.clear()
        self.stale.clear()
        self.index_valid = True

    def _reposition(self, slot: NodeSlot) -> None:
        """Move ``slot`` to its new place in its class index after reservations."""
        self._move(self.index[self.class_of[slot.id]], self.entry(slot))

    def _move(self, entries: list[Entry], new: Entry) -> None:
        """Move a node of the class whose sorted entries are ``entries`` to its entry ``new``
        (the same node: ``new % count`` is its rank), keeping ``heads``."""
        rank = new % self.count
        head = entries[0]
        del entries[bisect_left(entries, self.entries[rank])]
        self.entries[rank] = new
        insort(entries, new)
        if entries[0] != head:
            heads = self.heads
            del heads[bisect_left(heads, head)]
            insort(heads, entries[0])

    # -- pass 1

    # -- pass 1

    def keep(self, instance: Instance, prev: PreviousAllocation, slot: NodeSlot) -> bool:
        group = self.group(instance)
        prev_devices = kept_devices(group.devices, prev)
        if prev_devices is None:
            return False
        index = slot.runtime_index(prev.runtime_id)
        if index < 0 or index not in self.static_for(group, slot):
            return False
        req = group.requested(slot)
        devices = group.devices
        at, ids = claim(slot, req, (index,), group.resources, devices, prev_devices)
        if at < 0:
            return False
        iid = instance.id
        slot.placed[iid] = Reservation(instance, at, req, group.names, ids, devices, prev.cause)
        self.run.where[iid] = slot
        self.moved(slot)
        return True

    def restore(
        self,
        instance: Instance,
        slot: NodeSlot,
        runtime_index: int,
        keep: Mapping[str, tuple[str, ...]],
        cause: Cause | None,
    ) -> None:
        group = self.group(instance)
        req, devices = group.requested(slot), group.devices
        ids = take(slot, runtime_index, req, group.resources, devices, keep)
        slot.placed[instance.id] = Reservation(
            instance, runtime_index, req, group.names, ids, devices, cause
        )
        self.run.where[instance.id] = slot
        self.moved(slot)

    # -- pass 2

    def place(self, instances: Sequence[Instance], cause: Cause | None) -> list[Instance]:
        group = self.group(instances[0])
        if group.node_id is not None:
            return self._place_pinned(group, instances, cause)
        if len(instances) == 1 and self._place_one(group, instances[0], cause):
            return []
        return self._place_group(group, instances, cause)

    def _place_one(self, group: Group, inst: Instance, cause: Cause | None) -> bool:
        """:meth:`_place_group` for one instance, without its heap, while the best node passes
        the dynamic filters: the classes are walked in the order of their first entries
        (``heads``), each to its head past the nodes refused, until the next one's first entry
        comes after the best head found, which is the node ``_place_group`` would take first.
        False, and only that node noted as refused, when it refuses (then ``_place_group``
        goes on from there) or when no class has a node left."""
        if self.stale or not self.index_valid:
            self._ensure_index()
        walk, refused = group.walk, group.refused
        if walk is None:
            self._classes(group)
            walk = group.walk
        if refused is None or group.names or group.devices:  # (exhausted since?)
            refused = self._refused(group)
        assert walk is not None and group.per_class is not None
        index, count, class_at = self.index, self.count, self.class_at
        best = -1
        if not refused:  # each class's head is its first entry: the first class walked
            for first in self.heads:
                if walk[class_at[first % count]]:
                    best = first
                    break
        else:
            # (the head of each class past its refused nodes, as _place_group opens a class:
            # the same lines inline, not a call per class, on this hot path)
            passed = group.passed
            for first in self.heads:
                if 0 <= best < first:
                    break
                cid = class_at[first % count]
                if not walk[cid]:
                    continue
                entries = index[cid]
                end = len(entries)
                known = passed.get(cid)
                p = 0 if known is None else bisect_left(entries, known)
                while p < end and entries[p] % count in refused:
                    p += 1
                if p < end:
                    head = passed[cid] = entries[p]
                    if best < 0 or head < best:
                        best = head
                else:
                    passed[cid] = entries[-1] + 1
        if best < 0:
            return False
        rank = best % count
        cid = class_at[rank]
        slot = self.slot_at[rank] or self.run.slot(self.ids[rank])
        need = group.requested(self.class_slot[cid])
        resources, devices = group.resources, group.devices
        at, ids = claim(slot, need, walk[cid], resources, devices, NO_KEEP)
        if at < 0:
            refused.add(rank)
            if resources or devices:
                self._note_exhausted(slot, rank, group)
            return False
        iid = inst.id
        slot.placed[iid] = Reservation(inst, at, need, group.names, ids, devices, cause)
        self.where[iid] = slot
        # the node taken moves to its new place in its class's order
        self._move(
            index[cid],
            slot.order_base
            - slot.cpu_pool.free * self.cpu_step
            - slot.ram_pool.free * self.ram_step,
        )
        self.moves.append(slot.id)
        return True

    def _place_pinned(
        self, group: Group, instances: Sequence[Instance], cause: Cause | None
    ) -> list[Instance]:
        """Pass 2 for a service that names its node: only that node is a candidate."""
        assert group.node_id is not None
        if group.node_id not in self.run.nodes:
            return list(instances)
        slot = self.run.slot(group.node_id)
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
            self.run.where[iid] = slot
        if len(failed) < len(instances):
            self._reposition(slot)
            self.moves.append(slot.id)
        return failed

    def _refused(self, group: Group) -> set[int]:
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
                self.merged[key] = {}
            group.refused, group.passed = refused, self.passed[key]
            group.merged = self.merged[key]
        if self.exhausted:  # nodes without a free slot of a resource or a device it asks
            exhausted, merged = self.exhausted, group.merged
            needs: Iterable[str | ShareRequest] = chain(group.names, group.devices)
            for need in needs:
                got = exhausted.get(need)
                if got:
                    start = merged.get(need, 0)
                    if start < len(got):  # (only those found since the key's last merge)
                        group.refused.update(islice(got, start, None))
                        merged[need] = len(got)
        return group.refused

    def _note_exhausted(self, slot: NodeSlot, rank: int, group: Group) -> None:
        """Remember the named resources ``slot`` has no free slot of (or lacks) and the device
        requests its pools cannot serve now: they refuse every group that asks them, until
        something is released (what is free only shrinks meanwhile, and a policy's verdict
        on one request with less free does not turn)."""
        for r in group.resources:
            if slot.free_slots((r,)) is None:
                self.exhausted.setdefault(r.resource, []).append(rank)
        for d in group.devices:
            if not device_served(slot, d):
                self.exhausted.setdefault(d, []).append(rank)

    def _place_group(
        self, group: Group, instances: Sequence[Instance], cause: Cause | None
    ) -> list[Instance]:
        """Pass 2 for consecutive instances of one group (see the class docstring). A class
        joins the heap when its first entry (``heads``, walked in order) comes before every
        node in the heap: no node of the classes not joined yet can come first."""
        self._ensure_index()
        resources, devices, names = group.resources, group.devices, group.names
        if group.walk is None:
            self._classes(group)
        walk = group.walk
        assert walk is not None
        refused = self._refused(group)
        passed = group.passed
        index, class_slot, slot_at = self.index, self.class_slot, self.slot_at
        class_at, count, by_rank = self.class_at, self.count, self.ids
        cpu_step, ram_step = self.cpu_step, self.ram_step
        heads = self.heads
        walked, opened = len(heads), 0  # the classes in the order of heads, and how many seen
        # per class joined: what the group asks there, and the place of its head (its next
        # node in the order) in its index
        needs: dict[int, Requested] = {}
        cursors: dict[int, int] = {}
        heap: list[Entry] = []  # the heads of the classes joined, and the nodes taken
        touched: dict[int, Entry] = {}  # nodes taken: their entries now (the index's are stale)
        failed: list[Instance] = []
        where = self.run.where
        # The node last taken, at its new place, is held out of the heap: the next instance
        # takes it again without a heap operation (nor looking up its rank, class, state and
        # what is asked there) while it stays the best, as a big node often does; otherwise
        # it is swapped for the heap's best in one operation.
        last: Entry | None = None
        rank = cid = 0
        for n, inst in enumerate(instances):
            placed = False
            while True:
                if opened < walked:
                    first = heads[opened]
                    if (last is None or first < last) and (not heap or first < heap[0]):
                        # the next class may hold the best node: its head joins the heap
                        # (what the group asks of it is looked up when its first node comes
                        # out; no node in the heap moved, so the index is current there).
                        # The same lines as _place_one's, inline: a method called per class
                        # cost 5 % of heterogeneous's fresh balance (60,500 against 64,500/s)
                        opened += 1
                        joining = class_at[first % count]
                        if walk[joining]:
                            ranked = index[joining]
                            size = len(ranked)
                            known = passed.get(joining)
                            q = 0 if known is None else bisect_left(ranked, known)
                            while q < size and ranked[q] % count in refused:
                                q += 1
                            if q < size:
                                heappush(heap, ranked[q])
                                passed[joining] = ranked[q]
                                cursors[joining] = q
                            else:
                                passed[joining] = ranked[-1] + 1
                        continue
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
                        break
                    rank = key % count
                    cid = class_at[rank]
                    slot = slot_at[rank] or self.run.slot(by_rank[rank])
                    asked = needs.get(cid)
                    if asked is None:
                        asked = needs[cid] = group.requested(class_slot[cid])
                    need, runtimes = asked, walk[cid]
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
                    if resources or devices:
                        self._note_exhausted(slot, rank, group)
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
        for rank, key in touched.items():
            self._move(index[class_at[rank]], key)
        if touched:
            self.moves += [by_rank[rank] for rank in touched]
        return failed
