"""The planner's memo: what a long-running caller (``watch``) carries from one plan to the
next, so that a plan that changed little costs little. It gives the plan and the plan bytes
:func:`reconciler.planning.plans.make_plan` and ``plan_bytes`` give (the reference; the
differential tests compare), from the same rules (:func:`~reconciler.planning.plans.stop_reason`,
``match_node``, ``node_patch``): only what it reuses is its own."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from reconciler.model.documents import ActualInstance, ActualState
from reconciler.model.jsonbytes import Joined
from reconciler.placement.instances import BalanceResult, Failure, Placement
from reconciler.planning.plans import (
    Action,
    Plan,
    Reason,
    action_piece,
    arrivals,
    by_node_and_id,
    failure_piece,
    match_node,
    node_patch,
    node_piece,
    plan_document,
    start_action,
    stop_action,
    stop_reason,
)

__all__ = ["PlanMemo"]

_Match = tuple[
    ActualState, tuple[Placement | None, ...], list[str], list[tuple[str, ActualInstance]]
]

_NodePatch = tuple[
    int, list[Action], list[Action], tuple[dict[str, Any], ...], tuple[str | None, ...]
]
"""A node's patch in a :class:`PlanMemo`: the revision, stops and starts it was made for, the
patch, and the addresses its starts' records hold (SPEC §17)."""

_INSTANCE_ID = operator.attrgetter("instance_id")


def _identical(old: list[Action], new: list[Action]) -> bool:
    """The same action objects in the same order (an equal action may come from another
    placement: a patch's records are made from the placement, not the action)."""
    return len(old) == len(new) and all(map(operator.is_, old, new))


class PlanMemo:
    """What a long-running caller (``watch``) carries from one :func:`make_plan` call to the
    next, so that a plan that changed little costs little: per node, the diff of its actual
    document against the placements it names (while that document and those placements are
    the same objects), the actions (while their placement or running instance and reason are
    the same objects and value), the sorted action lists, and each node's patch (while its
    revision and actions are the same). Every reuse is checked against the inputs it came
    from; the plan is the one :func:`make_plan` computes without a memo."""

    def __init__(self) -> None:
        self._matches: dict[
            str,
            tuple[
                ActualState,
                tuple[Placement | None, ...],
                list[str],
                list[tuple[str, ActualInstance]],
            ],
        ] = {}
        self._stops: dict[tuple[str, str], tuple[ActualInstance, Reason, Action]] = {}
        self._starts: dict[str, tuple[Placement, Reason, Action]] = {}
        self._sorted: tuple[list[Action], list[Action], list[Action], list[Action]] | None = None
        # per node: the revision, stops and starts its patch was made for, the patch, and the
        # addresses the starts' records hold (SPEC §17)
        self._patches: dict[str, _NodePatch] = {}
        self.patches_built = 0  # in the last call: nodes whose patch was built again
        self.rematched = -1  # in the last call: nodes matched again by the delta path (-1: none)
        # plan_bytes: each action's and each node's pretty JSON, by the object it came from
        self._node_ids: set[str] = set()  # the last call's nodes (existing, actual, with actions)
        self._node_order: list[str] = []  # the same, sorted
        self._docs: dict[str, ActualState] = {}  # the last call's actual documents
        self._active: set[str] = set()  # the last call's nodes with actions
        self._patch_map: dict[str, tuple[dict[str, Any], ...]] = {}  # its Plan.patches
        self._action_fragments: dict[int, tuple[Action, bytes]] = {}
        self._node_fragments: dict[str, tuple[tuple[dict[str, Any], ...], bytes]] = {}
        # the last call's patch map and the nodes it looked at, when it was made from the one
        # before (the same nodes: every other node's patch is that one's object)
        self._patched_from: tuple[Mapping[str, Any], Iterable[str]] | None = None
        # plan_bytes: the patch map its node pieces were made for, the pieces in node id
        # order, and each node's position in them
        self._pieces_for: Mapping[str, Any] | None = None
        self.node_pieces: list[bytes] = []
        self._node_pos: dict[str, int] = {}
        self._actions_joined = Joined()
        self._nodes_joined = Joined()
        self._failure_fragments: dict[int, tuple[Failure, bytes]] = {}
        self._failures_joined = Joined()
        # the delta path (see _delta_matches): the last call's result and what it made of it,
        # while no instance was listed by two actual documents (else None: the full pass)
        self._result: BalanceResult | None = None
        self._listing: dict[str, str] | None = None  # instance id -> the node whose doc lists it
        self._kept: set[str] = set()  # the instances running where they are placed
        self._others: dict[str, list[tuple[str, ActualInstance]]] = {}  # nodes with any
        self._actual_order: list[str] = []  # the actual documents' node ids, sorted

    @property
    def patch_map(self) -> Mapping[str, tuple[dict[str, Any], ...]]:
        """The last call's ``Plan.patches`` (the mapping itself)."""
        return self._patch_map

    @property
    def patched_from(self) -> tuple[Mapping[str, Any], Iterable[str]] | None:
        """When the last call made its patches from the call before's (the same nodes): that
        call's ``Plan.patches`` and the nodes looked at; every other node's patch is the very
        object of that mapping. None otherwise."""
        return self._patched_from

    def make_plan(
        self,
        result: BalanceResult,
        actual: Mapping[str, ActualState],
        nodes: frozenset[str] | set[str],
        *,
        fingerprint: str = "",
        addresses: Mapping[str, str] | None = None,
    ) -> Plan:
        """:func:`~reconciler.planning.plans.make_plan`, reusing what this memo kept of the
        last call (and keeping this call's for the next). ``addresses``: see ``make_plan`` (a
        node's patch is made again when an address its starts record changes)."""
        return self._plan(result, actual, nodes, fingerprint, addresses or {})

    def _plan(
        self,
        result: BalanceResult,
        actual: Mapping[str, ActualState],
        nodes: frozenset[str] | set[str],
        fingerprint: str,
        addresses: Mapping[str, str],
    ) -> Plan:
        m = self
        desired = result.by_id
        get = desired.get
        moved_reason: dict[str, Reason] = {}
        m.rematched = -1
        delta = m._delta_matches(result, actual, get)
        if delta is not None:
            kept, running, waiting_ids = delta
        else:
            kept, running = m._full_matches(actual, get)
            waiting_ids = None
        m._result = result
        stops: list[Action] = []
        old_stops = m._stops
        stops_now: dict[tuple[str, str], tuple[ActualInstance, Reason, Action]] = {}
        # desired instances without a place: a stop of one is never "not-desired"
        unplaced = {f.instance_id: f.priority for f in result.failures} if result.failures else {}
        arrived: list[Mapping[str, int]] = []

        def arrivals_of() -> Mapping[str, int]:
            if not arrived:
                arrived.append(arrivals(result, actual))
            return arrived[0]

        for node_id, iid, inst in running:
            p = get(iid)
            reason = stop_reason(node_id, inst, p, nodes, unplaced, arrivals_of, iid)
            if p is not None and reason != "not-desired":
                moved_reason.setdefault(iid, reason)
            was = old_stops.get((node_id, iid))
            if was is not None and was[0] is inst and was[1] == reason:
                action = was[2]
            else:
                action = stop_action(node_id, iid, inst, reason)
            stops_now[(node_id, iid)] = (inst, reason, action)
            stops.append(action)
        m._stops = stops_now
        starts: list[Action] = []
        old_starts = m._starts
        starts_now: dict[str, tuple[Placement, Reason, Action]] = {}
        waiting: Iterable[Placement]
        if waiting_ids is not None:  # the delta path named the ids that can be waiting
            waiting = [p for p in map(get, waiting_ids - kept) if p is not None]
        else:  # the placements not running where placed (C-level passes: in a steady state, none)
            placements = result.placements
            not_kept = map(operator.not_, map(kept.__contains__, map(_INSTANCE_ID, placements)))
            waiting = itertools.compress(placements, not_kept)
        for p in waiting:
            iid = p.instance_id
            reason = moved_reason.get(iid, "new")
            known = old_starts.get(iid)
            if known is not None and known[0] is p and known[1] == reason:
                action = known[2]
            else:
                action = start_action(p, reason)
            starts_now[iid] = (p, reason, action)
            starts.append(action)
        m._starts = starts_now
        last = m._sorted
        if last is not None and _identical(last[0], stops) and _identical(last[1], starts):
            stops, starts = last[2], last[3]  # the same actions in the same order: sorted alike
        else:
            unsorted_stops, unsorted_starts = stops, starts
            stops = sorted(stops, key=by_node_and_id)
            starts = sorted(starts, key=by_node_and_id)
            m._sorted = (unsorted_stops, unsorted_starts, stops, starts)

        by_node: dict[str, tuple[list[Action], list[Action]]] = {}
        for a in stops:
            by_node.setdefault(a.node_id, ([], []))[0].append(a)
        for a in starts:
            by_node.setdefault(a.node_id, ([], []))[1].append(a)
        patches: dict[str, tuple[dict[str, Any], ...]] = {}
        old_patches = m._patches
        patches_now: dict[str, _NodePatch] = {}
        none: tuple[list[Action], list[Action]] = ([], [])
        built = 0
        every = set(nodes)
        every.update(actual, by_node)
        look_at: Iterable[str] = m._node_order
        patched_from: tuple[Mapping[str, Any], Iterable[str]] | None = None
        if every != m._node_ids:  # else the same ids, sorted last call
            m._node_ids, m._node_order = every, sorted(every)
            look_at = m._node_order
        elif len(m._patch_map) == len(every):
            # the same nodes: a node's patch can differ only where its document is not the last
            # call's object or it has actions now or had some then (C-level passes over the ids)
            order = m._node_order
            docs_now, docs_then = map(actual.get, order), map(m._docs.get, order)
            look_at = set(itertools.compress(order, map(operator.is_not, docs_now, docs_then)))
            look_at.update(by_node, m._active)
            patches = dict(m._patch_map)  # (the same keys in the same order: values replaced)
            patches_now = dict(old_patches)
            patched_from = (m._patch_map, look_at)
        for node_id in look_at:
            actual_doc = actual.get(node_id)
            revision = actual_doc.revision if actual_doc else 0
            node_stops, node_starts = by_node.get(node_id, none)
            ips = tuple([addresses.get(a.instance_id) for a in node_starts]) if addresses else ()
            was_patch = old_patches.get(node_id)
            if (
                was_patch is not None
                and was_patch[0] == revision
                and _identical(was_patch[1], node_stops)
                and _identical(was_patch[2], node_starts)
                and was_patch[4] == ips
            ):
                ops_tuple = was_patch[3]
            else:
                built += 1
                ops_tuple = node_patch(revision, node_stops, node_starts, desired, ips)
            patches_now[node_id] = (revision, node_stops, node_starts, ops_tuple, ips)
            patches[node_id] = ops_tuple
        m._patches = patches_now
        m.patches_built = built
        m._docs, m._active, m._patch_map = dict(actual), set(by_node), patches
        m._patched_from = patched_from
        return Plan(fingerprint, tuple(stops + starts), result.failures, patches)

    def _full_matches(
        self, actual: Mapping[str, ActualState], get: Any
    ) -> tuple[set[str], list[tuple[str, str, ActualInstance]]]:
        """Every node's instances as they are placed (kept: an id matches on the node it is placed
        on only) and the others, in node id order, reusing a node's match from the last call while
        its document and the placements it names are the same objects, and fills the memo, the
        delta path's index included (see :func:`_delta_matches`)."""
        m = self
        kept: set[str] = set()
        running: list[tuple[str, str, ActualInstance]] = []
        old_matches = m._matches
        matches_now: dict[str, _Match] = {}
        others_now: dict[str, list[tuple[str, ActualInstance]]] = {}
        order = sorted(actual)
        for node_id in order:
            doc = actual[node_id]
            got = old_matches.get(node_id)
            placed = tuple(map(get, doc.instances))
            if got is not None and got[0] is doc and got[1] == placed:
                matched, others = got[2], got[3]
                matches_now[node_id] = got
            else:
                matched, others = match_node(node_id, doc, get)
                matches_now[node_id] = (doc, placed, matched, others)
            kept.update(matched)  # (an id matches on the node it is placed on only)
            if others:
                others_now[node_id] = others
                running += [(node_id, iid, inst) for iid, inst in others]
        m._matches = matches_now
        m._listing = None
        listing: dict[str, str] = {}
        listed = 0
        for node_id in order:
            ids = actual[node_id].instances
            listed += len(ids)
            listing.update(dict.fromkeys(ids, node_id))
        if listed == len(listing):  # no instance listed by two documents
            m._listing, m._kept, m._others, m._actual_order = listing, kept, others_now, order
        return kept, running

    def _delta_matches(
        self, result: BalanceResult, actual: Mapping[str, ActualState], get: Any
    ) -> tuple[set[str], list[tuple[str, str, ActualInstance]], set[str]] | None:
        """:func:`_full_matches` from the last call's, when ``result`` names what changed since the
        last call's result (:attr:`BalanceResult.changes`), the same nodes have actual documents and
        no instance was listed by two of them: only the nodes whose document is not the last
        call's object, or that list a named id, are matched again. Also returns the ids that can
        be waiting to start (the last call's, the named ones and those no longer kept). None: take
        the full pass (which is what this gives, the running list in node id order)."""
        m = self
        listing, named = m._listing, result.changed_since(m._result)
        if listing is None or named is None:
            return None
        docs_then = m._docs
        if len(actual) != len(docs_then) or actual.keys() != docs_then.keys():
            return None
        order = m._actual_order
        docs_now = map(actual.__getitem__, order)
        edited = list(
            itertools.compress(order, map(operator.is_not, docs_now, map(docs_then.get, order)))
        )
        touched = {listing[iid] for iid in named if iid in listing}
        touched.update(edited)
        old_matches = m._matches
        matches_now = old_matches
        kept, others_now = m._kept, m._others
        left: set[str] = set()
        redone: list[list[str]] = []
        if edited:  # the documents list other ids: check first that no id is listed twice
            listing = dict(listing)
            for node_id in edited:  # (each id the last documents list is in the index once)
                for iid in docs_then[node_id].instances:
                    del listing[iid]
            for node_id in edited:
                for iid in actual[node_id].instances:
                    if listing.setdefault(iid, node_id) != node_id:
                        return None
        for node_id in sorted(touched):
            doc = actual[node_id]
            got = old_matches[node_id]
            placed = tuple(map(get, doc.instances))
            if got[0] is doc and got[1] == placed:
                continue
            if matches_now is old_matches:
                matches_now, kept, others_now = dict(old_matches), set(kept), dict(others_now)
            matched, others = match_node(node_id, doc, get)
            matches_now[node_id] = (doc, placed, matched, others)
            kept.difference_update(got[2])
            left.update(got[2])
            redone.append(matched)
            if others:
                others_now[node_id] = others
            else:
                others_now.pop(node_id, None)
        for matched in redone:  # (after every removal: an id may move from one to another)
            kept.update(matched)
        running = [
            (node_id, iid, inst)
            for node_id in sorted(others_now)
            for iid, inst in others_now[node_id]
        ]
        waiting = set(m._starts)
        waiting.update(named, left)
        m._matches, m._listing, m._kept, m._others = matches_now, listing, kept, others_now
        m.rematched = len(redone)
        return kept, running, waiting

    def plan_bytes(self, plan: Plan, inputs: Mapping[str, Any]) -> bytes:
        """``pretty_json(doc)`` of the plan document ``doc = plan.to_json()`` with ``inputs`` as
        its ``inputs``, put together from the fragments of the actions and node patches the memo
        holds while they are the same objects (the planner reuses them for what did not change)."""
        old_nodes = self._node_fragments
        actions, action_frags = _pieces(plan.actions, self._action_fragments, action_piece)
        nodes: dict[str, tuple[tuple[dict[str, Any], ...], bytes]]
        since = self._patched_from
        if since is not None and since[0] is self._pieces_for and plan.patches is self._patch_map:
            # the planner made these patches from the last ones, looking at these nodes only:
            # every other node's patch is the very object whose piece is kept
            nodes, pieces, pos = dict(old_nodes), list(self.node_pieces), self._node_pos
            for node_id in since[1]:
                ops = plan.patches[node_id]
                known = old_nodes.get(node_id)
                if known is None or known[0] is not ops:
                    known = nodes[node_id] = (ops, node_piece(node_id, ops))
                    pieces[pos[node_id]] = known[1]
        else:
            nodes = {}
            for node_id, ops in plan.patches.items():
                known = old_nodes.get(node_id)
                if known is None or known[0] is not ops:
                    known = (ops, node_piece(node_id, ops))
                nodes[node_id] = known
            order = sorted(nodes)
            pieces = [nodes[n][1] for n in order]
            pos = {n: k for k, n in enumerate(order)}
        self._action_fragments, self._node_fragments = actions, nodes
        self._pieces_for, self.node_pieces, self._node_pos = plan.patches, pieces, pos
        actions_array = self._actions_joined.array(action_frags, 1)
        # (a watcher's memo keeps an unplaceable service's failures: the same objects)
        failures, failure_frags = _pieces(plan.failures, self._failure_fragments, failure_piece)
        self._failure_fragments = failures
        return plan_document(
            plan,
            inputs,
            actions_array,
            self._nodes_joined.object(pieces, 1),
            self._failures_joined.array(failure_frags, 1),
        )


_T = TypeVar("_T")


def _pieces(
    values: Iterable[_T], known: Mapping[int, tuple[_T, bytes]], piece: Callable[[_T], bytes]
) -> tuple[dict[int, tuple[_T, bytes]], list[bytes]]:
    """Each value's piece, in order: the one ``known`` holds for the very object, else made;
    and what to know next time (by ``id``, with the object, so a reused id is not mistaken)."""
    now: dict[int, tuple[_T, bytes]] = {}
    out: list[bytes] = []
    for v in values:
        got = known.get(id(v))
        if got is None or got[0] is not v:
            got = (v, piece(v))
        now[id(v)] = got
        out.append(got[1])
    return now, out
