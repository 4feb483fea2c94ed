"""The status report's node entries made the fast way equal the reference: every node's state
read from the balance's own final state instead of a replay of its result (in every mode, with
preemption, rebalances and a changed set of services; the report a run writes is the same bytes
either way), and a pool's entry made without its inventory object."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from benchmarks.statedir import write_state_dir
from benchmarks.synth import SHAPES
from reconciler.accel import BalanceMemo, ClassIndex, node_states
from reconciler.controller import status as status_module
from reconciler.controller.configs import default_config_builder
from reconciler.controller.reconcile import (
    Computed,
    ReconcileCache,
    ReconcileOptions,
    compute_once,
    reconcile,
)
from reconciler.controller.status import _inv, _node_status, _pool
from reconciler.model.inventory import Inventory
from reconciler.placement.balancer import run_balance
from reconciler.placement.instances import Mode
from reconciler.placement.nodestate import InventoryPool, NodeSlot, Pool
from tests.support.balancer_scenarios import SETTINGS, Scenario, scenarios
from tests.support.builders import previous_of


def _entries(slots: dict[str, NodeSlot]) -> dict[str, dict[str, Any]]:
    return {node_id: _node_status(slot) for node_id, slot in slots.items()}


@SETTINGS
@given(scenario=scenarios(), data=st.data())
def test_the_runs_final_state_is_the_replayed_one(scenario: Scenario, data: st.DataObject) -> None:
    nodes = scenario.nodes()
    services = list(scenario.services)
    modes: list[Mode] = ["fresh", "stable", "rebalance"]
    mode = data.draw(st.sampled_from(modes), label="mode")
    previous = None
    if mode != "fresh":  # an earlier balance without one service, which comes back higher
        dropped = data.draw(st.integers(0, len(services) - 1), label="dropped")
        earlier = [s for i, s in enumerate(services) if i != dropped]
        bump = data.draw(st.integers(0, 2000), label="priority")
        first = run_balance(scenario.unit, nodes, earlier, None, "fresh", None, ClassIndex)[0]
        previous = previous_of(first)
        services = [
            s.model_copy(update={"priority": s.priority + bump}) if i == dropped else s
            for i, s in enumerate(services)
        ]
    overload = None
    if mode == "rebalance":
        hot = data.draw(st.sets(st.sampled_from([n.id for n in nodes])), label="overloaded")
        overload = {node_id: frozenset({"cpu", "ram"}) for node_id in sorted(hot)}
    search = partial(ClassIndex, services=services)
    result, run = run_balance(scenario.unit, nodes, services, previous, mode, overload, search)
    event(f"{mode}, preempted: {bool(result.preempted)}")
    replayed = node_states(scenario.unit, nodes, services, result)
    final = {slot.id: slot for slot in run.all_slots()}
    assert _entries(final) == _entries(replayed)


@SETTINGS
@given(scenario=scenarios())
def test_the_memo_gives_its_states_after_a_full_run_only(scenario: Scenario) -> None:
    nodes = scenario.nodes()
    memo = BalanceMemo()
    result = memo.balance(scenario.unit, nodes, scenario.services, mode="stable")
    states = memo.final_states(result)
    assert states is not None
    final = states()
    assert final is not None
    replayed = node_states(scenario.unit, nodes, scenario.services, result)
    assert _entries(final) == _entries(replayed)
    assert states() is None  # given once (its memory is let go)
    again = memo.balance(scenario.unit, nodes, scenario.services, previous_of(result))
    assert memo.incremental
    assert memo.final_states(again) is None  # answered from the memo: the cache replays


def _cold(root: Path, *, final: bool, cache: bool) -> bytes:
    opts = ReconcileOptions(
        configs=default_config_builder(), cache=ReconcileCache() if cache else None
    )
    if final:
        reconcile(root, opts)
    else:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(Computed, "final_states", lambda _self: None)
            reconcile(root, opts)
    return (root / "out" / "status.json").read_bytes()


@pytest.mark.parametrize("cache", [False, True], ids=["oneshot", "watch"])
@pytest.mark.parametrize("shape", SHAPES)
def test_a_cold_runs_report_is_the_replayed_one(tmp_path: Path, shape: str, cache: bool) -> None:
    """A cold run (a oneshot's, a watcher's first) on every fleet shape writes the status report
    a replay of its result gives, and replays nothing to write it."""
    for name in ("final", "replayed"):
        write_state_dir(tmp_path / name, 40, 160, shape=shape)
    with pytest.MonkeyPatch.context() as mp:

        def no_replay(*_args: object, **_kwargs: object) -> None:
            raise AssertionError("the status report replayed the result")

        mp.setattr(status_module, "node_states", no_replay)
        final = _cold(tmp_path / "final", final=True, cache=cache)
    replayed = _cold(tmp_path / "replayed", final=False, cache=cache)
    assert final == replayed


@given(
    capacity=st.integers(0, 10**12),
    used=st.integers(0, 10**12),
    settings=st.none()
    | st.tuples(
        st.integers(0, 10**6),  # reserved
        st.sampled_from([1.0, 0.5, 1.5, 2.0, 16.0]),  # allocation ratio
        st.integers(1, 4),  # min unit
        st.integers(1, 4),  # step size
    ),
)
def test_a_pools_entry_is_its_inventorys(
    capacity: int, used: int, settings: tuple[int, float, int, int] | None
) -> None:
    """The report's pool entries are made from the pool without its inventory object where it
    has no settings: the same entry as from the inventory."""
    if settings is None:
        pool: Pool = Pool("cpu", capacity)
    else:
        reserved, ratio, min_unit, step = settings
        spec = Inventory(
            "cpu",
            total=capacity + reserved,
            reserved=reserved,
            allocation_ratio=ratio,
            min_unit=min_unit,
            step_size=step,
        )
        pool = InventoryPool(spec)
    pool.free -= min(used, pool.capacity)
    assert _pool(pool) == _inv(pool.inventory)


def test_a_read_only_computation_keeps_no_node_states(tmp_path: Path) -> None:
    """``plan`` (a read-only computation) makes no status report: it keeps no node states in
    memory; a run that writes keeps them for its report."""
    write_state_dir(tmp_path / "state", 40, 160, shape="devices")
    opts = ReconcileOptions(configs=default_config_builder())
    assert compute_once(tmp_path / "state", opts, read_only=True).final is None
    assert compute_once(tmp_path / "state", opts).final is not None
