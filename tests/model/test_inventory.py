"""Placement-style integer inventories: capacity, unit rules, immutable consume/release."""

from __future__ import annotations

import dataclasses
import math
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.model.inventory import (
    REASONS,
    CapacityError,
    InvalidAmountError,
    InvalidInventoryError,
    Inventory,
    InventoryError,
    ReleaseError,
)

# Ratios that real deployments use, ones whose float products land just below an integer
# (100 * 0.29 == 28.999999999999996), and arbitrary floats in a sane range.
RATIOS = st.one_of(
    st.sampled_from([0.5, 1.0, 1.5, 16.0, 0.1, 0.29, 0.57, 1.1, 2.2]),
    st.floats(min_value=0.01, max_value=64.0, allow_nan=False, allow_infinity=False),
)


def expected_capacity(total: int, reserved: int, ratio: float) -> int:
    """Independent oracle: the ratio's shortest decimal repr, as an exact rational."""
    exact = Fraction(Decimal(repr(ratio)))
    return ((total - reserved) * exact.numerator) // exact.denominator


@st.composite
def inventories(draw: st.DrawFn, max_total: int = 10_000) -> Inventory:
    total = draw(st.integers(0, max_total))
    reserved = draw(st.integers(0, total))
    ratio = draw(RATIOS)
    min_unit = draw(st.integers(1, 8))
    max_unit = draw(st.none() | st.integers(min_unit, min_unit + 2 * max_total))
    step_size = draw(st.integers(1, 4))
    inv = Inventory("r", total, reserved, ratio, min_unit, max_unit, step_size)
    return inv.with_used(draw(st.integers(0, max(inv.capacity, 0))))


def obeys_rules(inv: Inventory, amount: int) -> bool:
    """The consume rules restated directly, for comparison with ``check``."""
    if amount == 0:
        return True
    return (
        amount >= inv.min_unit
        and (inv.max_unit is None or amount <= inv.max_unit)
        and amount % inv.step_size == 0
        and inv.used + amount <= inv.capacity
    )


class TestCapacity:
    @given(total=st.integers(0, 10**12), data=st.data(), ratio=RATIOS)
    def test_capacity_is_floor_of_unreserved_times_ratio(
        self, total: int, data: st.DataObject, ratio: float
    ) -> None:
        reserved = data.draw(st.integers(0, total))
        inv = Inventory("r", total, reserved=reserved, allocation_ratio=ratio)
        assert inv.capacity == expected_capacity(total, reserved, ratio)
        assert inv.free == inv.capacity

    @pytest.mark.parametrize(("ratio", "capacity"), [(0.29, 29), (0.57, 57), (1.13, 113)])
    def test_exact_arithmetic_avoids_float_off_by_one(self, ratio: float, capacity: int) -> None:
        assert math.floor(100 * ratio) == capacity - 1  # the trap float math falls into
        assert Inventory("r", 100, allocation_ratio=ratio).capacity == capacity

    def test_reserved_is_taken_before_overcommit(self) -> None:
        inv = Inventory("cpu", total=1000, reserved=200, allocation_ratio=1.5)
        assert inv.capacity == 1200

    def test_integer_ratio_is_accepted(self) -> None:
        assert Inventory("r", 10, allocation_ratio=16).capacity == 160

    @settings(max_examples=50)
    @given(inventories())
    def test_free_is_capacity_minus_used(self, inv: Inventory) -> None:
        assert inv.free == inv.capacity - inv.used
        assert 0 <= inv.free <= inv.capacity


class TestCheckRules:
    @pytest.mark.parametrize(
        ("inv", "amount", "reason", "error"),
        [
            (Inventory("r", 100), -1, "negative-amount", InvalidAmountError),
            (Inventory("r", 100, min_unit=4), 3, "below-min-unit", InvalidAmountError),
            (Inventory("r", 100, max_unit=10), 11, "above-max-unit", InvalidAmountError),
            (Inventory("r", 100, step_size=4), 6, "step-size", InvalidAmountError),
            (Inventory("r", 100, used=95), 6, "over-capacity", CapacityError),
            (Inventory("r", 100, reserved=50), 51, "over-capacity", CapacityError),
        ],
    )
    def test_violation_has_reason_and_exception_type(
        self, inv: Inventory, amount: int, reason: str, error: type[InventoryError]
    ) -> None:
        assert inv.check(amount) == reason
        assert not inv.can_provide(amount)
        with pytest.raises(error) as caught:
            inv.consume(amount)
        assert type(caught.value) is error
        assert caught.value.reason == reason
        assert f"cannot consume {amount}" in str(caught.value)
        assert str(caught.value).startswith("r: ")

    @pytest.mark.parametrize(
        ("amount", "reason"),
        [(-4, "negative-amount"), (2, "below-min-unit"), (24, "above-max-unit"), (6, "step-size")],
    )
    def test_first_broken_rule_is_reported(self, amount: int, reason: str) -> None:
        # every amount here is also over capacity; the unit rules are reported first
        inv = Inventory("r", 100, min_unit=4, max_unit=20, step_size=4, used=100)
        assert inv.check(amount) == reason

    def test_boundaries_are_inclusive(self) -> None:
        inv = Inventory("r", 100, min_unit=4, max_unit=20, step_size=4, used=80)
        assert inv.check(4) is None
        assert inv.check(20) is None
        assert inv.check(24) == "above-max-unit"
        assert inv.with_used(84).check(20) == "over-capacity"

    def test_capacity_message_is_readable(self) -> None:
        inv = Inventory("cpu", total=1000, used=800)
        with pytest.raises(
            CapacityError, match=r"^cpu: cannot consume 300 \(free 200 of capacity 1000\)$"
        ):
            inv.consume(300)

    @settings(max_examples=50)
    @given(inventories())
    def test_zero_is_always_a_no_op(self, inv: Inventory) -> None:
        full = inv.with_used(inv.capacity)
        for candidate in (inv, full):
            assert candidate.check(0) is None
            assert candidate.consume(0) == candidate
            assert candidate.release(0) == candidate

    @settings(max_examples=50)
    @given(inventories(max_total=200), st.integers(-50, 500))
    def test_check_matches_the_rules(self, inv: Inventory, amount: int) -> None:
        reason = inv.check(amount)
        assert (reason is None) == obeys_rules(inv, amount)
        assert reason is None or reason in REASONS
        assert inv.can_provide(amount) == (reason is None)

    def test_non_int_amount_is_a_type_error(self) -> None:
        inv = Inventory("r", 10)
        bad: Any
        for bad in (1.0, True, "1", None):
            with pytest.raises(TypeError):
                inv.check(bad)
            with pytest.raises(TypeError):
                inv.release(bad)


class TestConsumeRelease:
    def test_consume_returns_new_value_and_keeps_original(self) -> None:
        inv = Inventory("ram", total=1024, reserved=24)
        after = inv.consume(100)
        assert after.used == 100
        assert after.free == 900
        assert inv.used == 0
        assert after == dataclasses.replace(inv, used=100)

    def test_release_returns_new_value(self) -> None:
        inv = Inventory("ram", total=1024, used=300)
        assert inv.release(300) == Inventory("ram", total=1024)
        assert inv.used == 300

    def test_release_ignores_unit_rules(self) -> None:
        inv = Inventory("r", 100, min_unit=10, step_size=10, used=30)
        assert inv.release(3).used == 27

    @pytest.mark.parametrize(
        ("amount", "reason"), [(-1, "negative-amount"), (31, "release-below-zero")]
    )
    def test_bad_release_is_rejected(self, amount: int, reason: str) -> None:
        inv = Inventory("disk", 100, used=30)
        with pytest.raises(ReleaseError) as caught:
            inv.release(amount)
        assert caught.value.reason == reason
        assert str(caught.value).startswith(f"disk: cannot release {amount}")

    def test_inventory_is_frozen_and_hashable(self) -> None:
        inv = Inventory("r", 10)
        with pytest.raises(dataclasses.FrozenInstanceError):
            inv.used = 5  # type: ignore[misc]
        assert len({inv, Inventory("r", 10), inv.consume(1)}) == 2

    def test_errors_share_a_base(self) -> None:
        for error in (CapacityError, InvalidAmountError, ReleaseError, InvalidInventoryError):
            assert issubclass(error, InventoryError)
        assert issubclass(InventoryError, Exception)


def amounts_near_the_edges(inv: Inventory) -> st.SearchStrategy[int]:
    """Amounts that hit the interesting boundaries of ``inv`` often, plus arbitrary ones."""
    edges = {inv.free, inv.used, inv.min_unit, inv.step_size, inv.capacity}
    if inv.max_unit is not None:
        edges.add(inv.max_unit)
    return st.one_of(
        st.sampled_from(sorted(e + d for e in edges for d in (-1, 0, 1))),
        st.integers(-3, 12),
        st.integers(0, inv.capacity + 20),
    )


class TestOperationSequences:
    @settings(max_examples=60)
    @given(inventories(max_total=100), st.data())
    def test_used_stays_within_capacity(self, inv: Inventory, data: st.DataObject) -> None:
        for _ in range(data.draw(st.integers(0, 25), label="length")):
            op = data.draw(st.sampled_from(["consume", "release"]))
            amount = data.draw(amounts_near_the_edges(inv))
            before = inv
            try:
                inv = inv.consume(amount) if op == "consume" else inv.release(amount)
            except InventoryError as exc:
                assert inv == before  # a refused operation changes nothing
                if op == "consume":
                    assert exc.reason == before.check(amount)
                    assert isinstance(exc, CapacityError | InvalidAmountError)
                else:
                    assert isinstance(exc, ReleaseError)
                    assert amount < 0 or amount > before.used
            else:
                delta = amount if op == "consume" else -amount
                assert inv.used == before.used + delta
                assert dataclasses.replace(inv, used=before.used) == before
                if op == "consume":
                    assert before.can_provide(amount)
                else:
                    assert 0 <= amount <= before.used
            assert 0 <= inv.used <= inv.capacity

    @settings(max_examples=50)
    @given(inventories(max_total=100), st.data())
    def test_consume_then_release_round_trips(self, inv: Inventory, data: st.DataObject) -> None:
        amount = data.draw(st.integers(0, 200))
        if inv.can_provide(amount):
            assert inv.consume(amount).release(amount) == inv
        else:
            with pytest.raises((CapacityError, InvalidAmountError)):
                inv.consume(amount)


class TestConstruction:
    @pytest.mark.parametrize(
        ("kwargs", "field"),
        [
            ({"total": -1}, "total"),
            ({"reserved": -1}, "reserved"),
            ({"reserved": 11}, "reserved"),
            ({"allocation_ratio": 0.0}, "allocation_ratio"),
            ({"allocation_ratio": -1.5}, "allocation_ratio"),
            ({"allocation_ratio": math.nan}, "allocation_ratio"),
            ({"allocation_ratio": math.inf}, "allocation_ratio"),
            ({"min_unit": 0}, "min_unit"),
            ({"min_unit": 5, "max_unit": 4}, "max_unit"),
            ({"step_size": 0}, "step_size"),
            ({"used": -1}, "used"),
            ({"total": 10.0}, "total"),
            ({"total": True}, "total"),
            ({"max_unit": 2.5}, "max_unit"),
            ({"resource_class": ""}, "resource_class"),
        ],
    )
    def test_invalid_construction_is_rejected(self, kwargs: dict[str, Any], field: str) -> None:
        args: dict[str, Any] = {"resource_class": "r", "total": 10, **kwargs}
        with pytest.raises(InvalidInventoryError, match=field) as caught:
            Inventory(**args)
        assert caught.value.reason == "invalid-inventory"

    def test_boundary_constructions_are_accepted(self) -> None:
        assert Inventory("r", 0).capacity == 0
        assert Inventory("r", 10, reserved=10).capacity == 0
        assert Inventory("r", 10, min_unit=3, max_unit=3).check(3) is None

    def test_with_used_validates(self) -> None:
        inv = Inventory("r", 10)
        assert inv.with_used(7).used == 7
        with pytest.raises(InvalidInventoryError):
            inv.with_used(-1)


class TestSimpleConstructor:
    @given(st.integers(min_value=0, max_value=2**40), st.sampled_from(["cpu", "ram", "gpu/x"]))
    def test_equals_the_validated_constructor(self, total: int, name: str) -> None:
        fast = Inventory.simple(name, total)
        assert fast == Inventory(name, total=total)
        assert (fast.capacity, fast.free) == (total, total)
        assert fast.consume(total).free == 0

    def test_refuses_what_the_constructor_refuses(self) -> None:
        with pytest.raises(InvalidInventoryError):
            Inventory.simple("cpu", -1)
