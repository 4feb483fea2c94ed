"""The GitOps workflow of the README: desired files in a git repository, `reconciler plan` on a
pull request, and a diff of `plan --json` between two commits (SPEC §10: plans are
deterministic and can be diffed offline; §13: `plan` writes nothing)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.paths import DEMO

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")

GIT_ENV = {
    "GIT_AUTHOR_NAME": "ci",
    "GIT_AUTHOR_EMAIL": "ci@example.com",
    "GIT_COMMITTER_NAME": "ci",
    "GIT_COMMITTER_EMAIL": "ci@example.com",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(repo: Path, *args: str) -> str:
    proc = subprocess.run(
        ["git", "-C", str(repo), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **GIT_ENV},
        check=True,
    )
    return proc.stdout


def reconciler(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reconciler", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
        check=False,
    )


def starts(plan: dict[str, Any]) -> set[tuple[str, int, str]]:
    return {
        (a["itemId"], a["index"], a["version"]) for a in plan["actions"] if a["action"] == "start"
    }


def test_plan_json_diff_between_two_commits(tmp_path: Path) -> None:
    # the unit's repository: unit.yaml, desired/, and the nodes/ (with their resources files)
    # the unit reports; the controller's own out/ and checkpoint/ are never committed
    repo = tmp_path / "unit-repo"
    repo.mkdir()
    for name in ("unit.yaml", "desired", "nodes", "resources"):
        src = DEMO / name
        if src.is_dir():
            shutil.copytree(src, repo / name)
        else:
            shutil.copy2(src, repo / name)
    (repo / ".gitignore").write_text("out/\ncheckpoint/\n.lock\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "the unit as deployed")
    base = git(repo, "rev-parse", "HEAD").strip()

    # a pull request: one instance of the logger instead of three, telemetry 1.0.0
    git(repo, "checkout", "-q", "-b", "pr")
    logger = repo / "desired" / "apps" / "logger.yaml"
    logger.write_text(logger.read_text().replace("instances: 3", "instances: 1"))
    tele = repo / "desired" / "telemetry.yaml"
    tele.write_text(tele.read_text().replace("version: 0.9.1", "version: 1.0.0"))
    git(repo, "commit", "-q", "-am", "fewer loggers, telemetry 1.0.0")
    head = git(repo, "rev-parse", "HEAD").strip()

    plans: dict[str, str] = {}
    for name, commit in (("base", base), ("head", head)):
        tree = tmp_path / name
        git(repo, "worktree", "add", "-q", "--detach", str(tree), commit)
        proc = reconciler("plan", "--json", "--state", str(tree))
        assert proc.returncode == 2, proc.stderr  # 2: changes, all placed
        plans[name] = proc.stdout
        # plan is read-only: the checkout stays clean, not even an ignored file appears
        assert git(tree, "status", "--porcelain", "--ignored") == ""

    # what a CI job runs on the pull request: validate, then the human plan it posts
    proc = reconciler("validate", "--state", str(tmp_path / "head"))
    assert proc.returncode == 0, proc.stdout
    proc = reconciler("plan", "--state", str(tmp_path / "head"))
    assert proc.returncode == 2, proc.stderr
    assert "Plan: 8 to start, 0 to stop; 0 unplaceable." in proc.stdout
    assert "  com.example.telemetry:default\n    + start 0 1.0.0 on " in proc.stdout  # by service

    # the reviewer's diff: exactly the two removed loggers and the new telemetry version
    before, after = json.loads(plans["base"]), json.loads(plans["head"])
    assert len(before["actions"]) == 10 and len(after["actions"]) == 8
    assert starts(before) - starts(after) == {
        ("com.example.logger", 1, "1.0.0"),
        ("com.example.logger", 2, "1.0.0"),
        ("com.example.telemetry", 0, "0.9.1"),
        ("com.example.telemetry", 1, "0.9.1"),
    }
    assert starts(after) - starts(before) == {
        ("com.example.telemetry", 0, "1.0.0"),
        ("com.example.telemetry", 1, "1.0.0"),
    }
    (tmp_path / "base.json").write_text(plans["base"])
    (tmp_path / "head.json").write_text(plans["head"])
    diff = subprocess.run(
        ["diff", "-u", "base.json", "head.json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert diff.returncode == 1  # different
    lines = diff.stdout.splitlines()
    assert any(re.fullmatch(r'-\s+"version": "0\.9\.1",?', line) for line in lines)
    assert any(re.fullmatch(r'\+\s+"version": "1\.0\.0",?', line) for line in lines)
    assert any(line.startswith('-    "fingerprint": "sha256:') for line in lines)

    # that the same commit planned twice gives the same bytes is in tests/planning/test_planner.py
    # (TestFingerprint and test_planning_twice_gives_identical_bytes_and_writes_nothing)
