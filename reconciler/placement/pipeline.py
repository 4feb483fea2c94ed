"""The filter pipeline for one node (SPEC §7.4), the choice order (§7.5) and the failure
summaries (§7.7): what every candidate search answers with."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from reconciler.model.documents import Node
from reconciler.placement import filters
from reconciler.placement.ask import Ask
from reconciler.placement.filters import NO_NODES, Bounded, Idle
from reconciler.placement.instances import Failure, Instance
from reconciler.placement.nodestate import Basics, NodeSlot

__all__ = [
    "STATIC_NODE_PREFIX",
    "Bound",
    "Verdict",
    "best_runtime",
    "bounded_drop",
    "choice_key",
    "dynamic_bound",
    "dynamic_drop",
    "evaluate",
    "failure",
    "matrix_drop",
    "most_room",
    "nodes_feasible",
    "ordered_counts",
    "reason_and_counts",
    "static_drop",
    "static_runtime_verdict",
    "static_runtimes",
    "summarize",
    "summarize_counts",
    "unresolvable",
]


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


def matrix_drop(
    node_cells: Sequence[str | None], grid: Sequence[Sequence[str | None]]
) -> str | None:
    """``evaluate(slot, ask).dropped_by`` from what ``explain`` already asked every filter:
    ``node_cells``, each node filter's answer in :data:`filters.NODE_FILTERS` order, and
    ``grid``, each runtime's answers to :data:`filters.RUNTIME_FILTERS` (the filters are pure:
    asking them again answers the same)."""
    for nf, why in zip(filters.NODE_FILTERS, node_cells, strict=True):
        if why is not None:
            return nf.name
    runtime_filters = filters.RUNTIME_FILTERS
    if not grid:
        return runtime_filters[0].name
    alive: Sequence[int] = range(len(grid))
    for k, rf in enumerate(runtime_filters):
        alive = [i for i in alive if grid[i][k] is None]
        if not alive:
            return rf.name
    return None


def _leading_static(fs: Sequence[filters.NodeFilter] | Sequence[filters.RuntimeFilter]) -> int:
    """How many filters come first and are static."""
    lead = 0
    while lead < len(fs) and fs[lead].static:
        lead += 1
    return lead


_NODE_LEAD = _leading_static(filters.NODE_FILTERS)
_RUNTIME_LEAD = _leading_static(filters.RUNTIME_FILTERS)
_STATICS_FIRST = not any(f.static for f in filters.NODE_FILTERS[_NODE_LEAD:]) and not any(
    f.static for f in filters.RUNTIME_FILTERS[_RUNTIME_LEAD:]
)
"""Whether every static filter comes before every dynamic one (else :func:`dynamic_drop`
evaluates in full)."""
STATIC_NODE_PREFIX = frozenset([f.name for f in filters.NODE_FILTERS[:_NODE_LEAD]])
"""The static node filters that come before any dynamic one: a node such a filter drops stays
dropped whatever is reserved there (:func:`static_drop` asks them)."""


def static_runtime_verdict(slot: NodeSlot, ask: Ask) -> tuple[tuple[int, ...], str | None]:
    """The runtimes of ``slot`` surviving the static runtime filters that come first, in
    :func:`evaluate`'s order, and the code of the one that dropped the last runtime (None
    while some survive, or when the node has no runtimes)."""
    alive = list(range(len(slot.runtimes)))
    for rf in filters.RUNTIME_FILTERS[:_RUNTIME_LEAD]:
        alive = [i for i in alive if rf.check(slot, slot.runtimes[i], ask) is None]
        if not alive and slot.runtimes:
            return (), rf.name
    return tuple(alive), None


def dynamic_drop(
    slot: NodeSlot, ask: Ask, static: tuple[tuple[int, ...], str | None]
) -> str | None:
    """``evaluate(slot, ask).dropped_by`` for a node that passes the static node filters that
    come first, given its :func:`static_runtime_verdict` (the same for every node of a class:
    the class index computes it once): only the dynamic filters are asked."""
    if not _STATICS_FIRST:
        return evaluate(slot, ask).dropped_by
    for nf in filters.NODE_FILTERS[_NODE_LEAD:]:
        if nf.check(slot, ask) is not None:
            return nf.name
    if not slot.runtimes:
        return filters.RUNTIME_FILTERS[0].name
    alive, code = static
    if not alive:
        return code
    for rf in filters.RUNTIME_FILTERS[_RUNTIME_LEAD:]:
        runtimes = slot.runtimes
        survivors = [i for i in alive if rf.check(slot, runtimes[i], ask) is None]
        if not survivors:
            return rf.name
        alive = tuple(survivors)
    return None


Bound = tuple[tuple[filters.NodeFilter, ...], str | None]
"""What :func:`dynamic_drop` answers on every node of a class whatever is reserved there: the
dynamic node filters still to ask node by node, and the code when they all pass (see
:func:`dynamic_bound`, :func:`bounded_drop`)."""


def dynamic_bound(
    slot: NodeSlot,
    ask: Ask,
    static: tuple[tuple[int, ...], str | None],
    room: Callable[[int, int], int],
) -> Bound | None:
    """:func:`dynamic_drop` for every node of ``slot``'s class (which passes the static node
    filters that come first; ``static``: its :func:`static_runtime_verdict`), whatever is
    reserved on each, as far as the filters' own declarations tell it (:class:`filters.Idle`,
    :class:`filters.Bounded`); None when the answer depends on what is reserved.

    ``room(k, i)``: the largest ``room`` that ``filters.RUNTIME_FILTERS[k]`` declares for
    runtime ``i`` on any node of the class (the nodes of a class have their runtimes in one
    order, and a filter's ``need`` reads only what the class key holds: it is the same on each).

    The dynamic node filters come first: those idle for ``ask`` pass everywhere, the others
    are asked node by node (:func:`bounded_drop`). Then the runtimes passing the static
    runtime filters meet the dynamic runtime filters in order: one that needs nothing passes
    on each of them; one that needs more than its largest room on every one of them drops the
    node, whatever is reserved (reservations only shrink a pool below its capacity). Any other
    answer depends on the node's state: None."""
    if not _STATICS_FIRST:
        return None
    asked = tuple(
        nf
        for nf in filters.NODE_FILTERS[_NODE_LEAD:]
        if not (isinstance(nf, Idle) and nf.idle(ask))
    )
    if not slot.runtimes:
        return asked, filters.RUNTIME_FILTERS[0].name
    alive, code = static
    if not alive:
        return asked, code
    runtime_filters = filters.RUNTIME_FILTERS
    for k in range(_RUNTIME_LEAD, len(runtime_filters)):
        rf = runtime_filters[k]
        if not isinstance(rf, Bounded):
            return None
        need = rf.need(slot, ask)
        if need == 0:
            continue
        if all(need > room(k, i) for i in alive):
            return asked, rf.name
        return None
    return asked, None


def bounded_drop(slot: NodeSlot, ask: Ask, bound: Bound) -> str | None:
    """:func:`dynamic_drop` on a node of a class whose :func:`dynamic_bound` is ``bound``."""
    asked, code = bound
    for nf in asked:
        if nf.check(slot, ask) is not None:
            return nf.name
    return code


def most_room(
    slots: Iterable[NodeSlot],
    k: int,
    n_runtimes: int,
    empty: Iterable[tuple[Node, Basics]] = (),
) -> list[int]:
    """Per runtime index, the largest room ``filters.RUNTIME_FILTERS[k]`` declares on any of
    ``slots`` and of the nodes of ``empty`` (each with its basics: nodes nothing is reserved
    on, whose states need not be built); all of them the nodes of one class, ``n_runtimes``
    runtimes each. Empty when that filter declares none."""
    rf = filters.RUNTIME_FILTERS[k]
    if not isinstance(rf, Bounded):
        return []
    most = [-1] * n_runtimes
    for slot in slots:
        runtimes = slot.runtimes
        for i in range(n_runtimes):
            got = rf.room(slot, runtimes[i])
            if got > most[i]:
                most[i] = got
    for node, basics in empty:
        for i, got in enumerate(rf.empty_rooms(node, basics)):
            if got > most[i]:
                most[i] = got
    return most


def static_runtimes(slot: NodeSlot, ask: Ask) -> tuple[int, ...]:
    """The runtimes of ``slot`` passing every static filter for ``ask`` (empty when a static
    node filter fails): what no reservation or eviction changes."""
    for nf in filters.NODE_FILTERS:
        if nf.static and nf.check(slot, ask) is not None:
            return ()
    static = [rf for rf in filters.RUNTIME_FILTERS if rf.static]
    return tuple(
        i
        for i, rt in enumerate(slot.runtimes)
        if all(rf.check(slot, rt, ask) is None for rf in static)
    )


def static_drop(slot: NodeSlot, ask: Ask) -> str | None:
    """The code of the first node filter dropping ``slot`` for ``ask`` among the static ones
    that come before any dynamic one (:data:`STATIC_NODE_PREFIX`): what :func:`evaluate`
    charges there whatever is reserved. None when they all pass."""
    for nf in filters.NODE_FILTERS[:_NODE_LEAD]:
        if nf.check(slot, ask) is not None:
            return nf.name
    return None


def unresolvable(slot: NodeSlot, ask: Ask) -> bool:
    """Whether a node filter that gives a verdict (named resources and devices, through their
    sharing policies) says ``ask`` can never be served on ``slot`` as it is declared
    (Volcano's *UnschedulableAndUnresolvable*, or an error): no eviction there can help."""
    for nf in filters.NODE_FILTERS:
        verdict = getattr(nf, "verdict", None)
        if verdict is not None and verdict(slot, ask).unresolvable:
            return True
    return False


def choice_key(slot: NodeSlot) -> tuple[int, int, int, str]:
    """SPEC §7.5, smallest is best: priority, free CPU, free RAM (node pools), node id."""
    return (-slot.priority, -slot.cpu_pool.free, -slot.ram_pool.free, slot.id)


def best_runtime(slot: NodeSlot, verdict: Verdict) -> int:
    """Runtimes are sorted by (type, id), so the first survivor is the smallest."""
    return verdict.runtimes[0]


def summarize(instance: Instance, n_nodes: int, charges: Iterable[str]) -> Failure:
    """The failure of ``instance``, charged the code of the filter dropping each node."""
    return summarize_counts(instance, n_nodes, Counter(charges))


def summarize_counts(instance: Instance, n_nodes: int, counts: Mapping[str, int]) -> Failure:
    """The failure of ``instance`` from how many nodes each filter drops (no zero counts)."""
    return failure(instance, n_nodes, *reason_and_counts(counts))


def reason_and_counts(counts: Mapping[str, int]) -> tuple[str, tuple[tuple[str, int], ...]]:
    """A failure's reason (the code of the last filter that dropped a node) and its counts as
    summaries list them, from how many nodes each filter drops (no zero counts)."""
    reason = max(counts, key=filters.FILTER_CODES.index) if counts else NO_NODES
    return reason, ordered_counts(counts)


def ordered_counts(counts: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    """How many nodes each code dropped, as summaries list them: by count, then code."""
    return tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def nodes_feasible(feasible: int, n_nodes: int, ordered: Sequence[tuple[str, int]]) -> str:
    """``"1/4 nodes feasible: 2 Cpu, 1 Labels"``: how many nodes passed every filter, and how
    many each filter dropped (``ordered``: by count, then code), in the Kubernetes style."""
    if not n_nodes:
        return "0/0 nodes feasible: the unit has no nodes"
    detail = ", ".join(f"{n} {code}" for code, n in ordered)
    return f"{feasible}/{n_nodes} nodes feasible" + (f": {detail}" if detail else "")


def failure(
    instance: Instance, n_nodes: int, reason: str, ordered: tuple[tuple[str, int], ...]
) -> Failure:
    """A failure with the one-line summary of SPEC §7.7."""
    summary = f"{instance.label}: {nodes_feasible(0, n_nodes, ordered)}"
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
