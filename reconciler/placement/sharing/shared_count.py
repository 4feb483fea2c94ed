"""``shared-count``: a named host resource with N concurrent users (0 = unlimited), SPEC §6.2."""

from __future__ import annotations

from typing import ClassVar

from reconciler.model.inventory import Inventory
from reconciler.placement.sharing.base import (
    SUCCESS,
    Item,
    PoolState,
    ShareRequest,
    SharingPolicy,
    Status,
    StatusCode,
)

UNLIMITED = 2**62


class SharedCountPolicy(SharingPolicy):
    name: ClassVar[str] = "shared-count"
    device_pool: ClassVar[bool] = False  # named host resources only (SPEC §6.2)

    def new_state(self, resource: str, items: tuple[Item, ...], limit: int = 0) -> PoolState:
        total = limit if limit > 0 else UNLIMITED
        return PoolState(resource, self.name, items, Inventory.simple(resource, total))

    def filter(self, state: PoolState, request: ShareRequest, keep: tuple[str, ...] = ()) -> Status:
        if state.slots.can_provide(1):
            return SUCCESS
        return Status(
            StatusCode.UNSCHEDULABLE,
            f"{state.resource}: all {state.slots.capacity} shared slots in use",
        )

    def allocate(
        self, state: PoolState, request: ShareRequest, keep: tuple[str, ...] = ()
    ) -> tuple[PoolState, tuple[str, ...]]:
        status = self.filter(state, request, keep)
        if not status.ok:  # (the interface's refusal, not the inventory's CapacityError)
            raise ValueError(status.reason)
        return state.evolve(state.slots.consume(1)), (state.resource,)

    def release(self, state: PoolState, request: ShareRequest, ids: tuple[str, ...]) -> PoolState:
        return state.evolve(state.slots.release(1))
