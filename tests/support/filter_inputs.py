"""One node and one service as the placement filters see them: the node's state (a
:class:`~reconciler.placement.nodestate.NodeSlot`) and what one instance of the service asks
(an :class:`~reconciler.placement.balancer.Ask`), built with the public API only.

The state comes from ``balance`` and ``node_states`` (the status path), with other services
placed first where a table row needs something already taken; the ask is the balancer's own
(:func:`~reconciler.placement.balancer.ask_for`), plus what pass 1 keeps of a previous
allocation, which only the balancer sets. ``explain_cell`` is the same question through
``reconciler explain``'s matrix, so a table can check both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from reconciler.accel import balance, explain, node_states
from reconciler.model.documents import Node, Service, UnitConfig
from reconciler.model.values import instance_id
from reconciler.placement.ask import Ask, ask_for
from reconciler.placement.filters import FILTER_CODES
from reconciler.placement.instances import expand_instances
from reconciler.placement.nodestate import NodeSlot

__all__ = ["ask_of", "explain_cell", "slot_of"]


def slot_of(
    node: Node, *, unit: UnitConfig | None = None, others: Sequence[Service] = ()
) -> NodeSlot:
    """``node``'s state with every instance of ``others`` placed on it (each must fit)."""
    result = balance(unit, [node], list(others))
    assert not result.failures, f"the other services must all fit: {result.failures}"
    return node_states(unit, [node], list(others), result)[node.id]


def ask_of(
    service: Service,
    *,
    keep_runtime: str | None = None,
    keep_devices: Mapping[str, tuple[str, ...]] | None = None,
) -> Ask:
    """What instance 0 of ``service`` asks of a candidate node."""
    instance = expand_instances([service])[0]
    kept = tuple(sorted((r, tuple(ids)) for r, ids in (keep_devices or {}).items()))
    return replace(ask_for(instance, None), keep_runtime=keep_runtime, keep_devices=kept)


def explain_cell(
    node: Node,
    service: Service,
    code: str,
    *,
    unit: UnitConfig | None = None,
    others: Sequence[Service] = (),
) -> str | None:
    """The cell of filter ``code`` in ``explain``'s row for ``node`` and instance 0 of
    ``service``, balanced with ``others`` (which should outrank it, so that they are the ones
    placed)."""
    iid = instance_id(service.id, service.subject, 0)
    explanation = explain(unit, [node], [*others, service], iid)
    ((node_id, cells, _),) = explanation.rows
    assert node_id == node.id
    return cells[FILTER_CODES.index(code)]
