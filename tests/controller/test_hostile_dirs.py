"""An input directory that cannot be read is not a directory whose files were deleted, each
fault in the form it was found: a desired/ subdirectory replaced by a symlink or made
unreadable, nodes/ replaced by a symlink or a file, and every node file deleted. The objects
under an unreadable directory keep their last good versions (in memory, or from
checkpoint/last-good for a new process), the directory is reported like an invalid file
(``validate`` exits 1), and losing every node needs ``--allow-empty`` as losing every
service does."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.controller.configs import default_config_builder
from reconciler.controller.reconcile import ReconcileOptions, compute_once, reconcile
from reconciler.io.checkpoint_files import (
    load_checkpoint,
)
from reconciler.io.loader import load_state
from tests.support.agent_sim import apply_all


def cli(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The command in a new process: nothing in memory, the last good versions from disk."""
    return subprocess.run(
        [sys.executable, "-m", "reconciler", *args, "--state", str(state)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def allocations(state: Path) -> dict[str, Any]:
    doc = json.loads((state / "checkpoint" / "allocations.json").read_text())
    return dict(doc["data"]["instances"])


@pytest.fixture
def running(demo_copy: Path) -> Iterator[Path]:
    """The demo reconciled and applied by its agents: every instance runs."""
    assert cli(demo_copy, "reconcile").returncode == 0
    apply_all(demo_copy)
    assert cli(demo_copy, "reconcile").returncode == 0
    plan = cli(demo_copy, "plan", "--json")
    assert plan.returncode == 0, plan.stderr  # nothing to do
    yield demo_copy


def stops(state: Path) -> list[dict[str, Any]]:
    """The plan's stops, planned past the gate (an unreadable directory is an invalid input:
    ``plan`` alone exits 1 naming it, ``--allow-invalid`` plans with the last good versions)."""
    gated = cli(state, "plan", "--json")
    assert "Traceback" not in gated.stderr
    if json.loads(gated.stdout).get("invalidFiles"):
        assert gated.returncode == 1, gated.stderr
    proc = cli(state, "plan", "--json", "--allow-invalid")
    assert "Traceback" not in proc.stderr
    assert proc.returncode in (0, 2, 3), proc.stderr
    return [a for a in json.loads(proc.stdout)["actions"] if a["action"] == "stop"]


def assert_reported(state: Path, rel: str, fragment: str) -> None:
    proc = cli(state, "validate", "--json")
    assert proc.returncode == 1, proc.stdout
    errors = json.loads(proc.stdout)["errors"]
    assert [e["path"] for e in errors] == [str(state / rel)], errors
    assert fragment in errors[0]["message"] and "last good" in errors[0]["message"]


def assert_nothing_lost(state: Path, before: dict[str, Any]) -> None:
    """reconcile in a new process keeps every instance: no stop, the same allocations."""
    assert stops(state) == []
    proc = cli(state, "reconcile", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert [a for a in report["actions"] if a["action"] == "stop"] == []
    assert report["invalidInputs"], report
    assert allocations(state) == before
    status = json.loads((state / "out" / "status.json").read_text())
    assert len(status["instances"]) == len(before) and status["invalidInputs"]


def as_symlink(directory: Path, tmp_path: Path) -> None:
    """``directory`` moved away and a symlink to it put in its place (the files are intact
    behind it, which the controller must still not follow)."""
    moved = tmp_path / f"moved-{directory.name}"
    shutil.move(directory, moved)
    directory.symlink_to(moved, target_is_directory=True)


def test_a_desired_subdirectory_replaced_by_a_symlink(running: Path, tmp_path: Path) -> None:
    before = allocations(running)
    as_symlink(running / "desired" / "apps", tmp_path)
    assert_reported(running, "desired/apps", "is a symlink")
    assert_nothing_lost(running, before)


def test_nodes_replaced_by_a_symlink(running: Path, tmp_path: Path) -> None:
    before = allocations(running)
    as_symlink(running / "nodes", tmp_path)
    assert_reported(running, "nodes", "is a symlink")
    assert_nothing_lost(running, before)


def test_nodes_replaced_by_a_file(running: Path) -> None:
    before = allocations(running)
    shutil.rmtree(running / "nodes")
    (running / "nodes").write_text("not a directory\n")
    assert_reported(running, "nodes", "is not a directory")
    assert_nothing_lost(running, before)


def test_desired_replaced_by_a_file(running: Path) -> None:
    before = allocations(running)
    shutil.rmtree(running / "desired")
    (running / "desired").write_text("")
    assert_reported(running, "desired", "is not a directory")
    assert_nothing_lost(running, before)


def test_every_node_file_deleted_needs_allow_empty(running: Path) -> None:
    before = allocations(running)
    checkpoint = (running / "checkpoint" / "allocations.json").read_bytes()
    for node in (running / "nodes").glob("*.yaml"):
        node.unlink()
    for command in (["plan"], ["reconcile"]):
        proc = cli(running, *command)
        assert proc.returncode == 1, (command, proc.stdout)
        assert "no valid node left" in proc.stderr and "--allow-empty" in proc.stderr
        assert "Traceback" not in proc.stderr
    assert (running / "checkpoint" / "allocations.json").read_bytes() == checkpoint
    assert allocations(running) == before

    proc = cli(running, "reconcile", "--allow-empty", "--json")
    assert proc.returncode == 0, proc.stderr
    assert allocations(running) == {}  # what was asked for, explicitly


def test_every_node_lost_before_any_agent_ran_needs_allow_empty(demo_copy: Path) -> None:
    """Allocated but not yet running: the device ids and uids are still worth keeping."""
    assert cli(demo_copy, "reconcile").returncode == 0
    before = allocations(demo_copy)
    assert before
    for node in (demo_copy / "nodes").glob("*.yaml"):
        node.unlink()
    proc = cli(demo_copy, "reconcile")
    assert proc.returncode == 1 and "allocated" in proc.stderr, proc.stderr
    assert allocations(demo_copy) == before


def eacces_on(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Opening a directory named ``name`` fails with EACCES (as chmod 000 would for a user
    other than root, which these tests may run as)."""
    real = os.open

    def fake(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if os.path.basename(os.fspath(path)) == name and flags & os.O_DIRECTORY:
            raise PermissionError(errno.EACCES, "Permission denied", os.fspath(path))
        return real(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", fake)


@pytest.mark.parametrize(("name", "rel"), [("apps", "desired/apps"), ("nodes", "nodes")])
def test_an_unreadable_directory(
    running: Path, monkeypatch: pytest.MonkeyPatch, name: str, rel: str
) -> None:
    before = allocations(running)
    opts = ReconcileOptions(configs=default_config_builder())
    full = compute_once(running, opts, read_only=True)
    eacces_on(monkeypatch, name)

    _, diags = load_state(running)  # validate's load: no last good versions
    assert [(d.path, d.severity) for d in diags] == [(str(running / rel), "error")]
    assert "Permission denied" in diags[0].message

    c = compute_once(running, opts, read_only=True)  # a new process: from checkpoint/last-good
    assert c.view.services == full.view.services and c.view.nodes.keys() == full.view.nodes.keys()
    assert c.result.placements == full.result.placements
    assert [a for a in c.plan.actions if a.action == "stop"] == []
    assert c.view.unreadable == (f"{rel}/",)
    report = reconcile(running, opts)
    assert [a for a in report.plan.actions if a.action == "stop"] == []
    assert allocations(running) == before
    loaded = load_checkpoint(running / "checkpoint", c.view.actual, quarantine=False)
    assert loaded.checkpoint.allocations.keys() == before.keys()
    monkeypatch.undo()
    again = compute_once(running, opts, read_only=True)
    assert again.diagnostics == [] and again.view.unreadable == ()
    assert again.plan.fingerprint == full.plan.fingerprint


def test_a_watcher_keeps_them_from_its_previous_view(running: Path, tmp_path: Path) -> None:
    """In memory, from the previous view; once a directory is unreadable every load is a full
    pass, whatever the watcher's hint, so its return is seen."""
    view, _ = load_state(running)
    apps = running / "desired" / "apps"
    as_symlink(apps, tmp_path)
    after = view
    for hint in (None, {"desired/apps"}, {"desired/apps/logger.yaml"}):
        after, diags = load_state(running, view, changed=hint)
        assert after.services == view.services, hint
        assert [d.path for d in diags] == [str(apps)], hint
    again, diags = load_state(running, after, changed={"desired/navigation.yaml"})
    assert again.services == view.services and [d.path for d in diags] == [str(apps)]
    assert again.input_hash == after.input_hash != view.input_hash
    apps.unlink()
    shutil.move(tmp_path / "moved-apps", apps)
    back, diags = load_state(running, again, changed={"desired/navigation.yaml"})
    assert diags == [] and back.unreadable == () and back.input_hash == view.input_hash


def test_a_first_ever_unreadable_directory_has_no_objects(tmp_path: Path) -> None:
    (tmp_path / "desired").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "a.yaml").write_text("kind: Service\n")
    (tmp_path / "desired" / "team").symlink_to(tmp_path / "elsewhere")
    view, diags = load_state(tmp_path)
    assert view.services == {} and [d.path for d in diags] == [str(tmp_path / "desired/team")]
