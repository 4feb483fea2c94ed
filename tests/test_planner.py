"""Plans (SPEC §10): per-instance JSON Patch, reasons, determinism, read-only plan."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import jsonpatch
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.cli import main
from reconciler.models import ActualState
from reconciler.placement import BalanceResult, Placement, Requested
from reconciler.planner import empty_actual_document, make_plan, pointer
from reconciler.reconcile import ReconcileOptions, compute_once, reconcile
from reconciler.values import instance_id

from .agent_sim import apply_all

NODES = ["n1", "n2", "n3"]
ITEMS = ["a", "b", "c"]


def placement(
    item: str,
    index: int,
    node: str,
    version: str = "1.0.0",
    runtime: str = "runc",
    devices: tuple[tuple[str, tuple[str, ...]], ...] = (),
) -> Placement:
    return Placement(
        instance_id(item, "default", index),
        item,
        "default",
        index,
        version,
        0,
        node,
        runtime,
        Requested(),
        (),
        devices,
    )


def record(
    item: str,
    index: int,
    version: str = "1.0.0",
    runtime: str = "runc",
    state: str = "active",
    devices: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    return {
        "itemId": item,
        "subjectId": "default",
        "index": index,
        "version": version,
        "runtimeId": runtime,
        "state": state,
        "devices": devices or {},
    }


def actual_doc(node: str, revision: int, records: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "reconciler/v1",
        "kind": "ActualState",
        "nodeId": node,
        "revision": revision,
        "instances": {instance_id(r["itemId"], r["subjectId"], r["index"]): r for r in records},
    }


def desired_doc(node: str, actual: dict[str, Any], placements: list[Placement]) -> dict[str, Any]:
    """The desired document, computed independently of the planner: kept instances keep their
    observed record, the others appear as started (state activating)."""
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
        reconcile(demo_copy)
        apply_all(demo_copy)
        (demo_copy / "nodes" / "edge-1.yaml").unlink()
        c = compute_once(demo_copy, ReconcileOptions(), read_only=True)
        lost = {a.action for a in c.plan.actions if a.reason == "node-lost"}
        assert lost == {"stop", "start"}
        assert all(a.node_id == "edge-1" for a in c.plan.stops())

    def test_planning_twice_gives_identical_bytes_and_writes_nothing(
        self, demo_copy: Path, capsys: Any
    ) -> None:
        reconcile(demo_copy)
        svc = demo_copy / "desired" / "apps" / "logger.yaml"
        svc.write_text(svc.read_text().replace("instances: 3", "instances: 1"))
        before = {
            p: (p.read_bytes(), p.stat().st_mtime_ns) for p in demo_copy.rglob("*") if p.is_file()
        }
        assert main(["plan", "--state", str(demo_copy), "--json"]) == 2
        first = capsys.readouterr().out
        assert main(["plan", "--state", str(demo_copy), "--json"]) == 2
        second = capsys.readouterr().out
        assert first == second and json.loads(first)["changesPresent"] is True
        after = {
            p: (p.read_bytes(), p.stat().st_mtime_ns) for p in demo_copy.rglob("*") if p.is_file()
        }
        assert after == before

    def test_reconcile_twice_rewrites_nothing(self, demo_copy: Path) -> None:
        reconcile(demo_copy)
        files = {
            p: (p.read_bytes(), p.stat().st_mtime_ns) for p in demo_copy.rglob("*") if p.is_file()
        }
        report = reconcile(demo_copy)
        assert report.written == () and not report.checkpoint_written
        assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in files} == files

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
    """Stop n instances on one node and start n others on another."""
    stops = [record("old", i) for i in range(n)]
    actual = {"n1": ActualState.model_validate(actual_doc("n1", 1, stops))}
    placements = tuple(placement("new", i, "n2") for i in range(n))
    result = BalanceResult(placements, ())
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        make_plan(result, actual, {"n1", "n2"})
        best = min(best, time.perf_counter() - t0)
    return best


def test_planning_scales_linearly() -> None:
    small, large = _plan_time(2500), _plan_time(5000)
    # 2x the instances must cost well under 4x the time (quadratic would be 4x)
    assert large < 3.5 * small + 0.01, (small, large)
