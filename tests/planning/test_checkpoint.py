"""The allocation checkpoint (SPEC §9): format, recovery, crash safety, restarts."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import reconciler.io.checkpoint_files as checkpoint_module
from reconciler.cli.commands import main
from reconciler.controller.reconcile import ReconcileOptions, compute_once, reconcile
from reconciler.io.checkpoint_files import (
    CURRENT,
    PREVIOUS,
    load_checkpoint,
    save_checkpoint,
)
from reconciler.io.loader import load_state
from reconciler.model.documents import Node
from reconciler.model.values import instance_id
from reconciler.placement.instances import BalanceResult
from reconciler.planning.checkpoint import (
    GID_RANGE,
    Checkpoint,
    assign_ids,
    canonical,
    decode_checkpoint,
    encode_checkpoint,
)
from tests.support.agent_sim import apply_all
from tests.support.faults import FailAt
from tests.support.observability import without_made_time
from tests.support.plans import placement as plan_placement


def reconciled(state: Path) -> Checkpoint:
    reconcile(state)
    view, _ = load_state(state)
    return load_checkpoint(state / "checkpoint", view.actual).checkpoint


class TestFormat:
    def test_envelope_and_checksum_of_canonical_data(self, demo_copy: Path) -> None:
        reconcile(demo_copy)
        raw = (demo_copy / "checkpoint" / CURRENT).read_bytes()
        env = json.loads(raw)
        assert set(env) == {"formatVersion", "lineage", "generation", "data", "checksum"}
        # independent computation of the checksum over sorted keys without spaces
        body = json.dumps(env["data"], sort_keys=True, separators=(",", ":")).encode()
        assert env["checksum"] == "sha256:" + hashlib.sha256(body).hexdigest()
        inst = next(iter(env["data"]["instances"].values()))
        assert {"itemId", "version", "nodeId", "runtimeId", "reserved", "uid", "gid"} <= set(inst)

    def test_uids_and_gids_come_from_5000_to_9999(self, demo_copy: Path) -> None:
        cp = reconciled(demo_copy)
        assert cp.allocations
        for a in cp.allocations.values():
            assert 5000 <= a.uid <= 9999 and 5000 <= a.gid <= 9999
        by_item: dict[str, set[int]] = {}
        for a in cp.allocations.values():
            by_item.setdefault(a.item_id, set()).add(a.gid)
        assert all(len(g) == 1 for g in by_item.values())  # one gid per item
        assert len({g for gs in by_item.values() for g in gs}) == len(by_item)
        per_node: dict[str, list[int]] = {}
        for a in cp.allocations.values():
            per_node.setdefault(a.node_id, []).append(a.uid)
        assert all(len(u) == len(set(u)) for u in per_node.values())

    def test_uid_is_kept_across_versions(self, demo_copy: Path) -> None:
        before = reconciled(demo_copy)
        svc = demo_copy / "desired" / "apps" / "logger.yaml"
        svc.write_text(svc.read_text().replace("version: 1.0.0", "version: 1.1.0"))
        after = reconciled(demo_copy)
        logger = {i: a for i, a in after.allocations.items() if a.item_id == "com.example.logger"}
        assert logger and all(a.version == "1.1.0" for a in logger.values())
        assert all(before.allocations[i].uid == a.uid for i, a in logger.items())
        assert after.generation == before.generation + 1


class TestRestart:
    def test_restart_with_unchanged_inputs_changes_nothing(self, demo_copy: Path) -> None:
        first = reconciled(demo_copy)
        assert apply_all(demo_copy) > 0  # the agents start everything
        second = reconciled(demo_copy)
        files = {p: p.read_bytes() for p in demo_copy.rglob("*") if p.is_file()}
        mtimes = {p: p.stat().st_mtime_ns for p in files}
        # a "restart": a new computation from the files alone
        c = compute_once(demo_copy, ReconcileOptions(), read_only=True)
        assert not c.plan.changes_present
        assert {
            i: (a.node_id, a.runtime_id, a.devices, a.uid) for i, a in first.allocations.items()
        } == {i: (a.node_id, a.runtime_id, a.devices, a.uid) for i, a in second.allocations.items()}
        report = reconcile(demo_copy)
        assert report.written == () and not report.checkpoint_written
        assert {p: p.read_bytes() for p in files} == files
        assert {p: p.stat().st_mtime_ns for p in files} == mtimes

    def test_device_ids_are_sticky_across_a_restart(self, demo_copy: Path) -> None:
        first = reconciled(demo_copy)
        apply_all(demo_copy)
        # npu0 turns unhealthy: its holder keeps it and is flagged
        node = demo_copy / "nodes" / "edge-2.yaml"
        node.write_text(node.read_text().replace("- {id: npu0}", "- {id: npu0, healthy: false}"))
        c = compute_once(demo_copy, ReconcileOptions(), read_only=True)
        vision = next(p for p in c.result.placements if p.item_id == "com.example.vision")
        assert vision.devices == first.allocations[vision.instance_id].devices
        assert vision.unhealthy_devices == ("npu0",)
        assert not c.plan.changes_present

    def test_a_vanished_device_invalidates_its_allocation(self, demo_copy: Path) -> None:
        reconciled(demo_copy)
        apply_all(demo_copy)
        node = demo_copy / "nodes" / "edge-2.yaml"
        node.write_text(node.read_text().replace("      - {id: npu0}\n", ""))
        c = compute_once(demo_copy, ReconcileOptions(), read_only=True)
        vision = next(p for p in c.result.placements if p.item_id == "com.example.vision")
        assert vision.devices == (("example.com/npu", ("npu1",)),)
        reasons = {(a.action, a.reason) for a in c.plan.actions}
        assert reasons == {("stop", "moved"), ("start", "moved")}

    def test_a_fresh_process_sees_the_same_placements_and_an_empty_plan(
        self, demo_copy: Path
    ) -> None:
        """A real restart: a new interpreter that knows only the files."""
        assert main(["reconcile", "--state", str(demo_copy)]) == 0  # with the OCI configs
        apply_all(demo_copy)
        assert main(["reconcile", "--state", str(demo_copy)]) == 0
        status = json.loads((demo_copy / "out" / "status.json").read_text())
        proc = subprocess.run(
            [sys.executable, "-m", "reconciler", "plan", "--json", "--state", str(demo_copy)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr  # 0: no changes
        plan = json.loads(proc.stdout)
        assert plan["changesPresent"] is False and plan["actions"] == []
        # every patch is the revision test alone
        assert all(len(n["patch"]) == 1 for n in plan["nodes"].values())
        proc = subprocess.run(
            [sys.executable, "-m", "reconciler", "reconcile", "--json", "--state", str(demo_copy)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        report = json.loads(proc.stdout)
        assert report["written"] == [] and report["checkpointWritten"] is False
        again = json.loads((demo_copy / "out" / "status.json").read_text())
        keys = ("nodeId", "runtimeId", "devices", "uid", "gid")
        assert {i: [r[k] for k in keys] for i, r in again["instances"].items()} == {
            i: [r[k] for k in keys] for i, r in status["instances"].items()
        }


NPU_USER = """\
apiVersion: reconciler/v1
kind: Service
id: com.example.npu
version: 1.0.0
instances: 2
image:
  rootfs: rootfs/busybox
  cmd: [/bin/sh, -c, "sleep 1000"]
devices:
  - {resource: example.com/npu, count: 1}
"""


class TestDeviceHealth:
    """SPEC §6.3 on the demo: edge-2's exclusive pool example.com/npu holds npu0 and npu1
    (healthy) and npu2 (unhealthy); vision asks for one npu and is the only device user, so it
    is given the smallest free healthy id, npu0."""

    def _vision(self, state: Path) -> tuple[str, dict[str, Any]]:
        doc = json.loads((state / "out" / "status.json").read_text())
        return next((i, r) for i, r in doc["instances"].items() if r["itemId"].endswith("vision"))

    def test_unhealthy_device_stays_with_its_holder_is_flagged_and_not_given_out(
        self, demo_copy: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        reconcile(demo_copy)
        apply_all(demo_copy)
        vision_id, rec = self._vision(demo_copy)
        assert rec["devices"] == {"example.com/npu": ["npu0"]} and "unhealthyDevices" not in rec
        node = demo_copy / "nodes" / "edge-2.yaml"
        node.write_text(node.read_text().replace("- {id: npu0}", "- {id: npu0, healthy: false}"))
        # a new service asks for one npu per instance: npu1 is the only healthy free device;
        # npu0 (held, unhealthy) and npu2 (free, unhealthy) must not be given
        (demo_copy / "desired" / "npu.yaml").write_text(NPU_USER)
        report = reconcile(demo_copy)

        status = json.loads((demo_copy / "out" / "status.json").read_text())
        vision = status["instances"][vision_id]
        assert vision["nodeId"] == "edge-2"
        assert vision["devices"] == {"example.com/npu": ["npu0"]}
        assert vision["unhealthyDevices"] == ["npu0"]
        new0 = status["instances"][instance_id("com.example.npu", "default", 0)]
        assert (new0["nodeId"], new0["devices"]) == ("edge-2", {"example.com/npu": ["npu1"]})
        assert "unhealthyDevices" not in new0
        [failure] = status["failures"]
        assert failure["instanceId"] == instance_id("com.example.npu", "default", 1)
        assert failure["reason"] == "Devices"
        # edge-1 and edge-3 have no npu pool, edge-2 has no healthy free npu left
        assert failure["summary"] == "com.example.npu:default:1: 0/3 nodes feasible: 3 Devices"
        pool = status["nodes"]["edge-2"]["devices"]["example.com/npu"]
        assert (pool["total"], pool["healthy"], pool["allocated"]) == (3, 1, 2)
        # vision is not restarted; only the new instance starts
        assert [(a.action, a.item_id, a.index) for a in report.plan.actions] == [
            ("start", "com.example.npu", 0)
        ]
        cp = load_checkpoint(demo_copy / "checkpoint", {}).checkpoint
        assert cp.allocations[vision_id].devices == (("example.com/npu", ("npu0",)),)
        # and `reconciler status` shows the flag
        assert main(["status", "--state", str(demo_copy), "--json"]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown["instances"][vision_id]["unhealthyDevices"] == ["npu0"]

    def test_a_removed_device_moves_its_holder_to_another_free_device(
        self, demo_copy: Path
    ) -> None:
        reconcile(demo_copy)
        apply_all(demo_copy)
        vision_id, _ = self._vision(demo_copy)
        node = demo_copy / "nodes" / "edge-2.yaml"
        node.write_text(node.read_text().replace("      - {id: npu0}\n", ""))
        report = reconcile(demo_copy)
        # npu1 is the only healthy device left; same node (only edge-2 has a camera)
        assert [(a.action, a.instance_id, a.node_id, a.reason) for a in report.plan.actions] == [
            ("stop", vision_id, "edge-2", "moved"),
            ("start", vision_id, "edge-2", "moved"),
        ]
        ops = json.loads((demo_copy / "out" / "nodes" / "edge-2.json").read_text())
        assert ops[1] == {"op": "remove", "path": f"/instances/{vision_id}"}
        assert ops[2]["path"] == f"/instances/{vision_id}"
        assert ops[2]["value"]["devices"] == {"example.com/npu": ["npu1"]}
        cp = load_checkpoint(demo_copy / "checkpoint", {}).checkpoint
        assert cp.allocations[vision_id].devices == (("example.com/npu", ("npu1",)),)

    def test_a_removed_device_with_no_healthy_replacement_fails_its_holder(
        self, demo_copy: Path
    ) -> None:
        reconcile(demo_copy)
        apply_all(demo_copy)
        vision_id, _ = self._vision(demo_copy)
        node = demo_copy / "nodes" / "edge-2.yaml"
        text = node.read_text().replace("      - {id: npu0}\n", "")
        node.write_text(text.replace("- {id: npu1}", "- {id: npu1, healthy: false}"))
        report = reconcile(demo_copy)
        [failure] = report.plan.failures
        assert failure.instance_id == vision_id and failure.reason == "Devices"
        # edge-1 and edge-3 have no camera (Resources); edge-2 has no healthy npu (Devices)
        assert failure.summary == (
            "com.example.vision:default:0: 0/3 nodes feasible: 2 Resources, 1 Devices"
        )
        assert [(a.action, a.instance_id, a.node_id) for a in report.plan.actions] == [
            ("stop", vision_id, "edge-2")
        ]
        cp = load_checkpoint(demo_copy / "checkpoint", {}).checkpoint
        assert vision_id not in cp.allocations  # the allocation holding npu0 is gone
        status = json.loads((demo_copy / "out" / "status.json").read_text())
        assert vision_id not in status["instances"]
        assert [f["reason"] for f in status["failures"]] == ["Devices"]


def corrupt_variants(good: bytes, other_lineage: bytes) -> dict[str, bytes]:
    env = json.loads(good)
    flipped = bytearray(good)
    pos = good.index(b'"nodeId"') + 11  # a byte inside the data
    flipped[pos] ^= 0x01
    wrong_sum = dict(env, checksum="sha256:" + "0" * 64)
    future = dict(env, formatVersion=99)
    return {
        "empty": b"",
        "truncated": good[: len(good) // 2],
        "flipped-byte": bytes(flipped),
        "wrong-checksum": canonical(wrong_sum),
        "future-format": canonical(future),
        "other-lineage": other_lineage,
    }


class TestRecovery:
    @pytest.fixture
    def two_generations(self, demo_copy: Path) -> tuple[Path, Checkpoint, Checkpoint]:
        first = reconciled(demo_copy)
        svc = demo_copy / "desired" / "apps" / "logger.yaml"
        svc.write_text(svc.read_text().replace("instances: 3", "instances: 2"))
        second = reconciled(demo_copy)
        assert second.generation == first.generation + 1
        assert (demo_copy / "checkpoint" / PREVIOUS).exists()
        return demo_copy, first, second

    @pytest.mark.parametrize(
        "variant",
        ["empty", "truncated", "flipped-byte", "wrong-checksum", "future-format", "other-lineage"],
    )
    def test_corrupt_current_is_quarantined_and_previous_used(
        self, two_generations: tuple[Path, Checkpoint, Checkpoint], variant: str, tmp_path: Path
    ) -> None:
        state, first, _ = two_generations
        cpdir = state / "checkpoint"
        foreign = Checkpoint("another-lineage", 7, first.allocations, first.gids)
        bad = corrupt_variants((cpdir / CURRENT).read_bytes(), encode_checkpoint(foreign))[variant]
        (cpdir / CURRENT).write_bytes(bad)
        view, _ = load_state(state)
        report = load_checkpoint(cpdir, view.actual)
        assert report.source == "previous"
        assert report.checkpoint.allocations == first.allocations
        assert report.checkpoint.generation == first.generation
        quarantined = list((cpdir / "quarantine").iterdir())
        assert len(quarantined) == 1 and quarantined[0].read_bytes() == bad
        assert report.problems and "quarantine" in report.problems[0]

    def test_the_bytes_loaded_are_kept_as_the_previous_generation_without_a_second_read(
        self, two_generations: tuple[Path, Checkpoint, Checkpoint], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        state, _, second = two_generations
        cpdir = state / "checkpoint"
        on_disk = (cpdir / CURRENT).read_bytes()
        view, _ = load_state(state)
        report = load_checkpoint(cpdir, view.actual)
        assert report.source == "current" and report.current == on_disk
        reads: list[Path] = []
        real_read = checkpoint_module._read

        def counted(path: Path) -> bytes | None:
            reads.append(path)
            return real_read(path)

        monkeypatch.setattr(checkpoint_module, "_read", counted)
        third = replace(second, generation=second.generation + 1)
        save_checkpoint(cpdir, third, current=report.current)
        assert (cpdir / PREVIOUS).read_bytes() == on_disk
        assert (cpdir / CURRENT).read_bytes() == encode_checkpoint(third)
        assert cpdir / CURRENT not in reads
        (cpdir / CURRENT).write_bytes(b"")  # a bad current: loaded from previous, no bytes
        assert load_checkpoint(cpdir, view.actual).current is None

    def test_both_corrupt_rebuilds_from_actual_with_its_device_ids(self, demo_copy: Path) -> None:
        reconciled(demo_copy)
        apply_all(demo_copy)
        # the agents report vision holding npu1 (say, from an older controller run)
        actual = demo_copy / "actual" / "edge-2.yaml"
        doc = json.loads(actual.read_text())
        vision_id = next(i for i, r in doc["instances"].items() if r["itemId"].endswith("vision"))
        doc["instances"][vision_id]["devices"] = {"example.com/npu": ["npu1"]}
        actual.write_text(json.dumps(doc))
        svc = demo_copy / "desired" / "apps" / "logger.yaml"
        svc.write_text(svc.read_text().replace("instances: 3", "instances: 2"))
        reconciled(demo_copy)
        cpdir = demo_copy / "checkpoint"
        (cpdir / CURRENT).write_bytes(b"garbage")
        (cpdir / PREVIOUS).write_bytes(b"")
        view, _ = load_state(demo_copy)
        report = load_checkpoint(cpdir, view.actual)
        assert report.source == "actual"
        assert report.checkpoint.allocations[vision_id].devices == (("example.com/npu", ("npu1",)),)
        assert len(list((cpdir / "quarantine").iterdir())) == 2
        # and the balancer keeps those ids
        c = compute_once(demo_copy, ReconcileOptions(), read_only=True)
        assert c.result.by_id[vision_id].devices == (("example.com/npu", ("npu1",)),)

    def test_a_bad_checkpoint_is_never_read_as_nothing_allocated(self, demo_copy: Path) -> None:
        reconciled(demo_copy)
        apply_all(demo_copy)
        cpdir = demo_copy / "checkpoint"
        for name in (CURRENT, PREVIOUS):
            if (cpdir / name).exists():
                (cpdir / name).write_bytes(b"{")
        c = compute_once(demo_copy, ReconcileOptions(), read_only=True)
        assert c.loaded.source == "actual" and c.loaded.checkpoint.allocations
        assert not c.plan.changes_present  # nothing is restarted


class Boom(Exception):
    pass


STEPS = ["open", "write", "fsync", "rename", "fsync-dir"]
LINK_STEPS = ["link", "rename", "fsync-dir"]


class TestCrashPoints:
    def _setup(self, tmp_path: Path) -> tuple[Path, Checkpoint, Checkpoint]:
        cpdir = tmp_path / "checkpoint"
        old = Checkpoint("L", 1, {}, {"a": 5000})
        new = Checkpoint("L", 2, {}, {"a": 5000, "b": 5001})
        save_checkpoint(cpdir, old)
        return cpdir, old, new

    # Saving over an existing generation keeps the current file as allocations.prev.json by a
    # hard link renamed into place (calls 1-3: link, rename, fsync-dir), then replaces
    # allocations.json by an atomic write (calls 4-8: open, write, fsync, rename, fsync-dir),
    # each reported to the hook just before the step. The new checkpoint is in place once the
    # rename of call 7 happened, so from call 8 on.
    @pytest.mark.parametrize("crash_at", range(1, 10))
    def test_interrupted_write_leaves_exactly_old_or_new(
        self, tmp_path: Path, crash_at: int
    ) -> None:
        cpdir, old, new = self._setup(tmp_path)
        old_bytes = (cpdir / CURRENT).read_bytes()
        seen: list[str] = []

        def hook(name: str) -> None:
            seen.append(name)
            if len(seen) == crash_at:
                raise Boom(name)

        if crash_at <= 8:
            with pytest.raises(Boom):
                save_checkpoint(cpdir, new, hook=hook)
        else:
            save_checkpoint(cpdir, new, hook=hook)
        assert seen == (LINK_STEPS + STEPS)[: min(crash_at, 8)]
        expected = new if crash_at >= 8 else old
        assert (cpdir / CURRENT).read_bytes() == encode_checkpoint(expected)
        if crash_at < 8:
            assert (cpdir / CURRENT).read_bytes() == old_bytes
        report = load_checkpoint(cpdir, {}, quarantine=False)
        assert report.source == "current" and not report.problems
        assert report.checkpoint == expected
        assert not [p for p in cpdir.iterdir() if p.name.startswith(".")]  # no temp left
        if (cpdir / PREVIOUS).exists():  # kept before the current one is replaced
            assert (cpdir / PREVIOUS).read_bytes() == old_bytes

    def test_previous_generation_is_the_old_file_itself_or_a_copy_without_hard_links(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        cpdir, _old, new = self._setup(tmp_path)
        old_stat = (cpdir / CURRENT).stat()
        old_bytes = (cpdir / CURRENT).read_bytes()
        save_checkpoint(cpdir, new)
        assert (cpdir / PREVIOUS).read_bytes() == old_bytes
        assert (cpdir / PREVIOUS).stat().st_ino == old_stat.st_ino  # linked, not rewritten
        assert (cpdir / CURRENT).stat().st_ino != old_stat.st_ino

        def no_links(*_args: object, **_kwargs: object) -> None:
            raise OSError(1, "Operation not permitted")

        monkeypatch.setattr(os, "link", no_links)
        newer = replace(new, generation=3)
        current_bytes = (cpdir / CURRENT).read_bytes()
        save_checkpoint(cpdir, newer)
        assert (cpdir / PREVIOUS).read_bytes() == current_bytes
        assert load_checkpoint(cpdir, {}, quarantine=False).checkpoint == newer
        assert not [p for p in cpdir.iterdir() if p.name.startswith(".")]

    # os.fsync calls of that save: 1 the directory after the prev link, 2 the current file,
    # 3 its directory
    @pytest.mark.parametrize("failing", [1, 2, 3])
    def test_a_failing_fsync_ends_the_write_old_file_until_the_rename(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: int
    ) -> None:
        cpdir, old, new = self._setup(tmp_path)
        real = os.fsync
        calls = 0

        def broken_fsync(fd: int) -> None:
            nonlocal calls
            calls += 1
            if calls == failing:
                raise OSError(5, "Input/output error")
            real(fd)

        monkeypatch.setattr(os, "fsync", broken_fsync)
        with pytest.raises(OSError, match="Input/output error"):
            save_checkpoint(cpdir, new)
        monkeypatch.undo()
        assert calls == failing  # never retried: the first failure ends the write
        expected = new if failing == 3 else old
        assert load_checkpoint(cpdir, {}, quarantine=False).checkpoint == expected
        assert decode_checkpoint((cpdir / CURRENT).read_bytes(), "L") == expected
        assert not [p for p in cpdir.iterdir() if p.name.startswith(".")]

    @pytest.mark.parametrize("target", [PREVIOUS, CURRENT])
    def test_failing_rename_keeps_the_old_file(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str
    ) -> None:
        cpdir, old, new = self._setup(tmp_path)
        real = os.replace

        def broken_replace(src: str | Path, dst: str | Path) -> None:
            if Path(dst).name == target:
                raise OSError(28, "No space left on device")
            real(src, dst)

        monkeypatch.setattr(os, "replace", broken_replace)
        with pytest.raises(OSError, match="No space left"):
            save_checkpoint(cpdir, new)
        monkeypatch.undo()
        assert load_checkpoint(cpdir, {}, quarantine=False).checkpoint == old
        assert decode_checkpoint((cpdir / CURRENT).read_bytes(), "L") == old
        assert not [p for p in cpdir.iterdir() if p.name.startswith(".")]


def _clean_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _tree(root: Path) -> dict[str, bytes]:
    """Every file's bytes (the status page's without its time of making)."""
    return {
        str(p.relative_to(root)): (
            without_made_time(p.read_bytes()) if p.name == "status.html" else p.read_bytes()
        )
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


class TestCrashPointsOfAWholeReconcile:
    """Every write step of a real reconcile (last-good inputs, checkpoint, out/), interrupted
    one at a time by the write hook, a failing fsync (or syncfs) and a failing rename: the
    checkpoint reads back as exactly the old or the new one, and the next reconcile converges to
    exactly what an uninterrupted run leaves."""

    @pytest.fixture
    def scenario(self, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, int]:
        from tests.support.paths import DEMO

        base = tmp_path_factory.mktemp("crash") / "before"
        shutil.copytree(DEMO, base, ignore=shutil.ignore_patterns("out", "checkpoint", ".lock"))
        reconcile(base)  # generation 1
        svc = base / "desired" / "apps" / "logger.yaml"
        svc.write_text(svc.read_text().replace("instances: 3", "instances: 2"))
        reference = _clean_copy(base, base.parent / "reference")
        steps: list[str] = []
        report = reconcile(reference, ReconcileOptions(write_hook=steps.append))
        assert report.checkpoint_written and report.computed.checkpoint.generation == 2
        return base, reference, len(steps)

    def _check(self, state: Path, base: Path, reference: Path) -> None:
        cpdir = state / "checkpoint"
        current = (cpdir / CURRENT).read_bytes()
        old = (base / "checkpoint" / CURRENT).read_bytes()
        new = (reference / "checkpoint" / CURRENT).read_bytes()
        assert current in (old, new)
        lineage = (cpdir / "LINEAGE").read_text().strip()
        decode_checkpoint(current, lineage)
        report = load_checkpoint(cpdir, {}, quarantine=False)
        assert report.source == "current" and not report.problems
        # the next run converges to exactly the uninterrupted result, and a further one is idle
        again = reconcile(state)
        assert not again.problems
        assert _tree(state) == _tree(reference)
        idle = reconcile(state)
        assert idle.written == () and not idle.checkpoint_written

    def test_the_hook_sees_every_write_step(self, scenario: tuple[Path, Path, int]) -> None:
        _, _, n = scenario
        # one commit: the last-good inputs, allocations.prev.json (a hard link),
        # allocations.json, the configs, the node patches and the plan made visible at its
        # first flush; the status report at its second: five steps each (open, write, fsync,
        # rename, fsync-dir)
        assert n == 10

    def test_hook_interrupts_each_step(
        self, scenario: tuple[Path, Path, int], tmp_path: Path
    ) -> None:
        base, reference, n = scenario
        for k in range(1, n + 1):
            state = _clean_copy(base, tmp_path / f"k{k}")
            fault = FailAt(k, Boom(k))
            with pytest.raises(Boom):
                reconcile(state, ReconcileOptions(write_hook=fault.wrap(lambda _step: None)))
            self._check(state, base, reference)

    def _fail_each_call(
        self,
        scenario: tuple[Path, Path, int],
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        error: OSError,
        patch: Callable[[FailAt], None],
    ) -> int:
        """Fail the k-th call that ``patch`` routes through a FailAt, for k = 1, 2, ... until a
        run completes; after each failure the state is checked. Returns that first k."""
        base, reference, _ = scenario
        k = 0
        while True:
            k += 1
            state = _clean_copy(base, tmp_path / f"k{k}")
            fault = FailAt(k, error)
            patch(fault)
            try:
                reconcile(state)
            except OSError as e:
                assert e is fault.error and fault.calls == k  # the first failure ends the run
            else:
                return k  # k is past the last such call of a run
            finally:
                monkeypatch.undo()
            self._check(state, base, reference)

    def test_failing_fsync_at_each_sync(
        self,
        scenario: tuple[Path, Path, int],
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        from reconciler.io import fsio

        def patch(fault: FailAt) -> None:
            monkeypatch.setattr(os, "fsync", fault.wrap(os.fsync))
            monkeypatch.setattr(fsio, "_sync_filesystem_of", fault.wrap(fsio._sync_filesystem_of))

        k = self._fail_each_call(
            scenario, tmp_path, monkeypatch, OSError(5, "Input/output error"), patch
        )
        assert k > 4  # the checkpoint's fsyncs and the batches' syncfs were all hit

    def test_failing_rename_at_each_rename(
        self,
        scenario: tuple[Path, Path, int],
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        def patch(fault: FailAt) -> None:
            monkeypatch.setattr(os, "replace", fault.wrap(os.replace))

        k = self._fail_each_call(
            scenario, tmp_path, monkeypatch, OSError(28, "No space left on device"), patch
        )
        assert k > 3


class TestUnderTheLock:
    """SPEC §14: every write of out/ and checkpoint/ happens under the flock on DIR/.lock."""

    def test_a_held_lock_keeps_reconcile_from_writing_anything(self, demo_copy: Path) -> None:
        from reconciler.io.lock import LockTimeout, StateLock

        before = sorted(p.name for p in demo_copy.iterdir())
        with StateLock(demo_copy):
            with pytest.raises(LockTimeout):
                reconcile(demo_copy, ReconcileOptions(lock_timeout=0.3))
            assert sorted(p.name for p in demo_copy.iterdir()) == sorted([*before, ".lock"])

    def test_reconcile_waits_for_the_holder_and_then_writes(self, demo_copy: Path) -> None:
        import threading

        from reconciler.io.lock import StateLock

        done = threading.Event()

        def work() -> None:
            reconcile(demo_copy)
            done.set()

        with StateLock(demo_copy):
            worker = threading.Thread(target=work)
            worker.start()
            assert not done.wait(0.5)  # blocked on the flock, writing nothing meanwhile
            assert not (demo_copy / "out").exists()
            assert not (demo_copy / "checkpoint").exists()
        worker.join(timeout=30)
        assert done.is_set() and (demo_copy / "checkpoint" / CURRENT).is_file()


def test_example_units_reconcile(tmp_path: Path) -> None:
    from tests.support.paths import EXAMPLES

    for example in EXAMPLES:
        dst = tmp_path / example.name
        shutil.copytree(example, dst)
        report = reconcile(dst)
        assert report.computed.checkpoint.allocations


class TestLastGoodAcrossProcesses:
    def test_a_broken_desired_file_stops_nothing_in_a_oneshot_run(self, demo_copy: Path) -> None:
        reconcile(demo_copy)
        apply_all(demo_copy)
        svc = demo_copy / "desired" / "telemetry.yaml"
        svc.write_text("apiVersion: reconciler/v1\nkind: Service\nid: [broken\n")
        # a new process knows nothing but the disk
        c = compute_once(demo_copy, ReconcileOptions(), read_only=True)
        assert not c.plan.changes_present
        assert any(d.path.endswith("telemetry.yaml") for d in c.diagnostics)
        assert {p.item_id for p in c.result.placements} >= {"com.example.telemetry"}
        report = reconcile(demo_copy)
        assert not report.plan.stops()

    def test_a_broken_node_keeps_its_instances(self, demo_copy: Path) -> None:
        reconcile(demo_copy)
        apply_all(demo_copy)
        node = demo_copy / "nodes" / "edge-2.yaml"
        node.write_bytes(node.read_bytes() + b"\x00")
        c = compute_once(demo_copy, ReconcileOptions(), read_only=True)
        assert not c.plan.changes_present and "edge-2" in c.view.nodes

    def test_a_deleted_file_is_forgotten(self, demo_copy: Path) -> None:
        reconcile(demo_copy)
        apply_all(demo_copy)
        (demo_copy / "desired" / "telemetry.yaml").unlink()
        reconcile(demo_copy)
        # recreated broken: it never had a good version since it was deleted
        (demo_copy / "desired" / "telemetry.yaml").write_text("kind: [")
        c = compute_once(demo_copy, ReconcileOptions(), read_only=True)
        assert "com.example.telemetry" not in {p.item_id for p in c.result.placements}

    def test_every_bundled_document_round_trips(self, tmp_path: Path) -> None:
        from reconciler.io.lastgood import LastGoodStore
        from tests.support.paths import DEMO, EXAMPLES

        for state in (DEMO, *EXAMPLES):
            view, diags = load_state(state)
            assert diags == []
            store = LastGoodStore(tmp_path / state.name)
            assert store.sync(view) == len(view.files)
            for rel, rec in view.files.items():
                expected = rec.good
                if isinstance(expected, Node) and expected.resourcesFile is not None:
                    # kept resolved: the resources inline, no file to read again
                    expected = expected.model_copy(update={"resourcesFile": None})
                assert store.get(rel) == expected, rel
            assert store.sync(view) == 0  # nothing rewritten


def _items(n: int) -> BalanceResult:
    """One instance of each of ``n`` items, 20 per node (in placement order)."""
    return BalanceResult(
        tuple(plan_placement(f"item-{k:05d}", 0, f"n{k // 20:04d}") for k in range(n)), ()
    )


def test_items_beyond_the_gid_space_fail_and_the_others_get_the_smallest_gids() -> None:
    allocations, gids, errors = assign_ids(_items(5003), {}, {})
    assert sorted(gids.values()) == list(GID_RANGE)  # the first 5,000 items, in item order
    assert gids["item-00000"] == GID_RANGE.start and gids["item-04999"] == GID_RANGE.stop - 1
    assert errors == [
        f"item-0500{k}: no free gid in {GID_RANGE.start}-{GID_RANGE.stop - 1}" for k in range(3)
    ]
    assert len(allocations) == 5000


def test_gids_cost_one_pass_over_their_space() -> None:
    """Twice the new items cost about twice the time (CPU time, two sizes in one run, a wide
    margin): a scan from the start of the space for each item was quadratic (4.7x here)."""

    def cpu(n: int) -> float:
        result = _items(n)
        best = float("inf")
        for _ in range(3):
            t0 = time.process_time()
            assign_ids(result, {}, {})
            best = min(best, time.process_time() - t0)
        return best

    small, big = cpu(2500), cpu(5000)
    assert big < 3 * small + 0.005, (small, big)
