"""The warm-path benchmark still measures what it says (a small run): reconcile's stage
functions are found by the names it wraps, and plan.json is written before the run ends."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


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
