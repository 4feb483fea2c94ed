"""How long a standby ``watch --store`` replica takes to lead after ``kill -9`` of the leader,
measured on a small unit: the bound ``watch --help`` and docs/etcd.md state (``--lease`` + 2 s).
It was found exceeding ``--lease`` (5 of 23 takeovers with ``--lease 5`` took 5.0-6.35 s): a
dead leader's key goes only when etcd expires its lease, up to ``--lease`` after the last
refresh and then at etcd's next expiry check (every 0.5 s), and the standby sees it gone at
its next look."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from reconciler.cli.commands import TAKEOVER_SLACK
from reconciler.stores.base import FileStore, copy_unit
from reconciler.stores.etcd import EtcdStore
from tests.support.paths import DEMO

LEASE = int(os.environ.get("RECONCILER_TAKEOVER_LEASE", "3"))  # seconds
TRIALS = int(os.environ.get("RECONCILER_TAKEOVER_TRIALS", "3"))


def _replica(url: str, workdir: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "reconciler", "watch", "--store", url),
            *("--state", str(workdir), "--lease", str(LEASE), "--debounce", "50ms"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _leader_pid(store: EtcdStore) -> int | None:
    holder = store.leader()
    return int(holder.split("/")[1]) if holder else None


def _wait_for(store: EtcdStore, pid: int, timeout: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if _leader_pid(store) == pid:
            return time.monotonic()
        time.sleep(0.01)
    raise AssertionError(f"replica {pid} did not lead within {timeout} s")


def test_takeover_after_kill_9_is_within_the_stated_bound(
    etcd_url: str, tmp_path: Path, replicas: list[subprocess.Popen[bytes]]
) -> None:
    source = tmp_path / "source"
    shutil.copytree(DEMO, source, ignore=shutil.ignore_patterns("out", "checkpoint", ".lock"))
    store = EtcdStore(etcd_url)
    copy_unit(FileStore(source), store)
    leader = _replica(etcd_url, tmp_path / "r0")
    replicas.append(leader)
    _wait_for(store, leader.pid, 30)
    took: list[float] = []
    for n in range(1, TRIALS + 1):
        standby = _replica(etcd_url, tmp_path / f"r{n}")
        replicas.append(standby)
        time.sleep(1.5 + 0.4 * n)  # standing by; the leader's refreshes at some phase
        assert _leader_pid(store) == leader.pid
        os.kill(leader.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        leader.wait()
        took.append(_wait_for(store, standby.pid, 30) - killed_at)
        leader = standby
    print(f"takeovers with --lease {LEASE}: " + ", ".join(f"{t:.2f} s" for t in took))
    # never before the lease could have expired (a refresh is at most LEASE/3 old), and within
    # the bound the help states
    assert all(LEASE * 2 / 3 - 0.5 <= t <= LEASE + TAKEOVER_SLACK for t in took), took
