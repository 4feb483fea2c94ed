"""Prometheus metrics (SPEC §20): ``watch --metrics-addr``, ``reconcile --metrics-file``."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from reconciler.cli.commands import main
from reconciler.controller.metrics import ControllerMetrics
from reconciler.controller.reconcile import ReconcileOptions, reconcile
from reconciler.io.lock import StateLock
from reconciler.io.metrics_export import parse_metrics_addr
from tests.support.observability import troubled_demo

SPEC_METRICS = {
    "reconciler_runs_total",
    "reconciler_run_duration_seconds",
    "reconciler_instances",
    "reconciler_unplaceable",
    "reconciler_plan_actions",
    "reconciler_node_capacity",
    "reconciler_node_reserved",
    "reconciler_devices",
    "reconciler_alert_raised",
    "reconciler_last_success_timestamp_seconds",
    "reconciler_checkpoint_generation",
}


def _samples(text: str) -> dict[str, list[Sample]]:
    """Samples by family name, as Prometheus' own parser reads them."""
    out: dict[str, list[Sample]] = {}
    for family in text_string_to_metric_families(text):
        out.setdefault(family.name, []).extend(family.samples)
        for sample in family.samples:  # also by sample name (a counter's family has no _total)
            if sample.name != family.name:
                out.setdefault(sample.name, []).append(sample)
    return out


def _value(samples: dict[str, list[Sample]], name: str, **labels: str) -> float:
    found = [s.value for s in samples.get(name, []) if s.name == name and s.labels == labels]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def _status_json(state: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["status", "--state", str(state), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert isinstance(doc, dict)
    return doc


def _check_against_status(samples: dict[str, list[Sample]], doc: dict[str, Any]) -> None:
    """Every gauge of SPEC §20 has the value ``status --json`` shows."""
    states = [i["state"] for i in doc["instances"].values()]
    placed, failed = len(doc["instances"]), len(doc["failures"])
    assert _value(samples, "reconciler_instances", state="desired") == placed + failed
    assert _value(samples, "reconciler_instances", state="placed") == placed
    assert _value(samples, "reconciler_instances", state="unplaceable") == failed
    assert _value(samples, "reconciler_instances", state="active") == states.count("active")
    assert _value(samples, "reconciler_instances", state="failed") == states.count("failed")
    reasons = [f["reason"] for f in doc["failures"]]
    assert reasons
    for reason in set(reasons):
        assert _value(samples, "reconciler_unplaceable", reason=reason) == reasons.count(reason)
    n_series = 0
    for node_id, entry in doc["nodes"].items():
        for resource, inv in (
            ("cpu", entry["cpu"]),
            ("ram", entry["ram"]),
            ("storage", entry["partitions"]["storage"]),
            ("state", entry["partitions"]["state"]),
        ):
            cap = _value(samples, "reconciler_node_capacity", node=node_id, resource=resource)
            assert cap == inv["capacity"]
            res = _value(samples, "reconciler_node_reserved", node=node_id, resource=resource)
            assert res == inv["reserved"]
            n_series += 1
        for resource, pool in entry["devices"].items():
            labels = {"node": node_id, "resource": resource}
            assert _value(samples, "reconciler_node_capacity", **labels) == pool["total"]
            assert _value(samples, "reconciler_node_reserved", **labels) == pool["allocated"]
            n_series += 1
            for state, want in (
                ("healthy", pool["healthy"]),
                ("unhealthy", pool["total"] - pool["healthy"]),
                ("allocated", pool["allocated"]),
            ):
                assert _value(samples, "reconciler_devices", state=state, **labels) == want
    assert len(samples["reconciler_node_capacity"]) == n_series  # nothing else
    assert doc["alerts"]
    for alert in doc["alerts"]:
        labels = {"node": alert["node"], "resource": alert["resource"]}
        assert _value(samples, "reconciler_alert_raised", **labels) == 1
    assert len(samples["reconciler_alert_raised"]) == len(doc["alerts"])


def _plan_actions(state: Path) -> dict[str, int]:
    plan = json.loads((state / "out" / "plan.json").read_text())
    counts = {"start": 0, "stop": 0}
    for a in plan["actions"]:
        counts[a["action"]] += 1
    return counts


@pytest.fixture
def watcher(demo_copy: Path) -> Iterator[tuple[subprocess.Popen[str], str, list[str]]]:
    """`reconciler watch --metrics-addr 127.0.0.1:0` on the troubled demo: the process, the
    metrics URL it logged, and its log lines so far (read on)."""
    troubled_demo(demo_copy)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "reconciler",
            "watch",
            "--state",
            str(demo_copy),
            "--metrics-addr",
            "127.0.0.1:0",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    try:
        url = None
        deadline = time.monotonic() + 60
        assert proc.stderr is not None
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            found = re.search(r"serving metrics on (http://127\.0\.0\.1:(\d+)/metrics)", line)
            if found is not None:
                assert int(found.group(2)) != 0  # the chosen port, not the asked-for 0
                url = found.group(1)
        assert url is not None, "".join(lines)
        yield proc, url, lines
    finally:
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=60)
        assert proc.returncode == 0, "".join(lines) + rest
        assert "Traceback" not in rest


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        body = response.read().decode()
    assert isinstance(body, str)
    return body


def _wait_for_runs(url: str, at_least: float, timeout: float = 60) -> dict[str, list[Sample]]:
    deadline = time.monotonic() + timeout
    while True:
        samples = _samples(_get(url))
        runs = [s for s in samples.get("reconciler_runs_total", []) if s.name.endswith("_total")]
        done = sum(s.value for s in runs if s.labels == {"result": "success"})
        if done >= at_least or time.monotonic() > deadline:
            return samples
        time.sleep(0.1)


class TestWatchServesMetrics:
    def test_every_metric_matches_status_json_and_runs_grow_after_an_edit(
        self,
        watcher: tuple[subprocess.Popen[str], str, list[str]],
        demo_copy: Path,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        _, url, _ = watcher
        samples = _wait_for_runs(url, 1)
        assert samples.keys() >= SPEC_METRICS, SPEC_METRICS - samples.keys()
        runs = _value(samples, "reconciler_runs_total", result="success")
        assert runs >= 1
        assert _value(samples, "reconciler_run_duration_seconds_count") == runs
        assert _value(samples, "reconciler_last_success_timestamp_seconds") > time.time() - 120
        doc = _status_json(demo_copy, capsys)
        _check_against_status(samples, doc)
        for action, n in _plan_actions(demo_copy).items():
            assert _value(samples, "reconciler_plan_actions", action=action) == n
        generation = json.loads((demo_copy / "checkpoint" / "allocations.json").read_text())
        assert _value(samples, "reconciler_checkpoint_generation") == generation["generation"]

        time.sleep(1.0)  # the watcher's inotify watches are in place
        logger = demo_copy / "desired" / "apps" / "logger.yaml"
        logger.write_text(logger.read_text().replace("instances: 3", "instances: 4"))
        after = _wait_for_runs(url, runs + 1)
        assert _value(after, "reconciler_runs_total", result="success") > runs
        assert _value(after, "reconciler_instances", state="placed") == len(doc["instances"]) + 1
        _check_against_status(after, _status_json(demo_copy, capsys))

    def test_no_controller_metric_has_an_instance_label(self, demo_copy: Path) -> None:
        """Label cardinality: the series do not grow with the instances (3 logger instances
        or 30, on the same nodes)."""
        logger = demo_copy / "desired" / "apps" / "logger.yaml"
        counts = []
        for n in (3, 30):
            logger.write_text(re.sub(r"instances: \d+", f"instances: {n}", logger.read_text()))
            metrics = ControllerMetrics()
            metrics.observe(reconcile(demo_copy, ReconcileOptions()))
            series = [s for f in metrics.registry.collect() for s in f.samples]
            assert not any("instance" in s.labels for s in series)
            counts.append(len(series))
        assert counts[0] == counts[1]

    def test_a_bad_address_is_a_usage_error(self, demo_copy: Path) -> None:
        assert main(["watch", "--state", str(demo_copy), "--metrics-addr", "nowhere"]) == 64
        assert parse_metrics_addr("[::1]:0") == ("::1", 0)
        with pytest.raises(ValueError, match=r"0\.\.65535"):
            parse_metrics_addr("127.0.0.1:70000")


class TestMetricsFile:
    def test_parses_and_counts_runs_across_processes(
        self, demo_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        troubled_demo(demo_copy)
        target = tmp_path / "textfile" / "reconciler.prom"
        target.parent.mkdir()
        args = ["reconcile", "--state", str(demo_copy), "--metrics-file", str(target)]
        assert main(args) == 0
        first = _samples(target.read_text())
        assert first.keys() >= SPEC_METRICS, SPEC_METRICS - first.keys()
        assert target.stat().st_mode & 0o777 == 0o644  # node-exporter reads it as its own user
        _check_against_status(first, _status_json(demo_copy, capsys))
        assert main(args) == 0
        second = _samples(target.read_text())
        assert _value(second, "reconciler_runs_total", result="success") == 2
        assert _value(second, "reconciler_run_duration_seconds_count") == 2
        assert not list(tmp_path.glob("textfile/.*"))  # no temp file left (atomic write)

        # a failed run (another writer holds the lock) is counted; the gauges stay
        with StateLock(demo_copy):
            assert main([*args, "--lock-timeout", "0.1"]) == 1
        third = _samples(target.read_text())
        assert _value(third, "reconciler_runs_total", result="error") == 1
        assert _value(third, "reconciler_runs_total", result="success") == 2
        last = "reconciler_last_success_timestamp_seconds"
        assert _value(third, last) == _value(second, last)
        assert third["reconciler_node_capacity"] == second["reconciler_node_capacity"]

    def test_an_unwritable_file_is_a_warning_not_a_failure(
        self, demo_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        target = tmp_path / "missing-dir" / "reconciler.prom"
        assert main(["reconcile", "--state", str(demo_copy), "--metrics-file", str(target)]) == 0
        assert f"--metrics-file {target}: not written" in capsys.readouterr().err
        assert (demo_copy / "out" / "plan.json").exists()
