"""The sharing-policy interface and its value types."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from reconciler.model.inventory import Inventory

__all__ = ["PoolState", "PoolStatus", "ShareRequest", "SharingPolicy", "Status", "StatusCode"]


class StatusCode(StrEnum):
    """The closed set of outcomes of :meth:`SharingPolicy.filter` (as in Volcano/Kubernetes).

    ``UNSCHEDULABLE`` says the request could be served on this node if what others hold were
    given back (preemption may help); ``UNRESOLVABLE`` and ``ERROR`` say it cannot, whatever is
    released (see :attr:`Status.preemption_may_help`)."""

    SUCCESS = "Success"
    ERROR = "Error"  # the request itself is wrong for this pool (e.g. memory on an exclusive pool)
    UNSCHEDULABLE = "Unschedulable"  # not now: the pool is (partly) taken
    UNRESOLVABLE = "UnschedulableAndUnresolvable"  # never on this node, whatever is released


@dataclass(frozen=True, slots=True)
class Status:
    """A policy's verdict on a request: its code and, unless it succeeds, why not."""

    code: StatusCode
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.code is StatusCode.SUCCESS

    @property
    def preemption_may_help(self) -> bool:
        """Whether evicting holders of the pool could make the request fit here: True for
        ``Unschedulable`` (the pool is taken, not too small), False for
        ``UnschedulableAndUnresolvable`` and ``Error`` (never on this node as it is), and for
        a success (nothing to help)."""
        return self.code is StatusCode.UNSCHEDULABLE

    @property
    def unresolvable(self) -> bool:
        """Whether the request can never be served on this node as it is declared (its code is
        ``UnschedulableAndUnresolvable`` or ``Error``): a preemption there is useless."""
        return self.code is StatusCode.UNRESOLVABLE or self.code is StatusCode.ERROR


SUCCESS = Status(StatusCode.SUCCESS)


@dataclass(frozen=True, slots=True)
class ShareRequest:
    """What one instance asks of one pool: ``count`` items, or one item with ``memory``."""

    resource: str
    count: int = 1
    memory: int | None = None


@dataclass(frozen=True, slots=True)
class Item:
    """One shareable thing of a pool (a device; for shared-count, the resource itself)."""

    id: str
    healthy: bool = True
    memory: int | None = None


@dataclass(frozen=True, slots=True)
class PoolState:
    """The immutable state of one pool on one node.

    ``slots`` counts whole items in use (an Inventory, SPEC §6.1); ``memory_used`` is per item
    for memory-sharing policies; ``holders`` counts users per item.
    """

    resource: str
    policy: str
    items: tuple[Item, ...]
    slots: Inventory
    holders: tuple[tuple[str, int], ...] = ()
    memory_used: tuple[tuple[str, int], ...] = ()
    by_id: dict[str, Item] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.by_id:
            object.__setattr__(self, "by_id", {i.id: i for i in self.items})

    def holders_of(self, item_id: str) -> int:
        for key, n in self.holders:
            if key == item_id:
                return n
        return 0

    def evolve(
        self,
        slots: Inventory,
        holders: tuple[tuple[str, int], ...] | None = None,
        memory_used: tuple[tuple[str, int], ...] | None = None,
    ) -> PoolState:
        """The next state of the same pool (same items, so the id index is shared)."""
        new = object.__new__(PoolState)
        _set = object.__setattr__
        _set(new, "resource", self.resource)
        _set(new, "policy", self.policy)
        _set(new, "items", self.items)
        _set(new, "slots", slots)
        _set(new, "holders", self.holders if holders is None else holders)
        _set(new, "memory_used", self.memory_used if memory_used is None else memory_used)
        _set(new, "by_id", self.by_id)
        return new


@dataclass(frozen=True, slots=True)
class PoolStatus:
    resource: str
    policy: str
    total: int
    healthy: int
    allocated: int
    detail: dict[str, Any] = field(default_factory=dict)


class SharingPolicy(ABC):
    """One way of sharing a pool; stateless, all state lives in :class:`PoolState`.

    ``name`` is what a device pool names in ``policy:``; ``device_pool`` False keeps a policy
    out of device pools (``shared-count`` serves named host resources only)."""

    name: ClassVar[str]
    device_pool: ClassVar[bool] = True

    def check_devices(self, devices: tuple[Any, ...]) -> None:
        """Raise ValueError when a device pool of this policy declares ``devices`` (the node
        file's ``Device`` entries) it cannot serve; called when a node file is validated.
        By default every device will do."""
        return

    def has_request(self, state: PoolState, request: ShareRequest) -> bool:
        """Whether ``request`` asks something of the pool ``state`` (Volcano's
        ``HasDeviceRequest``): the balancer hands a request only to a pool whose policy says
        so. By default, a request of the pool's resource. It must answer from the pool's
        resource and policy and the request alone, never from the pool's devices or what is
        taken of them: the class index asks it once per class of nodes (whose pools have the
        same resources and policies, :attr:`~reconciler.model.documents.Node.device_kinds`)
        and skips the classes whose pools serve no request of a service."""
        return request.resource == state.resource

    def new_state(self, resource: str, items: tuple[Item, ...], limit: int = 0) -> PoolState:
        """The empty pool, items sorted by id; ``limit`` is the shared count where the policy
        has one (device pools have none: their slots are their items)."""
        ordered = tuple(sorted(items, key=lambda i: i.id))
        return PoolState(resource, self.name, ordered, Inventory.simple(resource, len(ordered)))

    @abstractmethod
    def filter(self, state: PoolState, request: ShareRequest, keep: tuple[str, ...] = ()) -> Status:
        """Whether ``allocate`` would succeed; ``keep`` asks for exactly these ids again."""

    @abstractmethod
    def allocate(
        self, state: PoolState, request: ShareRequest, keep: tuple[str, ...] = ()
    ) -> tuple[PoolState, tuple[str, ...]]:
        """Take what ``request`` asks; raises ValueError when ``filter`` would fail."""

    @abstractmethod
    def release(self, state: PoolState, request: ShareRequest, ids: tuple[str, ...]) -> PoolState:
        """Give back what an earlier ``allocate`` returned."""

    def status(self, state: PoolState) -> PoolStatus:
        return PoolStatus(
            state.resource,
            state.policy,
            total=len(state.items),
            healthy=sum(1 for i in state.items if i.healthy),
            allocated=sum(1 for _, n in state.holders if n > 0),
        )


def bump(pairs: tuple[tuple[str, int], ...], key: str, delta: int) -> tuple[tuple[str, int], ...]:
    """Add ``delta`` to ``key`` in a sorted tuple of pairs; drops zero entries."""
    d = dict(pairs)
    d[key] = d.get(key, 0) + delta
    if d[key] == 0:
        del d[key]
    return tuple(sorted(d.items()))
