"""The node agent (SPEC §15) against a fake runc: no root, no containers.

The fake keeps containers in a dict and records every call, so each test can say exactly what
was started, signalled and deleted, and that a refused (stale) plan touched nothing.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import os
import signal as signals
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.agent.node import (
    AgentError,
    AgentReport,
    agent_state_path,
    agent_watch,
    container_id,
    observed_state,
    run_agent_once,
)
from reconciler.agent.restarts import RESTART_POLICY_ANNOTATION
from reconciler.agent.runc import ContainerState, Runc, RuncError
from reconciler.cli.commands import main
from reconciler.controller.configs import default_config_builder
from reconciler.controller.reconcile import ReconcileOptions, reconcile
from reconciler.io.loader import load_state
from reconciler.io.lock import LockTimeout, StateLock
from reconciler.io.yamlsafe import parse_yaml
from reconciler.model.documents import ActualState
from reconciler.model.values import instance_id
from reconciler.planning.plans import pointer
from tests.support.fake_runc import FakeRunc

NODE = "n1"


# ---------------------------------------------------------------- helpers


def iid(item: str, index: int = 0) -> str:
    return instance_id(item, "default", index)


def cid(instance: str) -> str:
    return container_id(NODE, instance)


A0, A1, B0, B1 = (
    iid("com.example.a"),
    iid("com.example.a", 1),
    iid("com.example.b"),
    iid("com.example.b", 1),
)


def record(
    item: str, index: int = 0, version: str = "1.0.0", state: str = "active"
) -> dict[str, Any]:
    return {
        "itemId": item,
        "subjectId": "default",
        "index": index,
        "version": version,
        "runtimeId": "runc",
        "state": state,
        "devices": {},
    }


RECORDS = {
    A0: record("com.example.a"),
    A1: record("com.example.a", 1),
    B0: record("com.example.b"),
    B1: record("com.example.b", 1),
}


def write_actual(state: Path, revision: int, ids: dict[str, dict[str, Any]]) -> Path:
    (state / "actual").mkdir(exist_ok=True)
    doc = {
        "apiVersion": "reconciler/v1",
        "kind": "ActualState",
        "nodeId": NODE,
        "revision": revision,
        "instances": ids,
    }
    path = state / "actual" / f"{NODE}.yaml"
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return path


def write_patch(
    state: Path,
    revision: int,
    remove: tuple[str, ...] = (),
    add: dict[str, dict[str, Any]] | None = None,
) -> None:
    ops: list[dict[str, Any]] = [{"op": "test", "path": "/revision", "value": revision}]
    ops += [{"op": "remove", "path": pointer("instances", i)} for i in sorted(remove)]
    for i, rec in sorted((add or {}).items()):
        ops.append(
            {"op": "add", "path": pointer("instances", i), "value": rec | {"state": "activating"}}
        )
    (state / "out" / "nodes").mkdir(parents=True, exist_ok=True)
    (state / "out" / "nodes" / f"{NODE}.json").write_text(json.dumps(ops, indent=2) + "\n")


def make_bundle(state: Path, instance: str) -> None:
    d = state / "out" / "instances" / instance
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text("{}\n")


def read_actual(state: Path) -> ActualState:
    raw = (state / "actual" / f"{NODE}.yaml").read_bytes()
    return ActualState.model_validate(parse_yaml(raw).data)


@pytest.fixture
def state(tmp_path: Path) -> Path:
    d = tmp_path / "state"
    d.mkdir()
    return d


def once(state: Path, runc: FakeRunc, **kw: Any) -> AgentReport:
    return run_agent_once(state, NODE, runc, stop_timeout=kw.pop("stop_timeout", 1.0), **kw)


# ---------------------------------------------------------------- applying a plan


def test_a_plan_stops_and_starts_exactly_the_planned_instances(state: Path) -> None:
    runc = FakeRunc()
    runc.add(cid(A0))
    runc.add(cid(A1))
    write_actual(state, 3, {A0: RECORDS[A0], A1: RECORDS[A1]})
    write_patch(state, 3, remove=(A1,), add={B0: RECORDS[B0], B1: RECORDS[B1]})
    make_bundle(state, B0)
    make_bundle(state, B1)

    report = once(state, runc)

    assert not report.stale and report.applied and report.written
    assert report.stopped == (A1,)
    assert report.started == tuple(sorted((B0, B1)))
    assert report.already_running == () and dict(report.failed) == {}
    assert set(runc.containers) == {cid(A0), cid(B0), cid(B1)}
    # stops first (TERM, then delete), then starts; A0 is never touched
    assert runc.actions()[:2] == [("kill", cid(A1), "SIGTERM"), ("delete", cid(A1))]
    assert sorted(runc.actions()[2:]) == sorted([("run", cid(B0)), ("run", cid(B1))])
    bundle = runc.containers[cid(B0)].bundle
    assert bundle == (state / "out" / "instances" / B0).resolve() and bundle.is_absolute()

    actual = read_actual(state)
    assert actual.revision == 4 == report.revision
    assert set(actual.instances) == {A0, B0, B1}
    assert {i: r.state for i, r in actual.instances.items()} == dict.fromkeys(
        (A0, B0, B1), "active"
    )
    assert (
        actual.instances[B0]
        == ActualState.model_validate(
            {
                "apiVersion": "reconciler/v1",
                "kind": "ActualState",
                "nodeId": NODE,
                "instances": {B0: RECORDS[B0]},
            }
        ).instances[B0]
    )


def test_the_written_actual_loads_with_the_controllers_loader(state: Path) -> None:
    runc = FakeRunc()
    write_patch(state, 0, add={A0: RECORDS[A0] | {"devices": {"example.com/gpu": ["g0"]}}})
    make_bundle(state, A0)
    report = once(state, runc)
    assert report.revision == 1 and report.started == (A0,)
    view, diagnostics = load_state(state)
    assert diagnostics == []
    actual = view.actual[NODE]
    assert actual.revision == 1
    assert actual.instances[A0].state == "active"
    assert dict(actual.instances[A0].devices) == {"example.com/gpu": ("g0",)}
    mode = (state / "actual" / f"{NODE}.yaml").stat().st_mode & 0o777
    assert mode == 0o600


def test_a_missing_actual_file_is_revision_zero(state: Path) -> None:
    runc = FakeRunc()
    write_patch(state, 0, add={A0: RECORDS[A0]})
    make_bundle(state, A0)
    assert once(state, runc).revision == 1
    assert read_actual(state).revision == 1


def test_the_revision_wraps_to_one_after_the_largest_a_document_holds(state: Path) -> None:
    """An actual document at revision 2^63-1 (the most the loader accepts): the agent's next
    write is revision 1, which the controller's loader still reads, not 2^63 (refused, so the
    node would keep its last good actual document forever)."""
    top = 2**63 - 1
    runc = FakeRunc()
    write_actual(state, top, {})
    write_patch(state, top, add={A0: RECORDS[A0]})
    make_bundle(state, A0)
    report = once(state, runc)
    assert report.revision == 1 and report.started == (A0,)
    view, diagnostics = load_state(state)
    assert diagnostics == []
    assert view.actual[NODE].revision == 1


def test_a_version_bump_restarts_the_container(state: Path) -> None:
    runc = FakeRunc()
    runc.add(cid(A0))
    pid = runc.containers[cid(A0)].pid
    write_actual(state, 1, {A0: RECORDS[A0]})
    write_patch(state, 1, remove=(A0,), add={A0: record("com.example.a", version="2.0.0")})
    make_bundle(state, A0)
    report = once(state, runc)
    assert report.stopped == (A0,) and report.started == (A0,)
    assert runc.actions() == [
        ("kill", cid(A0), "SIGTERM"),
        ("delete", cid(A0)),
        ("run", cid(A0)),
    ]
    assert runc.containers[cid(A0)].pid != pid
    assert read_actual(state).instances[A0].version == "2.0.0"


def test_sigterm_ignored_escalates_to_sigkill_after_the_timeout(state: Path) -> None:
    runc = FakeRunc()
    runc.ignore_term = True
    runc.add(cid(A0))
    runc.add(cid(A1))
    write_actual(state, 1, {A0: RECORDS[A0], A1: RECORDS[A1]})
    write_patch(state, 1, remove=(A0, A1))
    t0 = time.monotonic()
    report = once(state, runc, stop_timeout=0.3)
    elapsed = time.monotonic() - t0
    assert report.stopped == tuple(sorted((A0, A1)))
    assert runc.containers == {}
    kills = [c for c in runc.calls if c[0] == "kill"]
    # both signalled, then waited for together (one timeout, not one each), then killed
    a, b = sorted((cid(A0), cid(A1)))
    assert kills == [
        ("kill", a, "SIGTERM"),
        ("kill", b, "SIGTERM"),
        ("kill", a, "SIGKILL"),
        ("kill", b, "SIGKILL"),
    ]
    assert elapsed >= 0.3  # the timeout was given before SIGKILL (no upper bound: CPU varies)
    assert read_actual(state).instances == {}


def test_stopping_a_container_that_is_already_gone_is_fine(state: Path) -> None:
    runc = FakeRunc()
    runc.add(cid(A1), status="stopped")
    write_actual(state, 2, {A0: RECORDS[A0], A1: RECORDS[A1]})
    write_patch(state, 2, remove=(A0, A1))
    report = once(state, runc)
    assert report.stopped == tuple(sorted((A0, A1))) and dict(report.failed) == {}
    assert ("kill", cid(A1), "SIGTERM") not in runc.calls  # not running: only deleted
    assert ("delete", cid(A1)) in runc.calls
    assert runc.containers == {}
    assert read_actual(state).revision == 3


# ---------------------------------------------------------------- stale plans


def test_a_stale_patch_is_refused_and_nothing_is_started_or_stopped(state: Path) -> None:
    runc = FakeRunc()
    runc.add(cid(A0))
    actual_path = write_actual(state, 5, {A0: RECORDS[A0]})
    before = actual_path.read_bytes()
    write_patch(state, 4, remove=(A0,), add={B0: RECORDS[B0]})  # planned from revision 4
    make_bundle(state, B0)

    report = once(state, runc)

    assert report.stale and not report.applied and not report.written
    assert "stale plan refused" in report.message and "revision 4" in report.message
    assert "revision 5" in report.message
    assert report.started == report.stopped == () and report.revision == 5
    assert runc.actions() == []
    assert set(runc.containers) == {cid(A0)}
    assert actual_path.read_bytes() == before


def test_a_patch_whose_operation_fails_is_refused_whole(state: Path) -> None:
    runc = FakeRunc()
    runc.add(cid(A0))
    actual_path = write_actual(state, 1, {A0: RECORDS[A0]})
    before = actual_path.read_bytes()
    # the revision matches, but A1 is not in the document: someone else changed it
    write_patch(state, 1, remove=(A0, A1), add={B0: RECORDS[B0]})
    make_bundle(state, B0)
    report = once(state, runc)
    assert report.stale and report.started == report.stopped == ()
    assert runc.actions() == [] and actual_path.read_bytes() == before


# ---------------------------------------------------------------- idempotency


def test_a_running_instance_is_never_started_twice(state: Path) -> None:
    runc = FakeRunc()
    actual_path = write_actual(state, 0, {})
    before = actual_path.read_bytes()
    write_patch(state, 0, add={A0: RECORDS[A0]})
    make_bundle(state, A0)
    assert once(state, runc).started == (A0,)

    # the same plan again: its revision test fails (the agent bumped the revision), but the
    # document already holds what it plans: nothing to apply, not stale, nothing written
    again = once(state, runc)
    assert not again.stale and not again.applied and not again.written
    assert again.started == () and "already applied" in again.message
    assert again.revision == 1

    # an agent that crashed after starting but before writing actual re-applies the plan
    actual_path.write_bytes(before)
    retry = once(state, runc)
    assert retry.already_running == (A0,) and retry.started == ()
    assert [c for c in runc.calls if c[0] == "run"] == [("run", cid(A0))]
    assert read_actual(state).instances[A0].state == "active"

    # the controller's next plan only tests the new revision: nothing to do, nothing written
    rev = read_actual(state).revision
    write_patch(state, rev)
    idle = once(state, runc)
    assert idle.applied and not idle.written and idle.revision == rev
    assert idle.started == idle.stopped == ()
    assert read_actual(state).revision == rev


def test_a_stopped_container_of_an_added_instance_is_deleted_and_started_again(
    state: Path,
) -> None:
    runc = FakeRunc()
    runc.add(cid(A0), status="stopped")
    write_patch(state, 0, add={A0: RECORDS[A0]})
    make_bundle(state, A0)
    report = once(state, runc)
    assert report.started == (A0,)
    assert runc.actions() == [("delete", cid(A0)), ("run", cid(A0))]
    assert runc.containers[cid(A0)].status == "running"


# ---------------------------------------------------------------- observed states


class Clock:
    """The agent's injected clock (seconds since the epoch)."""

    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make_bundle_with_policy(state: Path, instance: str, policy: str) -> None:
    make_bundle(state, instance)
    config = {"annotations": {RESTART_POLICY_ANNOTATION: policy}}
    (state / "out" / "instances" / instance / "config.json").write_text(json.dumps(config))


def test_a_container_that_dies_is_restarted_with_back_off(state: Path) -> None:
    runc, clock = FakeRunc(), Clock()
    write_patch(state, 0, add={A0: RECORDS[A0], A1: RECORDS[A1]})
    make_bundle(state, A0)
    make_bundle(state, A1)
    assert once(state, runc, now=clock).revision == 1
    write_patch(state, 1)  # the controller's next plan: nothing to change

    # it died: the first restart comes at once
    runc.containers[cid(A0)].status = "stopped"
    clock.t += 5
    report = once(state, runc, now=clock)
    assert report.restarted == (A0,) and report.states == {A0: "active", A1: "active"}
    assert report.written and report.start_failed == () and dict(report.failed) == {}
    assert runc.actions()[-2:] == [("delete", cid(A0)), ("run", cid(A0))]
    rec = read_actual(state).instances[A0]
    assert rec.state == "active" and rec.restartCount == 1 and rec.reason is None
    assert rec.lastExit is not None and rec.lastExit.reason == "the container is stopped"
    assert rec.lastExit.at.timestamp() == clock.t and rec.lastExit.code is None
    assert read_actual(state).instances[A1].restartCount == 0

    # dead again at once: not before its back-off (10 s from when it was found down)
    runc.containers[cid(A0)].status = "stopped"
    clock.t += 1
    found = clock.t
    waiting = once(state, runc, now=clock)
    assert waiting.restarted == () and waiting.states[A0] == "failed"
    assert waiting.next_restart == found + 10 and waiting.start_failed == ()
    assert "back-off 10s" in waiting.failed[A0]
    rec = read_actual(state).instances[A0]
    assert rec.restartCount == 1 and rec.reason == waiting.failed[A0]
    clock.t = found + 9.9
    assert once(state, runc, now=clock).restarted == ()
    assert not once(state, runc, now=clock).written  # waiting is no change: no new revision
    clock.t = found + 10
    assert once(state, runc, now=clock).restarted == (A0,)
    rec = read_actual(state).instances[A0]
    assert rec.restartCount == 2 and rec.state == "active" and rec.lastExit is not None
    assert rec.lastExit.at.timestamp() == found  # when it was found down

    # the back-off doubles: 20 s now
    runc.containers[cid(A0)].status = "stopped"
    found = clock.t = clock.t + 1
    assert once(state, runc, now=clock).next_restart == found + 20

    # a reboot: every container gone; all back after one run (A1's first restart is at once;
    # A0 waits out its back-off, then comes back too)
    runc.containers.clear()
    clock.t = found + 20
    report = once(state, runc, now=clock)
    assert report.restarted == tuple(sorted((A0, A1)))
    assert set(runc.containers) == {cid(A0), cid(A1)}
    last = read_actual(state).instances[A1].lastExit
    assert last is not None and last.reason == "container missing"


def test_the_back_off_resets_after_ten_minutes_of_running(state: Path) -> None:
    runc, clock = FakeRunc(), Clock()
    write_patch(state, 0, add={A0: RECORDS[A0]})
    make_bundle(state, A0)
    once(state, runc, now=clock)
    write_patch(state, 1)
    for _ in range(3):  # restarts 1 (at once), 2 (after 10 s), 3 (after 20 s)
        runc.containers[cid(A0)].status = "stopped"
        once(state, runc, now=clock)
        clock.t += 20
        once(state, runc, now=clock)
    assert read_actual(state).instances[A0].restartCount == 3
    clock.t += 600  # it has run 10 min since its last start
    once(state, runc, now=clock)
    runc.containers[cid(A0)].status = "stopped"
    assert once(state, runc, now=clock).restarted == (A0,)  # at once again
    assert read_actual(state).instances[A0].restartCount == 4


def test_restart_policy_never_leaves_it_failed(state: Path) -> None:
    runc, clock = FakeRunc(), Clock()
    write_patch(state, 0, add={A0: RECORDS[A0], B0: RECORDS[B0]})
    make_bundle_with_policy(state, A0, "never")
    make_bundle_with_policy(state, B0, "on-failure")
    once(state, runc, now=clock)
    write_patch(state, 1)
    runc.containers[cid(A0)].status = "stopped"
    del runc.containers[cid(B0)]  # missing: on-failure restarts it
    clock.t += 3600
    report = once(state, runc, now=clock)
    assert report.restarted == (B0,)
    assert report.states[A0] == "failed" and "restartPolicy is never" in report.failed[A0]
    assert report.next_restart is None
    assert runc.containers[cid(A0)].status == "stopped"
    rec = read_actual(state).instances[A0]
    assert rec.restartCount == 0 and rec.state == "failed" and rec.lastExit is not None


def test_a_failed_start_heals_on_a_later_attempt(state: Path) -> None:
    runc, clock = FakeRunc(), Clock()
    write_patch(state, 0, add={A0: RECORDS[A0]})
    make_bundle(state, A0)
    runc.fail_start.add(cid(A0))  # e.g. its rootfs is missing
    first = once(state, runc, now=clock)
    assert first.start_failed == (A0,) and "unable to start" in first.failed[A0]
    assert read_actual(state).instances[A0].reason == first.failed[A0]
    write_patch(state, 1)
    retry = once(state, runc, now=clock)  # the first restart: at once, and it fails again
    assert retry.start_failed == (A0,) and retry.next_restart == clock.t + 10
    runc.fail_start.clear()  # the cause is fixed
    clock.t += 10
    healed = once(state, runc, now=clock)
    assert healed.restarted == (A0,) and healed.states == {A0: "active"}
    rec = read_actual(state).instances[A0]
    assert rec.reason is None and rec.restartCount == 2


def test_the_agent_state_lives_outside_the_inputs_and_a_broken_one_is_ignored(
    state: Path,
) -> None:
    runc, clock = FakeRunc(), Clock()
    write_patch(state, 0, add={A0: RECORDS[A0]})
    make_bundle(state, A0)
    once(state, runc, now=clock)
    memory = agent_state_path(state.resolve(), NODE)
    assert memory == state.resolve() / f".agent-{NODE}.json"
    assert json.loads(memory.read_text())["instances"][A0]["startedAt"] == clock.t
    view, diagnostics = load_state(state)
    assert diagnostics == [] and set(view.actual) == {NODE}
    memory.write_text("{not json")
    write_patch(state, 1)
    runc.containers[cid(A0)].status = "stopped"
    assert once(state, runc, now=clock).restarted == (A0,)  # forgotten: restarted at once
    assert json.loads(memory.read_text())["instances"][A0]["streak"] == 1


def test_without_a_patch_the_states_are_still_refreshed(state: Path) -> None:
    runc = FakeRunc()
    runc.add(cid(A0))
    runc.add(cid(A1), status="created")
    write_actual(state, 7, {A0: RECORDS[A0] | {"state": "activating"}, A1: RECORDS[A1]})
    report = once(state, runc)
    assert not report.applied and not report.stale and report.written
    assert report.states == {A0: "active", A1: "activating"}
    assert read_actual(state).revision == 8
    assert runc.actions() == []
    # unchanged states: no write
    assert not once(state, runc).written
    assert read_actual(state).revision == 8


def declare_node(state: Path) -> None:
    (state / "nodes").mkdir(exist_ok=True)
    (state / "nodes" / f"{NODE}.yaml").write_text(
        f"apiVersion: reconciler/v1\nkind: Node\nid: {NODE}\ntype: edge\n"
    )


def test_without_a_patch_or_actual_nothing_is_written(state: Path) -> None:
    declare_node(state)
    report = once(state, FakeRunc())
    assert report.revision == 0 and not report.written and not report.applied
    assert not (state / "actual").exists()


def test_a_node_the_unit_does_not_know_is_an_error(state: Path) -> None:
    runc = FakeRunc()
    with pytest.raises(AgentError, match="'n1' is not a node of this unit"):
        once(state, runc)
    assert runc.calls == [] and not (state / "actual").exists()


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ("running", "active"),
        ("created", "activating"),
        ("paused", "inactive"),
        ("stopped", "failed"),
        (None, "failed"),
    ],
)
def test_state_mapping(status: str | None, expected: str) -> None:
    st = None if status is None else ContainerState("x", status, 1)
    assert observed_state(st)[0] == expected


# ---------------------------------------------------------------- failures of one instance


def test_a_missing_config_fails_that_instance_only(state: Path) -> None:
    runc = FakeRunc()
    write_patch(state, 0, add={A0: RECORDS[A0], A1: RECORDS[A1], B0: RECORDS[B0]})
    make_bundle(state, A0)
    make_bundle(state, B0)
    (state / "out" / "instances" / A1).mkdir(parents=True)  # a directory, but no config
    runc.fail_start.add(cid(B0))
    report = once(state, runc)
    assert report.started == (A0,)
    assert "config.json" in report.failed[A1]
    assert "unable to start container process" in report.failed[B0]
    assert [c for c in runc.calls if c[0] == "run"] == [("run", cid(A0)), ("run", cid(B0))]
    actual = read_actual(state)
    assert {i: r.state for i, r in actual.instances.items()} == {
        A0: "active",
        A1: "failed",
        B0: "failed",
    }


def test_bundles_are_not_followed_through_symlinks(state: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / A0).mkdir(parents=True)
    (elsewhere / A0 / "config.json").write_text("{}")
    (state / "out").mkdir()
    (state / "out" / "instances").symlink_to(elsewhere)
    write_patch(state, 0, add={A0: RECORDS[A0]})
    runc = FakeRunc()
    report = once(state, runc)
    assert "symlink" in report.failed[A0] and report.started == ()
    assert runc.actions() == []


def test_report_json_and_summary(state: Path) -> None:
    runc = FakeRunc()
    write_patch(state, 0, add={A0: RECORDS[A0], A1: RECORDS[A1]})
    make_bundle(state, A0)
    report = once(state, runc)
    doc = report.to_json()
    assert doc["started"] == [A0] and doc["failed"] == {A1: report.failed[A1]}
    assert doc["states"] == {A0: "active", A1: "failed"} and doc["revision"] == 1
    assert report.summary() == (
        "n1: 1 started, 0 stopped, 0 already running, 1 failed; actual revision 1 written"
    )


def test_container_logs_go_to_the_log_dir(state: Path, tmp_path: Path) -> None:
    runc = FakeRunc()
    write_patch(state, 0, add={A0: RECORDS[A0]})
    make_bundle(state, A0)
    logs = tmp_path / "logs"
    once(state, runc, log_dir=logs)
    assert (logs / f"{A0}.log").read_text() == "started\n"


def test_orphan_containers_of_this_node_are_stopped(state: Path) -> None:
    runc = FakeRunc()
    runc.add(cid(A0))
    runc.add(cid(B1))  # an orphan: started by an interrupted run, no longer planned
    runc.add(container_id("n2", B0))  # another node's container in a shared root
    runc.add("unrelated")
    write_actual(state, 1, {A0: RECORDS[A0]})
    write_patch(state, 1)
    report = once(state, runc)
    assert report.orphans_stopped == (B1,) and report.stopped == ()
    assert set(runc.containers) == {cid(A0), container_id("n2", B0), "unrelated"}
    assert not report.written  # the document did not change

    runc.add(cid(B1))
    assert once(state, runc, reap_orphans=False).orphans_stopped == ()
    assert cid(B1) in runc.containers


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize("node", ["../n1", "n1/x", "-n1", ""])
def test_an_invalid_node_id_is_refused_before_any_work(state: Path, node: str) -> None:
    runc = FakeRunc()
    with pytest.raises(AgentError, match="invalid node id"):
        run_agent_once(state, node, runc)
    assert runc.calls == [] and not (state / ".lock").exists()


@pytest.mark.parametrize(
    "ops",
    [
        [{"op": "remove", "path": "/instances/x"}],  # no revision test
        [{"op": "test", "path": "/revision", "value": 0}, {"op": "replace", "path": "/nodeId"}],
        [
            {"op": "test", "path": "/revision", "value": 0},
            {"op": "add", "path": "/instances/..~1..~1etc", "value": {}},
        ],
        [{"op": "test", "path": "/revision", "value": 0}, {"op": "remove", "path": "/revision"}],
        {"op": "test"},
    ],
)
def test_a_malformed_patch_is_an_error_and_touches_nothing(state: Path, ops: Any) -> None:
    runc = FakeRunc()
    runc.add(cid(A0))
    write_actual(state, 0, {A0: RECORDS[A0]})
    (state / "out" / "nodes").mkdir(parents=True)
    (state / "out" / "nodes" / f"{NODE}.json").write_text(json.dumps(ops))
    with pytest.raises(AgentError):
        once(state, runc)
    assert runc.actions() == []


def test_an_invalid_actual_file_is_an_error_with_its_position(state: Path) -> None:
    (state / "actual").mkdir()
    (state / "actual" / f"{NODE}.yaml").write_text(
        "apiVersion: reconciler/v1\nkind: ActualState\nnodeId: n1\nrevision: -1\n"
    )
    with pytest.raises(AgentError, match=r"n1\.yaml:4:\d+: revision"):
        once(state, FakeRunc())


def test_the_agent_holds_the_controllers_lock(state: Path) -> None:
    with StateLock(state), pytest.raises(LockTimeout):
        run_agent_once(state, NODE, FakeRunc(), lock_timeout=0.1)


# ---------------------------------------------------------------- with the controller


def test_the_loop_closes_with_the_controller(demo_copy: Path) -> None:
    """reconcile, every node's agent, reconcile: nothing left to plan; agents idle."""
    opts = ReconcileOptions(configs=default_config_builder())
    first = reconcile(demo_copy, opts)
    assert first.plan.changes_present
    nodes = sorted(first.plan.patches)
    runtimes = {n: FakeRunc() for n in nodes}
    # what the demo's actual files say runs is really running
    for n in nodes:
        actual = first.computed.view.actual.get(n)
        for i in actual.instances if actual else ():
            runtimes[n].add(container_id(n, i))
    reports = {n: run_agent_once(demo_copy, n, runtimes[n], stop_timeout=0.5) for n in nodes}
    starts = {(a.node_id, a.instance_id) for a in first.plan.starts()}
    stops = {(a.node_id, a.instance_id) for a in first.plan.stops()}
    assert {(n, i) for n, r in reports.items() for i in r.started} == starts
    assert {(n, i) for n, r in reports.items() for i in r.stopped} == stops
    assert all(not r.failed for r in reports.values()), reports

    second = reconcile(demo_copy, opts)
    assert not second.plan.changes_present
    idle = [run_agent_once(demo_copy, n, runtimes[n]) for n in nodes]
    assert not any(r.written or r.started or r.stopped or r.stale for r in idle)
    third = reconcile(demo_copy, opts)
    assert not third.plan.changes_present and third.written == ()
    for n in nodes:
        running = {s.id for s in runtimes[n].list() if s.status == "running"}
        placed = {p.instance_id for p in third.computed.result.placements if p.node_id == n}
        assert running == {container_id(n, i) for i in placed}

    # a container dies and its restart fails: observed, never planned; status shows it
    p = third.computed.result.placements[0]
    runc = runtimes[p.node_id]
    runc.containers[container_id(p.node_id, p.instance_id)].status = "stopped"
    runc.fail_start.add(container_id(p.node_id, p.instance_id))
    report = run_agent_once(demo_copy, p.node_id, runc)
    assert report.start_failed == (p.instance_id,) and report.written
    fourth = reconcile(demo_copy, opts)
    assert not fourth.plan.changes_present
    status = json.loads((demo_copy / "out" / "status.json").read_text())
    shown = status["instances"][p.instance_id]
    assert shown["state"] == "failed" and shown["restartCount"] == 1
    assert shown["reason"] == report.failed[p.instance_id]
    assert shown["lastExit"]["reason"] == "the container is stopped"
    others = [v for k, v in status["instances"].items() if k != p.instance_id]
    assert not any("restartCount" in v or "reason" in v for v in others)
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert main(["status", "--state", str(demo_copy)]) == 0
    text = " ".join(out.getvalue().split())
    assert "Failed instances" in text and "unable to start container process" in text
    assert f"on {p.node_id}: unable to start" in text


# ---------------------------------------------------------------- watch


@pytest.fixture
def watching(state: Path) -> Iterator[tuple[FakeRunc, list[AgentReport | None], threading.Event]]:
    runc = FakeRunc()
    runs: list[AgentReport | None] = []
    stop = threading.Event()
    thread = threading.Thread(
        target=agent_watch,
        args=(state, NODE, runc, stop),
        kwargs={"resync": 0.5, "debounce": 0.05, "on_run": runs.append, "stop_timeout": 0.2},
    )
    thread.start()
    try:
        yield runc, runs, stop
    finally:
        stop.set()
        thread.join(timeout=10)
        assert not thread.is_alive(), "agent_watch did not return on stop"


def _wait_for(cond: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_watch_applies_a_new_plan_and_resyncs(
    state: Path, watching: tuple[FakeRunc, list[AgentReport | None], threading.Event]
) -> None:
    runc, runs, stop = watching
    _wait_for(lambda: len(runs) >= 1)  # the first run, before any plan exists
    assert runs[0] is None  # a node nobody declared: logged, and the watch goes on
    declare_node(state)
    make_bundle(state, A0)
    write_patch(state, 0, add={A0: RECORDS[A0]})  # creates out/nodes: picked up
    _wait_for(lambda: cid(A0) in runc.containers)
    # the agent publishes its actual document after starting the container: wait for that run
    _wait_for(lambda: (state / "actual" / f"{NODE}.yaml").exists())
    assert read_actual(state).revision == 1
    runc.containers[cid(A0)].status = "stopped"
    write_patch(state, 1)  # a new plan (a file replaced in the watched directory)
    _wait_for(lambda: read_actual(state).instances[A0].restartCount == 1)  # restarted
    assert runc.containers[cid(A0)].status == "running"
    n = len(runs)
    _wait_for(lambda: len(runs) > n + 1)  # periodic resyncs keep running
    assert all(r is not None for r in runs[n:])
    t0 = time.monotonic()
    stop.set()
    assert time.monotonic() - t0 < 2


# ---------------------------------------------------------------- the runc wrapper

FAKE_RUNC = r"""
import json, os, sys, time
args = sys.argv[1:]
with open(os.environ["FAKE_RUNC_CALLS"], "a") as f:
    f.write(json.dumps({"args": args, "stdin_is_devnull": os.path.samestat(
        os.fstat(0), os.stat(os.devnull))}) + "\n")
log = None
i = 0
while args[i].startswith("--"):
    if args[i] == "--log":
        log = args[i + 1]
    i += 2
cmd, rest = args[i], args[i + 1:]
if cmd == "list":
    print(os.environ.get("FAKE_LIST", "null"))
elif cmd == "state":
    if rest[0] == "slow":
        time.sleep(5)
    if rest[0] == "missing":
        sys.stderr.write('time="x" level=error msg="container does not exist"\n')
        sys.exit(1)
    if rest[0] == "broken":
        sys.stderr.write('time="x" level=error msg="open state.json: permission denied"\n')
        sys.exit(1)
    print(json.dumps({"id": rest[0], "pid": 42, "status": "running", "bundle": "/b",
                      "created": "t", "owner": ""}))
elif cmd == "run":
    print("output of the container")
    if rest[-1] == "bad":
        with open(log, "a") as f:
            f.write(json.dumps({"level": "warning", "msg": "a warning"}) + "\n")
            f.write(json.dumps({"level": "error", "msg": "runc run failed: exec: no such file"})
                    + "\n")
        sys.stderr.write("runc run failed: exec: no such file\n")
        sys.exit(1)
    if os.fork() == 0:  # the container: keeps runc's stdout and stderr open
        with open(os.environ["FAKE_RUNC_CHILD"], "w") as f:
            f.write(str(os.getpid()))
        time.sleep(60)
        os._exit(0)
elif cmd == "kill":
    if rest[0] == "gone":
        sys.stderr.write('time="x" level=error msg="container not running"\n')
        sys.exit(1)
"""


@pytest.fixture
def fake_runc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    binary = tmp_path / "fake-runc"
    binary.write_text(f"#!{sys.executable}\n{FAKE_RUNC}")
    binary.chmod(0o755)
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_RUNC_CALLS", str(calls))
    monkeypatch.setenv("FAKE_RUNC_CHILD", str(tmp_path / "child.pid"))
    return binary, calls


def _calls(path: Path) -> builtins.list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_runc_wrapper_passes_its_root_and_parses_state_and_list(
    fake_runc: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary, calls = fake_runc
    runc = Runc(str(binary), root=tmp_path / "root")
    assert runc.list() == []  # runc prints null for no containers
    st = runc.state("n1.x")
    assert st == ContainerState("n1.x", "running", 42, "/b", "t")
    assert runc.state("missing") is None
    with pytest.raises(RuncError, match=r"open state\.json: permission denied") as err:
        runc.state("broken")
    assert err.value.command[-2:] == ("state", "broken")
    monkeypatch.setenv("FAKE_LIST", json.dumps([{"id": "b", "status": "stopped"}, {"id": "a"}]))
    assert [(s.id, s.status) for s in runc.list()] == [("a", "unknown"), ("b", "stopped")]
    runc.kill("n1.x", signals.SIGKILL)
    runc.kill("n1.x", "TERM")
    runc.delete("n1.x", force=True)
    with pytest.raises(RuncError, match="container not running"):
        runc.kill("gone")
    args = [c["args"] for c in _calls(calls)]
    assert all(a[:2] == ["--root", str(tmp_path / "root")] for a in args)
    assert args[-4:-1] == [
        ["--root", str(tmp_path / "root"), "kill", "n1.x", "9"],
        ["--root", str(tmp_path / "root"), "kill", "n1.x", "TERM"],
        ["--root", str(tmp_path / "root"), "delete", "--force", "n1.x"],
    ]
    assert all(c["stdin_is_devnull"] for c in _calls(calls))


@pytest.mark.parametrize("bad", ["-rf", "--root=/x", "a/b", "..", "", "a b"])
def test_runc_wrapper_refuses_ids_that_are_not_container_ids(
    fake_runc: tuple[Path, Path], bad: str
) -> None:
    runc = Runc(str(fake_runc[0]))
    with pytest.raises(ValueError):
        runc.state(bad)
    with pytest.raises(ValueError):
        runc.kill("ok", "TERM; rm")
    assert not fake_runc[1].exists()  # runc was never run


def test_run_detached_does_not_wait_for_the_container_and_reports_runc_errors(
    fake_runc: tuple[Path, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    binary, calls = fake_runc
    runc = Runc(str(binary))
    log = tmp_path / "c.log"
    t0 = time.monotonic()
    runc.run_detached("n1.x", tmp_path / "bundle", log)
    # the "container" keeps the fds for 60 s (killed below): a pipe would have made us wait
    assert time.monotonic() - t0 < 30
    child = int((tmp_path / "child.pid").read_text())
    with contextlib.suppress(ProcessLookupError):
        os.kill(child, signals.SIGKILL)
    assert log.read_text() == "output of the container\n"
    [call] = _calls(calls)
    assert call["stdin_is_devnull"]
    assert call["args"][0] == "--log" and call["args"][2:4] == ["--log-format", "json"]
    assert call["args"][4:] == ["run", "--detach", "--bundle", str(tmp_path / "bundle"), "n1.x"]

    with pytest.raises(RuncError, match="runc run failed: exec: no such file") as err:
        runc.run_detached("bad", tmp_path / "bundle")  # stdio to /dev/null
    assert err.value.returncode == 1
    assert "a warning" in caplog.text
    assert not Path(_calls(calls)[-1]["args"][1]).exists()  # runc's own log is removed


def test_runc_wrapper_times_out(fake_runc: tuple[Path, Path]) -> None:
    runc = Runc(str(fake_runc[0]), timeout=0.3)
    with pytest.raises(RuncError, match=r"no answer within 0\.3s"):
        runc.state("slow")
    with pytest.raises(RuncError, match="cannot run"):
        Runc("/nonexistent/runc").list()


# ---------------------------------------------------------------- the `reconciler agent` command

STATEFUL_RUNC = r"""
import json, os, sys
args = sys.argv[1:]
root = None
i = 0
while args[i].startswith("--"):  # global flags: --root R, --log L, --log-format json
    if args[i] == "--root":
        root = args[i + 1]
    i += 2
cmd, rest = args[i], args[i + 1:]
with open(os.environ["FAKE_RUNC_CALLS"], "a") as f:
    f.write(json.dumps([root, cmd, *rest]) + "\n")
db_path = os.path.join(root, "containers.json")
try:
    with open(db_path) as f:
        db = json.load(f)
except FileNotFoundError:
    db = {}

def save():
    os.makedirs(root, exist_ok=True)
    with open(db_path, "w") as f:
        json.dump(db, f)

def fail(msg):
    sys.stderr.write(f'time="x" level=error msg="{msg}"\n')
    sys.exit(1)

def state(cid):
    c = db[cid]
    return {"id": cid, "pid": c["pid"], "status": c["status"], "bundle": c["bundle"],
            "created": "t", "owner": ""}

if cmd == "state":
    if rest[0] not in db:
        fail("container does not exist")
    print(json.dumps(state(rest[0])))
elif cmd == "list":
    print(json.dumps([state(c) for c in sorted(db)] or None))
elif cmd == "run":
    cid, bundle = rest[-1], rest[rest.index("--bundle") + 1]
    if cid in db:
        fail("container with id exists")
    if not os.path.isfile(os.path.join(bundle, "config.json")):
        fail("config.json: no such file or directory")
    db[cid] = {"pid": 1000 + len(db), "status": "running", "bundle": bundle}
    save()
elif cmd == "kill":
    if rest[0] not in db:
        fail("container does not exist")
    if db[rest[0]]["status"] != "running":
        fail("container not running")
    db[rest[0]]["status"] = "stopped"
    save()
elif cmd == "delete":
    if rest[-1] not in db:
        if "--force" in rest:
            sys.exit(0)
        fail("container does not exist")
    del db[rest[-1]]
    save()
"""


@pytest.fixture
def runc_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stateful fake `runc` first on PATH (what the command runs); returns its calls file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    binary = bin_dir / "runc"
    binary.write_text(f"#!{sys.executable}\n{STATEFUL_RUNC}")
    binary.chmod(0o755)
    calls = tmp_path / "runc-calls.jsonl"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setenv("FAKE_RUNC_CALLS", str(calls))
    return calls


def _runc_calls(path: Path) -> builtins.list[builtins.list[str]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_cli_agent_applies_once_and_refuses_a_stale_plan(
    state: Path, tmp_path: Path, runc_on_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "runc-root"
    write_patch(state, 0, add={A0: RECORDS[A0], A1: RECORDS[A1]})
    make_bundle(state, A0)
    make_bundle(state, A1)
    base = ["agent", "--node", NODE, "--state", str(state), "--runc-root", str(root)]

    assert main([*base, "--once", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["started"] == sorted([A0, A1]) and doc["revision"] == 1 and not doc["stale"]
    assert doc["states"] == {A0: "active", A1: "active"}
    runs = [c for c in _runc_calls(runc_on_path) if c[1] == "run"]
    assert sorted(c[-1] for c in runs) == sorted([cid(A0), cid(A1)])
    assert all(c[0] == str(root) for c in _runc_calls(runc_on_path))  # its own --root
    assert read_actual(state).revision == 1

    # a plan computed from revision 0 again: stale, exit 4, nothing started or stopped
    write_patch(state, 0, remove=(A0,), add={B0: RECORDS[B0]})
    make_bundle(state, B0)
    before = (state / "actual" / f"{NODE}.yaml").read_bytes()
    seen = len(_runc_calls(runc_on_path))
    assert main(base) == 4  # --once is the default
    out = capsys.readouterr().out
    assert "stale plan refused" in out and "revision 0" in out and "revision 1" in out
    assert [c[1] for c in _runc_calls(runc_on_path)[seen:] if c[1] in ("run", "kill")] == []
    assert not any(c[1] == "delete" for c in _runc_calls(runc_on_path)[seen:])
    assert (state / "actual" / f"{NODE}.yaml").read_bytes() == before

    # the controller's plan from revision 1: A0 stopped (kill, then delete), B0 started
    write_patch(state, 1, remove=(A0,), add={B0: RECORDS[B0]})
    seen = len(_runc_calls(runc_on_path))
    assert main([*base, "--stop-timeout", "1s"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("n1: 1 started, 1 stopped, 0 already running, 0 failed")
    acts = [c[1:] for c in _runc_calls(runc_on_path)[seen:] if c[1] in ("run", "kill", "delete")]
    assert acts[:2] == [["kill", cid(A0), "15"], ["delete", "--force", cid(A0)]]
    assert acts[2][0] == "run" and acts[2][-1] == cid(B0) and len(acts) == 3
    assert set(read_actual(state).instances) == {A1, B0}


def test_cli_agent_watch_applies_new_plans_until_sigterm(
    state: Path, tmp_path: Path, runc_on_path: Path
) -> None:
    root = tmp_path / "runc-root"
    make_bundle(state, A0)
    write_patch(state, 0, add={A0: RECORDS[A0]})
    cmd = [sys.executable, "-m", "reconciler", "agent", "--node", NODE, "--state", str(state)]
    proc = subprocess.Popen(
        [*cmd, "--runc-root", str(root), "--watch"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        actual = state / "actual" / f"{NODE}.yaml"
        _wait_for(lambda: actual.exists() and read_actual(state).revision == 1, timeout=60)
        assert set(read_actual(state).instances) == {A0}
        write_patch(state, 1, remove=(A0,))  # a new plan, picked up by the watch
        _wait_for(lambda: read_actual(state).revision == 2, timeout=60)
        assert read_actual(state).instances == {}
        proc.send_signal(signals.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    acts = [c[1:] for c in _runc_calls(runc_on_path) if c[1] in ("run", "kill", "delete")]
    assert acts[-2:] == [["kill", cid(A0), "15"], ["delete", "--force", cid(A0)]]


def test_cli_agent_exit_codes_for_unknown_nodes_failed_starts_and_a_second_run(
    state: Path, tmp_path: Path, runc_on_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["agent", "--state", str(state), "--runc-root", str(tmp_path / "runc-root")]
    assert main([*base, "--node", "edge-9"]) == 1
    assert "'edge-9' is not a node of this unit" in capsys.readouterr().err

    write_patch(state, 0, add={A0: RECORDS[A0], A1: RECORDS[A1]})
    make_bundle(state, A0)
    (state / "out" / "instances" / A1).mkdir(parents=True)  # no config.json: its start fails
    assert main([*base, "--node", NODE]) == 1
    out = capsys.readouterr().out
    assert f"failed {A1}: no OCI config" in out and "1 started" in out

    (state / "out" / "instances" / A1).rmdir()
    make_bundle(state, A1)  # fixed: the first restart comes at once
    assert main([*base, "--node", NODE, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["restarted"] == [A1] and doc["startFailed"] == [] and not doc["stale"]
    assert read_actual(state).instances[A1].restartCount == 1

    # the same again (the plan still tests revision 0): nothing to apply, exit 0
    assert main([*base, "--node", NODE]) == 0
    assert "0 started" in capsys.readouterr().out


def _watch_one_instance(
    state: Path, runc: FakeRunc, runs: list[AgentReport | None], stop: threading.Event, **kw: Any
) -> threading.Thread:
    """A started ``agent_watch`` thread (no resync for an hour) on a plan that starts A0."""
    declare_node(state)
    make_bundle(state, A0)
    write_patch(state, 0, add={A0: RECORDS[A0]})
    thread = threading.Thread(
        target=agent_watch,
        args=(state, NODE, runc, stop),
        kwargs={"resync": 3600, "debounce": 0.05, "on_run": runs.append, **kw},
    )
    thread.start()
    return thread


def test_watch_runs_again_when_a_back_off_ends(state: Path) -> None:
    runc, clock = FakeRunc(), Clock()
    runs: list[AgentReport | None] = []
    stop = threading.Event()
    thread = _watch_one_instance(state, runc, runs, stop, now=clock)
    try:
        _wait_for(lambda: (state / "actual" / f"{NODE}.yaml").exists())
        runc.containers[cid(A0)].status = "stopped"
        write_patch(state, 1)  # wakes the watch: the first restart, at once
        _wait_for(lambda: read_actual(state).instances[A0].restartCount == 1)
        runc.containers[cid(A0)].status = "stopped"
        write_patch(state, 2)  # wakes it again: now it waits out 10 s of back-off
        _wait_for(lambda: any(r is not None and r.next_restart for r in runs))
        n = len(runs)
        time.sleep(1.5)
        assert len(runs) == n  # no resync for an hour, and the back-off has not ended
        clock.t += 10  # the back-off ends: the watch runs without a plan change or a resync
        _wait_for(lambda: read_actual(state).instances[A0].restartCount == 2)
        assert runc.containers[cid(A0)].status == "running"
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()


def test_watch_sees_a_plan_whose_event_never_came(
    state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan written between the start's run and the file watcher's start (or whose event is
    lost) is applied at the next tick, not at the next resync: the plan file's stat is not the
    one the last run began with."""

    def deaf_watch(*_args: Any, stop_event: threading.Event, **_kwargs: Any) -> Iterator[set[Any]]:
        while not stop_event.wait(0.05):
            yield set()  # timeouts only: no event ever arrives

    monkeypatch.setattr("reconciler.agent.node.watchfiles.watch", deaf_watch)
    runc = FakeRunc()
    runs: list[AgentReport | None] = []
    stop = threading.Event()
    thread = _watch_one_instance(state, runc, runs, stop)
    try:
        _wait_for(lambda: (state / "actual" / f"{NODE}.yaml").exists())
        runc.containers[cid(A0)].status = "stopped"
        write_patch(state, 1)
        _wait_for(lambda: read_actual(state).instances[A0].restartCount == 1, timeout=20)
        _wait_for(lambda: len(runs) == 2)  # the start's run and this one (told once done)
        time.sleep(0.5)
        assert len(runs) == 2  # an unchanged plan file runs nothing more
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()
