"""A balance leaves no garbage cycle behind: what it no longer needs is freed by reference
counting when it returns. A cycle (a search holding its run, which holds the search) would
leave the run's whole working state (every node's slots, at 5,000 nodes some 60,000 objects)
to Python's cyclic collector: a full pass inside whichever stage allocates next, and, in a
watcher, which freezes what survives each run, memory kept until the next resync."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator

import pytest

from benchmarks.synth import synth_unit
from reconciler.accel import BalanceMemo, balance, explain, node_states
from reconciler.placement.instances import Mode
from tests.support.builders import previous_of


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _garbage_after(work: Callable[[], object]) -> int:
    gc.collect()
    work()
    return gc.collect()  # the unreachable objects found: cyclic garbage only


@pytest.mark.parametrize("exhaustive", [False, True], ids=["index", "exhaustive"])
@pytest.mark.parametrize("mode", ["fresh", "stable", "rebalance"])
def test_a_balance_leaves_no_garbage_cycle(
    collector_off: None, exhaustive: bool, mode: Mode
) -> None:
    unit, nodes, services = synth_unit(40, 160, 1, "preemption")
    before = previous_of(balance(unit, nodes, services, mode="fresh"))
    run = lambda: balance(unit, nodes, services, before, mode, exhaustive=exhaustive)  # noqa: E731
    assert _garbage_after(run) == 0


def test_explain_and_node_states_leave_no_garbage_cycle(collector_off: None) -> None:
    unit, nodes, services = synth_unit(40, 160, 1, "homogeneous")
    result = balance(unit, nodes, services, mode="fresh")
    iid = result.placements[0].instance_id
    assert _garbage_after(lambda: explain(unit, nodes, services, iid)) == 0
    assert _garbage_after(lambda: node_states(unit, nodes, services, result)) == 0


def test_the_memo_frees_the_run_it_replaces(collector_off: None) -> None:
    unit, nodes, services = synth_unit(40, 160, 1, "homogeneous")
    memo = BalanceMemo()
    first = memo.balance(unit, nodes, services, {}, "stable")
    fewer = services[1:]
    assert _garbage_after(lambda: memo.balance(unit, nodes, fewer, previous_of(first))) == 0
