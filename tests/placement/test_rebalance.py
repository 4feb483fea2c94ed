"""Rebalancing on sustained load (SPEC §8), driven through separate reconcile runs: each run
reads only the disk, so the alert timeline crosses runs through the checkpoint as it would cross
oneshot processes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from freezegun import freeze_time

from reconciler.controller.reconcile import ReconcileReport, reconcile
from reconciler.model.values import instance_id
from tests.support.agent_sim import apply_all
from tests.support.load_traces import HOUR_REBALANCES, hour_trace

UNIT = """apiVersion: reconciler/v1
kind: UnitConfig
version: 1.0.0
nodes:
{entries}
"""
RULES = "alertRules: {cpu: {minThreshold: 75, maxThreshold: 75, minTimeout: 60s}}"
NODE = """apiVersion: reconciler/v1
kind: Node
id: {id}
type: t{id}
maxDMIPS: 1000
totalRAM: 1Gi
runtimes:
  - {{id: {rt}, type: {rt}, platform: {{architecture: x86_64, os: linux}}}}
"""
SERVICE = """apiVersion: reconciler/v1
kind: Service
id: {id}
version: 1.0.0
priority: {priority}
balancingPolicy: {policy}
image: {{rootfs: /r, cmd: [/bin/true]}}
quotas: {{cpuDMIPSLimit: 1000}}
"""


def make_state(root: Path, s3_policy: str = "enabled", rules: str = RULES) -> Path:
    priorities = {"A": 100, "B": 50, "C": 50, "D": 0}
    entries = "\n".join(
        f"  - {{nodeType: t{n}, nodeId: {n}, priority: {p}, {rules}}}"
        for n, p in priorities.items()
    )
    (root / "nodes").mkdir(parents=True)
    (root / "desired").mkdir()
    (root / "unit.yaml").write_text(UNIT.format(entries=entries))
    for n in priorities:
        (root / "nodes" / f"{n}.yaml").write_text(
            NODE.format(id=n, rt="runx" if n == "D" else "runc")
        )
    for sid, prio in (("s1", 100), ("s2", 50), ("s3", 50)):
        policy = s3_policy if sid == "s3" else "enabled"
        (root / "desired" / f"{sid}.yaml").write_text(
            SERVICE.format(id=sid, priority=prio, policy=policy)
        )
    return root


def report_usage(root: Path, node: str, instances: dict[str, int]) -> None:
    path = root / "nodes" / f"{node}.yaml"
    text = path.read_text().split("usage:")[0]
    usage = {
        "cpu": sum(instances.values()),
        "instances": {instance_id(s, "default", 0): {"cpu": c} for s, c in instances.items()},
    }
    path.write_text(text + "usage: " + json.dumps(usage) + "\n")


def where(report: ReconcileReport) -> dict[str, str]:
    return {p.item_id: p.node_id for p in report.computed.result.placements}


def moves(report: ReconcileReport) -> set[tuple[str, str, str, str]]:
    return {(a.action, a.item_id, a.node_id, a.reason) for a in report.plan.actions}


def start_unit(root: Path) -> None:
    first = reconcile(root)
    assert where(first) == {"s1": "A", "s2": "A", "s3": "B"}
    apply_all(root)
    assert not reconcile(root).plan.changes_present


def overload_a(root: Path, clock: Any) -> ReconcileReport:
    """From the first placement, A at 100 % (s1 500, s2 500) for 70 s: the run that rebalances."""
    start_unit(root)
    report_usage(root, "A", {"s1": 500, "s2": 500})
    clock.tick(10)
    reconcile(root)
    clock.tick(60)
    return reconcile(root)


class TestSustainedLoad:
    def test_rebalance_moves_s2_and_s3(self, tmp_path: Path) -> None:
        root = make_state(tmp_path / "state")
        with freeze_time("2026-11-22 08:00:00") as clock:
            start_unit(root)
            report_usage(root, "A", {"s1": 500, "s2": 500})
            clock.tick(10)
            assert reconcile(root).computed.mode == "stable"  # the timer starts
            clock.tick(30)
            assert reconcile(root).computed.mode == "stable"  # 30 s: not yet
            clock.tick(30)
            report = reconcile(root)  # 60 s at 100 % >= 75 %: raised, rebalance
        assert report.computed.mode == "rebalance"
        assert where(report) == {"s1": "A", "s2": "B", "s3": "C"}
        assert moves(report) == {
            ("stop", "s2", "A", "rebalanced"),
            ("start", "s2", "B", "rebalanced"),
            ("stop", "s3", "B", "rebalanced"),
            ("start", "s3", "C", "rebalanced"),
        }
        status = json.loads((root / "out" / "status.json").read_text())
        assert [(a["node"], a["resource"]) for a in status["alerts"]] == [("A", "cpu")]
        assert status["alerts"][0]["since"].startswith("2026-11-22T08:01")

    def test_a_disabled_balancing_policy_pins_s3(self, tmp_path: Path) -> None:
        root = make_state(tmp_path / "state", s3_policy="disabled")
        with freeze_time("2026-11-22 08:00:00") as clock:
            report = overload_a(root, clock)
        assert report.computed.mode == "rebalance"
        assert where(report) == {"s1": "A", "s2": "C", "s3": "B"}
        assert moves(report) == {
            ("stop", "s2", "A", "rebalanced"),
            ("start", "s2", "C", "rebalanced"),
        }
        assert not [a for a in report.plan.actions if a.node_id == "B"]

    def test_a_short_spike_triggers_nothing(self, tmp_path: Path) -> None:
        root = make_state(tmp_path / "state")
        with freeze_time("2026-11-22 08:00:00") as clock:
            start_unit(root)
            report_usage(root, "A", {"s1": 500, "s2": 500})
            clock.tick(10)
            reconcile(root)
            clock.tick(40)
            report_usage(root, "A", {"s1": 100, "s2": 100})
            clock.tick(1)
            reconcile(root)
            for _ in range(5):
                clock.tick(60)
                report = reconcile(root)
                assert report.computed.mode == "stable" and not report.plan.changes_present

    def test_a_raised_alert_retriggers_each_min_timeout(self, tmp_path: Path) -> None:
        root = make_state(tmp_path / "state")
        modes = []
        with freeze_time("2026-11-22 08:00:00") as clock:
            start_unit(root)
            report_usage(root, "A", {"s1": 500, "s2": 500})
            for _ in range(19):  # every 10 s for 3 minutes, usage stays at 100 %
                clock.tick(10)
                modes.append(reconcile(root).computed.mode)
        # raised after 60 s (the 7th observation), then again every further 60 s
        assert [i for i, m in enumerate(modes) if m == "rebalance"] == [6, 12, 18]


class TestAcrossRuns:
    def test_a_one_hour_trace_through_reconcile_runs_rebalances_as_counted(
        self, tmp_path: Path
    ) -> None:
        """The hour of test_alerts (27 rebalances counted by hand, rules 70/85 %, 60 s), each
        reading a separate reconcile that knows only the disk, agents applying every plan.
        The first rebalance moves s2 and s3 off A; every later one finds nothing to move (no
        oscillation), and no run undoes a move."""
        rules = "alertRules: {cpu: {minThreshold: 70, maxThreshold: 85, minTimeout: 60s}}"
        root = make_state(tmp_path / "state", rules=rules)
        placements = []
        rebalances = 0
        with freeze_time("2026-11-22 08:00:00") as clock:
            start_unit(root)
            for i, pct in enumerate(hour_trace()):
                if i:
                    clock.tick(10)
                report_usage(root, "A", {"s1": pct * 5, "s2": pct * 5})
                report = reconcile(root)
                rebalances += report.computed.mode == "rebalance"
                placements.append(where(report))
                if report.plan.changes_present:
                    assert report.computed.mode == "rebalance", (i, moves(report))
                    apply_all(root)
        assert rebalances == HOUR_REBALANCES == 27
        changes = [i for i in range(1, len(placements)) if placements[i] != placements[i - 1]]
        assert len(changes) == 1  # the first raise, at 960 s
        assert changes[0] * 10 == 960
        assert placements[-1] == {"s1": "A", "s2": "B", "s3": "C"}


class TestNoFlipFlop:
    def test_an_instance_the_lowered_capacity_cannot_place_keeps_its_node(
        self, tmp_path: Path
    ) -> None:
        """A rebalance lowers A to 75 %; with B, C and D gone nowhere else accepts s1, s2 or
        s3, so the rebalance keeps them all where they run (a stop would be undone by the very
        next run) and the next run, same inputs and time, rewrites nothing."""
        root = make_state(tmp_path / "state")
        for n in ("B", "C", "D"):
            (root / "nodes" / f"{n}.yaml").unlink()
        (root / "desired" / "s3.yaml").unlink()
        with freeze_time("2026-11-22 08:00:00") as clock:
            first = reconcile(root)
            assert where(first) == {"s1": "A", "s2": "A"}
            apply_all(root)
            report_usage(root, "A", {"s1": 500, "s2": 500})
            clock.tick(10)
            reconcile(root)
            clock.tick(60)
            rebalanced = reconcile(root)
            assert rebalanced.computed.mode == "rebalance"
            assert where(rebalanced) == {"s1": "A", "s2": "A"}
            assert not rebalanced.plan.changes_present
            assert not rebalanced.computed.result.failures
            after = reconcile(root)
        assert after.computed.mode == "stable"
        assert after.written == () and not after.checkpoint_written

    def test_the_next_run_keeps_the_rebalanced_reason_until_the_agents_act(
        self, tmp_path: Path
    ) -> None:
        """The plan of a rebalance says "rebalanced"; a reconcile before the agents applied it
        plans the same moves with the same reasons, and rewrites no file."""
        root = make_state(tmp_path / "state")
        with freeze_time("2026-11-22 08:00:00") as clock:
            rebalanced = overload_a(root, clock)
            assert rebalanced.computed.mode == "rebalance"
            clock.tick(1)
            again = reconcile(root)
        assert again.computed.mode == "stable"
        assert moves(again) == moves(rebalanced)
        assert {r for (_, _, _, r) in moves(again)} == {"rebalanced"}
        assert again.written == () and not again.checkpoint_written
        cp = json.loads((root / "checkpoint" / "allocations.json").read_text())
        causes = {a["itemId"]: a.get("cause") for a in cp["data"]["instances"].values()}
        assert causes == {"s1": None, "s2": "rebalanced", "s3": "rebalanced"}
        apply_all(root)
        assert not reconcile(root).plan.changes_present
