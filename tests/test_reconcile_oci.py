"""reconcile writes an OCI config per placed instance (SPEC §11) through the real host lookups."""

from __future__ import annotations

import json
from pathlib import Path

from reconciler.oci_glue import default_config_builder
from reconciler.reconcile import CONFIG_FAILURE, ReconcileOptions, reconcile

from .test_oci import assert_valid


def opts() -> ReconcileOptions:
    return ReconcileOptions(configs=default_config_builder())


def test_every_placed_instance_gets_a_valid_config(demo_copy: Path) -> None:
    report = reconcile(demo_copy, opts())
    placed = {p.instance_id: p for p in report.computed.result.placements}
    assert len(placed) == 7 and not report.computed.result.failures
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
        assert hosts.startswith("127.0.0.1 localhost")


def test_unchanged_configs_are_not_rewritten_and_stale_ones_removed(demo_copy: Path) -> None:
    reconcile(demo_copy, opts())
    assert reconcile(demo_copy, opts()).written == ()
    (demo_copy / "desired" / "apps" / "logger.yaml").unlink()
    report = reconcile(demo_copy, opts())
    dirs = {d.name for d in (demo_copy / "out" / "instances").iterdir() if d.is_dir()}
    assert dirs == {p.instance_id for p in report.computed.result.placements}
    assert len(dirs) == 4


def test_an_unknown_group_fails_that_instance_only(demo_copy: Path) -> None:
    res = demo_copy / "resources" / "edge-1.json"
    res.write_text(res.read_text().replace('"groups": ["video"]', '"groups": ["no-such-group-x"]'))
    report = reconcile(demo_copy, opts())
    failures = report.computed.result.failures
    assert [f.reason for f in failures] == [CONFIG_FAILURE]
    assert failures[0].item_id == "com.example.nav" and "no-such-group-x" in failures[0].summary
    assert len(report.computed.result.placements) == 6
    assert failures[0].instance_id not in report.computed.checkpoint.allocations
    assert not (demo_copy / "out" / "instances" / failures[0].instance_id).exists()
