"""End to end with real containers (SPEC §15, issue 8): the controller plus one agent per node.

A two-node state directory runs a busybox service through ``reconcile`` and both agents, each
agent with its own runc ``--root``; then ``runc list`` must show exactly the planned containers,
running, from configs that validate against the OCI schema. Then: the same plan applied again
(an agent that crashed before writing actual) starts nothing twice; a second reconcile plans
nothing; a stale patch is refused and touches nothing; scaling 2 → 1 stops exactly one
container; a version bump restarts its container; a container that dies shows as ``failed``;
deleting the service file stops them all. Every container under the test's runc roots is killed
and deleted in the fixture's teardown, even when the test fails, and the teardown checks that
none is left.

Skips, saying why, only when runc cannot run here at all: not root, no runc, no static busybox,
or runc failing a plain ``runc spec`` container.
"""

from __future__ import annotations

import json
import time

import pytest

from reconciler.agent.node import container_id
from reconciler.model.values import instance_id
from tests.support.e2e import (
    E2E,
    ITEM,
    NODES,
    write_service,
)

pytestmark = pytest.mark.slow


def test_two_agents_run_the_plan_with_runc(e2e: E2E) -> None:
    iid0 = instance_id(ITEM, "default", 0)
    iid1 = instance_id(ITEM, "default", 1)

    # ---- start: each node runs exactly its planned container
    t0 = time.monotonic()
    first = e2e.reconcile()
    assert len(first.plan.starts()) == 2 and first.plan.stops() == []
    where = {p.instance_id: p.node_id for p in first.computed.result.placements}
    assert where == {iid0: "n1", iid1: "n2"}  # cpu requests spread them
    reports = e2e.agents()
    e2e.timed("start", t0)
    assert reports["n1"].started == (iid0,) and reports["n2"].started == (iid1,)
    assert all(not r.failed and r.revision == 1 for r in reports.values()), reports
    assert {n: e2e.actual(n)["revision"] for n in NODES} == {"n1": 1, "n2": 1}  # 0 (no file) + 1
    running = e2e.containers()
    assert set(running["n1"]) == {container_id("n1", iid0)}
    assert set(running["n2"]) == {container_id("n2", iid1)}
    assert all(s.status == "running" for c in running.values() for s in c.values())
    bundle = (e2e.state / "out" / "instances" / iid0).resolve()
    assert running["n1"][container_id("n1", iid0)].bundle == str(bundle)
    assert e2e.actual("n1")["instances"] == {
        iid0: {
            "itemId": ITEM,
            "subjectId": "default",
            "index": 0,
            "version": "1.0.0",
            "runtimeId": "runc",
            "state": "active",
            "devices": {},
            "restartCount": 0,
        }
    }

    # ---- idempotent: the same plan applied again (an agent that crashed after starting,
    # before writing actual) finds its containers running and starts nothing twice
    for n in NODES:
        (e2e.state / "actual" / f"{n}.yaml").unlink()  # back to revision 0, as planned
    again = e2e.agents()
    assert {n: (r.started, r.already_running) for n, r in again.items()} == {
        "n1": ((), (iid0,)),
        "n2": ((), (iid1,)),
    }
    assert all(not r.failed and r.revision == 1 for r in again.values()), again
    assert e2e.containers() == running  # same containers, same pids

    # ---- the loop is closed: the next reconcile plans nothing, the agents idle
    t0 = time.monotonic()
    second = e2e.reconcile()
    assert not second.plan.changes_present
    idle = e2e.agents()
    assert not any(r.written or r.started or r.stopped or r.stale for r in idle.values())
    assert {n: r.already_running for n, r in idle.items()} == {"n1": (), "n2": ()}
    third = e2e.reconcile()
    assert not third.plan.changes_present and third.written == ()
    assert e2e.containers() == running  # same containers, same pids
    e2e.timed("idle", t0)

    # ---- a stale patch: the actual revision changes after planning; nothing happens
    t0 = time.monotonic()
    write_service(e2e.state, instances=1)
    scaled = e2e.reconcile()
    assert [(a.action, a.node_id, a.instance_id) for a in scaled.plan.actions] == [
        ("stop", "n2", iid1)
    ]
    actual_n2 = e2e.state / "actual" / "n2.yaml"
    doc = json.loads(actual_n2.read_text())
    doc["revision"] += 1  # another writer got there first
    actual_n2.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    bumped = actual_n2.read_bytes()
    refused = e2e.agents()
    assert refused["n2"].stale and "stale plan refused" in refused["n2"].message
    assert refused["n2"].stopped == () and refused["n2"].started == ()
    assert actual_n2.read_bytes() == bumped
    assert e2e.containers() == running
    e2e.timed("stale", t0)

    # ---- scaling 2 -> 1 (planned again from the new revision) stops exactly one container
    t0 = time.monotonic()
    replanned = e2e.reconcile()
    assert [(a.action, a.node_id, a.instance_id) for a in replanned.plan.actions] == [
        ("stop", "n2", iid1)
    ]
    reports = e2e.agents()
    assert reports["n2"].stopped == (iid1,) and reports["n1"].stopped == ()
    assert not any(r.started for r in reports.values())
    after = e2e.containers()
    assert after == {"n1": running["n1"], "n2": {}}
    assert e2e.actual("n2")["instances"] == {}
    assert not e2e.reconcile().plan.changes_present
    e2e.timed("scale 2->1", t0)

    # ---- a version bump replaces the container (same instance id, a new process)
    t0 = time.monotonic()
    old = after["n1"][container_id("n1", iid0)]
    write_service(e2e.state, instances=1, version="1.1.0")
    bump = e2e.reconcile()
    assert [(a.action, a.instance_id, a.reason) for a in bump.plan.actions] == [
        ("stop", iid0, "version-changed"),
        ("start", iid0, "version-changed"),
    ]
    reports = e2e.agents()
    assert reports["n1"].stopped == (iid0,) and reports["n1"].started == (iid0,)
    new = e2e.containers()
    assert set(new["n1"]) == {old.id} and new["n2"] == {}
    replaced = new["n1"][old.id]
    assert replaced.status == "running"
    assert replaced.pid != old.pid and replaced.created != old.created
    record = e2e.actual("n1")["instances"]
    assert isinstance(record, dict)
    assert record[iid0]["version"] == "1.1.0" and record[iid0]["state"] == "active"
    assert not e2e.reconcile().plan.changes_present
    e2e.timed("version bump", t0)

    # ---- a container that dies is started again by the agent (restartPolicy: always)
    t0 = time.monotonic()
    e2e.kill9("n1", old.id)
    reports = e2e.agents()
    assert reports["n1"].restarted == (iid0,) and reports["n1"].states == {iid0: "active"}
    back = e2e.runcs["n1"].state(old.id)
    assert back is not None and back.status == "running" and back.pid != replaced.pid
    record = e2e.actual("n1")["instances"]
    assert isinstance(record, dict) and record[iid0]["restartCount"] == 1
    assert not e2e.reconcile().plan.changes_present  # a state is observed, never planned
    e2e.timed("died", t0)

    # ---- deleting the service file stops them all
    t0 = time.monotonic()
    (e2e.state / "desired" / "sleeper.yaml").unlink()
    gone = e2e.reconcile(allow_empty=True)  # the mass-deletion guard needs the explicit yes
    assert [(a.action, a.instance_id) for a in gone.plan.actions] == [("stop", iid0)]
    reports = e2e.agents()
    assert reports["n1"].stopped == (iid0,)
    assert e2e.containers() == {"n1": {}, "n2": {}}
    assert e2e.actual("n1")["instances"] == {} and e2e.actual("n2")["instances"] == {}
    final = e2e.reconcile(allow_empty=True)
    assert not final.plan.changes_present
    e2e.timed("delete", t0)


def _running(e2e: E2E) -> dict[str, dict[str, str]]:
    return {n: {i: s.status for i, s in c.items()} for n, c in e2e.containers().items()}


def test_dead_containers_come_back_with_back_off_and_after_a_reboot(e2e: E2E) -> None:
    """Issue 24: kill -9, a second kill within the back-off, every container gone at once."""
    iid0, iid1 = instance_id(ITEM, "default", 0), instance_id(ITEM, "default", 1)
    c0, c1 = container_id("n1", iid0), container_id("n2", iid1)
    t = 1_800_000_000.0
    e2e.reconcile()
    e2e.agents(t)
    e2e.reconcile()
    assert _running(e2e) == {"n1": {c0: "running"}, "n2": {c1: "running"}}

    # kill -9: the next run starts it again, at once
    e2e.kill9("n1", c0)
    reports = e2e.agents(t + 1)
    assert reports["n1"].restarted == (iid0,) and reports["n2"].restarted == ()
    assert _running(e2e)["n1"] == {c0: "running"}
    record = e2e.actual("n1")["instances"]
    assert isinstance(record, dict) and record[iid0]["restartCount"] == 1
    assert record[iid0]["state"] == "active"
    assert record[iid0]["lastExit"]["reason"] == "the container is stopped"

    # killed again at once: not restarted before its 10 s back-off, restarted after
    e2e.kill9("n1", c0)
    waiting = e2e.agents(t + 2)["n1"]
    assert waiting.restarted == () and waiting.states == {iid0: "failed"}
    assert "back-off 10s" in waiting.failed[iid0] and waiting.next_restart == t + 12
    assert _running(e2e)["n1"] == {c0: "stopped"}
    assert e2e.agents(t + 11.9)["n1"].restarted == ()
    assert e2e.agents(t + 12)["n1"].restarted == (iid0,)
    assert _running(e2e)["n1"] == {c0: "running"}
    record = e2e.actual("n1")["instances"]
    assert isinstance(record, dict) and record[iid0]["restartCount"] == 2

    # ten minutes of running reset the back-off; then a reboot: every container gone
    e2e.agents(t + 12 + 600)
    for runc in e2e.runcs.values():
        for st in runc.list():
            runc.delete(st.id, force=True)
    assert e2e.containers() == {"n1": {}, "n2": {}}
    reports = e2e.agents(t + 700)  # one run: all back
    assert {n: r.restarted for n, r in reports.items()} == {"n1": (iid0,), "n2": (iid1,)}
    assert _running(e2e) == {"n1": {c0: "running"}, "n2": {c1: "running"}}
    lost = e2e.actual("n2")["instances"]
    assert isinstance(lost, dict) and lost[iid1]["lastExit"]["reason"] == "container missing"
    assert not e2e.reconcile().plan.changes_present


def test_a_missing_rootfs_created_later_heals(e2e: E2E) -> None:
    iid0 = instance_id(ITEM, "default", 0)
    rootfs, away = e2e.state / "rootfs", e2e.state / "rootfs.away"
    rootfs.rename(away)
    t = 1_800_000_000.0
    e2e.reconcile()
    reports = e2e.agents(t)
    assert reports["n1"].start_failed == (iid0,)
    assert reports["n1"].failed[iid0].startswith("runc run failed: invalid rootfs: ")
    record = e2e.actual("n1")["instances"]
    assert isinstance(record, dict) and record[iid0]["state"] == "failed"
    assert record[iid0]["reason"] == reports["n1"].failed[iid0]
    assert e2e.containers() == {"n1": {}, "n2": {}}

    away.rename(rootfs)  # the cause is fixed: the next attempt (the first restart: at once)
    reports = e2e.agents(t + 1)
    assert reports["n1"].restarted == (iid0,) and reports["n1"].start_failed == ()
    assert _running(e2e)["n1"] == {container_id("n1", iid0): "running"}
    record = e2e.actual("n1")["instances"]
    assert isinstance(record, dict) and record[iid0]["state"] == "active"
    assert "reason" not in record[iid0]


def test_a_leftover_of_an_interrupted_runc_run_does_not_block_the_start(e2e: E2E) -> None:
    """Issue 32 item 7: an agent killed during `runc run` leaves the container's directory
    under the runc root without a state.json (or with a torn one); runc then calls the
    container absent but refuses to create it. The next run starts the instance."""
    iid0, iid1 = instance_id(ITEM, "default", 0), instance_id(ITEM, "default", 1)
    c0, c1 = container_id("n1", iid0), container_id("n2", iid1)
    e2e.reconcile()
    assert e2e.runcs["n1"].root is not None and e2e.runcs["n2"].root is not None
    (e2e.runcs["n1"].root / c0).mkdir(parents=True)  # no state.json
    (e2e.runcs["n2"].root / c1).mkdir(parents=True)
    (e2e.runcs["n2"].root / c1 / "state.json").write_text('{"id": "n2.')  # torn
    assert e2e.runcs["n1"].state(c0) is None and e2e.runcs["n2"].state(c1) is None
    reports = e2e.agents()
    assert {n: (r.started, dict(r.failed)) for n, r in reports.items()} == {
        "n1": ((iid0,), {}),
        "n2": ((iid1,), {}),
    }
    assert _running(e2e) == {"n1": {c0: "running"}, "n2": {c1: "running"}}
