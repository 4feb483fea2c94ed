"""The benchmarks' named fleet shapes and ``benchmarks.balancer`` on any unit: each shape is a
valid unit of the size asked, with the property its name promises (checked on the documents
and on a balance, not on timings)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.balancer import measure, read_unit
from benchmarks.grow import SUBJECTS, grow
from benchmarks.statedir import bump_instances, copy_state_dir, edit_target
from benchmarks.synth import LATE_PREFIX, SHAPES, synth_documents, synth_unit
from reconciler.controller.reconcile import ReconcileOptions, reconcile
from reconciler.io.loader import load_state
from tests.support.paths import DEMO, ROOT

N_NODES, N_INSTANCES = 120, 480


@pytest.mark.parametrize("shape", SHAPES)
def test_every_shape_is_a_valid_unit_of_the_size_asked(shape: str) -> None:
    _, nodes, services = synth_unit(N_NODES, N_INSTANCES, 3, shape)  # validates every document
    assert len(nodes) == N_NODES
    assert sum(s.instances for s in services) == N_INSTANCES
    assert synth_documents(N_NODES, N_INSTANCES, 3, shape) == synth_documents(
        N_NODES, N_INSTANCES, 3, shape
    )  # deterministic per seed


def test_the_shapes_are_what_their_names_say() -> None:
    _, nodes, services = synth_unit(N_NODES, N_INSTANCES, 3, "many-small")
    assert len(services) == N_INSTANCES
    _, nodes, services = synth_unit(N_NODES, N_INSTANCES, 3, "few-big")
    assert len(services) == 10
    unit, nodes, _ = synth_unit(N_NODES, N_INSTANCES, 3, "heterogeneous")
    assert unit is not None and len(unit.nodes) == N_NODES  # an entry per node
    runtime_ids = [rt.id for n in nodes for rt in n.runtimes]
    assert len(set(runtime_ids)) == len(runtime_ids)  # every node its own runtime ids
    assert len({n.type for n in nodes}) == N_NODES
    assert all(n.usage is not None for n in nodes)
    _, nodes, _ = synth_unit(N_NODES, N_INSTANCES, 3, "devices")
    with_pools = sum(1 for n in nodes if n.devicePools)
    assert 0.15 * N_NODES < with_pools < 0.45 * N_NODES


@pytest.mark.parametrize(("shape", "percent"), [("unplaceable-1", 1), ("unplaceable-15", 15)])
def test_unplaceable_shapes_fail_that_share_of_the_instances(shape: str, percent: int) -> None:
    got = measure(synth_unit(N_NODES, N_INSTANCES, 3, shape))
    failed = got["stable"]["failed"]
    # whole services are made unplaceable until the share is reached (at most 20 over)
    assert N_INSTANCES * percent // 100 <= failed <= N_INSTANCES * percent // 100 + 20
    assert got["fresh"]["failed"] == failed


def test_the_preemption_shape_preempts_in_the_stable_run() -> None:
    unit = synth_unit(N_NODES, N_INSTANCES, 3, "preemption")
    late = [s for s in unit[2] if s.id.startswith(LATE_PREFIX)]
    assert late and all(s.priority == 1000 and s.nodeId is not None for s in late)
    got = measure(unit)
    assert got["stable"]["preempted"] > 0
    assert got["fresh"]["placed"] + got["fresh"]["failed"] == N_INSTANCES


def test_the_balancer_benchmark_measures_a_state_directory_as_json() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.balancer", "--state", str(DEMO), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=ROOT,
    )
    doc = json.loads(proc.stdout)
    unit = read_unit(DEMO)
    instances = sum(s.instances for s in unit[2])
    for mode in ("fresh", "stable"):
        assert set(doc[mode]) >= {"seconds", "instances_per_s", "placed", "failed"}
        assert doc[mode]["placed"] + doc[mode]["failed"] == instances
    assert doc["linear"]["seconds"] > 0  # the control: the instances expanded
    assert doc["unit"]["nodes"] == len(unit[1])


def test_the_edit_benchmarks_edit_a_real_state_directory(demo_copy: Path) -> None:
    """``--state``: the first desired file (in path order) that counts instances is edited."""
    target = edit_target(demo_copy)
    assert target == "desired/apps/logger.yaml"  # apps/ sorts first; logger has instances: 3
    bump_instances(demo_copy, target, -1)
    assert "instances: 2\n" in (demo_copy / target).read_text()
    copy = demo_copy.parent / "copy"
    (demo_copy / "out").mkdir()
    copy_state_dir(demo_copy, copy)
    assert (copy / target).read_text() == (demo_copy / target).read_text()
    assert not (copy / "out").exists()


def _benchmark_json(module: str, *args: str) -> dict[str, Any]:
    """``python -m benchmarks.MODULE ARGS --json``'s document."""
    proc = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
        cwd=ROOT,
    )
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def test_the_explain_benchmark_times_a_first_next_and_uncached_explain() -> None:
    (row,) = _benchmark_json("explain", "--state", str(DEMO), "--repeat", "1")["rows"]
    assert row["shape"] == str(DEMO)
    assert all(row[k] > 0 for k in ("first_s", "next_s", "uncached_s"))


def test_the_scaling_benchmark_compares_a_size_with_its_tenth() -> None:
    args = ("--nodes", "40", "--instances", "160", "--shape", "homogeneous")
    (row,) = _benchmark_json("scaling", *args)["rows"]
    assert row["shape"] == "homogeneous"
    for key in ("balance_fresh_s", "balance_stable_s", "linear_s", "oneshot_s", "warm_ms"):
        small, big = row["figures"]["tenth"][key], row["figures"]["full"][key]
        assert small > 0 and big > 0
        assert row["ratios"][key] == big / small


@pytest.mark.parametrize("source", ["state", "examples/rack", "examples/vehicle"])
def test_a_grown_unit_is_its_source_copied_under_new_ids(source: str, tmp_path: Path) -> None:
    """``benchmarks.grow``: a bundled unit grown to the size asked loads without a diagnostic,
    and each node is a copy of one of the source's with ``-<k>`` appended to its id, each
    service one with ``-<k // 5>`` appended to its item and ``-<k % 5>`` to its subject, its
    hostname and connections renamed to its copy's (everything else as written); a unit.yaml
    entry for one node gets one per copy, and a service naming its node names a copy of that
    node. Reconciled, the copies fail for no reason their source does not (gids, DNS names,
    connections) but capacity."""
    src = ROOT / source
    dest = tmp_path / "grown"
    sizes = grow(src, dest, 50, 200)
    view, diagnostics = load_state(dest)
    assert diagnostics == []
    base_view, _ = load_state(src)
    assert len(view.nodes) == sizes["nodes"] >= 50
    assert sum(s.instances for s in view.services_sorted()) == sizes["instances"] >= 200
    copies = sizes["nodes"] // len(base_view.nodes)
    for node_id, node in view.nodes.items():
        base_id, copy = node_id.rsplit("-", 1)
        assert 0 <= int(copy) < copies
        assert node.model_dump(exclude={"id", "resourcesFile"}) == base_view.nodes[
            base_id
        ].model_dump(exclude={"id", "resourcesFile"})
    originals = {s.id: s for s in base_view.services_sorted()}
    renamed = {"id", "subject", "nodeId", "hostname", "allowedConnections"}
    seen: set[int] = set()
    for service in view.services_sorted():
        base_id, group = service.id.rsplit("-", 1)
        source_service = originals[base_id]
        subject, r = service.subject.rsplit("-", 1)
        assert subject == source_service.subject and 0 <= int(r) < SUBJECTS
        k = int(group) * SUBJECTS + int(r)
        seen.add(k)
        assert service.model_dump(exclude=renamed) == source_service.model_dump(exclude=renamed)
        if source_service.nodeId is not None:
            assert service.nodeId is not None and service.nodeId.rsplit("-", 1)[0] == (
                source_service.nodeId
            )
        if source_service.hostname is not None:
            assert service.hostname == f"{source_service.hostname}-{k:05d}"
        assert service.allowedConnections == tuple(
            f"{target}-{group}/{rest}" if target in originals else f"{target}/{rest}"
            for target, _, rest in (c.partition("/") for c in source_service.allowedConnections)
        )
    assert seen == set(range(len(seen)))  # copies 0 .. n-1, each once per source service
    assert view.unit is not None and base_view.unit is not None
    named = [e.nodeId for e in base_view.unit.nodes if e.nodeId]
    assert sorted(e.nodeId for e in view.unit.nodes if e.nodeId) == sorted(
        f"{n}-{k:05d}" for n in named for k in range(copies)
    )
    again = tmp_path / "again"
    grow(src, again, 50, 200)
    files = sorted(p.relative_to(dest) for p in dest.rglob("*") if p.is_file())
    assert [(dest / f).read_bytes() for f in files] == [(again / f).read_bytes() for f in files]
    # the copies name each other as the source's services do: none fails for want of a gid,
    # a DNS name or a connection that the source has
    grown = reconcile(dest, ReconcileOptions()).computed.result.failures
    copy_state_dir(src, tmp_path / "base")
    base = reconcile(tmp_path / "base", ReconcileOptions()).computed
    reasons = {f.reason for f in base.result.failures}
    assert {f.reason for f in grown} <= reasons | {"Resources", "Devices", "Cpu", "Ram"}
    assert not {f.reason for f in grown} & ({"Ids", "Network"} - reasons)
