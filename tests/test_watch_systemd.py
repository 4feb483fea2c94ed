"""The long-running watcher and the systemd units (SPEC §14)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from reconciler.reconcile import ReconcileOptions, ReconcileReport
from reconciler.watch import WatchOptions, input_filter, watch_loop

ROOT = Path(__file__).resolve().parent.parent
UNITS = ["reconciler.path", "reconciler.service", "reconciler.timer", "reconciler-watch.service"]


def _wait_for(predicate: object, timeout: float = 15.0) -> bool:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _planned_instances(state: Path) -> int:
    try:
        plan = json.loads((state / "out" / "plan.json").read_text())
    except (OSError, ValueError):
        return -1
    return sum(1 for a in plan["actions"] if a["itemId"] == "com.example.logger")


class TestWatch:
    def test_reconciles_on_change_and_stops_on_sigterm(self, demo_copy: Path) -> None:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "reconciler",
                "watch",
                "--state",
                str(demo_copy),
                "--debounce",
                "100ms",
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert _wait_for(lambda: _planned_instances(demo_copy) == 3)
            svc = demo_copy / "desired" / "apps" / "logger.yaml"
            svc.write_text(svc.read_text().replace("instances: 3", "instances: 1"))
            assert _wait_for(lambda: _planned_instances(demo_copy) == 1)
            time.sleep(0.5)  # the watch is surely running now: this edit arrives as an event
            svc.write_text(svc.read_text().replace("instances: 1", "instances: 2"))
            assert _wait_for(lambda: _planned_instances(demo_copy) == 2)
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
        assert "changed: logger.yaml" in err and "stopped" in err
        assert "Traceback" not in err

    def test_own_outputs_do_not_wake_the_watcher(self, demo_copy: Path) -> None:
        accept = input_filter(demo_copy)
        from watchfiles import Change

        assert accept(Change.modified, str(demo_copy / "desired" / "a.yaml"))
        assert accept(Change.added, str(demo_copy / "nodes" / "n.yaml"))
        assert not accept(Change.modified, str(demo_copy / "out" / "plan.json"))
        assert not accept(Change.modified, str(demo_copy / "checkpoint" / "allocations.json"))
        assert not accept(Change.modified, str(demo_copy / ".lock"))
        assert not accept(Change.added, str(demo_copy / "desired" / ".a.yaml.swp"))

    def test_periodic_resync_without_events(self, demo_copy: Path) -> None:
        runs: list[ReconcileReport | None] = []
        stop = threading.Event()

        def on_run(report: ReconcileReport | None) -> None:
            runs.append(report)
            if len(runs) >= 3:
                stop.set()

        t = threading.Thread(
            target=watch_loop,
            args=(demo_copy, ReconcileOptions(), WatchOptions(debounce=0.05, resync=0.2)),
            kwargs={"stop": stop, "on_run": on_run},
        )
        t.start()
        t.join(timeout=30)
        assert not t.is_alive()
        assert len(runs) >= 3 and all(r is not None for r in runs)
        assert all(r is not None and r.written == () for r in runs[1:])  # nothing changed


class TestSystemdUnits:
    def test_units_verify_cleanly(self, tmp_path: Path) -> None:
        analyze = shutil.which("systemd-analyze")
        if analyze is None:
            pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
        binary = shutil.which("reconciler") or str(Path(sys.executable).parent / "reconciler")
        assert Path(binary).exists()
        for name in UNITS:
            text = (ROOT / "systemd" / name).read_text()
            (tmp_path / name).write_text(text.replace("/usr/local/bin/reconciler", binary))
        proc = subprocess.run(
            [analyze, "verify", *UNITS], cwd=tmp_path, capture_output=True, text=True, check=False
        )
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr

    def test_service_is_hardened(self) -> None:
        text = (ROOT / "systemd" / "reconciler.service").read_text()
        for line in (
            "Type=oneshot",
            "NoNewPrivileges=yes",
            "ProtectSystem=strict",
            "ReadWritePaths=/var/lib/reconciler",
            "PrivateTmp=yes",
            "ProtectHome=yes",
            "UMask=0077",
        ):
            assert line in text.splitlines()
        path = (ROOT / "systemd" / "reconciler.path").read_text()
        assert "TriggerLimitBurst=10000" in path.splitlines()
        for d in ("desired", "nodes", "actual"):
            assert f"PathChanged=/var/lib/reconciler/state/{d}" in path.splitlines()
