"""``status.json`` and ``plan.json`` put together from cached fragments (issue 9's warm path)
must be byte for byte what serializing the whole document gives: the fragment joiners against
orjson on random JSON values, and a watcher's runs (one cache across edits of every kind of
input) against ``pretty_json`` of the documents built from scratch."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.accel import plans as accel_plans
from reconciler.accel.plans import PlanMemo
from reconciler.controller.reconcile import ReconcileCache, ReconcileOptions, reconcile
from reconciler.controller.status import build_status
from reconciler.model.jsonbytes import (
    Joined,
    document,
    fragment,
    item,
    join_array,
    join_object,
    member,
    pretty_json,
)
from reconciler.placement.instances import Failure
from reconciler.planning.plans import Plan, failure_piece, started_record

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.text(max_size=5)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=20,
)


def _assemble(value: Any, depth: int, data: st.DataObject) -> bytes:
    """``value`` put together from fragments, each container either joined from its members
    or taken whole as one fragment (as the callers mix cached and fresh parts)."""
    if isinstance(value, dict) and data.draw(st.booleans()):
        pieces = [member(k, _assemble(value[k], depth + 1, data), depth) for k in sorted(value)]
        return join_object(pieces, depth)
    if isinstance(value, list) and data.draw(st.booleans()):
        return join_array([item(_assemble(v, depth + 1, data), depth) for v in value], depth)
    return fragment(value, depth)


@settings(max_examples=300, deadline=None)
@given(value=JSON, data=st.data())
def test_fragments_join_into_the_pretty_json_of_the_whole(value: Any, data: st.DataObject) -> None:
    assert _assemble(value, 0, data) + b"\n" == pretty_json(value)


@settings(max_examples=200, deadline=None)
@given(value=st.dictionaries(st.text(max_size=4), JSON, max_size=5), data=st.data())
def test_a_document_is_the_pretty_json_of_the_whole(value: Any, data: st.DataObject) -> None:
    members = [(k, _assemble(value[k], 1, data)) for k in sorted(value)]
    assert document(members) == pretty_json(value)


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.lists(JSON, max_size=4), min_size=1, max_size=5), data=st.data())
def test_joined_gives_what_joining_gives(values: list[list[Any]], data: st.DataObject) -> None:
    """A ``Joined`` fed pieces that are sometimes the very same objects, sometimes equal new
    ones, sometimes others, always gives the join of the pieces it is given."""
    joined = Joined()
    pieces: list[bytes] = []
    for value in values:
        reuse = data.draw(st.booleans())  # the same piece objects, in a new list
        fresh = [item(fragment(v, 2), 1) for v in value]
        pieces = list(pieces) if pieces and reuse else fresh
        assert joined.array(pieces, 1) == join_array(pieces, 1)
        assert joined.object(pieces, 1) == join_object(pieces, 1)


def _edit(path: Path, change: Any) -> None:
    doc = yaml.safe_load(path.read_text())
    change(doc)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def test_a_watchers_status_and_plan_are_the_whole_documents(demo_copy: Path) -> None:
    opts = ReconcileOptions(cache=ReconcileCache())
    view = None
    desired = sorted((demo_copy / "desired").glob("*.yaml"))
    node = sorted((demo_copy / "nodes").glob("*.yaml"))[0]

    def check() -> Any:
        nonlocal view
        report = reconcile(demo_copy, opts, view)
        c = report.computed
        view = c.view
        uids = {iid: (a.uid, a.gid) for iid, a in c.checkpoint.allocations.items()}
        raised = c.alerts.raised if c.alerts is not None else []
        whole = build_status(c.view, c.result, None, c.diagnostics, alerts=raised, uids=uids)
        assert (demo_copy / "out" / "status.json").read_bytes() == pretty_json(whole)
        assert (demo_copy / "out" / "plan.json").read_bytes() == pretty_json(c.plan_document())
        return c

    check()
    c = check()
    p = c.result.placements[0]  # its agent reports it running: its state is no longer pending
    running = dict(started_record(p), state="active")
    actual = {"apiVersion": "reconciler/v1", "kind": "ActualState", "nodeId": p.node_id}
    actual.update(revision=1, instances={p.instance_id: running})
    (demo_copy / "actual" / f"{p.node_id}.yaml").write_text(yaml.safe_dump(actual))
    check()
    _edit(desired[0], lambda d: d.update(instances=d.get("instances", 1) + 2))
    check()
    _edit(desired[1], lambda d: d.update(priority=d.get("priority", 0) + 5))
    check()
    _edit(node, lambda d: d.update(connected=False))
    check()
    (demo_copy / "desired" / "broken.yaml").write_text("kind: [\n")
    check()
    _edit(node, lambda d: d.update(connected=True))
    desired[0].unlink()
    check()


def test_plan_bytes_reuse_only_the_same_objects(demo_copy: Path) -> None:
    """A memo given another plan with equal-looking parts still serializes that plan."""
    report = reconcile(demo_copy, ReconcileOptions())
    plan = report.computed.plan
    memo = PlanMemo()
    inputs = {"fingerprint": plan.fingerprint, "mode": "stable"}
    first = memo.plan_bytes(plan, inputs)
    assert first == pretty_json(report.computed.plan_document())
    emptier = type(plan)(plan.fingerprint, (), plan.failures, {n: () for n in plan.patches})
    assert memo.plan_bytes(emptier, inputs) == pretty_json(dict(emptier.to_json(), inputs=inputs))


def test_plan_bytes_serialise_only_the_failures_not_seen_last_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A watcher's memo keeps an unplaceable service's failures (the same objects): the plan's
    ``failures`` are serialised for the new ones only, and read as a whole document does."""
    failures = tuple(
        Failure(f"i{k}", "svc", "default", k, "1.0", 0, "Cpu", "0/3 nodes", (("Cpu", 3),))
        for k in range(3)
    )
    plan = Plan("f", (), failures, {})
    memo = PlanMemo()
    made: list[Failure] = []
    real = failure_piece

    def counted(f: Failure) -> bytes:
        made.append(f)
        return real(f)

    monkeypatch.setattr(accel_plans, "failure_piece", counted)
    inputs = {"fingerprint": "f"}
    assert memo.plan_bytes(plan, inputs) == pretty_json(dict(plan.to_json(), inputs=inputs))
    assert made == list(failures)
    made.clear()
    other = Failure("i9", "svc", "default", 9, "1.0", 0, "Labels", "0/3 nodes", (("Labels", 3),))
    equal = Failure(*(getattr(failures[0], f.name) for f in fields(Failure)))
    later = Plan("f", (), (equal, failures[1], other), {})
    assert memo.plan_bytes(later, inputs) == pretty_json(dict(later.to_json(), inputs=inputs))
    assert made == [equal, other]  # an equal failure, another object: serialised again
    empty = Plan("f", (), (), {})
    assert memo.plan_bytes(empty, inputs) == pretty_json(dict(empty.to_json(), inputs=inputs))


def test_encoded_bytes_hold_no_spare_buffer() -> None:
    """What the controller keeps of its outputs (20,000 configs, a patch per node, cached
    fragments) costs its length in memory, not the capacity orjson grew while writing (4 times for
    a config-sized document, measured)."""
    import tracemalloc

    doc = {"process": {"env": [f"VAR_{i}=value-{i}" for i in range(120)]}, "hostname": "x"}
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [pretty_json(doc) for _ in range(50)] + [fragment(doc, 0) for _ in range(50)]
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 1.25 * sum(len(b) for b in kept) + 16_384
