"""Acceleration: the class index and the balancer's memo, behind the semantics of
:mod:`reconciler.placement`. Everything here answers exactly as the exhaustive reference does
(the differential tests compare); the functions below are the placement API with the index.
This package may import the semantics, never the reverse."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial

from reconciler.accel.index import ClassIndex
from reconciler.accel.memo import BalanceMemo, PreviousSince, states_of
from reconciler.model.documents import Node, Service, UnitConfig
from reconciler.model.gcpause import collector_paused
from reconciler.placement import balancer
from reconciler.placement.balancer import Explanation, Overload
from reconciler.placement.instances import BalanceResult, Mode, PreviousAllocation
from reconciler.placement.nodestate import NodeSlot, Occupancy
from reconciler.placement.search import Exhaustive, SearchFactory

__all__ = [
    "BalanceMemo",
    "ClassIndex",
    "FinalStates",
    "PreviousSince",
    "balance",
    "balance_with_states",
    "explain",
    "node_states",
]

FinalStates = Callable[[], dict[str, NodeSlot] | None]
"""Every node's state at the end of a balance, by node id: its result's placements reserved on
the real capacities, as :func:`node_states` replays them (a test compares). Given once: the
next call gives None (replay then)."""


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
    """:func:`reconciler.placement.balancer.balance` with the class index (``exhaustive``: with
    the reference search instead, for comparison)."""
    search: SearchFactory = Exhaustive if exhaustive else partial(ClassIndex, services=services)
    return balancer.balance(unit, nodes, services, previous, mode, overload, search=search)


def balance_with_states(
    unit: UnitConfig | None,
    nodes: Sequence[Node],
    services: Sequence[Service],
    previous: Mapping[str, PreviousAllocation] | None = None,
    mode: Mode | None = None,
    overload: Overload | None = None,
) -> tuple[BalanceResult, FinalStates | None]:
    """:func:`balance`, and its nodes' final states (the status report reads them instead of
    replaying the result; None when the result holds an instance at its old place, whose
    replay differs). Keep them only as long as needed: they hold every node's state."""
    balancer.check_keys(services)
    search = partial(ClassIndex, services=services)
    with collector_paused():
        result, run = balancer.run_balance(unit, nodes, services, previous, mode, overload, search)
    return result, (None if result.held else states_of(run))


def node_states(
    unit: UnitConfig | None,
    nodes: Sequence[Node],
    services: Sequence[Service],
    result: BalanceResult,
) -> dict[str, NodeSlot]:
    """:func:`reconciler.placement.balancer.node_states` with the class index."""
    return balancer.node_states(unit, nodes, services, result, search=ClassIndex)


def explain(
    unit: UnitConfig | None,
    nodes: Sequence[Node],
    services: Sequence[Service],
    instance_id: str,
    previous: Mapping[str, PreviousAllocation] | None = None,
    mode: Mode | None = None,
    overload: Overload | None = None,
    *,
    result: BalanceResult | None = None,
    occupied: Mapping[str, Occupancy] | None = None,
) -> Explanation:
    """:func:`reconciler.placement.balancer.explain` with the class index."""
    return balancer.explain(
        unit,
        nodes,
        services,
        instance_id,
        previous,
        mode,
        overload,
        search=ClassIndex,
        result=result,
        occupied=occupied,
    )
