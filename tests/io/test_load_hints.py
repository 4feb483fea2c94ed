"""A watcher's hint: a run loads only the files its events named, then stats every input.

``load_state(..., changed=paths)`` must give what the full pass gives whenever the hint names
every path the edits touched (files and directories, as the watcher reports them); a path only
a walk can resolve (a directory, a symlink) makes it the full pass. ``reconcile`` with a hint
stats every input after writing and runs again when the hint missed a change (SPEC §14: a lost
event never loses an edit)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import watchfiles
from hypothesis import example, given, settings

from reconciler.controller.reconcile import ReconcileOptions, reconcile
from reconciler.controller.watch import changed_inputs, changed_names
from reconciler.io.loader import Diagnostic, StateView, load_state
from tests.support.state_files import (
    ACTUAL,
    NODE,
    SERVICE,
    UNIT,
    edit_batches,
    seed_three,
    write,
)


def _projection(view: StateView, diags: list[Diagnostic]) -> dict[str, Any]:
    """Everything a load decides, without the stat keys (which only say when to read again)."""
    records = [
        (rel, r.sha256, r.deps_sha256, r.good, r.diagnostics, r.current, [d for d, _ in r.deps])
        for rel, r in view.files.items()
    ]
    return {
        "records": records,  # order included
        "unit": view.unit,
        "services": list(view.services.items()),
        "nodes": list(view.nodes.items()),
        "actual": list(view.actual.items()),
        "input_hash": view.input_hash,
        "diagnostics": diags,
    }


def _apply(root: Path, what: str, i: int, v: int) -> set[str]:
    """One edit; returns the paths (relative) a file watcher reports for it."""
    if what == "service":
        write(root, f"desired/s{i}.yaml", SERVICE.format(id=f"s{i}", version=f"1.{v}.0"))
        return {f"desired/s{i}.yaml"}
    if what == "broken":
        write(root, f"desired/s{i}.yaml", "kind: [oops\n")
        return {f"desired/s{i}.yaml"}
    if what == "delete":
        (root / f"desired/s{i}.yaml").unlink(missing_ok=True)
        return {f"desired/s{i}.yaml"}
    if what == "nested":  # a new team directory with a file in it
        created = not (root / f"desired/team{i}").exists()
        write(root, f"desired/team{i}/t{v}.yaml", SERVICE.format(id=f"t{i}x{v}", version="1.0.0"))
        return {f"desired/team{i}/t{v}.yaml"} | ({f"desired/team{i}"} if created else set())
    if what == "rmdir":  # a team directory moved away: one event, for the directory
        shutil.rmtree(root / f"desired/team{i}", ignore_errors=True)
        return {f"desired/team{i}"}
    if what == "node":
        text = NODE.format(id=f"n{i}").replace("1000", f"{1000 + v}")
        write(root, f"nodes/n{i}.yaml", text)
        return {f"nodes/n{i}.yaml"}
    if what == "actual":
        write(root, f"actual/n{i}.yaml", ACTUAL.format(id=f"n{i}", rev=v))
        return {f"actual/n{i}.yaml"}
    if what == "unit":
        write(root, "unit.yaml", UNIT.format(mode=["stable", "fresh", "stable"][v]))
        return {"unit.yaml"}
    if what == "unit-delete":
        (root / "unit.yaml").unlink(missing_ok=True)
        return {"unit.yaml"}
    if what == "hidden":  # an editor's temp file, or a file in a hidden directory
        write(root, f"desired/.h{i}.yaml", SERVICE.format(id=f"h{i}", version="1.0.0"))
        write(root, f"desired/.git/h{i}.yaml", SERVICE.format(id=f"g{i}", version="1.0.0"))
        return {f"desired/.h{i}.yaml", f"desired/.git/h{i}.yaml"}
    if what == "move-in":  # a directory of services moved in: one event, for the directory
        outside = root / ".staging" / f"m{i}"
        write(root, f".staging/m{i}/m{v}.yaml", SERVICE.format(id=f"m{i}x{v}", version="1.0.0"))
        target = root / f"desired/moved{i}"
        if target.exists():
            shutil.rmtree(target)
        outside.rename(target)
        return {f"desired/moved{i}"}
    if what == "notes":
        write(root, f"desired/notes{i}.txt", "not an input")
        return {f"desired/notes{i}.txt"}
    if what == "symlink":
        link = root / f"nodes/l{i}.yaml"
        if not link.is_symlink():
            link.symlink_to(f"n{v}.yaml")
        return {f"nodes/l{i}.yaml"}
    if what == "dir-symlink":  # the walk never follows a directory symlink: no input there
        write(root, f".staging/real/r{v}.yaml", SERVICE.format(id=f"r{v}", version="1.0.0"))
        link = root / f"desired/linked{i}"
        if not link.is_symlink():
            link.symlink_to(root / ".staging" / "real", target_is_directory=True)
        return {f"desired/linked{i}/r{v}.yaml"}
    assert what == "deep-actual"  # actual/ is not walked recursively: never an input
    created = not (root / "actual/sub").exists()
    write(root, f"actual/sub/n{i}.yaml", ACTUAL.format(id=f"n{i}", rev=v))
    return {f"actual/sub/n{i}.yaml"} | ({"actual/sub"} if created else set())


_KINDS = [
    "service",
    "broken",
    "delete",
    "nested",
    "rmdir",
    "node",
    "actual",
    "unit",
    "unit-delete",
    "hidden",
    "notes",
    "symlink",
    "deep-actual",
    "move-in",
    "dir-symlink",
]
_EDITS = edit_batches(_KINDS)


def _seed(root: Path) -> None:
    seed_three(root)


class TestHintedLoad:
    @given(batches=_EDITS)
    @example(batches=[[("nested", 0, 0)], [("rmdir", 0, 0)]])
    @example(batches=[[("deep-actual", 0, 0)], [("deep-actual", 0, 1)]])
    @example(batches=[[("move-in", 1, 0)], [("service", 1, 1)], [("move-in", 1, 1)]])
    @example(batches=[[("hidden", 0, 0)], [("symlink", 1, 0)], [("unit", 0, 1)]])
    @example(batches=[[("dir-symlink", 0, 0)], [("dir-symlink", 0, 1)]])
    @settings(max_examples=80, deadline=None)
    def test_a_complete_hint_gives_the_full_pass(
        self, batches: list[list[tuple[str, int, int]]]
    ) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            _seed(root)
            view, _ = load_state(root)
            for batch in batches:  # the edits of one debounced batch, then one run
                touched: set[str] = set()
                for what, i, v in batch:
                    touched |= _apply(root, what, i, v)
                hinted, hinted_diags = load_state(root, view, changed=touched)
                full, full_diags = load_state(root, view)
                assert _projection(hinted, hinted_diags) == _projection(full, full_diags)
                view = hinted  # the next batch starts from what the hinted run saw

    def test_files_outside_the_hint_are_not_looked_at(self, tmp_path: Path) -> None:
        _seed(tmp_path)
        view, _ = load_state(tmp_path)
        write(tmp_path, "desired/s0.yaml", SERVICE.format(id="s0", version="2.0.0"))
        write(tmp_path, "desired/s1.yaml", SERVICE.format(id="s1", version="2.0.0"))
        hinted, _ = load_state(tmp_path, view, changed={"desired/s0.yaml"})
        assert hinted.services[("s0", "default")].version == "2.0.0"
        assert hinted.services[("s1", "default")].version == "1.0.0"  # trusted: not stat'ed
        assert hinted.files["desired/s1.yaml"] is view.files["desired/s1.yaml"]
        full, _ = load_state(tmp_path, hinted)
        assert full.services[("s1", "default")].version == "2.0.0"

    def test_a_resources_file_is_checked_without_a_hint(self, tmp_path: Path) -> None:
        """A node's resourcesFile may live outside the watched directory: every hinted load
        checks the resources files nodes read."""
        _seed(tmp_path)
        res = tmp_path.parent / f"{tmp_path.name}-resources.json"
        res.write_text('[{"name": "gpu", "sharedCount": 1}]')
        write(
            tmp_path,
            "nodes/n0.yaml",
            NODE.format(id="n0") + f"resourcesFile: {res}\n",
        )
        view, diags = load_state(tmp_path)
        assert diags == []
        assert [r.name for r in view.nodes["n0"].resources or ()] == ["gpu"]
        res.write_text('[{"name": "gpu", "sharedCount": 1}, {"name": "can", "sharedCount": 2}]')
        st_ = res.stat()
        os.utime(res, ns=(st_.st_atime_ns, st_.st_mtime_ns + 1_000_000_000))
        hinted, _ = load_state(tmp_path, view, changed=set())
        assert [r.name for r in hinted.nodes["n0"].resources or ()] == ["gpu", "can"]


class TestReconcileWithAHint:
    def _edit(self, state: Path, rel: str, before: str, after: str) -> None:
        p = state / rel
        text = p.read_text()
        assert before in text
        p.write_text(text.replace(before, after))
        st_ = p.stat()
        os.utime(p, ns=(st_.st_atime_ns, st_.st_mtime_ns + 1_000_000_000))

    @pytest.mark.parametrize("recheck", [True, False])
    def test_a_complete_hint_is_one_pass(self, demo_copy: Path, recheck: bool) -> None:
        first = reconcile(demo_copy)
        self._edit(demo_copy, "desired/apps/logger.yaml", "instances: 3", "instances: 1")
        opts = ReconcileOptions(changed=frozenset({"desired/apps/logger.yaml"}), recheck=recheck)
        report = reconcile(demo_copy, opts, first.computed.view)
        assert report.passes == 1
        assert sum(1 for p in report.computed.result.placements if "logger" in p.item_id) == 1
        full, _ = load_state(demo_copy)
        assert report.computed.view.input_hash == full.input_hash

    @pytest.mark.parametrize("recheck", [True, False])
    def test_a_change_the_hint_missed_is_found_after_writing(
        self, demo_copy: Path, recheck: bool
    ) -> None:
        """The watcher lost the second file's event: the run stats every input after writing
        and runs again, whatever ``recheck`` says."""
        first = reconcile(demo_copy)
        self._edit(demo_copy, "desired/apps/logger.yaml", "instances: 3", "instances: 1")
        svc = next(
            p
            for p in sorted((demo_copy / "desired").rglob("*.yaml"))
            if "logger" not in p.name and "instances: 1\n" in p.read_text()
        )
        rel = svc.relative_to(demo_copy).as_posix()
        self._edit(demo_copy, rel, "instances: 1\n", "instances: 0\n")
        opts = ReconcileOptions(changed=frozenset({"desired/apps/logger.yaml"}), recheck=recheck)
        report = reconcile(demo_copy, opts, first.computed.view)
        assert report.passes == 2
        full, _ = load_state(demo_copy)
        assert report.computed.view.input_hash == full.input_hash
        gone = report.computed.view.files[rel].good
        assert gone is not None and getattr(gone, "instances", None) == 0


def test_changed_inputs_are_paths_relative_to_the_state_dir(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "desired").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere.yaml"
    elsewhere.write_text("x")
    link = state / "desired" / "link.yaml"
    link.symlink_to(elsewhere)  # named as the link, never as its target
    changes = {
        (watchfiles.Change.modified, str(state / "desired" / "a.yaml")),
        (watchfiles.Change.added, str(link)),
        (watchfiles.Change.deleted, str(state / "unit.yaml")),
        (watchfiles.Change.modified, str(elsewhere)),  # a resourcesFile outside: left out
        (watchfiles.Change.modified, str(state)),  # the directory itself: nothing to name
    }
    assert changed_inputs(state, changes) == {"desired/a.yaml", "desired/link.yaml", "unit.yaml"}


def test_a_file_created_and_gone_within_a_batch_is_not_named_in_the_log(tmp_path: Path) -> None:
    """``sed -i`` writes a temporary file beside the one it edits and renames it over it: the
    run's log line names the edited file, not the temporary one that no longer exists (unless
    it is all the batch holds)."""
    edited = tmp_path / "telemetry.yaml"
    edited.write_text("x")
    temp = tmp_path / "sedtY4paK"  # created, then renamed away: gone
    new = tmp_path / "huge.yaml"  # created and still there
    new.write_text("x")
    removed = tmp_path / "old.yaml"  # deleted, existed before the batch
    changes = {
        (watchfiles.Change.added, str(temp)),
        (watchfiles.Change.deleted, str(temp)),
        (watchfiles.Change.modified, str(edited)),
        (watchfiles.Change.added, str(new)),
        (watchfiles.Change.deleted, str(removed)),
    }
    assert changed_names(changes) == ["huge.yaml", "old.yaml", "telemetry.yaml"]
    only = {(watchfiles.Change.added, str(temp)), (watchfiles.Change.deleted, str(temp))}
    assert changed_names(only) == ["sedtY4paK"]
