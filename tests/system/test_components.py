"""Component instances through the controller and the agent (SPEC §18): a component on a
``rootfs`` runtime whose handler is a shell script is installed, its version recorded in
``actual/``, upgraded and removed on delete; it takes no CPU or RAM, gets no OCI config and no
network, and a second one on that runtime fails ``MaxInstances``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from reconciler.agent.node import run_agent_once
from reconciler.controller.configs import default_config_builder
from reconciler.controller.reconcile import ReconcileOptions, reconcile
from reconciler.model.values import instance_id
from tests.support.fake_runc import FakeRunc

HANDLER = """#!/bin/sh
# a component handler: records every call, and "installs" by copying the artifact's file
echo "$@" >> "{log}"
case "$1" in
  install) mkdir -p "{target}/$2" && cp "$4/image.bin" "{target}/$2/$3" && echo "flashed $2 $3" ;;
  remove) rm -rf "{target}/$2" && echo "erased $2 $3" ;;
  *) exit 2 ;;
esac
"""

NODE = {
    "apiVersion": "reconciler/v1",
    "kind": "Node",
    "id": "n1",
    "type": "edge",
    "maxDMIPS": 1000,
    "totalRAM": "1Gi",
    "runtimes": [
        {"id": "runc", "type": "runc", "platform": {"architecture": "x86_64"}},
        {
            "id": "fs",
            "type": "rootfs",
            "platform": {"architecture": "x86_64"},
            "handler": ["/bin/sh", "HANDLER"],
        },
    ],
}


def component(item: str, version: str = "1.0.0") -> str:
    # asks for far more CPU and RAM than the node has: a component consumes neither
    return (
        f"apiVersion: reconciler/v1\nkind: Service\ntype: component\nid: {item}\n"
        f"version: {version}\nruntimes: [rootfs]\n"
        "requestedResources: {cpu: 50000, ram: 64Gi}\n"
        "image: {rootfs: artifacts/fw}\n"
    )


@pytest.fixture
def unit(tmp_path: Path) -> Path:
    if shutil.which("sh") is None:
        pytest.skip("no /bin/sh")
    state = tmp_path / "state"
    (state / "desired").mkdir(parents=True)
    (state / "nodes").mkdir()
    (state / "artifacts" / "fw").mkdir(parents=True)
    (state / "artifacts" / "fw" / "image.bin").write_text("firmware v1\n")
    handler = tmp_path / "handler.sh"
    handler.write_text(HANDLER.format(log=tmp_path / "calls.log", target=tmp_path / "flash"))
    node = json.loads(json.dumps(NODE).replace("HANDLER", str(handler)))
    (state / "nodes" / "n1.yaml").write_text(json.dumps(node))
    return state


def run(state: Path, runc: FakeRunc) -> None:
    reconcile(state, ReconcileOptions(configs=default_config_builder(), allow_empty=True))
    report = run_agent_once(state, "n1", runc)
    assert not report.failed, report.failed


def calls(state: Path) -> list[str]:
    log = state.parent / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def test_a_component_is_installed_recorded_upgraded_and_removed(unit: Path) -> None:
    state, runc = unit, FakeRunc()
    (state / "desired" / "fw.yaml").write_text(component("fw"))
    run(state, runc)
    iid = instance_id("fw", "default", 0)
    artifact = str((state / "artifacts" / "fw").resolve())
    assert calls(state) == [f"install fw 1.0.0 {artifact}"]
    assert (state.parent / "flash" / "fw" / "1.0.0").read_text() == "firmware v1\n"
    actual = json.loads((state / "actual" / "n1.yaml").read_text())
    record = actual["instances"][iid]
    assert record["version"] == "1.0.0" and record["runtimeId"] == "fs"
    assert record["state"] == "active"
    assert record["handlerResult"] == "flashed fw 1.0.0"
    # no container, no OCI config, no network; no CPU or RAM reserved
    assert runc.containers == {}
    assert not (state / "out" / "instances" / iid).exists()
    assert not (state / "out" / "network.json").exists()
    status = json.loads((state / "out" / "status.json").read_text())
    assert "0/1 nodes" not in json.dumps(status)
    cp = json.loads((state / "checkpoint" / "allocations.json").read_text())
    reserved = cp["data"]["instances"][iid]["reserved"]
    assert (reserved["cpu"], reserved["ram"]) == (0, 0)
    # a second run changes nothing
    run(state, runc)
    assert len(calls(state)) == 1

    # a new version: the old one is removed, the new one installed
    (state / "desired" / "fw.yaml").write_text(component("fw", "1.1.0"))
    run(state, runc)
    assert calls(state)[1:] == ["remove fw 1.0.0", f"install fw 1.1.0 {artifact}"]
    actual = json.loads((state / "actual" / "n1.yaml").read_text())
    assert actual["instances"][iid]["version"] == "1.1.0"

    # deleted: removed
    (state / "desired" / "fw.yaml").unlink()
    run(state, runc)
    assert calls(state)[3:] == ["remove fw 1.1.0"]
    assert not (state.parent / "flash" / "fw").exists()
    actual = json.loads((state / "actual" / "n1.yaml").read_text())
    assert actual["instances"] == {}
    assert not list((state / "out" / "components").iterdir())


def test_a_second_component_on_the_runtime_fails_max_instances(unit: Path) -> None:
    state = unit
    (state / "desired" / "fw.yaml").write_text(component("fw"))
    (state / "desired" / "boot.yaml").write_text(component("boot"))
    report = reconcile(state, ReconcileOptions(configs=default_config_builder()))
    placed = [p.item_id for p in report.computed.result.placements]
    failures = {f.item_id: f.reason for f in report.computed.result.failures}
    assert placed == ["boot"]  # instance order: boot before fw
    assert failures == {"fw": "MaxInstances"}


def test_a_failing_handler_fails_the_component_with_its_words(unit: Path) -> None:
    state, runc = unit, FakeRunc()
    (state / "artifacts" / "fw" / "image.bin").unlink()
    (state / "desired" / "fw.yaml").write_text(component("fw"))
    reconcile(state, ReconcileOptions(configs=default_config_builder()))
    report = run_agent_once(state, "n1", runc)
    iid = instance_id("fw", "default", 0)
    assert "install failed: exit 1" in report.failed[iid]
    actual = json.loads((state / "actual" / "n1.yaml").read_text())
    assert actual["instances"][iid]["state"] == "failed"
