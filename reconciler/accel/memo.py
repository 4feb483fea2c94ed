"""The balancer's memo: what a long-running caller (``watch``) carries from one balance to the
next, so that an edit of a few services re-places only their instances."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from itertools import chain, compress, count, groupby, repeat
from operator import is_not

from reconciler.accel.index import ClassIndex
from reconciler.model.changes import InputChanges, ServiceKey
from reconciler.model.documents import Node, Service, UnitConfig
from reconciler.model.gcpause import collector_paused
from reconciler.model.values import instance_ids
from reconciler.placement.balancer import Made, Overload, Run, always, passes, run_balance, twice
from reconciler.placement.instances import (
    BalanceResult,
    Changes,
    Failure,
    Instance,
    Mode,
    Placement,
    PreviousAllocation,
    expand_instances,
    new_instance,
    service_order,
)
from reconciler.placement.nodestate import NodeSlot
from reconciler.placement.search import Exhaustive, SearchFactory

__all__ = ["BalanceMemo", "PreviousSince"]

PreviousSince = tuple[Mapping[str, PreviousAllocation], frozenset[str]]
"""A mapping of previous placements and the ids at which another one (a copy of it, edited)
may differ from it."""


class BalanceMemo:
    """What a long-running caller (``watch``) carries from one :func:`balance` call to the
    next: the last call's inputs, its instances per service, its result and the run in its
    final state.

    Which services and nodes changed since the last call is told by the caller, as the loader
    tells it (``inputs``: :class:`~reconciler.model.changes.InputChanges` counted from the
    revision of the last call's inputs); without it, or when it counts from another revision,
    the memo compares the services and nodes with its last call's, key by key, by equality. A
    service or node equal to the memo's (told unchanged, or found equal) is taken as the
    memo's: its instances and their groups in the class index are kept.

    A ``stable`` call whose unit and nodes are the memo's (but for nodes whose measured usage
    alone changed), whose ``previous`` is exactly the memo's result (the checkpoint the last
    run wrote) and with no overload is answered from the memo: the instances of the services
    that changed (edited, added, removed) are released, those that had a place keep it (pass
    1), and pass 2 and 3 run for every instance without a place, in instance order. That is the
    full run's result: in a full run every unchanged instance keeps its place (it fits beside
    every other reservation of the last result, so beside any subset of them: the filters are
    monotone in what is reserved), and so pass 2 and 3 see the same instances on the same
    reservations. An unchanged service that no node can serve whatever is reserved is not
    tried again and keeps the last result's failures, unless the final node states charge it
    otherwise (its failure summary counts the nodes each filter drops). When a changed
    service's instance cannot keep its place, the memo cannot tell what the full run's pass 1
    would do, so the call runs in full. Any other call runs in
    full and leaves its run in the memo (``fresh`` and ``stable`` ones: a rebalance's run
    records a cause with its placements).

    The memo's run is mutated by the next call: a memo belongs to one caller."""

    def __init__(self) -> None:
        self._unit: UnitConfig | None = None
        self._nodes: dict[str, Node] = {}  # the nodes of the call that left ``_run``
        self._node_at: dict[str, int] = {}
        """Where each node was in a ``nodes`` given (a guess: checked before it is used)."""
        self._service_at: dict[ServiceKey, int] = {}
        """Where each service was in a ``services`` given (a guess: checked before use)."""
        self._seen: int | None = None
        """The revision of the last call's inputs (``InputChanges.revision``); None: not told,
        or the call did not end."""
        self._expanded: dict[ServiceKey, tuple[Service, list[Instance]]] = {}
        """The last call's services, in instance order, each with its instances."""
        self._run: Run | None = None
        self._result: BalanceResult | None = None
        self._made: Made = {}
        self._order: list[ServiceKey] = []  # the services' keys in instance order
        self._pos: tuple[list[ServiceKey], dict[ServiceKey, int]] = ([], {})
        """``_order`` (the list itself) and each key's position in it (see :meth:`_position`)."""
        self._result_order: list[ServiceKey] | None = None
        """The ``_order`` list (itself) whose order ``_result``'s placements follow: while it
        is ``_order``, each service's placements are found in them by bisection."""
        self._validated: dict[str, PreviousAllocation] | None = None
        """The last ``previous`` found to be exactly ``_result`` (see _incremental), but for the
        instances in ``_dirty``: placed anew, or removed, by the calls since."""
        self._validated_from: Mapping[str, PreviousAllocation] | None = None
        """The mapping ``_validated`` is a copy of (what a ``previous_since`` names)."""
        self._dirty: set[str] = set()
        self._failing: tuple[BalanceResult | None, dict[ServiceKey, tuple[Failure, ...]]] = (
            None,
            {},
        )
        """A result and its failures by service (see :meth:`_failing_of`)."""
        self._tried: dict[ServiceKey, int] = {}
        """Per service sent through pass 2 and 3 by an answer from the memo's run: how many
        moves that run's index had seen before those passes (see :meth:`_incremental`)."""
        self.incremental = False  # whether the last call was answered from the memo
        self.replaced = 0  # instances the last call released and placed again (incremental)

    def balance(
        self,
        unit: UnitConfig | None,
        nodes: Sequence[Node],
        services: Sequence[Service],
        previous: Mapping[str, PreviousAllocation] | None = None,
        mode: Mode | None = None,
        overload: Overload | None = None,
        *,
        exhaustive: bool = False,
        previous_since: PreviousSince | None = None,
        inputs: InputChanges | None = None,
    ) -> BalanceResult:
        """:func:`reconciler.accel.balance` for these inputs: the same result, re-placing only
        the instances of the services that changed since the last call when it can (see the
        class docstring).

        ``inputs``: what changed in the unit, services and nodes since the last call's inputs
        (counted from their revision: the loader's :attr:`StateView.changes`, with the nodes
        the caller changed on the way), and the revision of these. Trusted: a service or node
        it does not name is taken as the last call's, whatever object is passed. Changes that
        count from another revision are not used (the memo compares by equality).

        ``previous_since``: a mapping ``previous`` is a copy of and the ids at which it may
        differ from it (what the checkpoint's memo tells, see
        :attr:`~reconciler.accel.checkpoint.CheckpointMemo.previous_since`), so that the
        memo checks those only when that mapping is the one it checked last call."""
        with collector_paused():
            try:
                return self._balance(
                    unit,
                    nodes,
                    services,
                    previous,
                    mode,
                    overload,
                    exhaustive,
                    previous_since,
                    inputs,
                )
            except BaseException:
                # (a call that did not end may have left its run and services half changed:
                # the next one starts from nothing)
                self._run, self._seen, self._expanded, self._order = None, None, {}, []
                raise

    def final_states(
        self, result: BalanceResult
    ) -> Callable[[], dict[str, NodeSlot] | None] | None:
        """The node states the last call ended with, if it ran in full and gave ``result``
        (see ``accel.FinalStates``); None otherwise (an incremental call: the status report's
        cache replays the few nodes that changed). Ask before the next call mutates them."""
        run = self._run
        if run is None or self.incremental or result is not self._result or result.held:
            return None
        return states_of(run)

    def dropped(
        self, result: BalanceResult, errors: Mapping[str, str], reason: str
    ) -> BalanceResult:
        """``result`` (this memo's last answer) with the placements of ``errors``' ids turned
        into failures by a phase after the balance (the network phase, the ids, the configs; see
        :meth:`BalanceResult.failed`): numbered, with what changed counted from where
        ``result``'s changes count (so the stages after it, which never saw ``result`` itself,
        stay incremental).

        When ``result`` is the memo's result, this one takes its place: those instances are
        released from the memo's run, so the next call, whose ``previous`` (the checkpoint
        written from this one) holds none of them, finds it exactly the memo's result and
        places them again in its pass 2, in instance order, as the full run does: their
        services have failures here. (Else every later call would run in full.)"""
        without = result.failed(errors, reason)
        gone = frozenset(errors)
        since = result.changes
        if since is not None:
            changes: Changes | None = Changes(since.since, since.ids | gone)
        else:
            changes = _changes(result, gone)
        out = replace(without, revision=next(_REVISIONS), changes=changes)
        run = self._run
        if run is None or result is not self._result:
            return out
        where, made = run.where, self._made
        placed = [iid for iid in sorted(gone) if iid in where]  # (in one order every time)
        for iid in gone:
            made.pop(iid, None)
        run.release_all(placed)
        self._dirty.update(placed)
        self._result = out  # (its placements in the order of result's)
        return out

    def _balance(
        self,
        unit: UnitConfig | None,
        nodes: Sequence[Node],
        services: Sequence[Service],
        previous: Mapping[str, PreviousAllocation] | None,
        mode: Mode | None,
        overload: Overload | None,
        exhaustive: bool,
        previous_since: PreviousSince | None,
        inputs: InputChanges | None,
    ) -> BalanceResult:
        if mode is None:
            mode = unit.placement if unit is not None else "stable"
        seen, self._seen = self._seen, None  # (set again when this call ends)
        told = inputs if inputs is not None and inputs.counts_from(seen) else None
        edits = self._edits(services, told)
        was = {k: self._expanded.get(k) for k in edits}  # (what the run holds of them)
        self._expand(edits)
        revision = inputs.revision if inputs is not None else None
        if mode == "stable" and not overload and not exhaustive:
            got = self._incremental(unit, nodes, edits, was, previous or {}, previous_since, told)
            if got is not None:
                self._seen = revision
                return got
        instances = self._flat()
        made: Made = {}
        search: SearchFactory = Exhaustive if exhaustive else partial(ClassIndex, services=services)
        result, run = run_balance(
            unit, nodes, services, previous, mode, overload, search, instances, made
        )
        self.incremental = False
        self.replaced = len(instances)
        self._seen = revision  # (``_expanded`` holds these services)
        if mode == "rebalance" or overload or exhaustive or result.held:
            # not a state the next stable call may start from (a held instance tries its
            # current spec in every full run)
            self._run = None
            return result
        result = _numbered(result)
        self._unit, self._nodes = unit, {n.id: n for n in nodes}
        self._node_at = dict(zip(self._nodes, range(len(nodes)), strict=False))
        self._run, self._result, self._made = run, result, made
        self._result_order = self._order
        self._validated = self._validated_from = None
        self._tried = {}  # (another run: its moves count from nothing)
        return result

    def _edits(
        self, services: Sequence[Service], told: InputChanges | None
    ) -> dict[ServiceKey, Service | None]:
        """The services that differ from the last call's (``_expanded``), by key: the new one,
        or None for one removed. ``told``: changes that count from the last call's inputs;
        the services they name are looked up in ``services`` where they were last time (no
        pass over every service) when none was added or removed. Without them, every service
        is compared with the last call's by equality."""
        old = self._expanded
        n = len(services)
        if told is not None:
            keys = told.services
            at = self._service_at
            if n == len(old) and all(k in old for k in keys):
                edits: dict[ServiceKey, Service | None] = {}
                for k in keys:
                    i = at.get(k)
                    if i is None or i >= n or services[i].key != k:
                        break
                    edits[k] = services[i]
                else:
                    return edits  # as many as before, none removed: none added
        by_key = {s.key: s for s in services}
        if len(by_key) != n:
            raise ValueError(twice(services))
        self._service_at = dict(zip(by_key, range(n), strict=True))
        if told is not None:
            edits = {k: by_key.get(k) for k in told.services if k in by_key or k in old}
            added = sum(1 for k in edits if k not in old)
            removed = sum(1 for s in edits.values() if s is None)
            if len(by_key) == len(old) + added - removed:
                return edits
            # (else the changes do not describe these services: compared below)
        edits = {}
        for k, s in by_key.items():
            was = old.get(k)
            if was is None or was[0] != s:
                edits[k] = s
        for k in old:
            if k not in by_key:
                edits[k] = None
        return edits

    def _expand(self, edits: Mapping[ServiceKey, Service | None]) -> None:
        """``_expanded`` and ``_order`` with ``edits`` (see :meth:`_edits`) put in; when none
        of them was added, removed or given another priority, the order is the last one."""
        if not edits:
            return
        expanded = self._expanded
        if all(
            s is not None and k in expanded and expanded[k][0].priority == s.priority
            for k, s in edits.items()
        ):
            for k, s in edits.items():
                assert s is not None
                expanded[k] = (s, _expanded_again(expanded[k], s))
            return
        for k, s in edits.items():
            if s is None:
                expanded.pop(k, None)
            else:
                got = expanded.get(k)
                expanded[k] = (s, expand_instances([s]) if got is None else _expanded_again(got, s))
        order = sorted(expanded, key=lambda k: service_order(expanded[k][0]))
        self._expanded = {k: expanded[k] for k in order}
        self._order = order

    def _position(self) -> dict[ServiceKey, int]:
        """Each service key's position in ``_order`` (made again when ``_order`` is another
        list: it is replaced, never changed in place)."""
        order, pos = self._pos
        if order is not self._order:
            pos = dict(zip(self._order, range(len(self._order)), strict=True))
            self._pos = (self._order, pos)
        return pos

    def _flat(self) -> list[Instance]:
        expanded = self._expanded
        return list(chain.from_iterable(expanded[key][1] for key in self._order))

    def _renewed(self, nodes: Sequence[Node], told: InputChanges | None) -> list[Node] | None:
        """The nodes that differ from the memo's in their measured usage alone (``usage``,
        ``reportedAt``); None when another node differs otherwise, or was added or removed.
        ``told``: changes that count from the last call's inputs (their nodes are looked up
        where they were last time); without them, every node is compared by equality."""
        known = self._nodes
        if len(nodes) != len(known):
            return None
        if told is None:
            differ: Iterable[Node] = (n for n in nodes if known.get(n.id) != n)
        else:
            differ = []
            at, fresh = self._node_at, False
            for node_id in told.nodes:
                i = at.get(node_id)
                if not fresh and (i is None or i >= len(nodes) or nodes[i].id != node_id):
                    at = self._node_at = {n.id: i for i, n in enumerate(nodes)}
                    i, fresh = at.get(node_id), True
                if i is None:
                    if node_id in known:
                        return None  # removed
                    continue  # (added and removed since)
                differ.append(nodes[i])
        renewed: list[Node] = []
        for node in differ:
            before = known.get(node.id)
            if before is None:
                return None  # added
            if before == node:
                continue  # (named, but equal)
            if not _usage_only(before, node):
                return None
            renewed.append(node)
        return renewed

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
        edits: Mapping[ServiceKey, Service | None],
        was: Mapping[ServiceKey, tuple[Service, list[Instance]] | None],
        previous: Mapping[str, PreviousAllocation],
        previous_since: PreviousSince | None,
        told: InputChanges | None,
    ) -> BalanceResult | None:
        """The answer from the memo's run, or None (see the class docstring). ``edits``:
        the services that changed (put in ``_expanded`` already), ``was``: what ``_expanded``
        held of them before (what the run reserved for)."""
        run, result = self._run, self._result
        if run is None or result is None or run.cause is not None or run.overloaded:
            return None
        if (told is None or told.unit) and unit != self._unit:
            return None
        renewed = self._renewed(nodes, told)
        if renewed is None:
            return None
        if not self._previous_is_result(result, previous, previous_since):
            return None
        if renewed:
            self._run = None  # mutated: a refusal leaves no usable state
            if not run.renew_usage(unit, renewed):
                return None
            self._run = run
            for node in renewed:
                self._nodes[node.id] = node
        changed = set(edits)
        if not changed and not result.failures:
            # the full run keeps every instance where it is (pass 1) and evicts nobody
            self.incremental, self.replaced = True, 0
            if not result.preempted:
                return result
            again = _numbered(
                replace(result, preempted=frozenset(), changes=_changes(result, frozenset()))
            )
            self._result = again
            return again
        # (With nothing changed but instances unplaced, those go through pass 2 and 3 again,
        # as in the full run: one evicted by the last run's pass 3 may now evict another.)
        self._run = None  # mutated below: a failure leaves no usable state
        index = run.search
        assert isinstance(index, ClassIndex)  # (a memo keeps no exhaustive run)
        index.compacted()
        expanded = self._expanded
        # A service scaled (edited in its instance count alone) keeps the reservations of the
        # instances both counts have: pass 1 would keep each where it is, with the very
        # amounts, resources and devices (the same spec asks the same), so each reservation
        # is only given the instance of the new spec (the class index knows a service by its
        # object). The others, and every instance of a service edited otherwise, are released.
        staying = {
            key: min(got[0].instances, now.instances)
            for key, now in edits.items()
            if now is not None and (got := was.get(key)) is not None and _count_only(got[0], now)
        }
        # release every instance of the services as they were
        where = run.where
        gone = set()
        replaced = 0
        made = self._made
        for key in sorted(changed):  # the same order every time (device pools keep holders)
            got = was.get(key)
            if got is None:
                continue
            gone.add(id(got[0]))  # (the class index knows a service by its object)
            stay = staying.get(key, 0)
            if stay:
                _rebind(where, got[1][:stay], expanded[key][1][:stay])
            for inst in got[1][stay:]:
                made.pop(inst.id, None)
            run.release_all(inst.id for inst in got[1][stay:])
        index.forget_services(gone)
        index.freed()
        # pass 1 for the services as they are now
        for key in sorted(k for k, s in edits.items() if s is not None):
            for inst in expanded[key][1][staying.get(key, 0) :]:
                replaced += 1
                prev = previous.get(inst.id)
                if prev is not None and not run.keep(inst, prev):
                    return None
        # pass 2 and 3: only the changed services and those with an instance unplaced last
        # time can have an instance without a place (in instance order, as in the full run)
        # An unchanged service that no node can serve whatever is reserved (too big for
        # every empty node, or no node passing its static filters) fails there again and
        # evicts nobody: it is left out (its failures: see below).
        # (A stable run is never overloaded: every instance of a service asks the same.)
        failing = self._failing_of(result)
        unplaced = changed | failing.keys()
        pos = self._position()
        # An unchanged service whose every instance failed when the memo's run last sent it
        # through pass 2 and 3 fails again, and evicts nobody, while no node passing its
        # static filters was reserved on or released from since just before those passes:
        # those nodes hold what they held then (the full run keeps it all in its pass 1), and
        # what pass 2 places on them before its turn is of its priority or above (instance
        # order), which neither makes room nor can be evicted by it. It is left out too.
        tried = self._tried
        pending: list[Instance] = []
        sent: list[ServiceKey] = []
        unresolved: list[ServiceKey] = []  # left out, every instance failing last time
        for key in sorted((k for k in unplaced if k in pos), key=pos.__getitem__):
            insts = expanded[key][1]
            if not insts:
                continue
            if key not in changed and (run.too_big(insts[0]) or index.nowhere(insts[0])):
                if len(failing[key]) == len(insts):  # (so none is placed: a memo holds none)
                    unresolved.append(key)
                continue
            since = tried.get(key) if key not in changed else None
            if (
                since is not None
                and len(failing[key]) == len(insts)
                and not index.moved_for(insts[0], since)
            ):
                unresolved.append(key)
                continue
            pending += [inst for inst in insts if inst.id not in where]
            sent.append(key)
        before_passes = index.moved_count()
        preempted = passes(run, pending, {}, always, preempt=True, everyone=self._flat)
        for key in changed:
            tried.pop(key, None)
        tried.update(dict.fromkeys(sent, before_passes))
        # Such a service left out has no placement, before and after; its failures are the
        # last result's very objects when they are charged alike on the final node states (as
        # the full run's ``failures`` would give them back; always, where only static filters
        # charge it): then it is not looked at again.
        kept: dict[ServiceKey, tuple[Failure, ...]] = {}
        for key in unresolved:
            first, inst = failing[key][0], expanded[key][1][0]
            if index.settled(inst) or (first.reason, first.counts) == run.charge(inst):
                kept[key] = failing[key]
        # Only these services' placements can differ from the last result's: the changed ones,
        # those with an instance unplaced before the passes (pass 2 may place it) and those of
        # an evicted instance; every other instance kept its very reservation.
        affected = set(changed)
        affected.update(k for k in failing if k not in kept)
        old_by_id = result.by_id
        for iid in preempted:
            placed = old_by_id.get(iid)
            if placed is not None:
                affected.add((placed.item_id, placed.subject_id))
        # Every other service keeps its segment (its placements, consecutive in instance
        # order): only the affected ones are looked at, in instance order. While the order of
        # the services is the one of the last result, each segment is found there by
        # bisection and the new placements are the last ones with those segments replaced.
        old = result.placements
        # (a service added or removed makes _expand order them anew: another list)
        spliced = self._result_order is self._order and all(k in pos for k in changed)
        segments = {} if spliced else _segments_of(result)
        pieces: list[tuple[Placement, ...]] = []
        end = 0
        new_segments = dict(segments)
        by_id = dict(old_by_id)
        redone: list[Instance] = []  # the affected services' instances, in instance order
        dirty = self._dirty  # (emptied by the check of previous above)
        for key in sorted((k for k in affected if k in pos), key=pos.__getitem__):
            if spliced:
                k = pos[key]
                start = bisect_left(old, k, lo=end, key=lambda p: pos[p.item_id, p.subject_id])
                pieces.append(old[end:start])
                end = bisect_right(old, k, lo=start, key=lambda p: pos[p.item_id, p.subject_id])
                old_seg = old[start:end]
            else:
                old_seg = segments.get(key, ())
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
            new_segments[key] = seg
            pieces.append(seg)
        for key in changed:
            if key not in pos:  # a service gone
                for p in new_segments.pop(key, ()):
                    del by_id[p.instance_id]
                    dirty.add(p.instance_id)
        if spliced:  # (no service was added or removed: the order would have changed)
            pieces.append(old[end:])
            placements = tuple(chain.from_iterable(pieces))
        else:
            order = self._order
            placements = tuple(
                chain.from_iterable(map(new_segments.get, order, repeat((), len(order))))
            )
        before = {f.instance_id: f for k, fs in failing.items() if k not in kept for f in fs}
        failures = _by_service(run.failures(redone, before))
        failures.update(kept)
        result = BalanceResult(
            placements,
            tuple(chain.from_iterable(failures[k] for k in sorted(failures, key=pos.__getitem__))),
            frozenset(preempted),
            by_id,
            revision=next(_REVISIONS),
            changes=_changes(result, frozenset(dirty)),
        )
        self._run, self._result = run, result
        self._failing = (result, failures)
        self._result_order = self._order
        self.incremental, self.replaced = True, replaced
        return result

    def _failing_of(self, result: BalanceResult) -> dict[ServiceKey, tuple[Failure, ...]]:
        """``result``'s failures by service (known when an incremental call made it)."""
        made, failing = self._failing
        if made is not result:
            failing = _by_service(result.failures)
            self._failing = (result, failing)
        return failing


_REVISIONS = count(1)
"""The revisions the memos give their results: unique in this process."""


def states_of(run: Run) -> Callable[[], dict[str, NodeSlot] | None]:
    """The run's node states by node id (see ``accel.FinalStates``): given once, then None,
    so that their memory is freed as soon as the caller is done with them (the status report
    is the peak of a oneshot's memory). Only the states are kept, not the run's index."""
    taken: list[dict[str, NodeSlot]] = [{slot.id: slot for slot in run.all_slots()}]
    return lambda: taken.pop() if taken else None


def _numbered(result: BalanceResult) -> BalanceResult:
    """``result`` with a revision of its own (a result a later one can name in its changes)."""
    return replace(result, revision=next(_REVISIONS))


def _by_service(failures: Iterable[Failure]) -> dict[ServiceKey, tuple[Failure, ...]]:
    """Failures by service, each service's in the order given."""
    by: dict[ServiceKey, list[Failure]] = {}
    for f in failures:
        key = (f.item_id, f.subject_id)
        got = by.get(key)
        if got is None:
            by[key] = [f]
        else:
            got.append(f)
    return {key: tuple(fs) for key, fs in by.items()}


def _changes(last: BalanceResult, ids: frozenset[str]) -> Changes | None:
    """What changed since ``last``: ``ids``, counted from its revision (None: it has none)."""
    return Changes(last.revision, ids) if last.revision is not None else None


_MEASURED = {"usage": None, "reportedAt": None}


def _count_only(old: Service, new: Service) -> bool:
    """Whether two versions of a service differ in nothing but their instance count."""
    return (
        old.instances != new.instances
        and old.model_copy(update={"instances": new.instances}) == new
    )


def _expanded_again(was: tuple[Service, list[Instance]], now: Service) -> list[Instance]:
    """``expand_instances([now])``, given the expansion of the service's last version: the
    ids of the indices both have are taken from it (each is a uuid5 of item:subject:index)."""
    instances = was[1]
    keep = min(len(instances), now.instances)
    item, subject = now.id, now.subject
    out = [new_instance(i.id, item, subject, i.index, now) for i in instances[:keep]]
    ids = instance_ids(item, subject, keep, now.instances)
    out += [new_instance(iid, item, subject, k, now) for k, iid in enumerate(ids, keep)]
    return out


def _rebind(
    where: Mapping[str, NodeSlot], old: Sequence[Instance], new: Sequence[Instance]
) -> None:
    """Give each reservation of an ``old`` instance the ``new`` instance of the same index
    (the same id; the reservation object stays, so what was made of it stays valid)."""
    for was, now in zip(old, new, strict=True):
        assert was.id == now.id  # (by index: uuid5 of item:subject:index)
        slot = where.get(was.id)
        if slot is not None:
            slot.placed[was.id].instance = now


def _usage_only(old: Node, new: Node) -> bool:
    """Whether two versions of a node's document differ in nothing but what its agent measures
    on every sample (``usage``, ``reportedAt``)."""
    return old.model_copy(update=_MEASURED) == new.model_copy(update=_MEASURED)


def _same_where_equal(
    seg: tuple[Placement, ...], old_seg: tuple[Placement, ...]
) -> tuple[Placement, ...]:
    """``seg`` with each placement equal to the last result's for the same instance replaced
    by that very object: an affected service's instances are released and placed again, most
    of them where they were, and every later stage takes an object it has seen as unchanged
    (``BalanceResult.changes`` need not name it). (``made`` keeps the new, equal object: it is
    only consulted for a reservation that was not released since.)"""
    if not old_seg:
        return seg
    before = {p.instance_id: p for p in old_seg}
    out = []
    for p in seg:
        q = before.get(p.instance_id)
        out.append(q if q is not None and (q is p or q == p) else p)
    return tuple(out)


def _segments_of(result: BalanceResult) -> dict[tuple[str, str], tuple[Placement, ...]]:
    """The placements of ``result`` per service (each service's are consecutive)."""
    return {
        key: tuple(group)
        for key, group in groupby(result.placements, key=lambda p: (p.item_id, p.subject_id))
    }


# ----------------------------------------------------------------------------- explain
