"""The planner's memo (``PlanMemo``, the warm path): a sequence of plans made with one memo
must equal the plans of the reference planner (``make_plan``, a separate implementation),
whatever changes between calls (placements moved, added, removed, failed or replaced by equal
new objects; actual documents edited, replaced, added or dropped; nodes lost), and a change on
one node must rebuild that node's patch only."""

from __future__ import annotations

import dataclasses
import itertools
import operator
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from reconciler.accel.plans import PlanMemo
from reconciler.model.documents import ActualState
from reconciler.model.values import instance_id
from reconciler.placement.instances import BalanceResult, Cause, Changes, Failure, Placement
from reconciler.planning.plans import make_plan, plan_bytes
from tests.support.plans import actual_doc, placement, record

NODES = ["n1", "n2", "n3"]
IDENTITIES = [(i, x) for i in ("a", "b", "c") for x in range(3)]


def _records(
    data: st.DataObject,
    node: str,
    placed: dict[tuple[str, int], Placement],
    elsewhere: set[tuple[str, int]],
) -> list[dict[str, Any]]:
    """Some identities' records: often as placed when placed on ``node`` (kept), else drawn;
    none of ``elsewhere`` (the identities other documents list, when the test keeps every
    instance on one document at most)."""
    records = []
    free = [k for k in IDENTITIES if k not in elsewhere]
    drawn = data.draw(st.lists(st.sampled_from(free), unique=True, max_size=4)) if free else []
    for i, x in drawn:
        p = placed.get((i, x))
        if p is not None and p.node_id == node and data.draw(st.booleans(), label="as placed"):
            records.append(record(i, x, p.version, devices={r: list(ids) for r, ids in p.devices}))
        else:
            records.append(
                record(
                    i,
                    x,
                    version=data.draw(st.sampled_from(["1.0.0", "2.0.0"])),
                    devices=data.draw(st.sampled_from([{}, {"gpu": ["g0"]}])),
                )
            )
    return records


def _placement(data: st.DataObject, item: str, index: int) -> Placement:
    p = placement(
        item,
        index,
        data.draw(st.sampled_from(NODES)),
        version=data.draw(st.sampled_from(["1.0.0", "2.0.0"])),
        devices=data.draw(st.sampled_from([(), (("gpu", ("g0",)),)])),
    )
    # the priority a displaced instance's stop reason compares, and why it was last moved
    priority = data.draw(st.sampled_from([0, 0, 5]), label="priority")
    causes: list[Cause | None] = [None, None, "preempted", "rebalanced"]
    cause = data.draw(st.sampled_from(causes), label="cause")
    return dataclasses.replace(p, priority=priority, cause=cause)


def _failure(item: str, index: int, priority: int) -> Failure:
    iid = instance_id(item, "default", index)
    label = f"{item}:default:{index}"
    return Failure(iid, item, "default", index, "1.0.0", priority, "Cpu", label, (("Cpu", 1),))


@settings(max_examples=400, deadline=None)
@pytest.mark.parametrize("naming", [False, True], ids=["plain", "naming-changes"])
@given(data=st.data())
def test_a_memo_gives_the_plan_made_without_it(naming: bool, data: st.DataObject) -> None:
    """``naming-changes``: each result names its changes since the last (the delta path)."""
    memo = PlanMemo()
    last: BalanceResult | None = None
    delta_taken = False
    once = data.draw(st.booleans(), label="an instance listed by one document at most")
    actual: dict[str, ActualState] = {}
    placed: dict[tuple[str, int], Placement] = {}
    failed: dict[tuple[str, int], Failure] = {}
    nodes = set(NODES)
    for step in range(data.draw(st.integers(1, 6), label="steps")):
        for node in [*NODES, "lost"]:
            change = data.draw(
                st.sampled_from(("keep", "keep", "keep", "new", "new", "drop")), label="actual"
            )
            if change == "new":
                revision = data.draw(st.integers(0, 50))
                elsewhere = {
                    (r.itemId, r.index)
                    for n, other in actual.items()
                    if n != node and once
                    for r in other.instances.values()
                }
                doc = actual_doc(node, revision, _records(data, node, placed, elsewhere))
                actual[node] = ActualState.model_validate(doc)
            elif change == "drop":
                actual.pop(node, None)
        for i, x in IDENTITIES:
            change = data.draw(st.sampled_from(("keep", "keep", "new", "drop", "copy", "fail")))
            failed.pop((i, x), None)
            if change == "new":
                placed[(i, x)] = _placement(data, i, x)
            elif change == "drop":
                placed.pop((i, x), None)
            elif change == "fail":  # desired, without a place (stopped: displaced or not)
                placed.pop((i, x), None)
                failed[(i, x)] = _failure(i, x, data.draw(st.sampled_from([0, 3, 9])))
            elif change == "copy" and (i, x) in placed:
                p = placed[(i, x)]  # an equal placement, another object
                placed[(i, x)] = placement(
                    i, x, p.node_id, p.version, p.runtime_id, devices=p.devices
                )
        if data.draw(st.integers(0, 4), label="node lost") == 0:
            nodes = set(NODES) - {data.draw(st.sampled_from(NODES))}
        result = _result(data, placed, failed, last if naming else None)
        got = memo.make_plan(result, dict(actual), nodes, fingerprint=f"f{step}")
        want = make_plan(result, dict(actual), nodes, fingerprint=f"f{step}")
        assert got == want, f"step {step}"
        assert got.actions == want.actions  # the order too
        inputs = {"fingerprint": f"f{step}"}
        if data.draw(st.integers(0, 3), label="plan bytes made") > 0:  # (sometimes skipped)
            assert memo.plan_bytes(got, inputs) == plan_bytes(want, inputs)
        delta_taken = delta_taken or memo.rematched >= 0
        last = result
    if naming:
        event("delta path taken" if delta_taken else "full pass only")


_REVISIONS = itertools.count(1000)


def _result(
    data: st.DataObject,
    placed: dict[tuple[str, int], Placement],
    failed: dict[tuple[str, int], Failure],
    last: BalanceResult | None,
) -> BalanceResult:
    """The placements as a result; given the last results, mostly one that names (as the
    balancer's memo does) a superset of the ids whose placement is not the last one's object,
    sometimes that very result again (nothing changed), or one naming its changes since
    another result (the planner must not take them as changes since its last)."""
    placements = tuple(placed[k] for k in sorted(placed))
    failures = tuple(failed[k] for k in sorted(failed))
    if last is None:
        return BalanceResult(placements, failures, revision=next(_REVISIONS))
    how = data.draw(st.sampled_from(("since", "since", "since", "same", "stale", "none")))
    old = last.placements
    same = len(placements) == len(old) and all(map(operator.is_, placements, old))
    if how == "same" and same and failures == last.failures:
        return last
    # stale: it names its changes since another result (here an equal copy of itself)
    base = (
        BalanceResult(placements, failures, revision=next(_REVISIONS)) if how == "stale" else last
    )
    if how == "none":
        return BalanceResult(placements, failures, revision=next(_REVISIONS))
    now = {p.instance_id: p for p in placements}
    changed = {i for i in now.keys() | base.by_id.keys() if now.get(i) is not base.by_id.get(i)}
    every = [instance_id(i, "default", x) for i, x in IDENTITIES]
    extra = data.draw(st.lists(st.sampled_from(every), max_size=3), label="named too")
    assert base.revision is not None
    changes = Changes(base.revision, frozenset(changed | set(extra)))
    return BalanceResult(placements, failures, revision=next(_REVISIONS), changes=changes)


def test_one_changed_node_rebuilds_its_patch_only() -> None:
    actual = {
        n: ActualState.model_validate(actual_doc(n, 1, [record("a", k)]))
        for k, n in enumerate(NODES)
    }
    placements = (
        *tuple(placement("a", k, n) for k, n in enumerate(NODES)),
        placement("b", 0, "n1"),
    )
    memo = PlanMemo()
    first = memo.make_plan(BalanceResult(placements, ()), actual, set(NODES))
    assert memo.patches_built == 3
    moved = (*placements[:3], placement("b", 0, "n2"))
    second = memo.make_plan(BalanceResult(moved, ()), actual, set(NODES))
    assert memo.patches_built == 2  # n1 loses b:0, n2 gains it; n3 is reused
    assert second.patches["n3"] is first.patches["n3"]
    assert second == make_plan(BalanceResult(moved, ()), actual, set(NODES))


def test_an_instance_no_longer_running_as_placed_starts_on_the_delta_path() -> None:
    """Its placement is the same object and the result does not name it: only its node's
    edited document tells it is no longer kept."""
    placements = (placement("a", 0, "n1"), placement("a", 1, "n2"))
    first = BalanceResult(placements, (), revision=1)
    running = {
        "n1": ActualState.model_validate(actual_doc("n1", 1, [record("a", 0)])),
        "n2": ActualState.model_validate(actual_doc("n2", 1, [record("a", 1)])),
    }
    memo = PlanMemo()
    assert not memo.make_plan(first, running, set(NODES)).actions
    again = BalanceResult(placements, (), revision=2, changes=Changes(1, frozenset()))
    stopped = dict(running, n1=ActualState.model_validate(actual_doc("n1", 2, [])))
    got = memo.make_plan(again, stopped, set(NODES))
    assert memo.rematched == 1  # n1 only
    assert [(a.action, a.instance_id, a.reason) for a in got.actions] == [
        ("start", placements[0].instance_id, "new")
    ]
    assert got == make_plan(again, stopped, set(NODES))


def test_a_start_whose_address_changed_gets_a_new_record() -> None:
    """The same placements and documents, another address for a start (its service's network
    changed): the memo builds that node's patch again, as a plan without memo does."""
    placements = (placement("a", 0, "n1"), placement("a", 1, "n2"))
    result = BalanceResult(placements, (), revision=next(_REVISIONS))
    actual: dict[str, ActualState] = {}
    memo = PlanMemo()
    first = memo.make_plan(
        result, actual, set(NODES), addresses={placements[0].instance_id: "10.0.0.2"}
    )
    moved = {placements[0].instance_id: "10.0.1.2"}
    got = memo.make_plan(result, actual, set(NODES), addresses=moved)
    assert got == make_plan(result, actual, set(NODES), addresses=moved)
    assert got.patches["n1"][1]["value"]["ip"] == "10.0.1.2"
    assert first.patches["n1"][1]["value"]["ip"] == "10.0.0.2"
    assert got.patches["n2"] is first.patches["n2"]  # (no address there: kept)
