"""The planner's memo (``PlanMemo``, issue 9's warm path): a sequence of plans made with one
memo must equal the plans made without it, whatever changes between calls (placements moved,
added, removed or replaced by equal new objects; actual documents edited, replaced, added or
dropped; nodes lost), and a change on one node must rebuild that node's patch only."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.models import ActualState
from reconciler.placement import BalanceResult, Placement
from reconciler.planner import PlanMemo, make_plan
from tests.test_planner import actual_doc, placement, record

NODES = ["n1", "n2", "n3"]
IDENTITIES = [(i, x) for i in ("a", "b", "c") for x in range(3)]


def _records(data: st.DataObject) -> list[dict[str, Any]]:
    return [
        record(
            i,
            x,
            version=data.draw(st.sampled_from(["1.0.0", "2.0.0"])),
            devices=data.draw(st.sampled_from([{}, {"gpu": ["g0"]}])),
        )
        for i, x in data.draw(st.lists(st.sampled_from(IDENTITIES), unique=True, max_size=4))
    ]


def _placement(data: st.DataObject, item: str, index: int) -> Placement:
    return placement(
        item,
        index,
        data.draw(st.sampled_from(NODES)),
        version=data.draw(st.sampled_from(["1.0.0", "2.0.0"])),
        devices=data.draw(st.sampled_from([(), (("gpu", ("g0",)),)])),
    )


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_a_memo_gives_the_plan_made_without_it(data: st.DataObject) -> None:
    memo = PlanMemo()
    actual: dict[str, ActualState] = {}
    placed: dict[tuple[str, int], Placement] = {}
    nodes = set(NODES)
    for step in range(data.draw(st.integers(1, 6), label="steps")):
        for node in [*NODES, "lost"]:
            change = data.draw(st.sampled_from(("keep", "keep", "new", "drop")), label="actual")
            if change == "new":
                revision = data.draw(st.integers(0, 50))
                doc = actual_doc(node, revision, _records(data))
                actual[node] = ActualState.model_validate(doc)
            elif change == "drop":
                actual.pop(node, None)
        for i, x in IDENTITIES:
            change = data.draw(st.sampled_from(("keep", "keep", "new", "drop", "copy")))
            if change == "new":
                placed[(i, x)] = _placement(data, i, x)
            elif change == "drop":
                placed.pop((i, x), None)
            elif change == "copy" and (i, x) in placed:
                p = placed[(i, x)]  # an equal placement, another object
                placed[(i, x)] = placement(
                    i, x, p.node_id, p.version, p.runtime_id, devices=p.devices
                )
        if data.draw(st.integers(0, 4), label="node lost") == 0:
            nodes = set(NODES) - {data.draw(st.sampled_from(NODES))}
        result = BalanceResult(tuple(placed[k] for k in sorted(placed)), ())
        got = make_plan(result, dict(actual), nodes, fingerprint=f"f{step}", memo=memo)
        want = make_plan(result, dict(actual), nodes, fingerprint=f"f{step}")
        assert got == want, f"step {step}"
        assert got.actions == want.actions  # the order too


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
    first = make_plan(BalanceResult(placements, ()), actual, set(NODES), memo=memo)
    assert memo.patches_built == 3
    moved = (*placements[:3], placement("b", 0, "n2"))
    second = make_plan(BalanceResult(moved, ()), actual, set(NODES), memo=memo)
    assert memo.patches_built == 2  # n1 loses b:0, n2 gains it; n3 is reused
    assert second.patches["n3"] is first.patches["n3"]
    assert second == make_plan(BalanceResult(moved, ()), actual, set(NODES))
