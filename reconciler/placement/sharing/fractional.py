"""``fractional``: one device with enough free memory, the fullest that fits (bin-packing)."""

from __future__ import annotations

from typing import Any, ClassVar

from reconciler.model.human import human_bytes
from reconciler.placement.sharing.base import (
    SUCCESS,
    Item,
    PoolState,
    PoolStatus,
    ShareRequest,
    SharingPolicy,
    Status,
    StatusCode,
    bump,
)


class FractionalPolicy(SharingPolicy):
    name: ClassVar[str] = "fractional"

    def check_devices(self, devices: tuple[Any, ...]) -> None:
        for d in devices:
            if d.memory is None:
                raise ValueError(f"device {d.id!r}: a fractional pool needs memory per device")

    @staticmethod
    def _free(state: PoolState, item: Item) -> int:
        used = dict(state.memory_used).get(item.id, 0)
        return (item.memory or 0) - used

    def _choose(
        self, state: PoolState, request: ShareRequest, keep: tuple[str, ...]
    ) -> str | Status:
        if request.memory is None:
            return Status(StatusCode.ERROR, f"{state.resource} is fractional: request memory")
        need = request.memory
        if keep:
            item = state.by_id.get(keep[0])
            if item is None:
                return Status(StatusCode.UNRESOLVABLE, f"{state.resource}: {keep[0]} vanished")
            if self._free(state, item) < need:
                return Status(
                    StatusCode.UNSCHEDULABLE, f"{state.resource}: {item.id} lacks free memory"
                )
            return item.id
        fits = [i for i in state.items if i.healthy and self._free(state, i) >= need]
        if not fits:
            biggest = max((i.memory or 0 for i in state.items if i.healthy), default=0)
            code = StatusCode.UNRESOLVABLE if biggest < need else StatusCode.UNSCHEDULABLE
            why = f"{state.resource}: no healthy device with {human_bytes(need)} free"
            return Status(code, why)
        return min(fits, key=lambda i: (self._free(state, i), i.id)).id

    def filter(self, state: PoolState, request: ShareRequest, keep: tuple[str, ...] = ()) -> Status:
        chosen = self._choose(state, request, keep)
        return chosen if isinstance(chosen, Status) else SUCCESS

    def allocate(
        self, state: PoolState, request: ShareRequest, keep: tuple[str, ...] = ()
    ) -> tuple[PoolState, tuple[str, ...]]:
        chosen = self._choose(state, request, keep)
        if isinstance(chosen, Status):
            raise ValueError(chosen.reason)
        assert request.memory is not None
        holders = bump(state.holders, chosen, 1)
        slots = state.slots if state.holders_of(chosen) else state.slots.consume(1)
        memory = bump(state.memory_used, chosen, request.memory)
        new = state.evolve(slots, holders, memory)
        return new, (chosen,)

    def release(self, state: PoolState, request: ShareRequest, ids: tuple[str, ...]) -> PoolState:
        assert request.memory is not None
        holders, memory, slots = state.holders, state.memory_used, state.slots
        for i in ids:
            holders = bump(holders, i, -1)
            memory = bump(memory, i, -request.memory)
            if dict(holders).get(i, 0) == 0:
                slots = slots.release(1)
        return state.evolve(slots, holders, memory)

    def status(self, state: PoolState) -> PoolStatus:
        base = super().status(state)
        detail: dict[str, Any] = {
            i.id: {"memory": i.memory or 0, "free": self._free(state, i)} for i in state.items
        }
        return PoolStatus(
            base.resource, base.policy, base.total, base.healthy, base.allocated, detail
        )
