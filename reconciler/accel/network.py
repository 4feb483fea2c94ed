"""The network phase's memo: what a long-running caller (``watch``) carries from one network
phase to the next, so that a run whose networked placements, services, unit and previous
network state are the last run's gets the last run's answer without the phase. It gives what
:func:`reconciler.planning.network.assign_networks` (the reference) gives; the differential
tests compare."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from reconciler.model.changes import ServiceKey
from reconciler.model.documents import Service, UnitConfig
from reconciler.placement.instances import BalanceResult
from reconciler.planning.network import NetworkResult, assign_networks, has_network

__all__ = ["NetworkMemo"]


@dataclass(frozen=True)
class _Call:
    unit: UnitConfig | None
    networked: dict[ServiceKey, Service]  # the services whose instances have a network
    previous: Mapping[str, Any]
    result: BalanceResult  # the balance the phase was given
    answer: NetworkResult


class NetworkMemo:
    """The last call's inputs and answer, and what changed in the balance's results since.

    The network phase reads of each placement only its instance id (and so its item, subject
    and index) and its node, of the networked placements only (those whose service
    :func:`~reconciler.planning.network.has_network`), in instance order. So a call whose unit,
    networked services (equal) and previous state (equal) are the last call's, and whose result
    places the very same networked instances on the same nodes, gets the last answer: their
    order is the same too (the services' priorities are the same). Which placements may differ
    from the last call's result is told by the results (:meth:`BalanceResult.changed_since`)
    or, when the later phases took placements out of it, by :meth:`counted_from`; when it is not
    known the phase runs. A memo belongs to one caller."""

    def __init__(self) -> None:
        self._last: _Call | None = None
        self._since: tuple[int, frozenset[str]] | None = None
        """The revision the next result may count its changes from (the result the run left,
        after the phases that take placements out) and the ids that differ between it and the
        last call's result (those it took out)."""
        self.reused = False  # whether the last call gave the last answer

    def assign(
        self,
        unit: UnitConfig | None,
        services: Mapping[ServiceKey, Service],
        result: BalanceResult,
        previous: Mapping[str, Any],
        *,
        networked: bool | None = None,
    ) -> NetworkResult:
        """:func:`~reconciler.planning.network.assign_networks`' answer for these inputs."""
        last, since = self._last, self._since
        self._last, self._since, self.reused = None, None, False
        if networked is False and (unit is None or unit.network is None):
            return assign_networks(unit, services, result, previous, networked=False)
        nets = {k: s for k, s in services.items() if has_network(unit, s)}
        if (
            last is not None
            and last.unit == unit
            and last.networked == nets
            and last.previous == previous
            and self._same_places(result, last.result, since, nets)
        ):
            self._last, self.reused = _Call(unit, nets, previous, result, last.answer), True
            return last.answer
        answer = assign_networks(unit, services, result, previous, networked=networked)
        self._last = _Call(unit, nets, previous, result, answer)
        return answer

    def counted_from(self, left: BalanceResult, taken: Iterable[str]) -> None:
        """The run left ``left``: the last call's result with the placements of ``taken`` taken
        out by the phases after it (``left`` is that result when they took none); the next
        call's result may count its changes from ``left``."""
        if self._last is not None and left.revision is not None:
            self._since = (left.revision, frozenset(taken))

    @staticmethod
    def _same_places(
        result: BalanceResult,
        last: BalanceResult,
        since: tuple[int, frozenset[str]] | None,
        nets: Mapping[ServiceKey, Service],
    ) -> bool:
        """Whether ``result`` places the networked instances ``last`` placed, and no other, on
        the same nodes (only the ids that may differ are looked at)."""
        named = result.changed_since(last)
        if named is None:
            changes = result.changes
            if since is None or changes is None or changes.since != since[0]:
                return False
            named = changes.ids | since[1]
        now, then = result.by_id, last.by_id
        for iid in named:
            a, b = then.get(iid), now.get(iid)
            if a is b:
                continue
            p = a if a is not None else b
            assert p is not None
            if (p.item_id, p.subject_id) not in nets:
                continue  # (the same id: the same service, networked or not)
            if a is None or b is None or a.node_id != b.node_id:
                return False
        return True
