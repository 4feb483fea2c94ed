"""A node document whose measured usage alone changed (its agent's periodic report, SPEC §19)
is taken in by the balancer's memo without re-placing every instance, with exactly the result
of a call without the memo."""

from __future__ import annotations

from datetime import UTC, datetime

from reconciler.accel import BalanceMemo, balance
from reconciler.model.documents import Node, NodeUsage, Service
from tests.support.builders import make_node, make_service, make_unit, previous_of, runtime


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


def test_a_failure_bounded_by_the_capacities_is_charged_again_after_a_usage_renewal() -> None:
    # "wide" asks more CPU than three nodes have room for once their usage is taken (900 of
    # 1000), and more RAM than any node has; the fourth node runs only another runtime. Its
    # charge ("4 nodes: 3 Cpu, 1 RuntimeType") then holds whatever is reserved: a watcher's
    # memo keeps it without charging it again. A usage renewal that gives n0 its CPU back
    # makes n0 drop it for RAM instead: the memo must charge it again, as a full run does.
    unit = make_unit()
    nodes = [_with_usage(make_node(f"n{i}", dmips=1000), cpu=100) for i in range(3)]
    nodes.append(make_node("n3", dmips=1000, runtimes=[runtime("crun")]))
    wide = make_service("wide", instances=1, cpu=950, ram="2Gi", runtimes=["runc"])
    svcs = [make_service("s0", instances=1, cpu=100, runtimes=["crun"]), wide]  # on n3
    memo = BalanceMemo()
    first = memo.balance(unit, nodes, svcs, {}, "stable")
    assert [(f.item_id, f.counts) for f in first.failures] == [
        ("wide", (("Cpu", 3), ("RuntimeType", 1)))
    ]
    edited = [make_service("s0", instances=2, cpu=100, runtimes=["crun"]), wide]
    second = memo.balance(unit, nodes, edited, previous_of(first), "stable")
    assert memo.incremental and second.failures == first.failures
    idle = [_with_usage(nodes[0], cpu=0, at=10), *nodes[1:]]
    third = memo.balance(unit, idle, edited, previous_of(second), "stable")
    assert memo.incremental
    full = balance(unit, idle, edited, previous_of(second), "stable")
    assert third == full
    assert [f.counts for f in third.failures] == [(("Cpu", 2), ("Ram", 1), ("RuntimeType", 1))]
