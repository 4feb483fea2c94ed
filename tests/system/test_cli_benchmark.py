"""``benchmarks.cli`` runs what it says (one small run, not timed): the floor, --help, and
validate and plan on the demo, with their exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.paths import ROOT as REPO


def test_the_cli_benchmark_runs_every_command() -> None:
    cmd = [sys.executable, "-m", "benchmarks.cli", "--runs", "1", "--json"]
    out = subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, text=True).stdout
    report = json.loads(out)
    results = report["results"]
    assert sorted(results) == ["plan", "python -c pass", "reconciler --help", "validate"]
    codes = {name: r["exitCode"] for name, r in results.items()}
    assert codes == {"python -c pass": 0, "reconciler --help": 0, "validate": 0, "plan": 2}
    assert all(r["bestMs"] > 0 for r in results.values())
    assert results["reconciler --help"]["targetMs"] == 150.0
