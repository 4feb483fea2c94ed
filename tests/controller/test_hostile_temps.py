"""Temp files of writers killed with SIGKILL in out/instances/ (in each instance's directory,
and the configs' manifest's ``..manifest.json.tmp-PID``) are swept by the next verifying run,
as those of out/ and checkpoint/ are; they were found piling up (4,345 after three kills)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler.controller.configs import default_config_builder
from reconciler.controller.reconcile import ReconcileCache, ReconcileOptions, reconcile
from reconciler.io.fsio import remove_stale_temp_files
from reconciler.oci.writer import WRITING

KILLED_AT = """
import os, signal, sys
from pathlib import Path
from reconciler.controller.configs import default_config_builder
from reconciler.controller.reconcile import ReconcileOptions, reconcile

state, target = Path(sys.argv[1]), sys.argv[2]
real_replace, real_rename = os.replace, os.rename

def replace(src, dst, *args, **kwargs):
    if str(dst).endswith(target):  # every temp of the batch is written: die before renaming
        os.kill(os.getpid(), signal.SIGKILL)
    return real_replace(src, dst, *args, **kwargs)

def rename(src, dst, *args, **kwargs):
    if str(dst).endswith(target):  # a first run's whole tree is written: die before renaming
        os.kill(os.getpid(), signal.SIGKILL)
    return real_rename(src, dst, *args, **kwargs)

os.replace, os.rename = replace, rename
reconcile(state, ReconcileOptions(configs=default_config_builder()))
"""


def killed_run(state: Path, target: str) -> int:
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_AT, str(state), target],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -9, err
    return proc.pid


def reconcile_in_a_new_process(state: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "reconciler", "reconcile", "--state", str(state)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def temps(state: Path) -> list[str]:
    return sorted(str(p.relative_to(state)) for p in state.rglob(".*.tmp-*"))


def test_a_killed_writers_temps_in_out_instances_are_swept(demo_copy: Path) -> None:
    # out/instances exists (not a first run, which makes it whole: see below)
    (demo_copy / "out" / "instances").mkdir(parents=True)
    first = killed_run(demo_copy, "/config.json")  # killed with every config in its temp
    left = temps(demo_copy)
    in_instances = [t for t in left if t.startswith("out/instances/") and t.count("/") == 3]
    assert len(in_instances) >= 2 * 4  # (config.json, hosts) x instances
    assert all(t.endswith(f".tmp-{first}") for t in in_instances)

    # the next run sweeps them first; killed with the configs in place and the manifest's temp
    second = killed_run(demo_copy, "/.manifest.json")
    left = temps(demo_copy)
    assert f"out/instances/..manifest.json.tmp-{second}" in left
    assert all(t.endswith(f".tmp-{second}") for t in left), left

    reconcile_in_a_new_process(demo_copy)
    assert temps(demo_copy) == []
    # and what the killed runs meant to write is there, whole
    configs = list((demo_copy / "out" / "instances").glob("*/config.json"))
    assert len(configs) >= 4 and (demo_copy / "out" / "instances" / ".manifest.json").is_file()


def test_a_first_run_killed_before_its_rename_leaves_a_temp_tree_the_next_run_sweeps(
    demo_copy: Path,
) -> None:
    pid = killed_run(demo_copy, "/out/instances")
    out = demo_copy / "out"
    assert not (out / "instances").exists()  # no instance directory, rather than some of them
    tree = out / f".instances.tmp-{pid}"
    assert len(list(tree.glob("*/config.json"))) >= 4
    reconcile_in_a_new_process(demo_copy)
    assert not tree.exists() and temps(demo_copy) == []
    configs = list((out / "instances").glob("*/config.json"))
    assert len(configs) >= 4 and (out / "instances" / ".manifest.json").is_file()


def test_a_watchers_event_runs_leave_them_to_the_next_verifying_run(demo_copy: Path) -> None:
    opts = ReconcileOptions(cache=ReconcileCache(), configs=default_config_builder())
    view = reconcile(demo_copy, opts).computed.view
    some = next(p for p in (demo_copy / "out" / "instances").iterdir() if p.is_dir())
    stale = some / ".config.json.tmp-99999"
    stale.write_text("torn")
    (demo_copy / "out" / "instances" / WRITING).write_text("")  # as a writer killed mid-batch
    trusting = dataclasses.replace(opts, verify=False)
    view = reconcile(demo_copy, trusting, view).computed.view
    assert stale.exists()  # an event run does not list 20,000 directories
    reconcile(demo_copy, opts, view)  # the resync does
    assert not stale.exists()


def test_the_sweep_never_follows_a_symlink(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / ".precious.tmp-1").write_text("not ours")
    (outside / "sub").mkdir()
    (outside / "sub" / ".precious.tmp-2").write_text("not ours")
    state = tmp_path / "state"
    (state / "out").mkdir(parents=True)
    (state / "out" / "instances").symlink_to(outside)
    (state / "checkpoint").symlink_to(outside)
    inst = state / "out" / "elsewhere"
    inst.mkdir()
    assert remove_stale_temp_files(state, "out/instances", subdirs=True) == 0
    assert remove_stale_temp_files(state, "checkpoint") == 0
    assert remove_stale_temp_files(state, "checkpoint/last-good") == 0
    assert (outside / ".precious.tmp-1").exists() and (outside / "sub" / ".precious.tmp-2").exists()


@pytest.mark.parametrize("kind", ["file", "symlink"])
def test_an_instance_entry_that_is_not_a_directory_is_left_alone(tmp_path: Path, kind: str) -> None:
    root = tmp_path / "out" / "instances"
    root.mkdir(parents=True)
    (root / ".hosts.tmp-5").write_text("torn")
    real = root / "a"
    real.mkdir()
    (real / ".hosts.tmp-5").write_text("torn")
    (real / "config.json").write_text("{}")
    (real / ".hidden-not-temp").write_text("kept")
    other = tmp_path / "other"
    other.mkdir()
    (other / ".x.tmp-1").write_text("not ours")
    if kind == "symlink":
        (root / "b").symlink_to(other)
    else:
        (root / "b").write_text("a file")
    assert remove_stale_temp_files(tmp_path, "out/instances", subdirs=True) == 2
    assert sorted(p.name for p in real.iterdir()) == [".hidden-not-temp", "config.json"]
    assert (other / ".x.tmp-1").exists()


def test_a_verifying_run_walks_the_instance_directories_only_after_a_writer_died(
    demo_copy: Path,
) -> None:
    """A batch of instance files is written between the marker's creation and its removal: a
    finished run leaves no marker, and the next verifying run does not open every instance
    directory (a temp file put there by hand, with no writer dead, is left); a marker left by a
    writer that died mid-batch makes it sweep them all, then removes the marker."""
    opts = ReconcileOptions(configs=default_config_builder())
    reconcile(demo_copy, opts)
    root = demo_copy / "out" / "instances"
    assert not (root / WRITING).exists()
    some = next(p for p in root.iterdir() if p.is_dir())
    by_hand = some / ".config.json.tmp-424242"
    by_hand.write_text("not a dead writer's")
    reconcile(demo_copy, opts)
    assert by_hand.exists()
    (root / WRITING).write_text("")
    reconcile(demo_copy, opts)
    assert not by_hand.exists() and not (root / WRITING).exists()
