"""The node agent's Prometheus metrics (SPEC §20): ``agent --watch --metrics-addr``."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from reconciler.agent.metrics import AgentMetrics
from reconciler.agent.node import AgentReport
from reconciler.cli.commands import main
from reconciler.controller.reconcile import ReconcileOptions, reconcile


def _families(text: str) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    return {
        f.name: [(s.name, s.labels, s.value) for s in f.samples]
        for f in text_string_to_metric_families(text)
    }


def test_restarts_are_counted_per_instance_and_runs_timed() -> None:
    metrics = AgentMetrics()
    metrics.observe(AgentReport("edge-1", 1, restarted=("a", "b"), elapsed=0.02))
    metrics.observe(AgentReport("edge-1", 2, restarted=("a",), elapsed=3.0))
    metrics.observe(None)  # a failed run: nothing to count
    metrics.observe(AgentReport("edge-1", 3))  # not timed (a run outside the watch loop)
    got = _families(metrics.registry_text())
    restarts = {
        s[1]["instance"]: s[2] for s in got["reconciler_agent_restarts"] if s[0].endswith("_total")
    }
    assert restarts == {"a": 2, "b": 1}
    durations = {s[0]: s for s in got["reconciler_agent_apply_duration_seconds"]}
    assert durations["reconciler_agent_apply_duration_seconds_count"][2] == 2
    assert durations["reconciler_agent_apply_duration_seconds_sum"][2] == pytest.approx(3.02)


def test_agent_watch_serves_its_metrics(demo_copy: Path, tmp_path: Path) -> None:
    """A watching agent on a node with nothing to run (edge-3): its port logged, both
    metrics served, the apply duration counting its runs."""
    if shutil.which("runc") is None:
        pytest.skip("runc is not installed (scripts/bootstrap installs it)")
    reconcile(demo_copy, ReconcileOptions())
    assert (
        main(
            [
                "agent",
                "--state",
                str(demo_copy),
                "--node",
                "edge-3",
                "--metrics-addr",
                "127.0.0.1:0",
            ]
        )
        == 64
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "reconciler",
            "agent",
            "--watch",
            "--node",
            "edge-3",
            "--state",
            str(demo_copy),
            "--runc-root",
            str(tmp_path / "runc"),
            "--metrics-addr",
            "127.0.0.1:0",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        url = None
        while url is None:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            found = re.search(r"serving metrics on (http://127\.0\.0\.1:\d+/metrics)", line)
            url = found.group(1) if found is not None else None
        assert url is not None, "".join(lines)
        deadline = time.monotonic() + 60
        while True:
            with urllib.request.urlopen(url, timeout=10) as response:
                got = _families(response.read().decode())
            count = [
                s
                for s in got.get("reconciler_agent_apply_duration_seconds", [])
                if s[0].endswith("_count")
            ]
            if (count and count[0][2] >= 1) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert count and count[0][2] >= 1
        assert "reconciler_agent_restarts" in got  # declared; no instance restarted yet
    finally:
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=60)
    assert proc.returncode == 0, "".join(lines) + rest
