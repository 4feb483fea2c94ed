"""The class index answers as the exhaustive search on every named fleet shape, and the
shape-independent shortcuts of pass 3 and of the failure summaries change no result: each is
compared with the run that does without it."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.synth import LATE_PREFIX, SHAPES, synth_unit
from reconciler.accel import BalanceMemo, ClassIndex, balance, explain, node_states
from reconciler.accel import index as class_index
from reconciler.model.values import instance_id
from reconciler.placement import balancer, filters, pipeline
from reconciler.placement.balancer import Run
from reconciler.placement.instances import BalanceResult, expand_instances
from reconciler.placement.nodestate import claim as nodestate_claim
from reconciler.placement.pipeline import (
    dynamic_drop,
    evaluate,
    matrix_drop,
    static_drop,
    static_runtime_verdict,
)
from reconciler.placement.search import Exhaustive
from tests.support.builders import make_node, make_service, previous_of, runtime
from tests.support.filter_inputs import ask_of, slot_of

SMALL = settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _runs(unit: Any, nodes: Any, services: Any, exhaustive: bool) -> list[BalanceResult]:
    """A fresh run, then a stable run from the fresh placements of every service but the late
    arrivals (which then preempt, on the preemption shape)."""
    fresh = balance(unit, nodes, services, mode="fresh", exhaustive=exhaustive)
    early = [s for s in services if not s.id.startswith(LATE_PREFIX)]
    before = balance(unit, nodes, early, mode="fresh", exhaustive=exhaustive)
    stable = balance(unit, nodes, services, previous_of(before), "stable", exhaustive=exhaustive)
    return [fresh, stable]


@pytest.mark.parametrize("shape", SHAPES)
@SMALL
@given(seed=st.integers(0, 10_000))
def test_the_index_gives_the_exhaustive_result_on_every_shape(shape: str, seed: int) -> None:
    unit, nodes, services = synth_unit(40, 160, seed, shape)
    assert _runs(unit, nodes, services, False) == _runs(unit, nodes, services, True)


@pytest.mark.parametrize("shape", SHAPES)
@SMALL
@given(seed=st.integers(0, 10_000))
def test_pruned_preemption_evicts_as_trying_every_node_does(shape: str, seed: int) -> None:
    """The bounds checked before any eviction (static filters, CPU and RAM that evictions can
    give back) and before any search (an ask too big for every empty node) only skip what
    cannot help: without them, the same result."""
    unit, nodes, services = synth_unit(40, 160, seed, shape)
    pruned = _runs(unit, nodes, services, False)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(balancer, "_could_fit", lambda *_: True)
        m.setattr(balancer.Run, "_fits_somewhere_empty", lambda *_: True)
        unpruned = _runs(unit, nodes, services, True)
    assert pruned == unpruned


@pytest.mark.parametrize("seed", [1, 5])
def test_pruned_preemption_evicts_as_trying_every_node_does_when_evicting(seed: int) -> None:
    """On units where the late arrivals fit only by evicting (checked), as above."""
    unit, nodes, services = synth_unit(40, 160, seed, "preemption")
    pruned = _runs(unit, nodes, services, False)
    assert pruned[1].preempted
    with pytest.MonkeyPatch.context() as m:
        m.setattr(balancer, "_could_fit", lambda *_: True)
        m.setattr(balancer.Run, "_fits_somewhere_empty", lambda *_: True)
        assert _runs(unit, nodes, services, True) == pruned


def test_an_unplaceable_service_tries_preemption_once_per_state() -> None:
    """Its second instance asks exactly what the first could not get by evicting, on the same
    node states: it is not tried again (and still fails, as trying would)."""
    nodes = [make_node("n0", dmips=1000), make_node("n1", dmips=1000)]
    low = make_service("low", instances=2, cpu=400, priority=1)
    big = make_service("big", instances=3, cpu=5000, priority=10)
    calls: list[str] = []
    real = balancer.Run.preempt

    def counting(run: balancer.Run, instance: Any) -> Any:
        calls.append(instance.id)
        return real(run, instance)

    first = balance(None, nodes, [low], mode="fresh")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(balancer.Run, "preempt", counting)
        got = balance(None, nodes, [low, big], previous_of(first), "stable")
    assert len(got.failures) == 3 and not got.preempted
    assert len(calls) == 1
    slow = balancer.balance(
        None, nodes, [low, big], previous_of(first), "stable", search=Exhaustive
    )
    assert got == slow


@pytest.mark.parametrize("needs", ["resource", "device"])
def test_no_eviction_is_tried_where_no_lower_instance_holds_what_is_short(needs: str) -> None:
    """A named resource with no free slot (or a device pool that cannot serve the request) is
    given back only by evicting its holders: where every holder has the priority of the
    instance or more, evicting the lower ones (however much CPU they hold) cannot help, and
    no eviction is tried there (pass 3 asks the pipeline of no trial node). The result is
    the one trying every node gives; a node where a lower instance holds it still evicts."""
    pool = {"resource": "example.com/npu", "policy": "exclusive", "devices": [{"id": "npu0"}]}
    declared: dict[str, Any] = (
        {"resources": [{"name": "cam", "sharedCount": 1}]}
        if needs == "resource"
        else {"device_pools": [pool]}
    )
    asked: dict[str, Any] = (
        {"resources": ["cam"]}
        if needs == "resource"
        else {"devices": [{"resource": "example.com/npu", "count": 1}]}
    )
    nodes = [make_node(f"n{i}", dmips=1000, **declared) for i in range(3)]
    holders = [
        make_service(f"keep{i}", priority=50, node_id=f"n{i}", cpu=100, **asked) for i in (0, 1)
    ]
    low = make_service("low", instances=3, priority=1, cpu=800)  # CPU on every node
    lower_holder = make_service("lowhold", priority=1, node_id="n2", cpu=50, **asked)
    first = balance(None, nodes, [*holders, low, lower_holder], mode="fresh")
    assert len(first.placements) == 6
    high = make_service("high", priority=40, cpu=500, **asked)
    services = [*holders, low, lower_holder, high]
    tried: list[str] = []
    real = evaluate

    def counting(slot: Any, ask: Any) -> Any:
        tried.append(slot.id)
        return real(slot, ask)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(balancer, "evaluate", counting)
        got = balance(None, nodes, services, previous_of(first), "stable")
    assert set(tried) == {"n2"}  # (n0 and n1: their holder has priority 50)
    assert [p.node_id for p in got.placements if p.item_id == "high"] == ["n2"]
    assert instance_id("lowhold", "default", 0) in got.preempted
    with pytest.MonkeyPatch.context() as m:
        m.setattr(balancer, "_could_fit", lambda *_: True)
        assert (
            balancer.balance(None, nodes, services, previous_of(first), "stable", search=Exhaustive)
            == got
        )


def test_services_asking_alike_try_preemption_once_per_priority_and_state() -> None:
    """Copies of one unplaceable service under other names (a fleet of one-instance services)
    ask alike: once one fails to preempt, the others of its priority fail without trying on
    the same node states (one copy per priority tries). Before, each copy walked every node
    trying evictions: a grown copy of the bundled demo (5,000 nodes, 333 such instances)
    spent 30 s in pass 3."""
    nodes = [make_node("n0", dmips=1000), make_node("n1", dmips=1000)]
    low = make_service("low", instances=2, cpu=400, priority=1)
    copies = [make_service(f"big{k}", cpu=5000, priority=10) for k in range(4)]
    copies += [make_service(f"top{k}", cpu=5000, priority=20) for k in range(3)]
    calls: list[str] = []
    real = balancer.Run.preempt

    def counting(run: balancer.Run, instance: Any) -> Any:
        calls.append(instance.service.id)
        return real(run, instance)

    first = balance(None, nodes, [low], mode="fresh")
    services = [low, *copies]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(balancer.Run, "preempt", counting)
        got = balance(None, nodes, services, previous_of(first), "stable")
    assert len(got.failures) == 7 and not got.preempted
    assert calls == ["top0", "big0"]  # (instance order: the higher priority first)
    slow = balancer.balance(None, nodes, services, previous_of(first), "stable", search=Exhaustive)
    assert got == slow


def test_one_instance_services_asking_alike_check_the_empty_nodes_once() -> None:
    """Whether an ask could fit some empty node is kept per amounts asked, not per service:
    a fleet of one-instance services asking a few amounts checks each once."""
    nodes = [make_node("n0", dmips=1000)]
    services = [make_service(f"s{k:02d}", cpu=300 if k % 2 else 200) for k in range(20)]
    services.append(make_service("aaa-too-big", cpu=5000, priority=100))  # (placed first)
    asked: list[int] = []
    real = balancer.Run._fits_somewhere_empty

    def counting(run: balancer.Run, ask: Any) -> bool:
        asked.append(ask.requested(run.slot("n0")).cpu)
        return real(run, ask)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(balancer.Run, "_fits_somewhere_empty", counting)
        got = balance(None, nodes, services, mode="fresh")
    assert sorted(asked) == [200, 300, 5000]  # (5000: the failure that sets the bound up)
    assert got == balancer.balance(None, nodes, services, mode="fresh", search=Exhaustive)


def _counted_claims(m: pytest.MonkeyPatch) -> list[str]:
    """The nodes the class index claims on from now on (in ``m``'s context), in order."""
    claims: list[str] = []

    def counting(slot: Any, *args: Any) -> Any:
        claims.append(slot.id)
        return nodestate_claim(slot, *args)

    m.setattr(class_index, "claim", counting)
    return claims


def _npu_pool(devices: int) -> dict[str, Any]:
    return {
        "resource": "example.com/npu",
        "policy": "exclusive",
        "devices": [{"id": f"npu{k}"} for k in range(devices)],
    }


def test_device_requests_are_not_walked_over_nodes_whose_pools_cannot_serve_them() -> None:
    """Services asking a device, each asking its own CPU (so none shares another's refusals):
    the index asks only nodes with a pool of that resource (a node without one refuses it
    whatever is reserved, as its whole class does), and a node whose pool cannot serve it
    (full, or of a policy that refuses the request) refuses once, not once per service.
    Before, every service walked the nodes without a pool that the choice order put first
    (the larger ones, here) and every pool already full: on the devices shape, 47,000 and
    17,000 of 85,000 claims."""
    nodes = [make_node(f"big{i:02d}", dmips=100_000) for i in range(40)]
    nodes += [make_node(f"npu{i}", dmips=50_000, device_pools=[_npu_pool(2)]) for i in range(4)]
    nodes += [
        make_node(
            "gpu0",
            dmips=90_000,
            device_pools=[
                {
                    "resource": "example.com/npu",
                    "policy": "fractional",
                    "devices": [{"id": "g0", "memory": "1Gi"}],
                }
            ],
        )
    ]
    services = [
        make_service(
            f"s{k:02d}",
            instances=2,
            cpu=10 + k,
            devices=[{"resource": "example.com/npu", "count": 1}],
        )
        for k in range(6)
    ]
    with pytest.MonkeyPatch.context() as m:
        claims = _counted_claims(m)
        got = balance(None, nodes, services, mode="fresh")
    assert got == balance(None, nodes, services, mode="fresh", exhaustive=True)
    assert len(got.placements) == 8 and len(got.failures) == 4  # 4 pools of 2 NPUs
    assert set(claims) <= {f"npu{i}" for i in range(4)} | {"gpu0"}
    assert claims.count("gpu0") == 1  # (a fractional pool: a count it refuses)
    assert len(claims) <= 8 + 4 + 1  # a claim per placement, a refusal per pool


def test_nodes_found_exhausted_after_a_release_refuse_every_group_asking_them() -> None:
    """The nodes whose device pool cannot serve a request refuse every group asking it, each
    group adding to its refused nodes only those found since it last looked; a release
    forgets them all, and the ones found after it refuse those groups again (without a claim
    of each), however many there were before."""
    nodes = [make_node(f"npu{i}", dmips=1000, device_pools=[_npu_pool(1)]) for i in range(4)]
    npu = [{"resource": "example.com/npu", "count": 1}]
    a = make_service("a", instances=5, cpu=10, devices=npu)  # 4 placed, the 5th refused by all
    b = make_service("b", cpu=11, devices=npu)
    b2 = make_service("b2", cpu=11, devices=npu)  # (b's shape: b's refusals)
    c = make_service("c", cpu=12, devices=npu)
    d = make_service("d", instances=2, cpu=13, devices=npu)
    run = Run(None, nodes, {}, search=ClassIndex)
    index = run.search
    assert isinstance(index, ClassIndex)
    instances = expand_instances([a, b, b2, c, d])
    of = {s.id: [i for i in instances if i.service is s] for s in (a, b, b2, c, d)}
    with pytest.MonkeyPatch.context() as m:
        claims = _counted_claims(m)
        assert len(index.place(of["a"], None)) == 1
        assert len(index.place(of["b"], None)) == 1  # the 4 pools found full: refused
        placed = of["a"][0]
        run.release_all((placed.id,))  # one pool free again
        assert index.place(of["c"], None) == []  # takes it
        assert len(index.place(of["d"], None)) == 2  # finds all 4 full again
        del claims[:]
        assert len(index.place(of["b2"], None)) == 1
    assert claims == []


def test_failures_of_services_asking_alike_are_summarized_alike() -> None:
    """Two services of one shape that fail are charged from one pass over the nodes, with the
    counts a pass per service gives."""
    nodes = [make_node(f"n{i}", dmips=1000 + 100 * i) for i in range(6)]
    services = [
        make_service("x", instances=2, cpu=5000),
        make_service("y", instances=2, cpu=5000),
        make_service("z", instances=1, cpu=10, runtimes=["crun"]),
    ]
    fast = balance(None, nodes, services, mode="fresh")
    slow = balance(None, nodes, services, mode="fresh", exhaustive=True)
    assert fast == slow
    by_service = {f.item_id: f.counts for f in fast.failures}
    assert by_service["x"] == by_service["y"] == (("Cpu", 6),)
    assert by_service["z"] == (("RuntimeType", 6),)


@pytest.mark.parametrize("exhaustive", [False, True], ids=["indexed", "every-filter"])
def test_an_eviction_that_frees_exactly_what_is_asked_is_made(exhaustive: bool) -> None:
    """The bound is tight: every lower-priority instance of a full node gives back exactly
    the CPU asked, and they are evicted."""
    nodes = [make_node("n0", dmips=1000)]
    low = make_service("low", instances=2, cpu=500, priority=1)
    first = balance(None, nodes, [low], mode="fresh", exhaustive=exhaustive)
    high = make_service("high", cpu=1000, priority=10)
    got = balance(None, nodes, [low, high], previous_of(first), "stable", exhaustive=exhaustive)
    assert got.preempted == {p.instance_id for p in first.placements}
    assert [p.item_id for p in got.placements] == ["high"]


def test_the_memo_charges_a_failing_service_again_on_the_nodes_an_edit_changed() -> None:
    """A failing service's charges are kept between a watcher's runs and computed again only
    on the nodes changed since: one where a new service took the CPU is now charged ``Cpu``
    instead of ``Ram``, as a full run charges it."""
    nodes = [make_node(f"n{i}", dmips=1000, ram="1Gi") for i in range(4)]
    filler = make_service("a", instances=4, cpu=100, ram="500Mi")
    failing = make_service("f", cpu=400, ram="600Mi")
    memo = BalanceMemo()
    first = memo.balance(None, nodes, [filler, failing], {}, "stable")
    assert [f.counts for f in first.failures] == [(("Ram", 4),)]
    now = [filler, failing, make_service("b", cpu=600)]
    got = memo.balance(None, nodes, now, previous_of(first), "stable")
    assert memo.incremental
    assert [f.counts for f in got.failures] == [(("Ram", 3), ("Cpu", 1))]
    assert got == balance(None, nodes, now, previous_of(first), "stable")


@pytest.mark.parametrize("shape", SHAPES)
@SMALL
@given(seed=st.integers(0, 10_000))
def test_the_dynamic_charge_is_the_pipelines_on_every_shape(shape: str, seed: int) -> None:
    """The index charges a node of a class passing the static node filters with its dynamic
    filters only (``dynamic_drop``, given the class's static runtime verdict): the code the
    whole pipeline gives, on node states with the unit's placements reserved."""
    unit, nodes, services = synth_unit(40, 160, seed, shape)
    result = balance(unit, nodes, services, mode="fresh")
    slots = node_states(unit, nodes, services, result)
    asked = 0
    for service in services:
        ask = ask_of(service)
        for slot in slots.values():
            if static_drop(slot, ask) is None:
                static = static_runtime_verdict(slot, ask)
                assert dynamic_drop(slot, ask, static) == evaluate(slot, ask).dropped_by
                asked += 1
    assert asked


@pytest.mark.parametrize("shape", SHAPES)
@SMALL
@given(seed=st.integers(0, 10_000))
def test_explains_matrix_drops_each_node_as_the_pipeline_does(shape: str, seed: int) -> None:
    """``explain`` charges each node from the answers it already has (``matrix_drop``: each
    node filter's, each runtime's to each runtime filter), not by asking the filters again:
    the code the whole pipeline gives, on node states with the unit's placements reserved
    (and on a node without runtimes)."""
    unit, nodes, services = synth_unit(40, 160, seed, shape)
    result = balance(unit, nodes, services, mode="fresh")
    slots = [
        *node_states(unit, nodes, services, result).values(),
        slot_of(make_node("bare", runtimes=[])),
    ]
    codes = set()
    for service in services:
        ask = ask_of(service)
        for slot in slots:
            cells = [f.check(slot, ask) for f in filters.NODE_FILTERS]
            grid = [
                [f.check(slot, rt, ask) for f in filters.RUNTIME_FILTERS] for rt in slot.runtimes
            ]
            want = evaluate(slot, ask).dropped_by
            assert matrix_drop(cells, grid) == want, slot.id
            codes.add(want)
    assert len(codes) > 1


@pytest.mark.parametrize("shape", SHAPES)
@SMALL
@given(seed=st.integers(0, 10_000), data=st.data())
def test_explain_from_what_another_explanation_left_on_each_node_says_the_same(
    shape: str, seed: int, data: st.DataObject
) -> None:
    """An explanation leaves what each node holds but the instance's own (``occupancy``);
    explaining another instance of the same balance from it (``occupied``) reserves again
    only on the nodes it lacks (that first instance's) and the new instance's own, and says
    exactly what explaining it from a replay of every placement says: placed, held or
    failing instances, named resources and devices."""
    unit, nodes, services = synth_unit(40, 160, seed, shape)
    result = balance(unit, nodes, services, mode="fresh")
    ids = sorted(result.by_id) + [f.instance_id for f in result.failures]
    first_id, *others = data.draw(st.lists(st.sampled_from(ids), min_size=2, max_size=4))
    first = explain(unit, nodes, services, first_id, result=result)
    assert first.occupancy is not None
    own = result.by_id.get(first_id)
    assert set(first.occupancy) == {n.id for n in nodes} - {own.node_id if own else ""}
    replayed: list[object] = []
    real = balancer.replay

    def replay(*args: Any, **kwargs: Any) -> Any:
        replayed.append(kwargs.get("only"))
        return real(*args, **kwargs)

    for iid in others:
        replayed.clear()
        with pytest.MonkeyPatch.context() as m:
            m.setattr(balancer, "replay", replay)
            got = explain(unit, nodes, services, iid, result=result, occupied=first.occupancy)
        assert got.occupancy is first.occupancy
        assert len(replayed) == 1 and isinstance(replayed[0], set)  # (no second replay)
        assert len(replayed[0]) <= 2
        want = explain(unit, nodes, services, iid, result=result)
        assert (got.rows, got.runtimes, got.placement, got.failure) == (
            want.rows,
            want.runtimes,
            want.placement,
            want.failure,
        )
        assert got == want


def test_explain_replays_every_node_when_what_it_was_given_does_not_fit() -> None:
    """An ``occupied`` whose entry for a node does not fit that node's pools (another node's:
    more runtimes, or more taken than it has) is not used: every node is replayed, and the
    explanation is the one a replay gives."""
    nodes = [
        make_node("a", runtimes=[runtime("r1", "runc"), runtime("r2", "crun")]),
        make_node("b", dmips=500),
    ]
    services = [make_service("s", instances=3, cpu=100)]
    result = balance(None, nodes, services, mode="fresh")
    iid = sorted(result.by_id)[0]
    want = explain(None, nodes, services, iid, result=result)
    assert want.occupancy is not None
    other = {k: v for k, v in want.occupancy.items()}
    if "a" in other and "b" in other:
        other["a"], other["b"] = other["b"], other["a"]  # (a's has a pool more than b's)
    else:
        other["b" if "b" in other else "a"] = ((10**9,), None, None)
    got = explain(None, nodes, services, iid, result=result, occupied=other)
    assert got == want and got.rows == want.rows


def test_the_dynamic_charge_of_a_node_whose_runtimes_all_fail_a_static_filter() -> None:
    """A node passing the static node filters whose every runtime a static runtime filter
    drops is charged that filter, as by the whole pipeline."""
    node = make_node("n0")
    slot = slot_of(node)
    for ask in (ask_of(make_service("a", runtimes=["crun"])), ask_of(make_service("b"))):
        assert static_drop(slot, ask) is None
        static = static_runtime_verdict(slot, ask)
        assert dynamic_drop(slot, ask, static) == evaluate(slot, ask).dropped_by
    assert evaluate(slot, ask_of(make_service("a", runtimes=["crun"]))).dropped_by == "RuntimeType"


def _class_of_four() -> list[Any]:
    """Four nodes of one class with rooms of 1000 to 4000 DMIPS; two have one ``camera`` slot."""
    camera = [{"name": "camera", "sharedCount": 1}]
    return [
        make_node(f"n{i}", dmips=1000 * (i + 1), ram="1Gi", resources=camera if i < 2 else [])
        for i in range(4)
    ]


def test_an_ask_more_than_a_class_could_ever_give_is_charged_per_class() -> None:
    """An ask needing more CPU than any node of a class could ever give is charged ``Cpu`` on
    every node of the class without the dynamic pipeline node by node, but for the named
    resource it asks, asked node by node first (``Resources`` where the slot is taken or
    missing). An ask needing exactly the largest room is charged node by node: the node with
    that room free drops it at ``Ram``, not ``Cpu``. As the exhaustive search charges."""
    nodes = _class_of_four()
    services = [
        make_service("a", cpu=100, resources=["camera"], priority=10),  # n1's camera slot
        make_service("b", ram="600Mi", priority=10),  # n3, by free CPU: 424Mi left there
        make_service("big", cpu=4001),
        make_service("big-camera", cpu=5000, resources=["camera"]),
        make_service("edge", cpu=4000, ram="600Mi"),
    ]
    asked: list[str] = []
    real = pipeline.dynamic_drop

    def counting(slot: Any, ask: Any, static: Any) -> Any:
        asked.append(ask.instance.item_id)
        return real(slot, ask, static)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(class_index, "dynamic_drop", counting)
        fast = balance(None, nodes, services, mode="fresh")
    assert fast == balance(None, nodes, services, mode="fresh", exhaustive=True)
    counts = {f.item_id: f.counts for f in fast.failures}
    assert counts == {
        "big": (("Cpu", 4),),
        "big-camera": (("Resources", 3), ("Cpu", 1)),
        "edge": (("Cpu", 3), ("Ram", 1)),
    }
    assert asked == ["edge"] * 4  # the only one the bound does not answer


def test_a_named_resource_taken_between_two_runs_of_a_watcher_is_charged_anew() -> None:
    """The index remembers a dynamic node filter's answers per node only while no node moves:
    a watcher's next run, after an edit took the last free ``camera`` slot, charges a new
    failing service asking it ``Resources`` there, as a full run does."""
    nodes = _class_of_four()
    first_services = [
        make_service("a", cpu=100, resources=["camera"], priority=10),
        make_service("big-camera", cpu=5000, resources=["camera"]),
    ]
    memo = BalanceMemo()
    first = memo.balance(None, nodes, first_services, {}, "stable")
    assert [f.counts for f in first.failures] == [(("Resources", 3), ("Cpu", 1))]
    now = [
        *first_services,
        make_service("c", cpu=100, resources=["camera"], priority=10),  # n0's camera slot
        make_service("bigger-camera", cpu=6000, resources=["camera"]),
    ]
    got = memo.balance(None, nodes, now, previous_of(first), "stable")
    assert memo.incremental
    assert got == balance(None, nodes, now, previous_of(first), "stable")
    counts = {f.item_id: f.counts for f in got.failures}
    assert counts == {"big-camera": (("Resources", 4),), "bigger-camera": (("Resources", 4),)}


def test_a_charge_no_node_gives_any_more_leaves_the_summary() -> None:
    """A watcher's run after an edit charges its failing service again on the node the edit
    changed: the one node it charged ``Ram`` is now charged ``Cpu``, and ``Ram`` leaves the
    summary (not ``0 Ram``), as in a full run."""
    nodes = [make_node("n0", dmips=1000, ram="1Gi")]
    filler = make_service("a", cpu=100, ram="500Mi", priority=10)
    failing = make_service("f", cpu=400, ram="600Mi")
    memo = BalanceMemo()
    first = memo.balance(None, nodes, [filler, failing], {}, "stable")
    assert [f.counts for f in first.failures] == [(("Ram", 1),)]
    now = [filler, failing, make_service("b", cpu=600, priority=10)]
    got = memo.balance(None, nodes, now, previous_of(first), "stable")
    assert memo.incremental
    assert [f.counts for f in got.failures] == [(("Cpu", 1),)]
    assert got.failures[0].summary.endswith("0/1 nodes feasible: 1 Cpu")
    assert got == balance(None, nodes, now, previous_of(first), "stable")
