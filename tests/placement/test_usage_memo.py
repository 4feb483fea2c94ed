"""A node document whose measured usage alone changed (its agent's periodic report, SPEC §19)
is taken in by the balancer's memo without re-placing every instance, with exactly the result
of a call without the memo."""

from __future__ import annotations

from datetime import UTC, datetime

from reconciler.accel import BalanceMemo, balance
from reconciler.model.documents import Node, NodeUsage, Service
from tests.support.builders import make_node, make_service, make_unit, previous_of


def _with_usage(node: Node, cpu: int, ram: int = 0, at: int = 0) -> Node:
    return node.model_copy(
        update={
            "usage": NodeUsage(cpu=cpu, ram=ram),
            "reportedAt": datetime.fromtimestamp(1_700_000_000 + at, UTC),
        }
    )


def _setup() -> tuple[list[Node], list[Service]]:
    nodes = [_with_usage(make_node(f"n{i}", dmips=1000), cpu=100) for i in range(4)]
    svcs = [make_service(f"s{k}", instances=3, cpu=100) for k in range(4)]
    return nodes, list(svcs)


def test_a_usage_only_change_replaces_nothing_and_matches_a_full_run() -> None:
    unit = make_unit()
    nodes, svcs = _setup()
    memo = BalanceMemo()
    first = memo.balance(unit, nodes, svcs, {}, "stable")
    prev = previous_of(first)
    second = memo.balance(unit, nodes, svcs, prev, "stable")
    assert memo.incremental
    # one node's agent reports new usage (and a new report time)
    busier = _with_usage(nodes[1], cpu=400, ram=1024, at=10)
    nodes2 = [nodes[0], busier, nodes[2], nodes[3]]
    third = memo.balance(unit, nodes2, svcs, previous_of(second), "stable")
    assert memo.incremental, "a usage-only change must not re-place every instance"
    assert memo.replaced == 0
    full = balance(unit, nodes2, svcs, previous_of(second), "stable")
    assert third.placements == full.placements
    assert third.failures == full.failures

    # then a new service is placed on the node with the most CPU left, as a full run does
    svcs2 = [*svcs, make_service("t", instances=1, cpu=100)]
    fourth = memo.balance(unit, nodes2, svcs2, previous_of(third), "stable")
    full2 = balance(unit, nodes2, svcs2, previous_of(third), "stable")
    assert fourth.placements == full2.placements
    assert memo.incremental


def test_usage_that_leaves_too_little_room_runs_in_full() -> None:
    unit = make_unit()
    nodes, svcs = _setup()
    memo = BalanceMemo()
    first = memo.balance(unit, nodes, svcs, {}, "stable")
    second = memo.balance(unit, nodes, svcs, previous_of(first), "stable")
    held = {p.node_id for p in second.placements}
    victim = sorted(held)[0]
    swamped = [_with_usage(n, cpu=990, at=10) if n.id == victim else n for n in nodes]
    third = memo.balance(unit, swamped, svcs, previous_of(second), "stable")
    full = balance(unit, swamped, svcs, previous_of(second), "stable")
    assert not memo.incremental
    assert third.placements == full.placements
    assert third.failures == full.failures


def test_a_change_beyond_usage_is_no_usage_only_change() -> None:
    unit = make_unit()
    nodes, svcs = _setup()
    memo = BalanceMemo()
    first = memo.balance(unit, nodes, svcs, {}, "stable")
    memo.balance(unit, nodes, svcs, previous_of(first), "stable")
    bigger = [nodes[0].model_copy(update={"maxDMIPS": 2000}), *nodes[1:]]
    memo.balance(unit, bigger, svcs, previous_of(first), "stable")
    assert not memo.incremental
