"""Integer inventories of consumable resources, after OpenStack Placement.

Every consumable of a node (CPU DMIPS, RAM bytes, storage, runtime slots, shared-resource
slots, devices) is an :class:`Inventory`: an immutable value holding an integer ``total``
and the rules for consuming it.

Rules:

* ``capacity = floor((total - reserved) * allocation_ratio)``, computed exactly: the ratio is
  read through its shortest decimal form (``Fraction(str(ratio))``), so ``0.29 * 100`` is 29,
  not the 28 that float arithmetic would give. ``free = capacity - used``.
* A non-zero amount can be consumed only if it is positive, ``>= min_unit``, ``<= max_unit``
  (when set), a multiple of ``step_size`` and ``<= free``. Consuming 0 is always allowed and
  changes nothing (``min_unit`` applies only to non-zero amounts).
* :meth:`Inventory.check` returns ``None`` or one stable reason code, tested in this order:
  ``"negative-amount"``, ``"below-min-unit"``, ``"above-max-unit"``, ``"step-size"``,
  ``"over-capacity"``.
* :meth:`Inventory.consume` / :meth:`Inventory.release` return a *new* inventory; a refused
  operation raises an :class:`InventoryError` subclass carrying ``.reason`` and leaves the
  original untouched (it is immutable anyway). Releasing is not subject to the unit or step
  rules: it only must not be negative or take ``used`` below zero.
* Construction validates ``total >= 0``, ``0 <= reserved <= total``, ``allocation_ratio > 0``
  (finite), ``min_unit >= 1``, ``max_unit is None or max_unit >= min_unit``,
  ``step_size >= 1`` and ``used >= 0`` (``used`` may exceed ``capacity``, e.g. after
  ``reserved`` grew; then ``free`` is negative and nothing non-zero can be consumed).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Final

__all__ = [
    "REASONS",
    "CapacityError",
    "InvalidAmountError",
    "InvalidInventoryError",
    "Inventory",
    "InventoryError",
    "ReleaseError",
]

NEGATIVE_AMOUNT: Final = "negative-amount"
BELOW_MIN_UNIT: Final = "below-min-unit"
ABOVE_MAX_UNIT: Final = "above-max-unit"
STEP_SIZE: Final = "step-size"
OVER_CAPACITY: Final = "over-capacity"
RELEASE_BELOW_ZERO: Final = "release-below-zero"
INVALID_INVENTORY: Final = "invalid-inventory"

#: Every reason code :meth:`Inventory.check` can return.
REASONS: Final = frozenset(
    {NEGATIVE_AMOUNT, BELOW_MIN_UNIT, ABOVE_MAX_UNIT, STEP_SIZE, OVER_CAPACITY}
)


class InventoryError(Exception):
    """Base of all inventory errors; ``reason`` is a stable machine-readable code."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason


class InvalidInventoryError(InventoryError):
    """The inventory's fields break a construction rule."""

    def __init__(self, message: str) -> None:
        super().__init__(message, INVALID_INVENTORY)


class CapacityError(InventoryError):
    """A consume asked for more than is free (reason ``"over-capacity"``)."""


class InvalidAmountError(InventoryError):
    """A consume broke the sign, ``min_unit``, ``max_unit`` or ``step_size`` rule."""


class ReleaseError(InventoryError):
    """A release was negative or would take ``used`` below zero."""


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _require_amount(amount: object) -> int:
    if isinstance(amount, bool) or not isinstance(amount, int):
        raise TypeError(f"amount must be an int, got {type(amount).__name__}: {amount!r}")
    return amount


@dataclass(frozen=True, slots=True)
class Inventory:
    """An immutable integer inventory of one resource class (see the module docstring)."""

    resource_class: str
    total: int
    reserved: int = 0
    allocation_ratio: float = 1.0
    min_unit: int = 1
    max_unit: int | None = None
    step_size: int = 1
    used: int = 0
    _capacity: int = field(init=False, repr=False, compare=False, hash=False, default=0)

    def __post_init__(self) -> None:
        def bad(what: str) -> InvalidInventoryError:
            return InvalidInventoryError(f"{self.resource_class!r}: invalid inventory: {what}")

        if not isinstance(self.resource_class, str) or not self.resource_class:
            raise bad("resource_class must be a non-empty string")
        for name in ("total", "reserved", "min_unit", "step_size", "used"):
            value = getattr(self, name)
            if not _is_int(value):
                raise bad(f"{name} must be an int, got {type(value).__name__} {value!r}")
        if self.max_unit is not None and not _is_int(self.max_unit):
            raise bad(f"max_unit must be an int or None, got {self.max_unit!r}")
        ratio: object = self.allocation_ratio
        if not isinstance(ratio, int | float) or isinstance(ratio, bool):
            raise bad(f"allocation_ratio must be a number, got {ratio!r}")
        if self.total < 0:
            raise bad(f"total must be >= 0, got {self.total}")
        if not 0 <= self.reserved <= self.total:
            raise bad(f"reserved must be in [0, total={self.total}], got {self.reserved}")
        if not (math.isfinite(ratio) and ratio > 0):
            raise bad(f"allocation_ratio must be a finite number > 0, got {ratio!r}")
        if self.min_unit < 1:
            raise bad(f"min_unit must be >= 1, got {self.min_unit}")
        if self.max_unit is not None and self.max_unit < self.min_unit:
            raise bad(f"max_unit must be >= min_unit={self.min_unit}, got {self.max_unit}")
        if self.step_size < 1:
            raise bad(f"step_size must be >= 1, got {self.step_size}")
        if self.used < 0:
            raise bad(f"used must be >= 0, got {self.used}")
        capacity = (self.total - self.reserved) * Fraction(str(ratio)) if ratio != 1 else None
        object.__setattr__(
            self,
            "_capacity",
            self.total - self.reserved if capacity is None else math.floor(capacity),
        )

    @staticmethod
    def simple(resource_class: str, total: int) -> Inventory:
        """``Inventory(resource_class, total=total)`` with every other field at its default,
        built without the general validation (only ``total >= 0`` can be wrong here)."""
        if type(total) is not int or total < 0 or not resource_class:
            return Inventory(resource_class, total=total)  # raises the usual error
        new = object.__new__(Inventory)
        _set = object.__setattr__
        _set(new, "resource_class", resource_class)
        _set(new, "total", total)
        _set(new, "reserved", 0)
        _set(new, "allocation_ratio", 1.0)
        _set(new, "min_unit", 1)
        _set(new, "max_unit", None)
        _set(new, "step_size", 1)
        _set(new, "_capacity", total)
        _set(new, "used", 0)
        return new

    def _derive(self, used: int) -> Inventory:
        """A copy with another ``used``, skipping the validation the original passed."""
        new = object.__new__(Inventory)
        _set = object.__setattr__
        _set(new, "resource_class", self.resource_class)
        _set(new, "total", self.total)
        _set(new, "reserved", self.reserved)
        _set(new, "allocation_ratio", self.allocation_ratio)
        _set(new, "min_unit", self.min_unit)
        _set(new, "max_unit", self.max_unit)
        _set(new, "step_size", self.step_size)
        _set(new, "_capacity", self._capacity)
        _set(new, "used", used)
        return new

    # -- derived quantities -------------------------------------------------------------------

    @property
    def capacity(self) -> int:
        """``floor((total - reserved) * allocation_ratio)``, in exact arithmetic."""
        return self._capacity

    @property
    def free(self) -> int:
        """``capacity - used`` (negative only if ``used`` was set above capacity)."""
        return self._capacity - self.used

    # -- queries ------------------------------------------------------------------------------

    def check(self, amount: int) -> str | None:
        """``None`` if ``amount`` can be consumed now, else the reason code of the first rule
        it breaks (see :data:`REASONS`)."""
        if type(amount) is not int:
            amount = _require_amount(amount)
        if (
            0 < amount <= self._capacity - self.used
            and self.step_size == 1
            and amount >= self.min_unit
            and (self.max_unit is None or amount <= self.max_unit)
        ):
            return None  # the common case, decided in one pass
        reason = self.check_units(amount)
        if reason is None and amount > self.free:
            return OVER_CAPACITY
        return reason

    def check_units(self, amount: int) -> str | None:
        """The rules of :meth:`check` that do not depend on what is free: ``None`` or the
        reason code of the first of sign, ``min_unit``, ``max_unit`` and ``step_size`` that
        ``amount`` breaks (0 breaks none)."""
        if amount < 0:
            return NEGATIVE_AMOUNT
        if amount == 0:
            return None
        if amount < self.min_unit:
            return BELOW_MIN_UNIT
        if self.max_unit is not None and amount > self.max_unit:
            return ABOVE_MAX_UNIT
        if amount % self.step_size != 0:
            return STEP_SIZE
        return None

    def describe(self, reason: str) -> str:
        """The rule behind a reason code of :meth:`check`, in words (``below min_unit 256``)."""
        return {
            NEGATIVE_AMOUNT: "negative amount",
            BELOW_MIN_UNIT: f"below min_unit {self.min_unit}",
            ABOVE_MAX_UNIT: f"above max_unit {self.max_unit}",
            STEP_SIZE: f"not a multiple of step_size {self.step_size}",
            OVER_CAPACITY: f"free {self.free} of capacity {self.capacity}",
        }[reason]

    def can_provide(self, amount: int) -> bool:
        """Whether ``consume(amount)`` would succeed."""
        return self.check(amount) is None

    # -- transitions (all return new values) --------------------------------------------------

    def consume(self, amount: int) -> Inventory:
        """A copy with ``used + amount``; raises :class:`CapacityError` or
        :class:`InvalidAmountError` (with ``.reason``) if :meth:`check` refuses."""
        reason = self.check(amount)
        if reason is None:
            return self if amount == 0 else self._derive(self.used + amount)
        message = f"{self.resource_class}: cannot consume {amount} ({self.describe(reason)})"
        if reason == OVER_CAPACITY:
            raise CapacityError(message, reason)
        raise InvalidAmountError(message, reason)

    def release(self, amount: int) -> Inventory:
        """A copy with ``used - amount``; raises :class:`ReleaseError` with reason
        ``"negative-amount"`` or ``"release-below-zero"``."""
        amount = _require_amount(amount)
        if amount < 0:
            raise ReleaseError(
                f"{self.resource_class}: cannot release {amount} (negative amount)",
                NEGATIVE_AMOUNT,
            )
        if amount > self.used:
            raise ReleaseError(
                f"{self.resource_class}: cannot release {amount} (only {self.used} used)",
                RELEASE_BELOW_ZERO,
            )
        return self if amount == 0 else self._derive(self.used - amount)

    def with_used(self, used: int) -> Inventory:
        """A copy with ``used`` set outright (validated like a construction)."""
        return dataclasses.replace(self, used=used)


_FIELDS = tuple(f for f in Inventory.__dataclass_fields__ if f != "used")
