"""Values the balancer takes and returns (SPEC §7): instances, placements, failures."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from operator import itemgetter
from typing import Any, Literal

from reconciler.model.documents import Service
from reconciler.model.values import instance_id, instance_ids

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
    "new_instance",
    "new_placement",
    "new_requested",
    "placement_order",
    "service_order",
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


def placement_order(p: Placement | Failure) -> tuple[int, str, str, int]:
    """SPEC §7.1 for a placement or a failure: priority descending, then itemId, subjectId,
    index ascending (the order of a result's placements and failures)."""
    return (-p.priority, p.item_id, p.subject_id, p.index)


def service_order(service: Service) -> tuple[int, str, str]:
    """SPEC §7.1 for services: priority descending, then itemId, subjectId ascending."""
    return (-service.priority, service.id, service.subject)


def expand_instances(services: Iterable[Service]) -> list[Instance]:
    """Every desired instance, in placement order (SPEC §7.1).

    The instances of one service share priority, itemId and subjectId and come by index, so
    they are consecutive in that order: the services are sorted, not the instances, and each
    one's ids are hashed in one batch. Only services with the same priority, itemId and
    subjectId (which a unit does not have) would interleave; then the instances are sorted as
    well (stably, as the services were: the order of one sort of every instance).
    """
    out: list[Instance] = []
    last: tuple[int, str, str] | None = None
    tied = False
    # (what is read of a service is read in the given order, usually the order the services
    # were made in and so near each other in memory, rather than in the sorted one)
    by_order = [(service_order(s), s.instances, s) for s in services]
    for key, count, s in sorted(by_order, key=itemgetter(0)):
        tied = tied or key == last
        last = key
        _, item, subject = key
        if count == 1:  # (many fleets' services mostly: no list of one)
            out.append(new_instance(instance_id(item, subject, 0), item, subject, 0, s))
            continue
        out += [
            new_instance(iid, item, subject, i, s)
            for i, iid in enumerate(instance_ids(item, subject, 0, count))
        ]
    if tied:
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
    # what the instance was given there, when known (from the checkpoint or a placement):
    # the spec version, the reserved amounts and the named resources. With these an instance
    # whose current spec no longer places keeps running as it was (a *hold*, see balancer)
    version: str | None = None
    requested: Requested | None = None
    resources: tuple[str, ...] = ()


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
        return PreviousAllocation(
            self.node_id,
            self.runtime_id,
            self.devices,
            self.cause,
            self.version,
            self.requested,
            self.resources,
        )


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
class Changes:
    """What changed from one balance result to a later one of the same memo: the earlier one's
    :attr:`BalanceResult.revision`, and a superset of the instance ids whose placement is not
    that result's very object (placed anew, moved, removed, unplaced)."""

    since: int
    ids: frozenset[str]


@dataclass(frozen=True)
class BalanceResult:
    placements: tuple[Placement, ...]  # in instance order (SPEC §7.1)
    failures: tuple[Failure, ...]  # in instance order
    preempted: frozenset[str] = frozenset()  # ids evicted by a higher-priority instance
    by_id: Mapping[str, Placement] = field(default_factory=dict, compare=False)
    revision: int | None = field(default=None, compare=False, repr=False)
    """Not part of the value: the number a :class:`~reconciler.accel.memo.BalanceMemo` gave
    this result (unique in this process), so that a later result can say what changed since
    (:attr:`changes`). None for a result no memo made."""

    changes: Changes | None = field(default=None, compare=False, repr=False)
    """Not part of the value: what changed since an earlier result of the same memo, set on a
    call the memo answered from its last result. Every id it does not name has the same
    ``Placement`` object in both results, or is in neither, so a later stage that kept what it
    made of the earlier result needs to look at these ids only."""

    held: frozenset[str] = frozenset()
    """Ids whose current spec places nowhere and that keep their last placement (node,
    runtime, devices, version and amounts): each is both placed and failed."""

    def failed(self, errors: Mapping[str, str], reason: str) -> BalanceResult:
        """This result with the placements of ``errors``' ids turned into failures of
        ``reason``, each with its message (a phase after the balance refused them: the network
        phase, the uids and gids, the configs). Not numbered (see ``BalanceMemo.dropped``)."""
        failures = list(self.failures)
        for p in self.placements:
            if p.instance_id in errors:
                failures.append(
                    Failure(
                        p.instance_id,
                        p.item_id,
                        p.subject_id,
                        p.index,
                        p.version,
                        p.priority,
                        reason,
                        errors[p.instance_id],
                        ((reason, 1),),
                    )
                )
        failures.sort(key=placement_order)
        kept = tuple(p for p in self.placements if p.instance_id not in errors)
        return BalanceResult(kept, tuple(failures), self.preempted, held=self.held - errors.keys())

    def changed_since(self, last: BalanceResult | None) -> frozenset[str] | None:
        """The ids whose placement may not be ``last``'s very object: none when this is
        ``last``, :attr:`changes`' when they are counted from ``last``'s revision; None when not
        known (a stage that kept what it made of ``last`` then takes its full pass)."""
        if last is None:
            return None
        if self is last:
            return frozenset()
        changes = self.changes
        if changes is None or last.revision is None or changes.since != last.revision:
            return None
        return changes.ids

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without ``revision`` and ``changes`` (numbers of this process only)."""
        return dict(self.__dict__, revision=None, changes=None)

    def __post_init__(self) -> None:
        if not self.by_id and self.placements:
            object.__setattr__(self, "by_id", {p.instance_id: p for p in self.placements})


# ----------------------------------------------------------------------------- fast constructors
#
# A balance builds an Instance and a Placement for each desired instance (20,000 in the
# benchmark). A frozen dataclass's ``__init__`` must set each field through
# ``object.__setattr__`` (its own ``__setattr__`` refuses), a call per field: 3.4 us for a
# ``Placement(...)``. The constructors below build the same objects in a fifth of that time
# (55 ms less per balance of 20,000): the object is made as an instance of a plain class
# with the same slots in the same order (its *twin*), the fields are stored directly, and it is
# then given its real class, which CPython allows between classes of one layout. The result
# is exactly what the dataclass's constructor builds (equal, same hash, frozen from then on;
# the tests compare field by field). Each takes every field, positionally.


def _twin(cls: type[Any]) -> type[Any]:
    """A plain class with the slots of the frozen slotted dataclass ``cls``, in field order."""
    return type(f"_Unfrozen{cls.__name__}", (), {"__slots__": tuple(f.name for f in fields(cls))})


_new = object.__new__
_INSTANCE = _twin(Instance)
_PLACEMENT = _twin(Placement)
_REQUESTED = _twin(Requested)


def new_instance(id: str, item_id: str, subject_id: str, index: int, service: Service) -> Instance:
    """``Instance(id, item_id, subject_id, index, service)`` (see above)."""
    obj: Any = _new(_INSTANCE)
    obj.id = id
    obj.item_id = item_id
    obj.subject_id = subject_id
    obj.index = index
    obj.service = service
    obj.__class__ = Instance
    built: Instance = obj  # (no typing.cast: a call each time)
    return built


def new_placement(
    instance_id: str,
    item_id: str,
    subject_id: str,
    index: int,
    version: str,
    priority: int,
    node_id: str,
    runtime_id: str,
    requested: Requested,
    resources: tuple[str, ...],
    devices: DeviceIds,
    unhealthy_devices: tuple[str, ...],
    cause: Cause | None,
) -> Placement:
    """``Placement(...)`` with every field given (see above)."""
    obj: Any = _new(_PLACEMENT)
    obj.instance_id = instance_id
    obj.item_id = item_id
    obj.subject_id = subject_id
    obj.index = index
    obj.version = version
    obj.priority = priority
    obj.node_id = node_id
    obj.runtime_id = runtime_id
    obj.requested = requested
    obj.resources = resources
    obj.devices = devices
    obj.unhealthy_devices = unhealthy_devices
    obj.cause = cause
    obj.__class__ = Placement
    built: Placement = obj  # (no typing.cast: a call each time)
    return built


def new_requested(cpu: int, ram: int, storage: int, state: int) -> Requested:
    """``Requested(cpu, ram, storage, state)`` (see above)."""
    obj: Any = _new(_REQUESTED)
    obj.cpu = cpu
    obj.ram = ram
    obj.storage = storage
    obj.state = state
    obj.__class__ = Requested
    built: Requested = obj  # (no typing.cast: a call each time)
    return built
