"""Acceleration: the class index and the balancer's memo, behind the semantics of
:mod:`reconciler.placement`. Everything here answers exactly as the exhaustive reference does
(the differential tests compare); the functions below are the placement API with the index.
This package may import the semantics, never the reverse."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial

from reconciler.accel.index import ClassIndex
from reconciler.accel.memo import BalanceMemo, PreviousSince
from reconciler.model.documents import Node, Service, UnitConfig
from reconciler.placement import balancer
from reconciler.placement.balancer import Explanation, Overload
from reconciler.placement.instances import BalanceResult, Mode, PreviousAllocation
from reconciler.placement.nodestate import NodeSlot
from reconciler.placement.search import Exhaustive, SearchFactory

__all__ = ["BalanceMemo", "ClassIndex", "PreviousSince", "balance", "explain", "node_states"]


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
    )
