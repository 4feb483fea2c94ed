"""``exclusive``: whole devices, ``count`` distinct healthy ids, smallest free ids first."""

from __future__ import annotations

from typing import ClassVar

from reconciler.placement.sharing.base import (
    SUCCESS,
    PoolState,
    ShareRequest,
    SharingPolicy,
    Status,
    StatusCode,
    bump,
)


class ExclusivePolicy(SharingPolicy):
    name: ClassVar[str] = "exclusive"

    def _choose(
        self, state: PoolState, request: ShareRequest, keep: tuple[str, ...]
    ) -> tuple[str, ...] | Status:
        if request.memory is not None:
            return Status(StatusCode.ERROR, f"{state.resource} is exclusive: request a count")
        if keep:
            missing = [i for i in keep if i not in state.by_id]
            if missing:
                return Status(StatusCode.UNRESOLVABLE, f"{state.resource}: {missing[0]} vanished")
            taken = [i for i in keep if state.holders_of(i) > 0]
            if taken:
                return Status(StatusCode.UNSCHEDULABLE, f"{state.resource}: {taken[0]} is taken")
            if len(keep) != request.count:
                return Status(StatusCode.UNSCHEDULABLE, f"{state.resource}: count changed")
            return tuple(sorted(keep))
        healthy = [i for i in state.items if i.healthy]
        if len(healthy) < request.count:
            return Status(
                StatusCode.UNRESOLVABLE,
                f"{state.resource}: {request.count} requested, {len(healthy)} healthy devices",
            )
        free = [i.id for i in healthy if state.holders_of(i.id) == 0]
        if len(free) < request.count:
            return Status(
                StatusCode.UNSCHEDULABLE,
                f"{state.resource}: {request.count} requested, {len(free)} free",
            )
        return tuple(free[: request.count])

    def filter(self, state: PoolState, request: ShareRequest, keep: tuple[str, ...] = ()) -> Status:
        chosen = self._choose(state, request, keep)
        return chosen if isinstance(chosen, Status) else SUCCESS

    def allocate(
        self, state: PoolState, request: ShareRequest, keep: tuple[str, ...] = ()
    ) -> tuple[PoolState, tuple[str, ...]]:
        chosen = self._choose(state, request, keep)
        if isinstance(chosen, Status):
            raise ValueError(chosen.reason)
        holders = state.holders
        for i in chosen:
            holders = bump(holders, i, 1)
        slots = state.slots.consume(len(chosen))
        return state.evolve(slots, holders), chosen

    def release(self, state: PoolState, request: ShareRequest, ids: tuple[str, ...]) -> PoolState:
        holders = state.holders
        for i in ids:
            holders = bump(holders, i, -1)
        slots = state.slots.release(len(ids))
        return state.evolve(slots, holders)
