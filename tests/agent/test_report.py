"""The agent's node report (SPEC §19): declared facts merged with measured ones, usage sampled
from /proc and the cgroups, stale reports failing NodeState."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from reconciler.accel import balance
from reconciler.agent.report import (
    NodeAgentConfig,
    NodeReportError,
    Sampler,
    UsageSample,
    container_usage,
    load_node_config,
)
from reconciler.agent.reporter import NodeReporter
from reconciler.controller.reconcile import ReconcileOptions, reconcile
from reconciler.controller.reports import StaleMarks
from reconciler.model.documents import Node
from reconciler.placement.filters import NodeStateFilter
from reconciler.placement.nodestate import make_slot
from tests.support.builders import make_service, make_unit
from tests.support.fake_runc import FakeRunc

NODE_CONFIG = """apiVersion: reconciler/v1
kind: NodeAgentConfig
id: n1
type: edge
maxDMIPS: 10000
osFeatures: [gpu-driver]
partitions:
  - {{name: data, types: [storages, states], path: {path}}}
runtimes:
  - id: runc
    type: runc
    platform: {{architecture: x86_64, os: linux}}
"""


def meminfo_total() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal")


@pytest.fixture
def state(tmp_path: Path) -> Path:
    d = tmp_path / "state"
    (d / "desired").mkdir(parents=True)
    return d


@pytest.fixture
def config(tmp_path: Path) -> NodeAgentConfig:
    path = tmp_path / "node.yaml"
    path.write_text(NODE_CONFIG.format(path=tmp_path))
    return load_node_config(path)


def read_node(state: Path) -> Node:
    return Node.model_validate(json.loads((state / "nodes" / "n1.yaml").read_text()))


def test_the_written_node_holds_what_the_machine_measures(
    state: Path, config: NodeAgentConfig, tmp_path: Path
) -> None:
    NodeReporter(state, config, FakeRunc(), clock=lambda: 1_800_000_000).report(sample=False)
    node = read_node(state)
    assert node.totalRAM == meminfo_total()
    assert node.numCores == len(os.sched_getaffinity(0))
    st = os.statvfs(tmp_path)
    (part,) = node.partitions
    assert (part.name, part.types, part.totalSize) == (
        "data",
        ("storages", "states"),
        st.f_blocks * st.f_frsize,
    )
    assert node.maxDMIPS == 10000 and node.type == "edge" and node.connected
    assert node.osInfo is not None
    assert node.osInfo.features[0] == "gpu-driver"
    assert node.osInfo.features[-1] == f"kernel={os.uname().release}"
    assert node.reportedAt == datetime.fromtimestamp(1_800_000_000, UTC)
    assert [r.id for r in node.runtimes] == ["runc"]


def test_a_bad_node_config_is_reported_with_its_place(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(NODE_CONFIG.format(path=tmp_path).replace("maxDMIPS: 10000", "maxDMIPS: -1"))
    with pytest.raises(NodeReportError, match=r"node\.yaml:5:\d+: .*maxDMIPS"):
        load_node_config(path)


def _busy_loop() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _sample_under_load(sampler: Sampler, pid: int) -> UsageSample | None:
    assert sampler.sample({"busy": pid}) is None  # the first sample only starts the window
    start = _cpu_seconds(pid)
    deadline = time.monotonic() + 30
    while _cpu_seconds(pid) - start < 0.5:  # until the loop has burnt half a CPU second
        assert time.monotonic() < deadline, "the busy loop got no CPU"
        time.sleep(0.05)
    return sampler.sample({"busy": pid})


def test_usage_under_a_busy_loop_is_within_sane_bounds(config: NodeAgentConfig) -> None:
    loop = _busy_loop()
    try:
        sampler = Sampler(config.maxDMIPS)
        got = _sample_under_load(sampler, loop.pid)
    finally:
        loop.kill()
        loop.wait()
    assert got is not None
    usage = got.to_usage()
    cores = len(os.sched_getaffinity(0))
    # one busy CPU of `cores`: at least a good part of that share, never more than all
    assert config.maxDMIPS * 0.5 / cores <= usage.cpu <= config.maxDMIPS
    assert 0 < usage.ram < meminfo_total()
    # the "container" here is the loop's own cgroup (the test's): read, and bounded
    cpu, mem = usage.instances["busy"].cpu, usage.instances["busy"].ram
    assert 0 < cpu <= config.maxDMIPS
    assert mem >= 0


def test_a_process_cgroup_usage_is_read() -> None:
    cpu, mem = container_usage(Path("/proc"), Path("/sys/fs/cgroup"), os.getpid())
    assert cpu is not None and cpu > 0
    assert mem is None or mem > 0


ALERT_UNIT = """apiVersion: reconciler/v1
kind: UnitConfig
version: 1.0.0
nodeTimeout: 1h
nodes:
  - nodeType: edge
    alertRules:
      cpu: {minThreshold: 5, maxThreshold: 10, minTimeout: 10s}
"""


def test_the_controller_raises_a_cpu_alert_from_real_sampled_load(
    state: Path, config: NodeAgentConfig
) -> None:
    (state / "unit.yaml").write_text(ALERT_UNIT)
    loop = _busy_loop()
    try:
        reporter = NodeReporter(state, config, FakeRunc(), clock=lambda: 1_800_000_000)
        reporter.report()  # starts the window
        start = _cpu_seconds(loop.pid)
        deadline = time.monotonic() + 30
        while _cpu_seconds(loop.pid) - start < 0.5:
            assert time.monotonic() < deadline, "the busy loop got no CPU"
            time.sleep(0.05)
        node = reporter.report()
    finally:
        loop.kill()
        loop.wait()
    assert node.usage is not None and node.usage.cpu * 100 >= 10 * node.maxDMIPS
    t0 = 1_800_000_000.0
    first = reconcile(state, ReconcileOptions(clock=lambda: t0))
    assert first.computed.alerts is not None and not first.computed.alerts.raised
    later = reconcile(state, ReconcileOptions(clock=lambda: t0 + 11))
    assert later.computed.alerts is not None
    raised = later.computed.alerts.raised
    assert [(a["node"], a["resource"]) for a in raised] == [("n1", "cpu")], raised


def _reported(at: float) -> Node:
    return Node.model_validate(
        {
            "apiVersion": "reconciler/v1",
            "kind": "Node",
            "id": "n1",
            "type": "edge",
            "maxDMIPS": 1000,
            "totalRAM": "1Gi",
            "runtimes": [{"id": "runc", "type": "runc", "platform": {"architecture": "x86_64"}}],
            "reportedAt": datetime.fromtimestamp(at, UTC).isoformat(),
        }
    )


def test_a_stale_report_fails_node_state_after_the_timeout() -> None:
    unit = make_unit()  # nodeTimeout 60 s by default
    node = _reported(1_000)
    svc = make_service("s", runtimes=["runc"])
    marks = StaleMarks()
    fresh = marks.apply(unit, [node], 1_060)
    assert fresh == [node]
    assert balance(unit, fresh, [svc], {}, "stable").failures == ()

    stale = marks.apply(unit, [node], 1_000 + 180)
    result = balance(unit, stale, [svc], {}, "stable")
    (failure,) = result.failures
    assert failure.reason == "NodeState"
    slot = make_slot(unit, stale[0], frozenset())
    assert NodeStateFilter().check(slot, None) == "no report for 3m"  # type: ignore[arg-type]
    assert marks.apply(unit, [node], 1_000 + 190)[0] is stale[0]  # the same copy: memo hits
    # a node written by hand (no reportedAt) is never stale
    by_hand = node.model_copy(update={"reportedAt": None})
    assert marks.apply(unit, [by_hand], 10**10) == [by_hand]


def test_the_controller_fails_a_node_whose_agent_stopped_reporting(
    state: Path, config: NodeAgentConfig
) -> None:
    (state / "unit.yaml").write_text(
        "apiVersion: reconciler/v1\nkind: UnitConfig\nversion: 1.0.0\nnodeTimeout: 1m\n"
    )
    (state / "desired" / "s.yaml").write_text(
        "apiVersion: reconciler/v1\nkind: Service\nid: s\nversion: 1.0.0\n"
        "runtimes: [runc]\nimage: {rootfs: /r}\n"
    )
    t0 = 1_800_000_000
    NodeReporter(state, config, FakeRunc(), clock=lambda: t0).report(sample=False)
    ok = reconcile(state, ReconcileOptions(clock=lambda: t0 + 30))
    assert [p.node_id for p in ok.computed.result.placements] == ["n1"]
    late = reconcile(state, ReconcileOptions(clock=lambda: t0 + 180))
    assert late.computed.result.placements == ()
    (failure,) = late.computed.result.failures
    assert failure.reason == "NodeState"
