"""End to end with a device plugin and real containers (SPEC §19): a plugin (a plain grpcio
server) registers with the agent; its two devices appear as a pool in the node document the
agent writes; an instance asking for one is placed; before starting it the agent calls
Allocate and the running runc container sees the plugin's env var and device node; the plugin
marks the device unhealthy: status flags the holder; the plugin dies: its devices are unhealthy
at once, the pool is gone after the grace period (clock injected).

Skips, saying why, only when runc cannot run here (not root, no runc, no static busybox)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.agent.deviceplugin.manager import DevicePluginManager
from reconciler.agent.deviceplugin.prestart import PluginBundles, agent_bundles_dir
from reconciler.agent.node import container_id, run_agent_once
from reconciler.agent.report import load_node_config
from reconciler.agent.reporter import NodeReporter
from reconciler.agent.runc import Runc, RuncError
from reconciler.controller.configs import default_config_builder
from reconciler.controller.reconcile import ReconcileOptions, reconcile
from reconciler.model.documents import Node
from reconciler.model.values import instance_id
from tests.support.deviceplugin import Answer, TestPlugin
from tests.support.e2e import make_e2e_rootfs, runtime_architecture, skip_unless_runc_works
from tests.support.runc import require_runc_and_busybox
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

RESOURCE = "example.com/widget"
ITEM = "com.example.widgets"


class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="dp-", dir="/tmp") as d:  # short socket paths
        yield Path(d)


def node_doc(state: Path) -> Node:
    return Node.model_validate(json.loads((state / "nodes" / "n1.yaml").read_text()))


def pool_health(node: Node) -> dict[str, bool] | None:
    for pool in node.devicePools:
        if pool.resource == RESOURCE:
            return {d.id: d.healthy for d in pool.devices}
    return None


def test_a_device_plugin_serves_a_runc_container(tmp_path: Path, plugin_dir: Path) -> None:
    busybox = require_runc_and_busybox()
    skip_unless_runc_works(tmp_path, busybox)
    state = tmp_path / "state"
    (state / "desired").mkdir(parents=True)
    make_e2e_rootfs(state / "rootfs", busybox)
    (state / "unit.yaml").write_text(
        "apiVersion: reconciler/v1\nkind: UnitConfig\nversion: 1.0.0\nnodeTimeout: 1h\n"
    )
    (tmp_path / "node.yaml").write_text(
        "apiVersion: reconciler/v1\nkind: NodeAgentConfig\nid: n1\ntype: edge\n"
        "maxDMIPS: 1000\nruntimes:\n  - id: runc\n    type: runc\n"
        f"    platform: {{architecture: {runtime_architecture()}, os: linux}}\n"
    )
    (state / "desired" / "w.yaml").write_text(
        f"apiVersion: reconciler/v1\nkind: Service\nid: {ITEM}\nversion: 1.0.0\n"
        "runtimes: [runc]\nrequestedResources: {cpu: 100}\n"
        f"devices: [{{resource: {RESOURCE}, count: 1}}]\n"
        'image:\n  rootfs: rootfs\n  cmd: [/bin/sh, -c, "sleep 3600"]\n'
    )
    config = load_node_config(tmp_path / "node.yaml")
    clock = Clock()
    runc = Runc(root=tmp_path / "runc-n1", timeout=30)
    answer = Answer(
        envs={"WIDGET_VISIBLE": "from-the-plugin"}, devices=[("/dev/widget0", "/dev/null", "rw")]
    )
    plugin = TestPlugin(plugin_dir, RESOURCE, {"w0": True, "w1": True}, answer)
    manager = DevicePluginManager(plugin_dir, clock=clock, grace=300)
    reporter = NodeReporter(state, config, runc, plugins=manager, clock=clock)
    opts = ReconcileOptions(configs=default_config_builder(), clock=clock)
    iid = instance_id(ITEM, "default", 0)
    cid = container_id("n1", iid)
    try:
        manager.start()
        plugin.start()
        wait_for(lambda: {p.resource for p in manager.pools()} == {RESOURCE}, "the pool")
        wait_for(lambda: len(manager.pools()[0].devices) == 2, "both devices")
        node = reporter.report(sample=False)
        assert pool_health(node) == {"w0": True, "w1": True}
        assert pool_health(node_doc(state)) == {"w0": True, "w1": True}
        (pool,) = node_doc(state).devicePools
        assert pool.policy == "exclusive"

        first = reconcile(state, opts)
        (placed,) = first.computed.result.placements
        assert placed.node_id == "n1" and dict(placed.devices) == {RESOURCE: ("w0",)}

        bundles = PluginBundles(manager, agent_bundles_dir(state, "n1"))
        report = run_agent_once(state, "n1", runc, stop_timeout=1.0, prepare=bundles.prepare)
        assert report.started == (iid,), report
        assert plugin.allocations == [["w0"]]
        seen = subprocess.run(
            [
                "runc",
                "--root",
                str(tmp_path / "runc-n1"),
                "exec",
                cid,
                "/bin/sh",
                "-c",
                'echo "$WIDGET_VISIBLE"; [ -c /dev/widget0 ] && echo is-a-char-device',
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert seen.returncode == 0, seen.stderr
        assert seen.stdout.split() == ["from-the-plugin", "is-a-char-device"]
        # the controller's own bundle is untouched: the merged one is the agent's
        out_config = json.loads((state / "out" / "instances" / iid / "config.json").read_text())
        assert "WIDGET_VISIBLE=from-the-plugin" not in out_config["process"]["env"]

        # the plugin reports the held device unhealthy: status flags the holder
        plugin.set_health("w0", False)
        wait_for(
            lambda: pool_health(reporter.report(sample=False)) == {"w0": False, "w1": True},
            "w0 unhealthy",
        )
        flagged = reconcile(state, opts)
        status = json.loads((state / "out" / "status.json").read_text())
        flags = {k: v.get("unhealthyDevices") for k, v in status["instances"].items()}
        assert flags == {iid: ["w0"]}
        assert flagged.computed.result.placements[0].unhealthy_devices == ("w0",)

        # the plugin dies: every device unhealthy at once, the pool gone after the grace
        plugin.stop()
        wait_for(
            lambda: pool_health(reporter.report(sample=False)) == {"w0": False, "w1": False},
            "all unhealthy",
        )
        clock.t += 299
        assert pool_health(reporter.report(sample=False)) is not None
        clock.t += 1
        assert pool_health(reporter.report(sample=False)) is None
        assert pool_health(node_doc(state)) is None
    finally:
        plugin.stop()
        manager.stop()
        with contextlib.suppress(RuncError):
            runc.kill(cid, "KILL")
        with contextlib.suppress(RuncError):
            runc.delete(cid, force=True)
    assert runc.list() == []
