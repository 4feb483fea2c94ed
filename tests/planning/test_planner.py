"""Plans (SPEC §10): per-instance JSON Patch, reasons, determinism, read-only plan."""

from __future__ import annotations

import gc
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.cli.commands import main
from reconciler.controller.reconcile import ReconcileOptions, compute_once, reconcile
from reconciler.model.documents import ActualState
from reconciler.model.values import instance_id
from reconciler.placement.instances import BalanceResult, Placement
from reconciler.planning.plans import Plan, empty_actual_document, make_plan, pointer
from tests.support.agent_sim import apply_all, read_actual
from tests.support.plans import actual_doc, placement, record
from tests.support.state_files import inline_resources

NODES = ["n1", "n2", "n3"]


def snapshot(state: Path) -> dict[str, tuple[bytes | None, int]]:
    """Every file's bytes and mtime and every directory's mtime (a created or removed entry
    changes its directory's mtime)."""
    out: dict[str, tuple[bytes | None, int]] = {".": (None, state.stat().st_mtime_ns)}
    for p in sorted(state.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(state))] = (
            p.read_bytes() if p.is_file() else None,
            st.st_mtime_ns,
        )
    return out


ITEMS = ["a", "b", "c"]


def desired_doc(
    node: str,
    actual: dict[str, Any],
    placements: list[Placement],
    addresses: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The desired document, computed independently of the planner: kept instances keep their
    observed record, the others appear as started (state activating, with their network
    address from ``addresses`` when they have one)."""
    doc = dict(actual, instances={})
    for p in placements:
        if p.node_id != node:
            continue
        seen = actual["instances"].get(p.instance_id)
        same = (
            seen is not None
            and seen["version"] == p.version
            and seen["runtimeId"] == p.runtime_id
            and sorted((k, sorted(v)) for k, v in seen.get("devices", {}).items())
            == sorted((k, sorted(v)) for k, v in p.devices)
        )
        if same:
            doc["instances"][p.instance_id] = seen
        else:
            doc["instances"][p.instance_id] = {
                "itemId": p.item_id,
                "subjectId": p.subject_id,
                "index": p.index,
                "version": p.version,
                "runtimeId": p.runtime_id,
                "state": "activating",
                "devices": {r: list(ids) for r, ids in p.devices},
            }
            if addresses and p.instance_id in addresses:
                doc["instances"][p.instance_id]["ip"] = addresses[p.instance_id]
    return doc


def check_patches(
    placements: list[Placement], actual: dict[str, dict[str, Any]], nodes: list[str]
) -> None:
    parsed = {n: ActualState.model_validate(d) for n, d in actual.items()}
    plan = make_plan(BalanceResult(tuple(placements), ()), parsed, set(nodes))
    for node in sorted(set(nodes) | set(actual)):
        doc = actual.get(node, empty_actual_document(node))
        ops = list(plan.patches[node])
        assert ops[0] == {"op": "test", "path": "/revision", "value": doc["revision"]}
        kinds = [op["op"] for op in ops[1:]]
        assert kinds == sorted(kinds, key=lambda k: k != "remove")  # removes, then adds
        removes = [op["path"] for op in ops if op["op"] == "remove"]
        adds = [op["path"] for op in ops if op["op"] == "add"]
        assert removes == sorted(removes) and adds == sorted(adds)
        assert "move" not in kinds and "replace" not in kinds
        got = jsonpatch.apply_patch(doc, ops)
        expected = desired_doc(node, doc, placements) if node in nodes else dict(doc, instances={})
        assert got == expected


class TestPatchGivesTheDesiredDocument:
    def test_scenario_mix(self) -> None:
        actual = {
            "n1": actual_doc(
                "n1", 4, [record("a", 0), record("b", 0, version="0.9.0"), record("c", 0)]
            ),
            "n2": actual_doc("n2", 1, [record("a", 1, devices={"gpu": ["g0"]})]),
            "gone": actual_doc("gone", 9, [record("c", 1)]),
        }
        placements = [
            placement("a", 0, "n1"),  # kept
            placement("b", 0, "n1"),  # version changed: stop + start
            placement("a", 1, "n2", devices=(("gpu", ("g1",)),)),  # devices changed
            placement("c", 1, "n3"),  # node lost: started elsewhere
            placement("a", 2, "n3", runtime="crun"),  # new
        ]  # c:0 is no longer desired
        check_patches(placements, actual, ["n1", "n2", "n3"])
        parsed = {n: ActualState.model_validate(d) for n, d in actual.items()}
        plan = make_plan(BalanceResult(tuple(placements), ()), parsed, {"n1", "n2", "n3"})
        reasons = {(a.action, a.item_id, a.index, a.node_id): a.reason for a in plan.actions}
        assert reasons == {
            ("stop", "b", 0, "n1"): "version-changed",
            ("start", "b", 0, "n1"): "version-changed",
            ("stop", "c", 0, "n1"): "not-desired",
            ("stop", "a", 1, "n2"): "moved",
            ("start", "a", 1, "n2"): "moved",
            ("stop", "c", 1, "gone"): "node-lost",
            ("start", "c", 1, "n3"): "node-lost",
            ("start", "a", 2, "n3"): "new",
        }

    @settings(max_examples=150, deadline=None)
    @given(st.data())
    def test_random_states(self, data: st.DataObject) -> None:
        identities = [(i, x) for i in ITEMS for x in range(3)]
        actual: dict[str, dict[str, Any]] = {}
        for node in [*NODES, "lost"]:
            if data.draw(st.booleans()):
                recs = [
                    record(
                        i,
                        x,
                        version=data.draw(st.sampled_from(["1.0.0", "2.0.0"])),
                        devices=data.draw(st.sampled_from([{}, {"gpu": ["g0"]}])),
                    )
                    for i, x in data.draw(
                        st.lists(st.sampled_from(identities), unique=True, max_size=4)
                    )
                ]
                actual[node] = actual_doc(node, data.draw(st.integers(0, 50)), recs)
        chosen = data.draw(st.lists(st.sampled_from(identities), unique=True, max_size=7))
        placements = [
            placement(
                i,
                x,
                data.draw(st.sampled_from(NODES)),
                version=data.draw(st.sampled_from(["1.0.0", "2.0.0"])),
                devices=data.draw(st.sampled_from([(), (("gpu", ("g0",)),)])),
            )
            for i, x in chosen
        ]
        check_patches(placements, actual, NODES)

    def test_pointer_escapes(self) -> None:
        assert pointer("instances", "a/b~c") == "/instances/a~1b~0c"


def check_demo_patches(
    state: Path,
    plan: Plan,
    placements: tuple[Placement, ...],
    addresses: Mapping[str, str] | None = None,
) -> None:
    """Each node's patch, applied with jsonpatch to its actual/ document (or the empty one when
    the file is missing), gives the desired document for that node; a node that is gone gives
    the empty list of instances."""
    nodes = {p.stem for p in (state / "nodes").glob("*.yaml")}
    docs = {
        n: read_actual(state, n)
        for n in nodes | {p.stem for p in (state / "actual").glob("*.yaml")}
    }
    assert set(plan.patches) == set(docs)
    for node, doc in docs.items():
        got = jsonpatch.apply_patch(doc, list(plan.patches[node]))
        expected = (
            desired_doc(node, doc, list(placements), addresses)
            if node in nodes
            else dict(doc, instances={})
        )
        assert got == expected, node


def _addresses(c: Any) -> dict[str, str]:
    """Per instance id, its network address in a computed run (the demo has networks)."""
    return {iid: n.ip for iid, n in c.network.instances.items()} if c.network else {}


class TestPlansOfTheDemo:
    def test_version_bump_and_node_loss(self, demo_copy: Path) -> None:
        reconcile(demo_copy)
        apply_all(demo_copy)
        svc = demo_copy / "desired" / "telemetry.yaml"
        svc.write_text(svc.read_text().replace("version: 0.9.1", "version: 1.0.0"))
        c = compute_once(demo_copy, ReconcileOptions(), read_only=True)
        tele = [a for a in c.plan.actions if a.item_id == "com.example.telemetry"]
        assert sorted((a.action, a.index, a.version, a.reason) for a in tele) == [
            ("start", 0, "1.0.0", "version-changed"),
            ("start", 1, "1.0.0", "version-changed"),
            ("stop", 0, "0.9.1", "version-changed"),
            ("stop", 1, "0.9.1", "version-changed"),
        ]
        assert len(c.plan.actions) == 4  # nothing else moves
        check_demo_patches(demo_copy, c.plan, c.result.placements, _addresses(c))
        reconcile(demo_copy)
        apply_all(demo_copy)
        on_edge1 = set(read_actual(demo_copy, "edge-1")["instances"])
        assert on_edge1  # nav and the loggers
        (demo_copy / "nodes" / "edge-1.yaml").unlink()
        c = compute_once(demo_copy, ReconcileOptions(), read_only=True)
        stops = {a.instance_id: (a.node_id, a.reason) for a in c.plan.stops()}
        assert stops == {iid: ("edge-1", "node-lost") for iid in on_edge1}
        placed = {p.instance_id for p in c.result.placements}
        starts = {a.instance_id: a.reason for a in c.plan.starts()}
        assert starts == {iid: "node-lost" for iid in on_edge1 & placed}
        assert starts  # the loggers start elsewhere
        # nav needs the labels only edge-1 had: it fails, and is still stopped there
        nav = instance_id("com.example.nav", "default", 0)
        assert nav in on_edge1 and nav not in placed
        assert [f.instance_id for f in c.plan.failures] == [nav]
        check_demo_patches(demo_copy, c.plan, c.result.placements, _addresses(c))
        assert c.plan.patches["edge-1"][0] == {
            "op": "test",
            "path": "/revision",
            "value": read_actual(demo_copy, "edge-1")["revision"],
        }

    def test_planning_twice_gives_identical_bytes_and_writes_nothing(
        self, demo_copy: Path, capsys: Any
    ) -> None:
        reconcile(demo_copy)
        svc = demo_copy / "desired" / "apps" / "logger.yaml"
        svc.write_text(svc.read_text().replace("instances: 3", "instances: 1"))
        before = snapshot(demo_copy)
        assert main(["plan", "--state", str(demo_copy), "--json"]) == 2
        first = capsys.readouterr().out
        assert main(["plan", "--state", str(demo_copy), "--json"]) == 2
        second = capsys.readouterr().out
        assert first == second and json.loads(first)["changesPresent"] is True
        assert main(["plan", "--state", str(demo_copy)]) == 2  # the human form reads the same
        assert snapshot(demo_copy) == before

    def test_plan_writes_nothing_even_with_a_corrupt_checkpoint(
        self, demo_copy: Path, capsys: Any
    ) -> None:
        reconcile(demo_copy)
        apply_all(demo_copy)
        (demo_copy / "checkpoint" / "allocations.json").write_bytes(b"{ torn")
        before = snapshot(demo_copy)
        # the previous generation is used, in memory only: nothing quarantined, nothing written
        assert main(["plan", "--state", str(demo_copy), "--json"]) in (0, 2)
        capsys.readouterr()
        assert snapshot(demo_copy) == before
        assert not (demo_copy / "checkpoint" / "quarantine").exists()

    def test_plan_of_a_never_reconciled_directory_creates_nothing(
        self, demo_copy: Path, capsys: Any
    ) -> None:
        before = snapshot(demo_copy)
        assert main(["plan", "--state", str(demo_copy)]) == 2
        assert "Plan: 10 to start, 0 to stop; 0 unplaceable." in capsys.readouterr().out
        assert snapshot(demo_copy) == before
        assert not (demo_copy / "out").exists() and not (demo_copy / "checkpoint").exists()
        assert not (demo_copy / ".lock").exists()

    def test_reconcile_twice_rewrites_nothing(self, demo_copy: Path, capsys: Any) -> None:
        """With the OCI configs, as the CLI runs it: the second run writes no file."""
        assert main(["reconcile", "--state", str(demo_copy)]) == 0
        assert "Plan: 10 to start" in capsys.readouterr().out
        files = snapshot(demo_copy)
        assert any("config.json" in p for p in files)
        assert main(["reconcile", "--state", str(demo_copy), "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["written"] == [] and report["checkpointWritten"] is False
        assert snapshot(demo_copy) == files

    def test_reconcile_twice_after_the_agents_reports_no_changes(
        self, demo_copy: Path, capsys: Any
    ) -> None:
        assert main(["reconcile", "--state", str(demo_copy)]) == 0
        apply_all(demo_copy)
        assert main(["reconcile", "--state", str(demo_copy)]) == 0
        assert "No changes." in capsys.readouterr().out
        files = snapshot(demo_copy)
        assert main(["reconcile", "--state", str(demo_copy)]) == 0
        out = capsys.readouterr().out
        assert "No changes." in out and "Wrote 0 file(s) in 1 pass(es)." in out
        assert snapshot(demo_copy) == files

    def test_apply_writes_the_saved_plan_or_refuses_a_stale_one(
        self, demo_copy: Path, tmp_path: Path, capsys: Any
    ) -> None:
        saved = tmp_path / "plan.json"
        assert main(["plan", "--json", "--state", str(demo_copy)]) == 2
        saved.write_text(capsys.readouterr().out)
        assert main(["apply", str(saved), "--state", str(demo_copy)]) == 0
        capsys.readouterr()
        written = json.loads((demo_copy / "out" / "plan.json").read_text())
        assert written == json.loads(saved.read_text())
        # an input changes after the plan was saved: the plan is stale, nothing is written
        assert main(["plan", "--json", "--state", str(demo_copy)]) == 2
        saved.write_text(capsys.readouterr().out)
        svc = demo_copy / "desired" / "apps" / "logger.yaml"
        svc.write_text(svc.read_text().replace("instances: 3", "instances: 2"))
        before = snapshot(demo_copy)
        assert main(["apply", str(saved), "--state", str(demo_copy)]) == 4
        assert "stale plan" in capsys.readouterr().err
        assert snapshot(demo_copy) == before

    def test_plan_exit_codes(self, demo_copy: Path, capsys: Any) -> None:
        assert main(["plan", "--state", str(demo_copy)]) == 2
        reconcile(demo_copy)
        apply_all(demo_copy)
        assert main(["plan", "--state", str(demo_copy)]) == 0
        assert "No changes." in capsys.readouterr().out
        svc = demo_copy / "desired" / "apps" / "logger.yaml"
        svc.write_text(svc.read_text().replace("instances: 3", "instances: 300"))
        assert main(["plan", "--state", str(demo_copy)]) == 3
        out = capsys.readouterr().out
        assert "0/3 nodes feasible" in out and "unplaceable." in out


def _plan_time(n: int) -> float:
    """Stop n instances on one node and start n others on another (best of five, in CPU time of
    this process, without the garbage collector's pauses, which grow with the heap and blur the
    comparison; other processes on a loaded machine do not count)."""
    stops = [record("old", i) for i in range(n)]
    actual = {"n1": ActualState.model_validate(actual_doc("n1", 1, stops))}
    placements = tuple(placement("new", i, "n2") for i in range(n))
    result = BalanceResult(placements, ())
    best = float("inf")
    gc.collect()
    gc.disable()
    try:
        for _ in range(5):
            t0 = time.process_time()
            plan = make_plan(result, actual, {"n1", "n2"})
            best = min(best, time.process_time() - t0)
    finally:
        gc.enable()
    assert len(plan.stops()) == n and len(plan.starts()) == n
    assert len(plan.patches["n1"]) == n + 1 and len(plan.patches["n2"]) == n + 1
    return best


def test_planning_scales_linearly() -> None:
    """Issue 6: 10,000 stops and 10,000 starts (benchmarks/plan.py measures the absolute time);
    here only the growth: 4x the instances must cost well under 16x the time (quadratic).
    (2x against a bound of 3x failed on a noisy VM at 3.15x: the margin is wide now.)"""
    small, large = _plan_time(2500), _plan_time(10000)
    assert large < 8.0 * small + 0.01, (small, large)


class TestFingerprint:
    """SPEC §10: the fingerprint covers the input files' contents and the checkpoint generation,
    nothing else, so identical inputs give identical plan bytes wherever and whenever they are
    planned, and `apply` of a saved plan is refused only when an input really changed.

    The loader once hashed each resourcesFile's absolute path and stat key into
    StateView.input_hash; only contents count now."""

    def test_identical_inputs_in_two_directories_plan_identically(
        self, demo_copy: Path, tmp_path: Path, capsys: Any
    ) -> None:
        import shutil

        inline = tmp_path / "inline"
        shutil.copytree(demo_copy, inline)
        inline_resources(inline)
        other = tmp_path / "elsewhere"
        shutil.copytree(inline, other)
        assert main(["plan", "--json", "--state", str(inline)]) == 2
        a = capsys.readouterr().out
        assert main(["plan", "--json", "--state", str(other)]) == 2
        assert capsys.readouterr().out == a

    def test_a_resources_file_in_two_directories_plans_identically(
        self, demo_copy: Path, tmp_path: Path, capsys: Any
    ) -> None:
        import shutil

        other = tmp_path / "elsewhere"
        shutil.copytree(demo_copy, other)
        assert main(["plan", "--json", "--state", str(demo_copy)]) == 2
        a = capsys.readouterr().out
        assert main(["plan", "--json", "--state", str(other)]) == 2
        assert capsys.readouterr().out == a

    def test_planning_twice_seconds_apart_gives_identical_bytes(
        self, demo_copy: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """As a CI job does: plan right after the checkout, and again later."""
        from reconciler.io import fsio

        monkeypatch.setattr(fsio, "RACY_WINDOW_NS", 10**18)  # within 2 s of the checkout
        assert main(["plan", "--json", "--state", str(demo_copy)]) == 2
        first = capsys.readouterr().out
        monkeypatch.setattr(fsio, "RACY_WINDOW_NS", 0)  # seconds later
        assert main(["plan", "--json", "--state", str(demo_copy)]) == 2
        assert capsys.readouterr().out == first

    def test_a_second_reconcile_after_the_racy_window_rewrites_nothing(
        self, demo_copy: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from reconciler.io import fsio

        # the first run happens within 2 s of the copy: the resources file is not "settled"
        monkeypatch.setattr(fsio, "RACY_WINDOW_NS", 10**18)
        reconcile(demo_copy)
        monkeypatch.setattr(fsio, "RACY_WINDOW_NS", 0)  # ... and the second one later
        report = reconcile(demo_copy)
        assert report.written == ()

    def test_touching_a_resources_file_does_not_make_a_plan_stale(
        self, demo_copy: Path, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from reconciler.io import fsio

        monkeypatch.setattr(fsio, "RACY_WINDOW_NS", 0)  # every file counts as settled
        assert main(["plan", "--json", "--state", str(demo_copy)]) == 2
        saved = tmp_path / "plan.json"
        saved.write_text(capsys.readouterr().out)
        res = demo_copy / "resources" / "edge-1.json"
        res.write_bytes(res.read_bytes())  # same bytes, new mtime
        os.utime(res, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
        assert main(["apply", str(saved), "--state", str(demo_copy)]) == 0
