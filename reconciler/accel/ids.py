"""The uid and gid memo: what a long-running caller (``watch``) carries from one assignment
to the next, so that an edit re-assigns the ids of the nodes it touched only. It gives what
:func:`reconciler.planning.checkpoint.assign_ids` (the reference) gives, from the same rules
(``assign_gids``, ``node_allocations``); the differential tests compare."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from operator import attrgetter, is_
from typing import cast

from reconciler.placement.instances import BalanceResult, Placement, placement_order
from reconciler.planning.checkpoint import (
    GID_RANGE,
    Allocation,
    Checkpoint,
    assign_gids,
    collect_allocations,
    node_allocations,
    placements_by_node,
)

__all__ = ["IdsMemo"]

_ITEM_ID = attrgetter("item_id")


class IdsMemo:
    """What :func:`~reconciler.planning.checkpoint.assign_ids` made last call, per node: the
    node's placements (by identity) and the allocation it gave each. A node whose placements
    are the very same objects, in the same order, whose old allocations are the ones given last
    call, with the same gids, gets the same allocations: its uids depend on nothing else (they
    are unique per node). A long-running caller (``watch``) keeps one across runs; it belongs
    to one caller.

    It also keeps the last call's result and the allocations it returned, when every placement
    got one: a call whose result names that result in its ``since`` (see
    :class:`~reconciler.placement.instances.BalanceResult`), whose old allocations are exactly the
    ones returned (:meth:`given_last`) and whose gids are the same works on the nodes of the
    instances ``since`` names only (an item added or removed since has all its instances named;
    every other item must keep its gid)."""

    def __init__(self) -> None:
        self._gids: dict[str, int] | None = None
        self._counts: Counter[str] | None = None  # each placed item's placements, last call
        self._nodes: dict[str, tuple[list[Placement], list[Allocation]]] = {}
        self._result: BalanceResult | None = None
        self._out: dict[str, Allocation] | None = None  # None: the last call had errors
        self.patched = False  # whether the last call worked on the named nodes only
        self.since: tuple[Mapping[str, Allocation], frozenset[str]] | None = None
        """After a patched call: the allocations the call before returned, and a superset of
        the ids whose allocation differs in this call's (see :attr:`Checkpoint.since`)."""

    def since_for(
        self, allocations: Mapping[str, Allocation]
    ) -> tuple[Mapping[str, Allocation], frozenset[str]] | None:
        """:attr:`since`, when ``allocations`` is what the last call returned."""
        return self.since if self.since is not None and allocations is self._out else None

    def assign(
        self,
        result: BalanceResult,
        old: Mapping[str, Allocation],
        old_gids: Mapping[str, int],
        *,
        old_is_last: bool = False,
    ) -> tuple[dict[str, Allocation], dict[str, int], list[str]]:
        """:func:`assign_ids`, recomputing only the nodes whose placements changed since this
        memo's last call. ``old_is_last``: ``old`` holds exactly the allocations the last call
        returned (the very objects; see :meth:`given_last`)."""
        return self._assign(result, old, old_gids, old_is_last)

    def given_last(self, cp: Checkpoint) -> bool:
        """Whether ``cp``'s allocations are exactly the ones the last call returned: the
        checkpoint file written from them, read back through the decode cache that wrote it
        (:class:`~reconciler.accel.checkpoint.CheckpointCache`: the very objects)."""
        out = self._out
        return out is not None and cp.memo is not None and cp.memo.decoded(out) is cp.allocations

    def _assign(
        self,
        result: BalanceResult,
        old: Mapping[str, Allocation],
        old_gids: Mapping[str, int],
        old_is_last: bool,
    ) -> tuple[dict[str, Allocation], dict[str, int], list[str]]:
        """:func:`~reconciler.planning.checkpoint.assign_ids` from the same rules, reusing the
        allocations of each node whose placements, old allocations and gids are the last
        call's (the very objects), or patching the last call's mapping (see
        :meth:`_patched_ids`). After a patched call the touched nodes' allocations come last in
        the mapping (every caller looks them up by id, and the checkpoint sorts them)."""
        got = self._patched_gids(result, old_gids)
        if got is None:
            gids, errors = assign_gids(result.placements, old_gids)
            counts = Counter(map(_ITEM_ID, result.placements))
        else:
            (gids, counts), errors = got, []
        self._counts = counts if not errors else None
        placements = result.placements
        self.since = None
        patched = None
        if old_is_last and not errors:
            # (gids patched from the last call's keep every gid of an item placed then and now)
            patched = self._patched_ids(result, old, gids, kept=got is not None)
        self.patched = patched is not None
        if patched is not None:
            return patched, gids, []
        by_node = placements_by_node(placements)
        last = self._nodes if self._gids == gids else {}
        nodes_now: dict[str, tuple[list[Placement], list[Allocation]]] = {}
        given: dict[str, Allocation | str | None] = {}
        for node_id, ps in by_node.items():
            ids = [p.instance_id for p in ps]
            was = last.get(node_id)
            if (
                was is not None
                and len(was[0]) == len(ps)
                and all(map(is_, was[0], ps))
                and all(map(is_, map(old.get, ids), was[1]))
            ):
                nodes_now[node_id] = was
                given.update(zip(ids, was[1], strict=True))
                continue
            made = node_allocations(ps, old, gids)
            if all(type(a) is Allocation for a in made):
                nodes_now[node_id] = (ps, cast(list[Allocation], made))
            given.update(zip(ids, made, strict=True))
        allocations = collect_allocations(placements, given, errors)
        self._gids, self._nodes = gids, nodes_now
        clean = not errors and len(allocations) == len(placements)
        self._result, self._out = (result, allocations) if clean else (None, None)
        return allocations, gids, errors

    def _patched_gids(
        self, result: BalanceResult, old_gids: Mapping[str, int]
    ) -> tuple[dict[str, int], Counter[str]] | None:
        """:func:`assign_gids`' gids and each item's placement count, from the last call's for
        the instances ``result.changes`` names only: while ``old_gids`` are the gids the last
        call gave (the checkpoint it wrote), every item placed then and now keeps its gid, an
        item no longer placed loses it, and the items placed anew take the smallest free gids
        in item order, as the full pass gives them. The very mapping of the last call when no
        item came or went. None when that does not apply (the caller takes the full pass)."""
        last, last_gids, counts = self._result, self._gids, self._counts
        if last is None or last_gids is None or counts is None:
            return None
        if old_gids is not last_gids and old_gids != last_gids:
            return None
        named = result.changed_since(last)
        if named is None:
            return None
        now_by_id, then_by_id = result.by_id, last.by_id
        delta: Counter[str] = Counter()
        for iid in named:
            then, now = then_by_id.get(iid), now_by_id.get(iid)
            if then is now:
                continue
            if then is not None:
                delta[then.item_id] -= 1
            if now is not None:
                delta[now.item_id] += 1
        came, went = [], []
        for item, d in delta.items():
            if d:
                before = counts.get(item, 0)
                if before == 0:
                    came.append(item)
                elif before + d == 0:
                    went.append(item)
        if not came and not went:
            if delta:
                counts = counts.copy()
                counts.update(delta)
            return last_gids, counts
        gids = dict(last_gids)
        for item in went:
            del gids[item]
        used = set(gids.values())
        free = (g for g in GID_RANGE if g not in used)
        for item in sorted(came):
            gid = next(free, None)
            if gid is None:
                return None  # (the full pass says which items found none)
            gids[item] = gid
        counts = counts.copy()
        counts.update(delta)
        for item in went:
            del counts[item]
        return gids, counts

    def _patched_ids(
        self,
        result: BalanceResult,
        old: Mapping[str, Allocation],
        gids: dict[str, int],
        *,
        kept: bool = False,
    ) -> dict[str, Allocation] | None:
        """:func:`assign_ids`' allocations, made from this memo's last call for the nodes of the
        instances ``result.changes`` names only (every other node has the very placements, old
        allocations and gids of the last call, so the same allocations); None when that does not
        apply or a node ran out of uids (the caller then makes them all)."""
        last, out, last_gids = self._result, self._out, self._gids
        if last is None or out is None or last_gids is None:
            return None
        # an item added or removed since has all its instances named; any other keeps its gid
        # (``kept``: known, gids being :meth:`_patched_gids`' of the last call's)
        if (
            not kept
            and gids != last_gids
            and any(gids.get(item, gid) != gid for item, gid in last_gids.items())
        ):
            return None
        named = result.changed_since(last)
        if named is None:
            return None
        now_by_id, then_by_id = result.by_id, last.by_id
        touched: dict[str, list[Placement]] = {}  # node -> its placements named by ``since``
        for iid in named:
            then = then_by_id.get(iid)
            if then is not None:
                touched.setdefault(then.node_id, [])
            now = now_by_id.get(iid)
            if now is not None:
                touched.setdefault(now.node_id, []).append(now)
        if not touched and len(out) == len(result.placements):
            # every placement the last call's object, in its order: the very mapping it returned
            # (so the checkpoint that holds it still reads as "given last")
            self._gids, self._result, self.since = gids, result, (out, frozenset())
            return out
        nodes = dict(self._nodes)
        given = dict(out)
        staying: dict[str, list[Placement]] = {}
        changed = set(named)  # the ids whose allocation may differ from the last call's
        for node_id in touched:  # first every touched node's last allocations out (a moved
            was = nodes.pop(node_id, None)  # instance's new node may come before its old one)
            if was is not None:
                for p in was[0]:
                    del given[p.instance_id]
                    changed.add(p.instance_id)
                staying[node_id] = [p for p in was[0] if p.instance_id not in named]
        for node_id, arrived in touched.items():
            ps = staying.get(node_id, []) + arrived
            if not ps:
                continue
            ps.sort(key=placement_order)  # as in the result
            made = node_allocations(ps, old, gids)
            if not all(type(a) is Allocation for a in made):
                return None
            allocs = cast(list[Allocation], made)
            nodes[node_id] = (ps, allocs)
            given.update(zip([p.instance_id for p in ps], allocs, strict=True))
        # (not expected: the nodes above hold every placement; the ids not named are the last
        # call's, whose keys were the last result's)
        if len(given) != len(result.placements) or any(
            (iid in given) is not (iid in now_by_id) for iid in named
        ):
            return None
        # the last mapping with the touched nodes' allocations taken out and put in again (at the
        # end: not in placement order, see assign_ids; building it in that order costs 2-3 ms)
        allocations = given
        self._gids, self._nodes, self._result, self._out = gids, nodes, result, allocations
        self.since = (out, frozenset(changed))
        return allocations
