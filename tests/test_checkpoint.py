"""The allocation checkpoint (SPEC §9): format, recovery, crash safety, restarts."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from reconciler.checkpoint import (
    CURRENT,
    PREVIOUS,
    Checkpoint,
    canonical,
    decode_checkpoint,
    encode_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from reconciler.loader import load_state
from reconciler.models import Node
from reconciler.reconcile import ReconcileOptions, compute_once, reconcile

from .agent_sim import apply_all


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


class TestCrashPoints:
    def _setup(self, tmp_path: Path) -> tuple[Path, Checkpoint, Checkpoint]:
        cpdir = tmp_path / "checkpoint"
        old = Checkpoint("L", 1, {}, {"a": 5000})
        new = Checkpoint("L", 2, {}, {"a": 5000, "b": 5001})
        save_checkpoint(cpdir, old)
        return cpdir, old, new

    @pytest.mark.parametrize("step", STEPS)
    @pytest.mark.parametrize("nth", [1, 2, 3])
    def test_interrupted_write_leaves_old_or_new(self, tmp_path: Path, step: str, nth: int) -> None:
        cpdir, old, new = self._setup(tmp_path)
        seen: list[str] = []

        def hook(name: str) -> None:
            seen.append(name)
            if name == step and seen.count(step) == nth:
                raise Boom(step)

        with contextlib.suppress(Boom):
            save_checkpoint(cpdir, new, hook=hook)
        got = load_checkpoint(cpdir, {}, quarantine=False).checkpoint
        assert got in (old, new)
        assert not [p for p in cpdir.iterdir() if p.name.startswith(".")]  # no temp left
        decode_checkpoint((cpdir / CURRENT).read_bytes(), "L")  # never torn

    def test_failing_fsync_ends_the_write_and_keeps_the_old_file(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        cpdir, old, new = self._setup(tmp_path)

        def broken_fsync(fd: int) -> None:
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(os, "fsync", broken_fsync)
        with pytest.raises(OSError):
            save_checkpoint(cpdir, new)
        monkeypatch.undo()
        assert load_checkpoint(cpdir, {}, quarantine=False).checkpoint == old

    def test_failing_rename_keeps_the_old_file(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        cpdir, old, new = self._setup(tmp_path)
        real = os.replace

        def broken_replace(src: str | Path, dst: str | Path) -> None:
            if str(dst).endswith(CURRENT):
                raise OSError(28, "No space left on device")
            real(src, dst)

        monkeypatch.setattr(os, "replace", broken_replace)
        with pytest.raises(OSError):
            save_checkpoint(cpdir, new)
        monkeypatch.undo()
        assert load_checkpoint(cpdir, {}, quarantine=False).checkpoint == old


def test_example_units_reconcile(tmp_path: Path) -> None:
    from .conftest import EXAMPLES

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
        from reconciler.lastgood import LastGoodStore

        from .conftest import DEMO, EXAMPLES

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
