"""write_instance_outputs interrupted at every system call that can fail (SPEC §2, §11): each
file is old or new, never torn; a config never names a hosts file that is not there; the next
call converges to exactly what an uninterrupted one leaves, and the one after writes nothing."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from reconciler.io import fsio
from reconciler.oci import writer as oci_writer
from reconciler.oci.builder import BuiltConfig
from reconciler.oci.writer import WriteMemo, write_instance_outputs
from tests.support.faults import FailAt
from tests.support.oci import built_configs, expected_files


def _files(state: Path) -> dict[str, bytes]:
    """The instance files (not the manifest, nor the marker a failed batch leaves behind for
    the next verifying run's sweep: checked in ``_check``)."""
    root = state / "out" / "instances"
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in (oci_writer.MANIFEST, oci_writer.WRITING)
    }


@pytest.fixture
def before(tmp_path: Path) -> tuple[Path, dict[str, BuiltConfig], dict[str, BuiltConfig]]:
    """out/instances with 4 instances; the next set: 2 of them changed (a config, a hosts
    file), 1 the same, 1 gone, and 3 new ones."""
    old = built_configs(4)
    state = tmp_path / "before"
    state.mkdir()
    write_instance_outputs(state, old)
    ids = sorted(old)
    new = dict(built_configs(7, "x"))
    new[ids[0]] = BuiltConfig.of(old[ids[0]].config, "changed hosts\n")
    new[ids[1]] = old[ids[1]]
    del new[ids[3]]
    return state, old, new


def _check(state: Path, old: dict[str, BuiltConfig], new: dict[str, BuiltConfig]) -> None:
    got = _files(state)
    was, will = expected_files(old), expected_files(new)
    for rel, data in got.items():
        assert data in (was.get(rel), will.get(rel)), rel
    for iid in set(old) | set(new):
        if f"{iid}/config.json" in got:
            assert f"{iid}/hosts" in got, iid  # never a config without its hosts file
            if (
                got[f"{iid}/config.json"]
                == will.get(f"{iid}/config.json")
                != was.get(f"{iid}/config.json")
            ):
                assert got[f"{iid}/hosts"] == will[f"{iid}/hosts"], iid
    root = state / "out" / "instances"
    temps = [p for p in root.rglob("*") if ".tmp-" in p.name]
    # a batch that failed leaves its temp files to the sweep, and the marker that asks for it
    assert not temps or (root / oci_writer.WRITING).is_file(), temps
    oci_writer.sweep_instance_temps(state)
    assert not [p for p in root.rglob("*") if ".tmp-" in p.name]
    assert not (root / oci_writer.WRITING).exists()


@pytest.mark.parametrize(
    "target",
    [(os, "mkdir"), (os, "open"), (os, "write"), (os, "replace"), (fsio, "_sync_filesystem_of")],
    ids=["mkdir", "open", "write", "replace", "syncfs"],
)
@pytest.mark.parametrize("with_memo", [False, True])
def test_a_failure_at_each_call_leaves_old_or_new(
    before: tuple[Path, dict[str, BuiltConfig], dict[str, BuiltConfig]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    target: tuple[Any, str],
    with_memo: bool,
) -> None:
    base, old, new = before

    def run(k: int) -> tuple[Path, WriteMemo | None, FailAt]:
        """A copy of ``before`` given ``new``, the ``k``-th call of ``target`` failing."""
        state = tmp_path / f"k{k}"
        shutil.copytree(base, state)
        memo = WriteMemo() if with_memo else None
        if memo is not None:
            write_instance_outputs(state, old, memo=memo)  # the memo knows the directory
        fault = FailAt(k, OSError(28, "No space left on device"))
        monkeypatch.setattr(*target, fault.wrap(getattr(*target)))
        try:
            write_instance_outputs(state, new, memo=memo, verify=False)
        except OSError as e:
            assert e is fault.error
            if memo is not None:
                assert len(memo) == 0  # a failed call leaves the memo empty
        finally:
            monkeypatch.undo()
        return state, memo, fault

    _, _, counted = run(0)  # uninterrupted: how many calls there are
    assert counted.calls > 1
    for k in range(1, counted.calls + 1):
        state, memo, _fault = run(k)
        _check(state, old, new)
        write_instance_outputs(state, new, memo=memo, verify=False)
        assert _files(state) == expected_files(new)
        assert write_instance_outputs(state, new).written == ()


@pytest.mark.parametrize(
    "target",
    [(os, "mkdir"), (os, "open"), (os, "write"), (os, "rename"), (fsio, "_sync_filesystem_of")],
    ids=["mkdir", "open", "write", "rename", "syncfs"],
)
def test_a_first_run_interrupted_leaves_no_instances_directory_or_all_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: tuple[Any, str]
) -> None:
    """A first run (no out/instances) makes the directory whole, in one rename: a failure at
    any call leaves none of it or all of it, never some instances; the next call converges."""
    new = built_configs(5)

    def run(k: int) -> tuple[Path, FailAt]:
        state = tmp_path / f"k{k}"
        state.mkdir()
        fault = FailAt(k, OSError(28, "No space left on device"))
        monkeypatch.setattr(*target, fault.wrap(getattr(*target)))
        try:
            write_instance_outputs(state, new)
        except OSError as e:
            assert e is fault.error
        finally:
            monkeypatch.undo()
        return state, fault

    _, counted = run(0)
    assert counted.calls >= 1  # (one rename: the tree's)
    for k in range(1, counted.calls + 1):
        state, _fault = run(k)
        root = state / "out" / "instances"
        if root.exists():
            assert _files(state) == expected_files(new), k
        # a writer that failed (not killed) removes its own temp tree
        assert [p.name for p in state.rglob("*") if ".tmp-" in p.name] == []
        write_instance_outputs(state, new)
        assert _files(state) == expected_files(new)
        assert write_instance_outputs(state, new).written == ()


def test_a_first_run_renames_once_not_per_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What makes a first run cheap: its files are created under their final names in a temp
    tree renamed once; the next run's changes go through the per-file batch."""
    renames: list[str] = []
    real_rename, real_replace = os.rename, os.replace

    def rename(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        renames.append(str(dst))
        real_rename(src, dst, *args, **kwargs)

    def replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
        renames.append(str(dst))
        real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(os, "replace", replace)
    built = built_configs(20)
    write_instance_outputs(tmp_path, built)
    root = tmp_path / "out" / "instances"
    assert renames == [str(root), str(root / oci_writer.MANIFEST)]
    assert _files(tmp_path) == expected_files(built)
    # the manifest describes what was written: the next run reads no file and writes none
    assert write_instance_outputs(tmp_path, built).written == ()
    renames.clear()
    changed = dict(built)
    one = sorted(built)[0]
    changed[one] = BuiltConfig.of(built[one].config, "other hosts\n")
    assert write_instance_outputs(tmp_path, changed).written == (f"instances/{one}/hosts",)
    assert renames == [str(root / one / "hosts"), str(root / oci_writer.MANIFEST)]


def test_a_killed_first_runs_temp_tree_is_swept_and_never_followed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / ".instances.tmp-4242" / "i-1").mkdir(parents=True)
    (out / ".instances.tmp-4242" / "i-1" / "config.json").write_text("{}")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("mine")
    (out / ".instances.tmp-4243").symlink_to(elsewhere)
    # this process's own pid: a killed writer that had it (pids are reused)
    (out / f".instances.tmp-{os.getpid()}" / "x").mkdir(parents=True)
    built = built_configs(3)
    write_instance_outputs(tmp_path, built)  # removes the one it would have used
    assert not (out / f".instances.tmp-{os.getpid()}").exists()
    assert _files(tmp_path) == expected_files(built)
    assert oci_writer.sweep_instance_temps(tmp_path) == 1
    assert sorted(p.name for p in out.iterdir()) == [".instances.tmp-4243", "instances"]
    assert (elsewhere / "keep").read_text() == "mine"
