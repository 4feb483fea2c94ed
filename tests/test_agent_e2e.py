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

import contextlib
import json
import os
import platform
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from reconciler.agent import AgentReport, container_id, run_agent_once
from reconciler.oci_glue import default_config_builder
from reconciler.reconcile import ReconcileOptions, ReconcileReport, reconcile
from reconciler.runc import ContainerState, Runc, RuncError
from reconciler.values import instance_id

from .runtime_support import find_static_busybox, make_busybox_rootfs
from .test_oci import assert_valid

pytestmark = pytest.mark.slow

NODES = ("n1", "n2")
ITEM = "com.example.sleeper"
STOP_TIMEOUT = 1.0  # `sleep` as pid 1 ignores SIGTERM: every stop ends in SIGKILL after this


def _make_rootfs(rootfs: Path, busybox: str) -> None:
    make_busybox_rootfs(
        rootfs, busybox, ("sh", "sleep", "true"), ("proc", "dev", "sys", "tmp", "etc")
    )


def _architecture() -> str:
    machine = platform.machine()
    return {"aarch64": "arm64"}.get(machine, machine)


def _skip_unless_runc_works(tmp_path: Path, busybox: str) -> None:
    """Run a plain `runc spec` container once; skip (with runc's words) if even that fails."""
    probe = tmp_path / "probe"
    _make_rootfs(probe / "rootfs", busybox)
    spec = subprocess.run(
        ["runc", "spec", "--bundle", str(probe)],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    if spec.returncode != 0:
        pytest.skip(f"`runc spec` fails here: {spec.stderr.strip()}")
    config = json.loads((probe / "config.json").read_text())
    config["process"]["terminal"] = False
    config["process"]["args"] = ["/bin/true"]
    (probe / "config.json").write_text(json.dumps(config))
    root = tmp_path / "runc-probe"
    try:
        ran = subprocess.run(
            ["runc", "--root", str(root), "run", "--bundle", str(probe), "probe"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
    finally:
        subprocess.run(
            ["runc", "--root", str(root), "delete", "--force", "probe"],
            capture_output=True,
            check=False,
            timeout=30,
        )
    if ran.returncode != 0:
        pytest.skip(f"runc cannot run even a plain `runc spec` container here: {ran.stderr}")


SERVICE = """apiVersion: reconciler/v1
kind: Service
id: {item}
version: {version}
instances: {instances}
runtimes: [runc]
requestedResources: {{cpu: 100}}
image:
  rootfs: rootfs
  cmd: [/bin/sh, -c, "sleep 3600"]
"""


def write_service(state: Path, *, instances: int = 2, version: str = "1.0.0") -> None:
    text = SERVICE.format(item=ITEM, version=version, instances=instances)
    (state / "desired" / "sleeper.yaml").write_text(text)


@dataclass
class E2E:
    state: Path
    runcs: dict[str, Runc]
    logs: Path
    timings: dict[str, float]

    def reconcile(self, *, allow_empty: bool = False) -> ReconcileReport:
        opts = ReconcileOptions(configs=default_config_builder(), allow_empty=allow_empty)
        report = reconcile(self.state, opts)
        assert report.plan.complete, [f.summary for f in report.plan.failures]
        assert report.computed.diagnostics == []
        placed = {p.instance_id for p in report.computed.result.placements}
        bundles = self.state / "out" / "instances"
        assert {d.name for d in bundles.iterdir() if d.is_dir()} == placed
        for iid in placed:  # every config runc is given is valid OCI 1.0.2
            assert_valid(json.loads((bundles / iid / "config.json").read_text()))
        return report

    def agents(self) -> dict[str, AgentReport]:
        return {
            n: run_agent_once(self.state, n, runc, stop_timeout=STOP_TIMEOUT, log_dir=self.logs / n)
            for n, runc in self.runcs.items()
        }

    def containers(self) -> dict[str, dict[str, ContainerState]]:
        return {n: {s.id: s for s in runc.list()} for n, runc in self.runcs.items()}

    def actual(self, node: str) -> dict[str, object]:
        data = json.loads((self.state / "actual" / f"{node}.yaml").read_text())
        assert isinstance(data, dict)
        return data

    def timed(self, name: str, t0: float) -> None:
        self.timings[name] = round(time.monotonic() - t0, 2)


@pytest.fixture
def e2e(tmp_path: Path) -> Iterator[E2E]:
    if os.geteuid() != 0:
        pytest.skip("runc containers need root here (euid is not 0)")
    if shutil.which("runc") is None:
        pytest.skip("runc is not on PATH (scripts/bootstrap or .ci/run installs it)")
    busybox = find_static_busybox()
    if busybox is None:
        pytest.skip("no static busybox (/bin/busybox from busybox-static) for the rootfs")
    _skip_unless_runc_works(tmp_path, busybox)

    state = tmp_path / "state"
    (state / "desired").mkdir(parents=True)
    (state / "nodes").mkdir()
    _make_rootfs(state / "rootfs", busybox)
    (state / "unit.yaml").write_text(
        "apiVersion: reconciler/v1\nkind: UnitConfig\nversion: 1.0.0\n"
        "nodes:\n  - {nodeType: edge}\n"
    )
    for n in NODES:
        node = {
            "apiVersion": "reconciler/v1",
            "kind": "Node",
            "id": n,
            "type": "edge",
            "maxDMIPS": 1000,
            "totalRAM": "1Gi",
            "runtimes": [
                {
                    "id": "runc",
                    "type": "runc",
                    "platform": {"architecture": _architecture(), "os": "linux"},
                }
            ],
        }
        (state / "nodes" / f"{n}.yaml").write_text(json.dumps(node))  # JSON is YAML 1.2
    write_service(state)
    runcs = {n: Runc(root=tmp_path / f"runc-{n}", timeout=30) for n in NODES}
    env = E2E(state, runcs, tmp_path / "logs", {})
    try:
        yield env
    finally:
        for runc in runcs.values():  # leave nothing behind, whatever happened
            try:
                left = runc.list()
            except RuncError:
                continue
            for st in left:
                with contextlib.suppress(RuncError):
                    runc.kill(st.id, "KILL")
                with contextlib.suppress(RuncError):
                    runc.delete(st.id, force=True)
        print(f"e2e timings (s): {env.timings}")
        remaining = {n: [st.id for st in runc.list()] for n, runc in runcs.items()}
        assert remaining == {n: [] for n in NODES}, f"containers left behind: {remaining}"


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

    # ---- a container that dies shows as failed (and is not restarted by the agent)
    t0 = time.monotonic()
    e2e.runcs["n1"].kill(old.id, "KILL")
    deadline = time.monotonic() + 30
    while (st := e2e.runcs["n1"].state(old.id)) is not None and st.status != "stopped":
        assert time.monotonic() < deadline, f"{old.id} still {st.status} after SIGKILL"
        time.sleep(0.05)
    revision = e2e.actual("n1")["revision"]
    assert isinstance(revision, int)
    reports = e2e.agents()
    assert reports["n1"].states == {iid0: "failed"} and "stopped" in reports["n1"].failed[iid0]
    assert reports["n1"].started == () and reports["n1"].revision == revision + 1
    assert e2e.actual("n1")["revision"] == revision + 1
    record = e2e.actual("n1")["instances"]
    assert isinstance(record, dict) and record[iid0]["state"] == "failed"
    assert {s.id: s.status for s in e2e.runcs["n1"].list()} == {old.id: "stopped"}
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
