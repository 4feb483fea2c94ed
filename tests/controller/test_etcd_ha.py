"""Two ``watch --store`` replicas on one etcd: kill -9 the leader in the middle of a reconcile
(issue 11). The other replica takes over once the dead leader's lease expires, and the unit
ends with the checkpoint a single clean run computes from the same inputs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.statedir import write_state_dir
from reconciler.controller.configs import default_config_builder
from reconciler.controller.reconcile import ReconcileOptions, reconcile
from reconciler.stores.base import FileStore, copy_unit
from reconciler.stores.etcd import EtcdStore

LEASE = 2  # seconds
CHECKPOINT = "checkpoint/allocations.json"


def _replica(url: str, workdir: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "reconciler",
            "-v",
            "watch",
            "--store",
            url,
            "--state",
            str(workdir),
            "--lease",
            str(LEASE),
            "--debounce",
            "100ms",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )


def _pid_of(identity: str | None) -> int | None:
    """Identities are host/pid/random."""
    return int(identity.split("/")[1]) if identity else None


def _wait(predicate: Any, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if predicate():
            return time.monotonic()
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _checkpoint(data: bytes) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(data)
    return {"generation": doc["generation"], "data": doc["data"]}


def test_kill_9_of_the_leader_mid_reconcile(
    etcd_url: str, tmp_path: Path, replicas: list[subprocess.Popen[bytes]]
) -> None:
    # a unit whose first reconcile takes a few seconds (4,000 OCI configs to build, write and
    # commit), so that the leader can be killed while it computes
    source = tmp_path / "source"
    write_state_dir(source, 200, 2000)
    store = EtcdStore(etcd_url)
    copy_unit(FileStore(source), store)

    # the reference: one clean run of the same inputs, in a plain state directory
    clean = tmp_path / "clean"
    shutil.copytree(source, clean)
    reconcile(clean, ReconcileOptions(configs=default_config_builder()))
    expected = _checkpoint((clean / CHECKPOINT).read_bytes())
    assert expected["generation"] == 1 and len(expected["data"]["instances"]) == 2000

    a = _replica(etcd_url, tmp_path / "a", tmp_path / "a.log")
    replicas.append(a)
    # the first replica leads on its own before the second starts: the one to kill is known
    _wait(lambda: _pid_of(store.leader()) == a.pid, 30, "replica a to lead")
    b = _replica(etcd_url, tmp_path / "b", tmp_path / "b.log")
    replicas.append(b)
    # b stands by before a dies (else, on a slow machine, it first campaigns after a's lease
    # ran out and never sees a lead)
    _wait(lambda: "standing by" in (tmp_path / "b.log").read_text(), 30, "replica b to stand by")
    assert CHECKPOINT not in store.snapshot().entries, "a committed before it could be killed"
    os.kill(a.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    a.wait()
    # killed mid-reconcile: nothing of its run reached etcd (one transaction at the end)
    entries = store.snapshot().entries
    assert CHECKPOINT not in entries
    assert not any(rel.startswith("out/") for rel in entries)

    took_over = _wait(lambda: _pid_of(store.leader()) == b.pid, 30, "replica b to lead")
    takeover = took_over - killed_at
    # the dead leader's lease expires LEASE s after its last refresh; b polls every LEASE/4
    assert takeover <= LEASE + 1.5, f"takeover took {takeover:.2f} s"

    _wait(lambda: CHECKPOINT in store.snapshot().entries, 60, "b's commit")
    final = store.snapshot().entries
    assert _checkpoint(final[CHECKPOINT].data) == expected  # no placement lost or duplicated
    assert {r for r in final if r.startswith("out/nodes/")} == {
        f"out/nodes/{p.name}" for p in (clean / "out" / "nodes").iterdir()
    }
    plan = json.loads(final["out/plan.json"].data)
    assert plan == json.loads((clean / "out" / "plan.json").read_bytes())

    # b keeps the unit; a clean stop releases the leader key at once
    b.send_signal(signal.SIGTERM)
    assert b.wait(timeout=20) == 0, (tmp_path / "b.log").read_text()[-2000:]
    assert store.leader() is None
    # b stood by while a led, and led only after a's death: one reconciler at a time
    lines = (tmp_path / "b.log").read_text().splitlines()
    standby = [i for i, line in enumerate(lines) if "standing by" in line and str(a.pid) in line]
    led = [
        i
        for i, line in enumerate(lines)
        if "reconciler.ha: controller" in line and " leads " in line
    ]
    assert standby and led and standby[0] < led[0], lines
    print(f"takeover {takeover:.2f} s after kill -9 (lease {LEASE} s)")
