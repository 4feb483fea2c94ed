"""``verify`` (issue 9's warm path): a watcher's event-triggered run trusts that the outputs
whose content did not change are what it wrote; a verifying run (its first, every resync)
repairs an output edited behind its back, and a changed output is written either way."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from reconciler.oci_glue import default_config_builder
from reconciler.reconcile import ReconcileCache, ReconcileOptions, reconcile


def test_trusted_between_resyncs_repaired_on_a_verifying_run(demo_copy: Path) -> None:
    opts = ReconcileOptions(configs=default_config_builder(), cache=ReconcileCache())
    report = reconcile(demo_copy, opts)
    patch = sorted((demo_copy / "out" / "nodes").glob("*.json"))[0]
    config = sorted((demo_copy / "out" / "instances").glob("*/config.json"))[0]
    good_patch, good_config = patch.read_bytes(), config.read_bytes()
    patch.write_text("[]\n")
    config.write_text("{}\n")
    trusting = dataclasses.replace(opts, verify=False)
    report = reconcile(demo_copy, trusting, report.computed.view)
    assert patch.read_text() == "[]\n" and config.read_text() == "{}\n"
    assert report.written == ()
    # a changed output is written even when trusting
    svc = demo_copy / "desired" / "apps" / "logger.yaml"
    svc.write_text(svc.read_text().replace("instances: 3", "instances: 2"))
    report = reconcile(demo_copy, trusting, report.computed.view)
    assert "out/plan.json" in report.written
    svc.write_text(svc.read_text().replace("instances: 2", "instances: 3"))
    report = reconcile(demo_copy, trusting, report.computed.view)
    # the resync repairs what was edited by hand
    report = reconcile(demo_copy, opts, report.computed.view)
    assert patch.read_bytes() == good_patch
    assert config.read_bytes() == good_config
