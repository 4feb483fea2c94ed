"""The warm-path benchmarks still measure what they say (small runs): reconcile's stage
functions are found by the names ``benchmarks.warm`` wraps, plan.json is written before the run
ends, and ``benchmarks.watch`` sees the real watcher's runs begin and write the plan."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.paths import ROOT as REPO


def test_the_warm_benchmark_times_every_stage(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "benchmarks.warm", "--nodes", "20", "--instances", "60"]
    cmd += ["--edits", "3", "--dir", str(tmp_path), "--json"]
    out = subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, text=True).stdout
    report = json.loads(out)
    assert len(report["out_after_ms"]) == len(report["run_ms"]) == 3
    assert all(0 < o < r for o, r in zip(report["out_after_ms"], report["run_ms"], strict=True))
    stages = set(report["stages_ms"])
    assert stages == {
        "assign_ids",
        "balance",
        "commit flush (plan)",
        "configs",
        "last-good sync",
        "load_checkpoint",
        "load_state",
        "make_plan",
        "save_checkpoint",
        "status_bytes",
        "write_instance_outputs",
    }
    assert list(tmp_path.iterdir()) == []  # the state directory is removed


def test_the_watch_benchmark_times_edits_through_the_real_watcher(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "benchmarks.watch", "--nodes", "20", "--instances", "60"]
    cmd += ["--edits", "2", "--debounce", "0.05", "--dir", str(tmp_path), "--json"]
    out = subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, text=True).stdout
    report = json.loads(out)
    assert report["steady_before_edits"] is True  # the agents' reports reached a plan of nothing
    assert len(report["edits"]) == 2
    for e in report["edits"]:
        # the watcher waited at least its debounce, then wrote plan.json before its run ended
        assert e["wait_ms"] >= 50
        assert 0 < e["plan_out_ms"] < e["run_ms"]
        assert abs(e["edit_to_plan_ms"] - (e["wait_ms"] + e["plan_out_ms"])) < 1e-6
        assert 0 <= e["collector_ms"] <= e["run_ms"] + e["wait_ms"]
        assert e["rss_mib"] > 0
    assert set(report["summary_ms"]) == set(report["edits"][0]) - {"rss_mib"}
    assert list(tmp_path.iterdir()) == []  # the state directory is removed
