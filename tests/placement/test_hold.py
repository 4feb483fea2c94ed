"""Desired instances are never stopped as ``not-desired``: an edit that makes a running
instance's spec unplaceable keeps it where it runs, as it was placed (a *hold*).

The scenarios are the four bad edits found by trying the demo as a user would (a label no node
has, more CPU than any node has, a device request with no pool, a misspelled runtime type), each
on a running service: the balancer keeps the instance's node, runtime, devices, version and
amounts and reports a failure for its new spec; the plan stops nothing and exits 3; the config
on disk stays the one the containers run. When the new spec becomes placeable the usual
replacement follows; a deleted service still stops. Expected values are worked out by hand from
the scenario (node sizes, requests), never read back from the code's output.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from reconciler.accel import BalanceMemo, balance
from reconciler.cli.commands import main
from reconciler.controller.reconcile import reconcile
from reconciler.model.documents import ActualInstance, ActualState, Node, Service
from reconciler.model.values import instance_id
from reconciler.planning.plans import make_plan
from tests.support.agent_sim import apply_all
from tests.support.builders import make_node, make_service, previous_of

ITEM = "com.example.logger"
IID = instance_id(ITEM, "default", 0)
LABEL = f"{ITEM}:default:0"

GPU_POOL = {
    "resource": "example.com/gpu",
    "policy": "exclusive",
    "devices": [{"id": "gpu0"}, {"id": "gpu1"}],
}


def nodes() -> list[Node]:
    """A (1000 DMIPS, two GPUs) and B (800 DMIPS): the service goes to A, the most CPU."""
    return [make_node("A", device_pools=[GPU_POOL]), make_node("B", dmips=800)]


def service(**changes: Any) -> Service:
    args: dict[str, Any] = {
        "cpu": 300,
        "ram": "64Mi",
        "runtimes": ["runc"],
        "devices": [{"resource": "example.com/gpu", "count": 1}],
    }
    args.update(changes)
    return make_service(ITEM, **args)


# each bad edit, the reason code and the counts (by hand: B has no GPU pool, so the node-level
# Devices filter drops it before any runtime-level filter; Labels comes before Devices)
BAD_EDITS: dict[str, tuple[dict[str, Any], str, str]] = {
    "label no node has": ({"labels": ["lidar"]}, "Labels", "2 Labels"),
    "more cpu than any node": ({"cpu": 99999}, "Cpu", "1 Cpu, 1 Devices"),
    "device request with no pool": (
        {
            "devices": [
                {"resource": "example.com/gpu", "count": 1},
                {"resource": "example.com/lidar", "count": 1},
            ]
        },
        "Devices",
        "2 Devices",
    ),
    "misspelled runtime type": ({"runtimes": ["runcc"]}, "RuntimeType", "1 Devices, 1 RuntimeType"),
}


def actual_of(result_placements: Any, version: str) -> dict[str, ActualState]:
    """What the agents report after starting every placement (state active)."""
    docs: dict[str, dict[str, ActualInstance]] = {}
    for p in result_placements:
        docs.setdefault(p.node_id, {})[p.instance_id] = ActualInstance(
            itemId=p.item_id,
            subjectId=p.subject_id,
            index=p.index,
            version=version,
            runtimeId=p.runtime_id,
            state="active",
            devices=p.device_map(),
        )
    return {
        n: ActualState(apiVersion="reconciler/v1", kind="ActualState", nodeId=n, instances=recs)
        for n, recs in docs.items()
    }


class TestBalancerHolds:
    @pytest.mark.parametrize("edit", sorted(BAD_EDITS))
    @pytest.mark.parametrize("exhaustive", [False, True], ids=["indexed", "every-filter"])
    def test_a_bad_edit_keeps_the_running_instance_as_it_was(
        self, edit: str, exhaustive: bool
    ) -> None:
        changes, code, counts = BAD_EDITS[edit]
        first = balance(None, nodes(), [service()], exhaustive=exhaustive)
        placed = first.by_id[IID]
        assert (placed.node_id, placed.devices) == ("A", (("example.com/gpu", ("gpu0",)),))
        edited = service(version="2.0.0", **changes)
        second = balance(None, nodes(), [edited], previous_of(first), exhaustive=exhaustive)
        held = second.by_id[IID]
        assert second.held == {IID}
        # where and as it was: node, runtime, devices, version and amounts
        assert (held.node_id, held.runtime_id, held.version) == ("A", "runc", "1.0.0")
        assert held.devices == placed.devices and held.requested == placed.requested
        assert held.resources == placed.resources
        (f,) = second.failures
        assert f.instance_id == IID and f.reason == code and f.version == "2.0.0"
        assert f.summary == (
            f"{LABEL}: new spec 2.0.0 unplaceable, keeping 1.0.0 on A: 0/2 nodes feasible: {counts}"
        )

    def test_a_held_instance_goes_on_holding_and_then_takes_its_new_spec(self) -> None:
        first = balance(None, nodes(), [service()])
        bad = service(version="2.0.0", labels=["lidar"])
        second = balance(None, nodes(), [bad], previous_of(first))
        third = balance(None, nodes(), [bad], previous_of(second))
        assert third.by_id[IID] == second.by_id[IID] and third.held == {IID}
        fixed = service(version="2.0.0")
        fourth = balance(None, nodes(), [fixed], previous_of(third))
        assert fourth.held == frozenset() and fourth.failures == ()
        now = fourth.by_id[IID]
        assert (now.node_id, now.version, now.devices) == ("A", "2.0.0", first.by_id[IID].devices)

    def test_a_hold_keeps_its_capacity_from_lower_priority_newcomers(self) -> None:
        # A has 1000 DMIPS and the held instance 300 of them; a newcomer of lower priority
        # asking 800 fits neither on A (700 free) nor on B (800 DMIPS, but it is pinned to A)
        first = balance(None, nodes(), [service(priority=5)])
        bad = service(priority=5, version="2.0.0", cpu=99999)
        newcomer = make_service("com.example.new", cpu=800, node_id="A", runtimes=["runc"])
        second = balance(None, nodes(), [bad, newcomer], previous_of(first))
        assert second.held == {IID}
        assert "com.example.new" in {f.item_id for f in second.failures}
        used = sum(p.requested.cpu for p in second.placements if p.node_id == "A")
        assert used == 300 <= 1000

    def test_a_higher_priority_newcomer_preempts_a_held_instance(self) -> None:
        first = balance(None, nodes(), [service(priority=5)])
        bad = service(priority=5, version="2.0.0", cpu=99999)
        boss = make_service("com.example.boss", priority=50, cpu=800, node_id="A")
        second = balance(None, nodes(), [bad, boss], previous_of(first))
        assert IID in second.preempted and IID not in second.by_id and not second.held
        assert second.by_id[instance_id("com.example.boss", "default", 0)].node_id == "A"
        actual = actual_of(first.placements, "1.0.0")
        plan = make_plan(second, actual, {"A", "B"})
        assert [(a.action, a.instance_id, a.reason) for a in plan.stops()] == [
            ("stop", IID, "preempted")
        ]
        # the next run (the agents have not stopped it yet) plans the same stop, for the same
        # reason, though that run evicts nobody
        third = balance(None, nodes(), [bad, boss], previous_of(second))
        assert not third.preempted
        again = make_plan(third, actual, {"A", "B"})
        assert [(a.instance_id, a.reason) for a in again.stops()] == [(IID, "preempted")]

    def test_the_memo_gives_what_a_full_run_gives_through_a_hold(self) -> None:
        memo = BalanceMemo()
        specs = [
            service(),
            service(version="2.0.0", labels=["lidar"]),
            service(version="2.0.0", labels=["lidar"]),
            service(version="2.0.0"),
            service(version="2.0.0"),
        ]
        prev_memo: dict[str, Any] = {}
        prev_full: dict[str, Any] = {}
        other = make_service("com.example.other", cpu=100, runtimes=["runc"])
        for spec in specs:
            with_memo = memo.balance(None, nodes(), [spec, other], prev_memo)
            full = balance(None, nodes(), [spec, other], prev_full)
            assert with_memo == full and with_memo.held == full.held
            prev_memo, prev_full = previous_of(with_memo), previous_of(full)


class TestPlanReasons:
    def test_a_held_instance_is_neither_stopped_nor_started(self) -> None:
        first = balance(None, nodes(), [service()])
        actual = actual_of(first.placements, "1.0.0")
        second = balance(None, nodes(), [service(labels=["lidar"])], previous_of(first))
        plan = make_plan(second, actual, {"A", "B"})
        assert plan.actions == () and not plan.complete
        assert [f.summary for f in plan.failures] == [
            f"{LABEL}: new spec unplaceable, keeping 1.0.0 on A: 0/2 nodes feasible: 2 Labels"
        ]

    def test_a_deleted_service_stops_as_not_desired(self) -> None:
        first = balance(None, nodes(), [service()])
        actual = actual_of(first.placements, "1.0.0")
        gone = balance(None, nodes(), [], previous_of(first))
        plan = make_plan(gone, actual, {"A", "B"})
        assert [(a.instance_id, a.reason) for a in plan.stops()] == [(IID, "not-desired")]

    def test_a_lost_node_stops_as_node_lost(self) -> None:
        first = balance(None, nodes(), [service()])
        actual = actual_of(first.placements, "1.0.0")
        only_b = [make_node("B", dmips=800)]
        second = balance(None, only_b, [service()], previous_of(first))
        plan = make_plan(second, actual, {"B"})
        assert [(a.instance_id, a.reason) for a in plan.stops()] == [(IID, "node-lost")]

    def test_a_desired_instance_that_cannot_be_held_stops_as_unplaceable(self) -> None:
        # fresh mode keeps nothing: an unplaceable desired instance stops, but not as
        # "not-desired"
        first = balance(None, nodes(), [service()])
        actual = actual_of(first.placements, "1.0.0")
        bad = service(labels=["lidar"])
        second = balance(None, nodes(), [bad], previous_of(first), mode="fresh")
        assert IID not in second.by_id
        plan = make_plan(second, actual, {"A", "B"})
        assert [(a.instance_id, a.reason) for a in plan.stops()] == [(IID, "unplaceable")]


# ---------------------------------------------------------------- the demo, through the CLI


DEMO_EDITS: dict[str, Callable[[str], str]] = {
    "label no node has": lambda t: t.replace("instances: 3", "instances: 3\nlabels: [lidar]"),
    "more cpu than any node": lambda t: t.replace("  cpu: 50", "  cpu: 99999"),
    "device request with no pool": lambda t: (
        t + "devices:\n  - {resource: example.com/lidar, count: 1}\n"
    ),
    "misspelled runtime type": lambda t: t.replace("runtimes: [runc]", "runtimes: [runcc]"),
}


def _configs(state: Path) -> dict[str, bytes]:
    root = state / "out" / "instances"
    return {d.name: (d / "config.json").read_bytes() for d in sorted(root.iterdir()) if d.is_dir()}


@pytest.mark.parametrize("edit", sorted(DEMO_EDITS))
def test_a_bad_edit_of_a_running_demo_service_stops_nothing(
    demo_copy: Path, edit: str, capsys: pytest.CaptureFixture[str]
) -> None:
    state = str(demo_copy)
    assert main(["reconcile", "--state", state]) == 0
    apply_all(demo_copy)
    assert main(["reconcile", "--state", state]) == 0
    configs = _configs(demo_copy)
    logger = demo_copy / "desired" / "apps" / "logger.yaml"
    text = logger.read_text()
    edited = DEMO_EDITS[edit](text.replace("version: 1.0.0", "version: 1.1.0"))
    assert edited != text
    logger.write_text(edited.replace("sleep 1", "sleep 2"))  # and a new command line
    capsys.readouterr()
    assert main(["plan", "--json", "--state", state]) == 3
    plan = json.loads(capsys.readouterr().out)
    assert plan["actions"] == []
    summaries = [f["summary"] for f in plan["failures"]]
    assert len(summaries) == 3
    for k, summary in enumerate(sorted(summaries)):
        assert summary.startswith(
            f"{ITEM}:default:{k}: new spec 1.1.0 unplaceable, keeping 1.0.0 on edge-1: 0/3 nodes"
        ), summary
    # reconcile writes the same: no stop in any node patch, the configs the containers run
    # are left as they are (not rebuilt from the new command line)
    assert main(["reconcile", "--state", state]) == 0
    for patch in (demo_copy / "out" / "nodes").glob("*.json"):
        assert [op["op"] for op in json.loads(patch.read_text())] == ["test"], patch.name
    assert _configs(demo_copy) == configs
    assert b"sleep 2" not in b"".join(configs.values())
    # fixed again (the new version kept): the usual version-changed replacement follows
    logger.write_text(text.replace("version: 1.0.0", "version: 1.1.0"))
    capsys.readouterr()
    assert main(["plan", "--json", "--state", state]) == 2
    actions = json.loads(capsys.readouterr().out)["actions"]
    assert {(a["action"], a["reason"], a["version"]) for a in actions} == {
        ("stop", "version-changed", "1.0.0"),
        ("start", "version-changed", "1.1.0"),
    }
    assert len(actions) == 6
    # deleting the service stops its instances as not desired
    logger.unlink()
    assert main(["plan", "--json", "--state", state]) == 2
    actions = json.loads(capsys.readouterr().out)["actions"]
    assert len(actions) == 3
    assert {(a["action"], a["reason"]) for a in actions} == {("stop", "not-desired")}


def test_a_reconciled_hold_survives_a_restart(demo_copy: Path) -> None:
    """The hold lives in the checkpoint: a fresh process plans the same (nothing) again."""
    reconcile(demo_copy)
    apply_all(demo_copy)
    reconcile(demo_copy)
    logger = demo_copy / "desired" / "apps" / "logger.yaml"
    logger.write_text(logger.read_text().replace("  cpu: 50", "  cpu: 99999"))
    first = reconcile(demo_copy)
    again = reconcile(demo_copy)
    assert first.plan.actions == () == again.plan.actions
    assert first.computed.result.held == again.computed.result.held
    assert len(again.computed.result.held) == 3
