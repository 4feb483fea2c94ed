"""The status report's node entries in a watcher's run: looking only at the nodes the changes
name (the nodes replaced, those of the instances the balance says changed, those of every
instance of an edited service) gives every node's entry as a full pass does, along random
edit sequences balanced through the memo (hypothesis), whether the loads' changes count from
the last call's view, from another one, or are not known."""

from __future__ import annotations

import itertools
import shutil
from dataclasses import replace
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from benchmarks.statedir import bump_instances, write_state_dir
from reconciler.accel import BalanceMemo
from reconciler.accel.ids import IdsMemo
from reconciler.controller.reconcile import ReconcileCache, ReconcileOptions, reconcile
from reconciler.controller.status import (
    AllocationIds,
    NodeStatusCache,
    build_status,
    node_statuses,
    status_bytes,
)
from reconciler.io.loader import StateView
from reconciler.model.changes import InputChanges
from reconciler.model.documents import ActualState, Node
from reconciler.model.jsonbytes import pretty_json
from reconciler.placement.instances import PreviousAllocation
from reconciler.planning.checkpoint import Allocation
from tests.placement.test_balance_memo_inputs import _anew, _edit
from tests.support.balancer_scenarios import SETTINGS, Scenario, node_docs, scenarios
from tests.support.builders import make_node, make_service, make_unit, previous_of, reported

_REVISIONS = itertools.count(10_000)


@SETTINGS
@given(scenario=scenarios(), data=st.data())
def test_the_nodes_the_changes_name_give_every_nodes_entry(
    scenario: Scenario, data: st.DataObject
) -> None:
    nodes = scenario.nodes()
    node_ids = [n.id for n in nodes]
    svcs = list(scenario.services)
    memo = BalanceMemo()
    cache = NodeStatusCache()
    previous: dict[str, PreviousAllocation] = {}
    told = InputChanges.unknown(next(_REVISIONS))
    looked = 0  # steps that looked at the named nodes only
    for step in range(data.draw(st.integers(1, 6), label="steps")):
        how = data.draw(st.sampled_from(("told", "told", "gap", "unknown")), label="how")
        changes = told
        if how == "gap":  # counted from another view: found by identity instead
            changes = InputChanges((told.since or 0) - 1, told.revision)
        elif how == "unknown":
            changes = InputChanges.unknown(told.revision)
        view = StateView(
            Path("unit"),
            scenario.unit,
            {s.key: s for s in svcs},
            {n.id: n for n in nodes},
            revision=told.revision,
            changes=changes,
        )
        result = memo.balance(scenario.unit, nodes, svcs, previous, "stable", inputs=changes)
        had = cache._basis is not None
        got = node_statuses(view, result, cache)
        assert got == node_statuses(view, result), f"step {step}"
        looked += had and result.changes is not None
        previous = previous_of(result)
        # the edits before the next call: services (in place), a node replaced or made anew
        keys = _edit(data, svcs, node_ids, step)
        named: set[str] = set()
        what = data.draw(st.sampled_from(("same", "same", "edited", "anew")), label="node")
        if what != "same":
            i = data.draw(st.integers(0, len(nodes) - 1), label="which node")
            nodes = list(nodes)
            if what == "edited":
                doc = data.draw(node_docs(node_ids[i]), label="node doc")
                nodes[i] = Node.model_validate(doc)
                named.add(node_ids[i])
            else:  # an equal object made anew, not named (a stale mark's copy, a reload)
                nodes[i] = _anew(nodes[i])
        told = InputChanges(
            told.revision, next(_REVISIONS), services=frozenset(keys), nodes=frozenset(named)
        )


def test_the_node_an_unchanged_instance_moves_to_is_looked_at() -> None:
    """A high-priority service pinned to n1 evicts a low one, which moves to n2: n2's entry
    changes though neither n2 nor the low service changed; n3 is not looked at."""
    unit = make_unit()
    nodes = [make_node("n1", dmips=2000), make_node("n2", dmips=1000), make_node("n3", dmips=900)]
    low = make_service("low", cpu=800)
    high = make_service("high", cpu=1500, priority=100, node_id="n1")
    memo = BalanceMemo()
    cache = NodeStatusCache()
    first = InputChanges.unknown(next(_REVISIONS))
    before = memo.balance(unit, nodes, [low], {}, "stable", inputs=first)
    assert [p.node_id for p in before.placements] == ["n1"]
    view = StateView(Path("unit"), unit, {low.key: low}, {n.id: n for n in nodes})
    node_statuses(replace(view, revision=first.revision), before, cache)
    told = InputChanges(first.revision, next(_REVISIONS), services=frozenset({high.key}))
    after = memo.balance(unit, nodes, [low, high], previous_of(before), "stable", inputs=told)
    where = {p.item_id: p.node_id for p in after.placements}
    assert where == {"high": "n1", "low": "n2"} and after.changes is not None
    now = replace(
        view, services={low.key: low, high.key: high}, revision=told.revision, changes=told
    )
    assert node_statuses(now, after, cache) == node_statuses(now, after)
    assert cache.looked == 2 and cache.recomputed == 2  # n1 and n2


@SETTINGS
@given(scenario=scenarios(), data=st.data())
def test_the_records_the_changes_name_give_the_whole_report(
    scenario: Scenario, data: st.DataObject
) -> None:
    """The whole report (``status_bytes``) of a watcher's runs, its instance records made again
    only for the instances the balance, the uid memo or an agent's report changed, is the
    report a fresh process builds; the records the status page reads keep the result's
    order."""
    nodes = scenario.nodes()
    node_ids = [n.id for n in nodes]
    svcs = list(scenario.services)
    memo, ids, cache = BalanceMemo(), IdsMemo(), NodeStatusCache()
    previous: dict[str, PreviousAllocation] = {}
    allocations: dict[str, Allocation] = {}
    gids: dict[str, int] = {}
    actual: dict[str, ActualState] = {}
    told = InputChanges.unknown(next(_REVISIONS))
    for step in range(data.draw(st.integers(1, 6), label="steps")):
        result = memo.balance(scenario.unit, nodes, svcs, previous, "stable", inputs=told)
        allocations, gids, _ = ids.assign(result, allocations, gids, old_is_last=True)
        uids = AllocationIds(allocations, ids.since_for(allocations))
        reports = data.draw(st.booleans(), label="an agent reports")
        if reports and result.placements:
            p = data.draw(st.sampled_from(result.placements), label="reported")
            on = data.draw(st.sampled_from([p.node_id, *node_ids]), label="on node")
            state = data.draw(st.sampled_from(["active", "failed", "inactive"]), label="state")
            doc = reported(p, on, state)
            actual = {**actual, on: doc}  # (a load replaces the mapping)
        view = StateView(
            Path("unit"),
            scenario.unit,
            {s.key: s for s in svcs},
            {n.id: n for n in nodes},
            actual,
            revision=told.revision,
            changes=told,
        )
        got = status_bytes(view, result, (), uids=uids, cache=cache)
        assert got == pretty_json(build_status(view, result, None, (), uids=dict(uids))), step
        assert list(cache._records) == [p.instance_id for p in result.placements], step
        previous = previous_of(result)
        keys = _edit(data, svcs, node_ids, step)
        told = InputChanges(told.revision, next(_REVISIONS), services=frozenset(keys))


def test_a_watchers_edit_remakes_the_report_of_what_it_changed_only(tmp_path: Path) -> None:
    """In the controller: after one service is scaled, the report's node entries and instance
    records are looked at for what that edit changed (one node, its instances), not for all
    200 instances on 50 nodes; the report is the one a fresh process writes."""
    root = tmp_path / "unit"
    write_state_dir(root, 50, 200, actual_every=0)
    opts = ReconcileOptions(cache=ReconcileCache())
    assert opts.cache is not None
    view = reconcile(root, opts).computed.view
    view = reconcile(root, opts, view).computed.view  # (a steady run: the memos' chain)
    service = sorted((root / "desired").rglob("*.yaml"))[0].stem
    bump_instances(root, service, +1)
    reconcile(root, opts, view)
    status = opts.cache.status
    assert 0 < status.looked <= 2 and 0 < status.remade < 50
    report = (root / "out" / "status.json").read_bytes()
    fresh = tmp_path / "fresh"
    shutil.copytree(root, fresh)
    reconcile(fresh, ReconcileOptions())
    assert (fresh / "out" / "status.json").read_bytes() == report
