"""A node whose report grows too old between two runs, its file unchanged: the loader names no
change, but the stale mark does (``StaleMarks.changed``), and a watcher's run (the balancer's
memo told what changed) moves what ran there, as a fresh process does."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from reconciler.controller.reconcile import ReconcileCache, ReconcileOptions, reconcile
from reconciler.controller.reports import StaleMarks
from reconciler.model.documents import Node
from reconciler.placement.instances import BalanceResult
from tests.support.builders import make_unit
from tests.support.state_files import write

T0 = 1_800_000_000


def _node(node_id: str, at: float, dmips: int = 1000) -> str:
    return (
        "apiVersion: reconciler/v1\nkind: Node\n"
        f"id: {node_id}\ntype: edge\nmaxDMIPS: {dmips}\ntotalRAM: 1Gi\n"
        "runtimes: [{id: runc, type: runc, platform: {architecture: x86_64}}]\n"
        f"reportedAt: '{datetime.fromtimestamp(at, UTC).isoformat()}'\n"
    )


def _reported(node_id: str, at: float) -> Node:
    return Node.model_validate(
        {
            "apiVersion": "reconciler/v1",
            "kind": "Node",
            "id": node_id,
            "type": "edge",
            "maxDMIPS": 1000,
            "totalRAM": "1Gi",
            "reportedAt": datetime.fromtimestamp(at, UTC).isoformat(),
        }
    )


def test_the_marks_name_the_nodes_whose_mark_changed() -> None:
    unit = make_unit()  # nodeTimeout 60 s
    a, b = _reported("a", 1_000), _reported("b", 1_100)
    marks = StaleMarks()
    marks.apply(unit, [a, b], 1_050)
    assert marks.changed == frozenset()  # nothing stale, nothing was
    marks.apply(unit, [a, b], 1_000 + 120)
    assert marks.changed == {"a"}  # a marked ("no report for 2m")
    marks.apply(unit, [a, b], 1_000 + 150)
    assert marks.changed == frozenset()  # the same reason: the same copy
    marks.apply(unit, [a, b], 1_000 + 185)
    assert marks.changed == {"a", "b"}  # a: "3m" now; b marked
    fresh_a = _reported("a", 1_180)
    marks.apply(unit, [fresh_a, b], 1_000 + 190)
    assert marks.changed == {"a"}  # unmarked
    marks.apply(unit, [fresh_a], 1_000 + 190)
    assert marks.changed == {"b"}  # gone (the loader names it too)


class _Counted(datetime):
    """A report time that counts how often its timestamp is read."""

    reads = 0

    def timestamp(self) -> float:
        _Counted.reads += 1
        return super().timestamp()


def _counted(node_id: str, at: float) -> Node:
    # (model_copy does not validate: the subclass stays)
    return _reported(node_id, at).model_copy(update={"reportedAt": _Counted.fromtimestamp(at, UTC)})


def test_the_same_mapping_given_again_is_marked_when_its_oldest_report_grows_too_old() -> None:
    # a watcher gives the view's nodes mapping: the same object while no node file changed.
    # While none is stale, only the oldest report's age is looked at; it still turns stale.
    unit = make_unit()  # nodeTimeout 60 s
    by_hand = _reported("c", 0).model_copy(update={"reportedAt": None})  # never stale
    nodes = {"a": _counted("a", 1_100), "b": _counted("b", 1_000), "c": by_hand}
    marks = StaleMarks()
    _Counted.reads = 0
    assert marks.apply(unit, nodes, 1_050) == list(nodes.values())
    assert _Counted.reads == 2 and marks.changed == frozenset()
    assert marks.apply(unit, nodes, 1_060) == list(nodes.values())  # b 60 s old: not stale
    assert _Counted.reads == 2 and marks.changed == frozenset()
    got = marks.apply(unit, nodes, 1_061)  # b's report 61 s old
    assert marks.changed == {"b"}
    assert [n is m for n, m in zip(got, nodes.values(), strict=True)] == [True, False, True]
    assert got[1].id == "b" and got[1].reportedAt is not None
    # what a list of the same nodes gives
    assert StaleMarks().apply(unit, list(nodes.values()), 1_061) == got
    # another mapping (a node file changed): every report looked at again
    again = dict(nodes)
    _Counted.reads = 0
    marks.apply(unit, again, 1_061)
    assert _Counted.reads == 2 and marks.changed == frozenset()


def test_a_watchers_run_moves_the_instances_of_a_node_gone_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    write(state, "unit.yaml", "apiVersion: reconciler/v1\nkind: UnitConfig\nversion: 1.0.0\n")
    write(state, "nodes/big.yaml", _node("big", T0, dmips=2000))  # the first choice
    write(state, "nodes/small.yaml", _node("small", T0 + 10_000))  # reports in the future
    write(
        state,
        "desired/s.yaml",
        "apiVersion: reconciler/v1\nkind: Service\nid: s\nversion: 1.0.0\ninstances: 2\n"
        "runtimes: [runc]\nimage: {rootfs: /r}\nrequestedResources: {cpu: 100}\n",
    )
    cache = ReconcileCache()
    told: list[bool] = []  # per balance: whether the memo was told what changed since its last
    memo = cache.balance
    plain = memo.balance

    def spied(*args: Any, **kwargs: Any) -> BalanceResult:
        inputs = kwargs.get("inputs")
        told.append(inputs is not None and inputs.counts_from(memo._seen))  # (white box)
        return plain(*args, **kwargs)

    monkeypatch.setattr(memo, "balance", spied)
    first = reconcile(state, ReconcileOptions(clock=lambda: T0 + 10, cache=cache))
    assert {p.node_id for p in first.computed.result.placements} == {"big"}
    # again, a little later: nothing changed, the memo answers, told so
    again = reconcile(
        state, ReconcileOptions(clock=lambda: T0 + 20, cache=cache), first.computed.view
    )
    assert cache.balance.incremental and told == [False, True]
    # then big's report is 5 minutes old: no file changed, but big fails NodeState
    late = ReconcileOptions(clock=lambda: T0 + 300, cache=cache)
    watched = reconcile(state, late, again.computed.view)
    assert watched.computed.view.changes is not None and watched.computed.view.changes.empty
    assert told == [False, True, True]  # told: big's mark changed (the marks named it)
    fresh = reconcile(state, ReconcileOptions(clock=lambda: T0 + 300))  # a new process
    assert watched.computed.result == fresh.computed.result
    assert {p.node_id for p in watched.computed.result.placements} == {"small"}


def test_the_status_report_shows_a_node_with_a_stale_report_disconnected(tmp_path: Path) -> None:
    """The report shows the nodes as the balancer saw them: one whose report is too old is
    disconnected there too (its file still says connected), and again connected once it
    reports."""
    state = tmp_path / "state"
    write(state, "unit.yaml", "apiVersion: reconciler/v1\nkind: UnitConfig\nversion: 1.0.0\n")
    write(state, "nodes/big.yaml", _node("big", T0))
    write(state, "nodes/small.yaml", _node("small", T0 + 10_000))
    cache = ReconcileCache()

    def connected(at: float, view: Any = None) -> tuple[dict[str, bool], Any]:
        report = reconcile(state, ReconcileOptions(clock=lambda: at, cache=cache), view)
        status = json.loads((state / "out" / "status.json").read_bytes())
        return {n: e["connected"] for n, e in status["nodes"].items()}, report.computed.view

    now, view = connected(T0 + 10)
    assert now == {"big": True, "small": True}
    now, view = connected(T0 + 300, view)  # big's report is 5 minutes old
    assert now == {"big": False, "small": True}
    reconcile(state, ReconcileOptions(clock=lambda: T0 + 300))  # a new process: the same
    fresh = json.loads((state / "out" / "status.json").read_bytes())
    assert {n: e["connected"] for n, e in fresh["nodes"].items()} == now
    write(state, "nodes/big.yaml", _node("big", T0 + 290))  # big reports again
    now, view = connected(T0 + 300, view)
    assert now == {"big": True, "small": True}
