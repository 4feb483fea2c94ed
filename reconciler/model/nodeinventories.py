"""A node's inventory settings (SPEC §6.1, OpenStack Placement's inventories): the ``inventories``
field of a node file.

``inventories: {cpu: {...}, ram: {...}, storage: {...}, state: {...}}``, each key optional, each
holding ``reserved``, ``allocationRatio``, ``minUnit``, ``maxUnit`` and ``stepSize``. Amounts are in
the units of the matching capacity: DMIPS for ``cpu``, byte quantities (``512Mi``) for ``ram``,
``storage`` and ``state``.

- ``reserved`` and ``allocationRatio`` shape the node's pool of that resource: its capacity is
  ``floor((total - reserved) * allocationRatio)`` (:class:`~reconciler.model.inventory.Inventory`),
  where ``total`` is what the node has of it (for CPU and RAM, the amount left after the system's
  measured usage, SPEC §7.3; ``reserved`` is then at most that). A ratio above 1 overcommits.
- ``minUnit``, ``maxUnit`` and ``stepSize`` restrict every non-zero request of that resource on
  the node (also one served from a runtime's own ``allowedDMIPS``/``allowedRAM`` pool, which
  ``reserved`` and ``allocationRatio`` leave as they are).

Nothing declared means ratio 1, nothing reserved, units of 1: the node's pools as without the
field.
"""

from __future__ import annotations

from fractions import Fraction
from functools import cached_property
from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, Strict, model_validator

from reconciler.model.values import INT64_MAX, Bytes, NonNegInt, PosBytes, PosInt

__all__ = [
    "MAX_ALLOCATION_RATIO",
    "ByteInventory",
    "CpuInventory",
    "NodeInventories",
    "Units",
]

MAX_ALLOCATION_RATIO = 1000
"""The highest ``allocationRatio`` a node may declare."""

AllocationRatio = Annotated[
    float, Strict(), Field(gt=0, le=MAX_ALLOCATION_RATIO, allow_inf_nan=False)
]

Units = tuple[int, int | None, int]
"""``(minUnit, maxUnit, stepSize)`` of one resource (``maxUnit`` None: no upper bound)."""


class _Settings(BaseModel):
    """The settings of one resource's inventory; each kind gives its fields their units."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True, defer_build=True)

    reserved: int = 0
    allocationRatio: float = 1.0
    minUnit: int = 1
    maxUnit: int | None = None
    stepSize: int = 1

    @model_validator(mode="after")
    def _units_in_order(self) -> Self:
        low, high, step = self.units
        if low < 1 or step < 1:
            raise ValueError("minUnit and stepSize must be at least 1")
        if high is not None and high < low:
            raise ValueError(f"maxUnit {high} is below minUnit {low}")
        return self

    @property
    def units(self) -> Units:
        """``(minUnit, maxUnit, stepSize)``: what a request of the resource must respect."""
        return (self.minUnit, self.maxUnit, self.stepSize)

    @property
    def shapes_capacity(self) -> bool:
        """Whether ``reserved`` or ``allocationRatio`` differ from their defaults."""
        return self.reserved != 0 or self.allocationRatio != 1


class CpuInventory(_Settings):
    """``inventories.cpu``: amounts in DMIPS."""

    reserved: NonNegInt = 0
    """CPU kept from the pool, in DMIPS (Dhrystone million instructions per second)."""
    allocationRatio: AllocationRatio = 1.0
    """Overcommit: capacity is (total - reserved) x ratio."""
    minUnit: PosInt = 1
    """The smallest non-zero CPU request accepted on the node."""
    maxUnit: PosInt | None = None
    """The largest CPU request accepted on the node; no bound when absent."""
    stepSize: PosInt = 1
    """A CPU request must be a multiple of it."""


class ByteInventory(_Settings):
    """``inventories.ram``, ``.storage``, ``.state``: byte quantities (``64Mi``, ``1G``, 4096)."""

    reserved: Bytes = 0
    """Bytes kept from the pool."""
    allocationRatio: AllocationRatio = 1.0
    """Overcommit: capacity is (total - reserved) x ratio."""
    minUnit: PosBytes = 1
    """The smallest non-zero request accepted on the node (bytes)."""
    maxUnit: PosBytes | None = None
    """The largest request accepted on the node (bytes); no bound when absent."""
    stepSize: PosBytes = 1
    """A request must be a multiple of it (bytes)."""


class NodeInventories(BaseModel):
    """``inventories`` of a node file: per resource, its inventory settings."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True, defer_build=True)

    cpu: CpuInventory = CpuInventory()
    """Inventory settings of CPU (DMIPS)."""
    ram: ByteInventory = ByteInventory()
    """Inventory settings of RAM."""
    storage: ByteInventory = ByteInventory()
    """Inventory settings of storage (the partition typed storages)."""
    state: ByteInventory = ByteInventory()
    """Inventory settings of state (the partition typed states)."""

    @cached_property
    def units(self) -> tuple[Units, Units, Units, Units]:
        """The unit rules of cpu, ram, storage and state, in that order (computed once: the
        balancer's class key reads them for every node)."""
        return (self.cpu.units, self.ram.units, self.storage.units, self.state.units)

    @cached_property
    def declared(self) -> bool:
        """Whether any setting differs from its default (else the pools are as without them);
        computed once (the balancer asks for every node of every run)."""
        return self is not _DEFAULT and self != _DEFAULT


_DEFAULT = NodeInventories()


def check_totals(
    inventories: NodeInventories,
    *,
    max_dmips: int,
    total_ram: int,
    storage: int | None,
    state: int | None,
    shared: bool,
) -> None:
    """Raise ValueError when a ``reserved`` exceeds what the node has of it (``storage`` and
    ``state``: the sizes of the partitions typed so, None when there is none; ``shared``: one
    partition is typed both, so it has one pool, shaped by ``inventories.storage``)."""
    checks: list[tuple[str, ByteInventory | CpuInventory, int | None, str]] = [
        ("cpu", inventories.cpu, max_dmips, "maxDMIPS"),
        ("ram", inventories.ram, total_ram, "totalRAM"),
        ("storage", inventories.storage, storage, "the partition typed storages"),
        ("state", inventories.state, state, "the partition typed states"),
    ]
    for name, settings, total, what in checks:
        if total is None:
            continue
        if settings.reserved > total:
            raise ValueError(f"{name}.reserved {settings.reserved} exceeds {what} ({total})")
        ratio = Fraction(str(settings.allocationRatio))
        if (total - settings.reserved) * ratio > INT64_MAX:
            raise ValueError(
                f"{name}: ({what} - reserved) x allocationRatio {settings.allocationRatio} "
                "exceeds 2^63-1: no output could hold that capacity"
            )
    if shared and inventories.state.shapes_capacity:
        raise ValueError(
            "state: one partition is typed both storages and states, so it is one "
            "pool: set its reserved and allocationRatio under inventories.storage"
        )
