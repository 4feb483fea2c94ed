"""The end-to-end setup with real containers: a two-node state directory running a busybox
service, one runc ``--root`` per node, and :class:`E2E` to reconcile and run the agents. The
``e2e`` fixture that builds it is in tests/system/conftest.py."""

from __future__ import annotations

import json
import platform
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from reconciler.agent.node import AgentReport, run_agent_once
from reconciler.agent.runc import ContainerState, Runc
from reconciler.controller.configs import default_config_builder
from reconciler.controller.reconcile import ReconcileOptions, ReconcileReport, reconcile
from tests.support.busybox import make_busybox_rootfs
from tests.support.oci import assert_valid

NODES = ("n1", "n2")

ITEM = "com.example.sleeper"

STOP_TIMEOUT = 1.0  # `sleep` as pid 1 ignores SIGTERM: every stop ends in SIGKILL after this


def make_e2e_rootfs(rootfs: Path, busybox: str) -> None:
    make_busybox_rootfs(
        rootfs, busybox, ("sh", "sleep", "true"), ("proc", "dev", "sys", "tmp", "etc")
    )


def runtime_architecture() -> str:
    machine = platform.machine()
    return {"aarch64": "arm64"}.get(machine, machine)


def runc_node(node_id: str) -> dict[str, Any]:
    """A node document with one runc runtime of this machine's architecture."""
    return {
        "apiVersion": "reconciler/v1",
        "kind": "Node",
        "id": node_id,
        "type": "edge",
        "maxDMIPS": 100000,
        "totalRAM": "8Gi",
        "runtimes": [
            {"id": "runc", "type": "runc", "platform": {"architecture": runtime_architecture()}}
        ],
    }


def skip_unless_runc_works(tmp_path: Path, busybox: str) -> None:
    """Run a plain `runc spec` container once; skip (with runc's words) if even that fails."""
    probe = tmp_path / "probe"
    make_e2e_rootfs(probe / "rootfs", busybox)
    spec = subprocess.run(
        ["runc", "spec", "--bundle", str(probe)],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    if spec.returncode != 0:
        pytest.skip(f"`runc spec` fails here: {spec.stderr.strip()}")
    config = json.loads((probe / "config.json").read_text())
    config["process"]["terminal"] = False
    config["process"]["args"] = ["/bin/true"]
    (probe / "config.json").write_text(json.dumps(config))
    root = tmp_path / "runc-probe"
    try:
        ran = subprocess.run(
            ["runc", "--root", str(root), "run", "--bundle", str(probe), "probe"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
    finally:
        subprocess.run(
            ["runc", "--root", str(root), "delete", "--force", "probe"],
            capture_output=True,
            check=False,
            timeout=30,
        )
    if ran.returncode != 0:
        pytest.skip(f"runc cannot run even a plain `runc spec` container here: {ran.stderr}")


SERVICE = """apiVersion: reconciler/v1
kind: Service
id: {item}
version: {version}
instances: {instances}
runtimes: [runc]
requestedResources: {{cpu: 100}}
image:
  rootfs: rootfs
  cmd: [/bin/sh, -c, "sleep 3600"]
"""


def write_service(state: Path, *, instances: int = 2, version: str = "1.0.0") -> None:
    text = SERVICE.format(item=ITEM, version=version, instances=instances)
    (state / "desired" / "sleeper.yaml").write_text(text)


@dataclass
class E2E:
    state: Path
    runcs: dict[str, Runc]
    logs: Path
    timings: dict[str, float]

    def reconcile(self, *, allow_empty: bool = False) -> ReconcileReport:
        opts = ReconcileOptions(configs=default_config_builder(), allow_empty=allow_empty)
        report = reconcile(self.state, opts)
        assert report.plan.complete, [f.summary for f in report.plan.failures]
        assert report.computed.diagnostics == []
        placed = {p.instance_id for p in report.computed.result.placements}
        bundles = self.state / "out" / "instances"
        assert {d.name for d in bundles.iterdir() if d.is_dir()} == placed
        for iid in placed:  # every config runc is given is valid OCI 1.0.2
            assert_valid(json.loads((bundles / iid / "config.json").read_text()))
        return report

    def agents(self, now: float | None = None) -> dict[str, AgentReport]:
        clock = time.time if now is None else (lambda: now)
        return {
            n: run_agent_once(
                self.state, n, runc, stop_timeout=STOP_TIMEOUT, log_dir=self.logs / n, now=clock
            )
            for n, runc in self.runcs.items()
        }

    def kill9(self, node: str, cid: str) -> None:
        """SIGKILL a container and wait until runc sees it stopped."""
        runc = self.runcs[node]
        runc.kill(cid, "KILL")
        deadline = time.monotonic() + 30
        while (st := runc.state(cid)) is not None and st.status != "stopped":
            assert time.monotonic() < deadline, f"{cid} still {st.status} after SIGKILL"
            time.sleep(0.05)

    def containers(self) -> dict[str, dict[str, ContainerState]]:
        return {n: {s.id: s for s in runc.list()} for n, runc in self.runcs.items()}

    def actual(self, node: str) -> dict[str, object]:
        data = json.loads((self.state / "actual" / f"{node}.yaml").read_text())
        assert isinstance(data, dict)
        return data

    def timed(self, name: str, t0: float) -> None:
        self.timings[name] = round(time.monotonic() - t0, 2)
