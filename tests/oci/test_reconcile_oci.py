"""reconcile writes an OCI config per placed instance (SPEC §11) through the real host lookups."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from reconciler.controller.configs import default_config_builder
from reconciler.controller.reconcile import CONFIG_FAILURE, ReconcileOptions, reconcile
from tests.support.oci import assert_valid


def opts() -> ReconcileOptions:
    return ReconcileOptions(configs=default_config_builder())


def test_every_placed_instance_gets_a_valid_config(demo_copy: Path) -> None:
    report = reconcile(demo_copy, opts())
    placed = {p.instance_id: p for p in report.computed.result.placements}
    assert len(placed) == 10 and not report.computed.result.failures
    dirs = {d.name for d in (demo_copy / "out" / "instances").iterdir() if d.is_dir()}
    assert dirs == set(placed)
    for iid, p in placed.items():
        config = json.loads((demo_copy / "out" / "instances" / iid / "config.json").read_text())
        assert_valid(config)
        env = dict(e.split("=", 1) for e in config["process"]["env"])
        assert env["INSTANCE_ID"] == iid and env["ITEM_ID"] == p.item_id
        alloc = report.computed.checkpoint.allocations[iid]
        assert config["process"]["user"]["uid"] == alloc.uid
        assert config["root"]["path"] == str((demo_copy / "rootfs" / "busybox").resolve())
        hosts = (demo_copy / "out" / "instances" / iid / "hosts").read_text()
        assert hosts.startswith(("127.0.0.1 localhost", "127.0.0.1\tlocalhost"))


def _stamps(state: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime) of every instance file: a rewrite renames a new inode in."""
    root = state / "out" / "instances"
    return {
        str(f.relative_to(root)): (f.stat().st_ino, f.stat().st_mtime_ns)
        for f in sorted(root.glob("*/*"))
    }


def test_unchanged_configs_are_not_rewritten_and_stale_ones_removed(demo_copy: Path) -> None:
    first = reconcile(demo_copy, opts())
    ids = {p.item_id: p.instance_id for p in first.computed.result.placements}
    before = _stamps(demo_copy)
    # config.json and hosts of each of the 10 instances, network.json and resolv.conf of the 3
    # with a network
    assert len(before) == 10 * 2 + 3 * 2
    assert reconcile(demo_copy, opts()).written == ()
    assert _stamps(demo_copy) == before

    # one service's image env changes: only its config.json is rewritten (the same plan)
    vision = demo_copy / "desired" / "apps" / "vision.yaml"
    vision.write_text(vision.read_text().replace("image:\n", "image:\n  env: [MODE=night]\n"))
    report = reconcile(demo_copy, opts())
    assert report.plan.actions == first.plan.actions
    vid = ids["com.example.vision"]
    assert [w for w in report.written if w.startswith("out/instances/")] == [
        f"out/instances/{vid}/config.json"
    ]
    after = _stamps(demo_copy)
    assert {k for k in before if after[k] != before[k]} == {f"{vid}/config.json"}
    config = json.loads((demo_copy / "out" / "instances" / vid / "config.json").read_text())
    assert "MODE=night" in config["process"]["env"]

    # a deleted service: the configs of its (no longer placed) instances are removed, the
    # others are left as they are
    before = _stamps(demo_copy)
    (demo_copy / "desired" / "apps" / "logger.yaml").unlink()
    report = reconcile(demo_copy, opts())
    dirs = {d.name for d in (demo_copy / "out" / "instances").iterdir() if d.is_dir()}
    assert dirs == {p.instance_id for p in report.computed.result.placements}
    assert len(dirs) == 7
    loggers = {
        p.instance_id for p in first.computed.result.placements if p.item_id == "com.example.logger"
    }
    assert len(loggers) == 3 and not loggers & dirs
    assert sorted(w for w in report.written if w.startswith("out/instances/")) == sorted(
        f"out/instances/{i}" for i in loggers
    )
    assert _stamps(demo_copy) == {k: v for k, v in before.items() if k.split("/")[0] in dirs}


def test_an_unknown_group_fails_that_instance_only(demo_copy: Path) -> None:
    res = demo_copy / "resources" / "edge-1.json"
    res.write_text(res.read_text().replace('"groups": ["video"]', '"groups": ["no-such-group-x"]'))
    report = reconcile(demo_copy, opts())
    failures = report.computed.result.failures
    assert [f.reason for f in failures] == [CONFIG_FAILURE]
    assert failures[0].item_id == "com.example.nav" and "no-such-group-x" in failures[0].summary
    assert len(report.computed.result.placements) == 9
    assert failures[0].instance_id not in report.computed.checkpoint.allocations
    assert not (demo_copy / "out" / "instances" / failures[0].instance_id).exists()
    for placement in report.computed.result.placements:  # every other instance has its config
        config = demo_copy / "out" / "instances" / placement.instance_id / "config.json"
        assert_valid(json.loads(config.read_text()))


def test_outputs_are_published_in_dependency_order(
    demo_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Configs before the node patches that name them; the patches with plan.json in one
    batch; status.json last, in a batch with what the plan was computed from and the
    configs' manifest (records for the next reader and writer, not outputs anyone waits
    for), so the plan waits for none of them."""
    from reconciler.controller import reconcile as reconcile_module
    from reconciler.io.fsio import atomic_write_many as real_many
    from reconciler.oci.writer import write_instance_outputs as real_outputs

    batches: list[list[str]] = []

    def many(items: Any, **kwargs: Any) -> None:
        batches.append([str(path.relative_to(demo_copy)) for path, _, _ in items])
        real_many(items, **kwargs)

    def outputs(*args: Any, **kwargs: Any) -> Any:
        batches.append(["configs"])
        return real_outputs(*args, **kwargs)

    monkeypatch.setattr(reconcile_module, "atomic_write_many", many)
    monkeypatch.setattr(reconcile_module, "write_instance_outputs", outputs)
    reconcile(demo_copy, opts())
    out = [b for b in batches if b == ["configs"] or any(p.startswith("out/") for p in b)]
    assert out[0] == ["configs"]
    assert "out/plan.json" in out[1] and any(p.startswith("out/nodes/") for p in out[1])
    # the page just before the report it shows (a report on disk always has its page)
    assert out[2:] == [
        [
            "out/status.html",
            "out/status.json",
            "out/plan.basis.json",
            "out/instances/.manifest.json",
        ]
    ]
