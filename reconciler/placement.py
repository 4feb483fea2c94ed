"""Values the balancer takes and returns (SPEC §7): instances, placements, failures."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from .models import Service
from .values import instance_id

__all__ = [
    "BalanceResult",
    "Cause",
    "Failure",
    "Instance",
    "Mode",
    "Placement",
    "PreviousAllocation",
    "Requested",
    "expand_instances",
]

Mode = Literal["fresh", "stable", "rebalance"]

Cause = Literal["rebalanced", "preempted"]
"""Why an instance was last given a new place other than by an ordinary placement: by a
rebalance (SPEC §8) or because a higher-priority instance evicted it (SPEC §7.6). It is kept
with the allocation while the instance stays there, so the plan's reason for the move is the
same in every run until the agents carry it out."""


@dataclass(frozen=True, slots=True)
class Instance:
    """One desired instance: identity (itemId, subjectId, index) plus its service."""

    id: str
    item_id: str
    subject_id: str
    index: int
    service: Service

    @property
    def priority(self) -> int:
        return self.service.priority

    @property
    def version(self) -> str:
        return self.service.version

    @property
    def label(self) -> str:
        return f"{self.item_id}:{self.subject_id}:{self.index}"

    def order_key(self) -> tuple[int, str, str, int]:
        """SPEC §7.1: priority descending, then itemId, subjectId, index ascending."""
        return (-self.service.priority, self.item_id, self.subject_id, self.index)


def expand_instances(services: list[Service] | tuple[Service, ...]) -> list[Instance]:
    """Every desired instance, in placement order (SPEC §7.1)."""
    out = [
        Instance(instance_id(s.id, s.subject, i), s.id, s.subject, i, s)
        for s in services
        for i in range(s.instances)
    ]
    out.sort(key=Instance.order_key)
    return out


@dataclass(frozen=True, slots=True)
class Requested:
    """Amounts reserved for one instance on its node (SPEC §7.2)."""

    cpu: int = 0
    ram: int = 0
    storage: int = 0
    state: int = 0


DeviceIds = tuple[tuple[str, tuple[str, ...]], ...]
"""(resource, device ids) pairs sorted by resource; ids sorted."""


@dataclass(frozen=True, slots=True)
class PreviousAllocation:
    """Where an instance was placed before (from the checkpoint or the actual state)."""

    node_id: str
    runtime_id: str
    devices: DeviceIds = ()
    cause: Cause | None = None


@dataclass(frozen=True, slots=True)
class Placement:
    instance_id: str
    item_id: str
    subject_id: str
    index: int
    version: str
    priority: int
    node_id: str
    runtime_id: str
    requested: Requested
    resources: tuple[str, ...]  # named host resources, in the service's order
    devices: DeviceIds
    unhealthy_devices: tuple[str, ...] = ()  # held devices now reported unhealthy
    cause: Cause | None = None  # why it was last moved, when not an ordinary placement

    @property
    def label(self) -> str:
        return f"{self.item_id}:{self.subject_id}:{self.index}"

    def device_map(self) -> dict[str, tuple[str, ...]]:
        return dict(self.devices)

    def previous(self) -> PreviousAllocation:
        return PreviousAllocation(self.node_id, self.runtime_id, self.devices, self.cause)


@dataclass(frozen=True, slots=True)
class Failure:
    instance_id: str
    item_id: str
    subject_id: str
    index: int
    version: str
    priority: int
    reason: str  # code of the filter that removed the last node
    summary: str  # "item:subject:index: 0/4 nodes feasible: 2 Cpu, 1 Labels, 1 NodeState"
    counts: tuple[tuple[str, int], ...]  # sorted by count descending, then reason

    @property
    def label(self) -> str:
        return f"{self.item_id}:{self.subject_id}:{self.index}"


@dataclass(frozen=True)
class BalanceResult:
    placements: tuple[Placement, ...]  # in instance order (SPEC §7.1)
    failures: tuple[Failure, ...]  # in instance order
    preempted: frozenset[str] = frozenset()  # ids evicted by a higher-priority instance
    by_id: Mapping[str, Placement] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.by_id and self.placements:
            object.__setattr__(self, "by_id", {p.instance_id: p for p in self.placements})
