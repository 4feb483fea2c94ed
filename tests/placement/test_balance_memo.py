"""The balancer's memo (``BalanceMemo``, issue 9's warm path): a long-running caller's sequence
of calls must give exactly what calls without the memo give, whatever changes between them
(services edited, added, removed; nodes, unit or mode changed; a previous that is not the last
result), and an edit of one service must be answered without re-placing the others."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reconciler.accel import BalanceMemo, balance, node_states
from reconciler.accel import ids as ids_module
from reconciler.accel import index as index_module
from reconciler.accel.checkpoint import CheckpointMemo
from reconciler.accel.ids import IdsMemo
from reconciler.accel.index import ClassIndex
from reconciler.io.loader import load_state
from reconciler.model.documents import Node, Service, UnitConfig
from reconciler.model.values import instance_id
from reconciler.placement.balancer import Run
from reconciler.placement.instances import (
    BalanceResult,
    Cause,
    Mode,
    Placement,
    PreviousAllocation,
)
from reconciler.placement.nodestate import NodeSlot
from reconciler.planning.checkpoint import (
    Checkpoint,
    assign_gids,
    assign_ids,
    decode_checkpoint,
    encode_checkpoint,
)
from tests.support.balancer_scenarios import SETTINGS, Scenario, node_docs, scenarios, services
from tests.support.builders import make_node, make_service, previous_of


def _state(slot: NodeSlot) -> tuple[object, ...]:
    """Everything a node's state holds that a later placement may read."""
    return (
        sorted(slot.placed),
        slot.cpu,
        slot.ram,
        slot.partitions,
        [(rt.slots, rt.cpu, rt.ram) for rt in slot.runtimes],
        slot.resources,
        slot.pools,
    )


def _assert_holds_exactly(
    memo: BalanceMemo,
    unit: UnitConfig,
    nodes: list[Node],
    svcs: list[Service],
    result: BalanceResult,
) -> None:
    """The run the memo keeps for the next call holds the result's reservations and nothing
    else: each node's state equals a replay of the result on fresh node states."""
    run = memo._run  # white box: what the next call starts from
    if run is None:
        return
    replayed = node_states(unit, nodes, svcs, result)
    for node_id, slot in run.slots.items():
        assert _state(slot) == _state(replayed[node_id]), node_id
    assert set(run.where) == {p.instance_id for p in result.placements}
    # each reservation holds the instance of the service as it is now (a scaled service's
    # kept reservations too: a later edit looks its group up by that service)
    by_key = {s.key: s for s in svcs}
    for slot in run.slots.values():
        for res in slot.placed.values():
            assert res.instance.service == by_key[res.instance.service.key], res.instance.label


def _edit(data: st.DataObject, svcs: list[Service], node_ids: list[str], step: int) -> None:
    """One change to the desired services, in place."""
    what = data.draw(
        st.sampled_from(("instances", "replace", "remove", "add", "priority", "huge", "none")),
        label=f"edit {step}",
    )
    if what == "add" or not svcs:
        svcs.append(data.draw(services(f"t{step}", node_ids), label="added"))
        return
    k = data.draw(st.integers(0, len(svcs) - 1), label="which")
    s = svcs[k]
    if what == "instances":
        n = data.draw(st.integers(0, 6), label="instances")
        svcs[k] = s.model_copy(update={"instances": n})
    elif what == "replace":
        svcs[k] = data.draw(services(s.id, node_ids), label="replacement")
    elif what == "remove":
        del svcs[k]
    elif what == "priority":
        svcs[k] = s.model_copy(update={"priority": (s.priority + 1) % 3})
    elif what == "huge":  # more CPU than any node has: it fails whatever is reserved, and
        # what its failures count may still change with the other edits (named resources)
        asked = s.requestedResources.model_copy(update={"cpu": 10_000_000})
        svcs[k] = s.model_copy(update={"requestedResources": asked})


@SETTINGS
@given(scenario=scenarios(), data=st.data())
def test_a_memo_gives_what_a_full_balance_gives(scenario: Scenario, data: st.DataObject) -> None:
    nodes = scenario.nodes()
    node_ids = [n.id for n in nodes]
    unit = scenario.unit
    svcs = list(scenario.services)
    memo = BalanceMemo()
    previous: dict[str, PreviousAllocation] = {}
    older: dict[str, PreviousAllocation] = {}
    last: dict[str, PreviousAllocation] | None = None  # previous_of(the last result)
    last_got: BalanceResult | None = None
    given: dict[str, PreviousAllocation] = {}  # the previous of the last call
    ids = _Ids()
    for step in range(data.draw(st.integers(1, 6), label="steps")):
        mode: Mode = data.draw(
            st.sampled_from(("stable", "stable", "stable", "fresh")), label="mode"
        )
        if data.draw(st.integers(0, 5), label="nodes change") == 0:
            i = data.draw(st.integers(0, len(nodes) - 1), label="node")
            nodes = list(nodes)
            nodes[i] = Node.model_validate(data.draw(node_docs(node_ids[i]), label="node doc"))
        if data.draw(st.integers(0, 6), label="previous kept") == 0:
            previous = {}  # a lost checkpoint: not the memo's result
        told = _previous_since(data, previous, given)
        got = memo.balance(unit, nodes, svcs, previous, mode, previous_since=told)
        given = previous
        want = balance(unit, nodes, svcs, previous, mode)
        assert got == want, f"step {step}"
        if _where(previous) != _where(last):  # not the last result: never from the memo
            assert not memo.incremental, f"step {step}"
        _assert_since_holds(got, last_got, memo.incremental)
        got = _dropped_later(data, memo, got, last_got)
        tamper = data.draw(st.integers(0, 7), label="ids tampered")
        ids.assign(got, tampered=tamper == 0, gid_changed=tamper == 1)
        last, last_got = previous_of(got), got
        # by_id is not compared by ==: the memo patches the last one
        assert dict(got.by_id) == {p.instance_id: p for p in got.placements}, f"step {step}"
        _assert_holds_exactly(memo, unit, nodes, svcs, got)
        older, previous = previous, _as_the_checkpoint_gives(got, previous)
        _tamper(data, previous, node_ids, step)
        stale = data.draw(st.integers(0, 9), label="stale previous")
        if stale == 0:
            # the checkpoint before the last one (a run that crashed before saving): its
            # objects are the ones the memo checked last time
            previous = dict(older)
        elif stale == 1:  # the very checkpoint of the last call again (a save that failed)
            previous = dict(given)
        _edit(data, svcs, node_ids, step)


def _dropped_later(
    data: st.DataObject, memo: BalanceMemo, got: BalanceResult, last: BalanceResult | None
) -> BalanceResult:
    """Sometimes a phase after the balance (the network phase, the configs) turns some of
    ``got``'s placements into failures, telling the memo as ``reconcile`` does: the result the
    stages after it see (the checkpoint is written from it). The next call must still give
    what a full run on that checkpoint gives (the caller checks)."""
    if not got.placements or data.draw(st.integers(0, 2), label="a later phase drops") != 0:
        return got
    ids = data.draw(
        st.lists(st.sampled_from(sorted(got.by_id)), min_size=1, max_size=3, unique=True),
        label="dropped",
    )
    errors = {i: f"{got.by_id[i].label}: refused" for i in ids}
    out = memo.dropped(got, errors, "Network")
    assert out == got.failed(errors, "Network")
    assert {f.instance_id for f in out.failures} == {f.instance_id for f in got.failures} | set(ids)
    assert not out.by_id.keys() & set(ids)
    # what the stages after it (which saw ``last``) may take from their last call
    if last is not None and (named := out.changed_since(last)) is not None:
        assert named >= set(ids)
        for iid in (out.by_id.keys() | last.by_id.keys()) - named:
            assert out.by_id.get(iid) is last.by_id.get(iid), iid
    return out


def _items_given(
    m: pytest.MonkeyPatch, cls: type, name: str, instances: Callable[..., Iterable[Any]]
) -> list[str]:
    """The item ids of the instances each call of ``cls.name`` is given (``instances`` picks
    them from its arguments), recorded while ``m`` lasts."""
    given: list[str] = []
    method = getattr(cls, name)

    def recording(self: object, *args: Any) -> Any:
        given.extend(i.item_id for i in instances(*args))
        return method(self, *args)

    m.setattr(cls, name, recording)
    return given


def _where(
    previous: Mapping[str, PreviousAllocation] | None,
) -> dict[str, tuple[object, ...]] | None:
    """What a full run's pass 1 reads of each previous allocation (its spec version, amounts
    and resources matter to a hold only, and a result with a hold leaves no memo)."""
    if previous is None:
        return None
    return {i: (p.node_id, p.runtime_id, p.devices, p.cause) for i, p in previous.items()}


class _Ids:
    """The uids and gids of each result, as ``reconcile`` makes them: the last allocations
    written through a checkpoint memo and read back (the very objects), an :class:`IdsMemo`
    told so; each call compared with a call without the memo."""

    def __init__(self) -> None:
        self.memo = IdsMemo()
        self.encoder = CheckpointMemo()
        self.cp = Checkpoint("lin", 0)
        self.patched = 0
        self.encoded_patched = 0

    def assign(self, result: BalanceResult, tampered: bool, gid_changed: bool = False) -> None:
        cp = self.cp
        if gid_changed and cp.gids:  # the allocations the memo gave, another gid for an item
            item = min(cp.gids)
            gids = {**cp.gids, item: 9000 + (cp.gids[item] + 1) % 999}
            cp = Checkpoint("lin", cp.generation, cp.allocations, gids, memo=cp.memo)
        if tampered and cp.allocations:  # an allocation changed behind the memo's back
            iid = min(cp.allocations)
            changed = {**cp.allocations, iid: replace(cp.allocations[iid], uid=5999)}
            cp = Checkpoint("lin", cp.generation, changed, cp.gids)
        is_last = self.memo.given_last(cp)
        assert not (tampered and cp is not self.cp and is_last)
        got = self.memo.assign(result, cp.allocations, cp.gids, old_is_last=is_last)
        want = assign_ids(result, cp.allocations, cp.gids)
        assert got[1:] == want[1:]
        assert got[0] == want[0]
        if not self.memo.patched:  # (a patched mapping puts the touched nodes' last)
            assert list(got[0]) == list(want[0])
        for iid, a in want[0].items():
            assert got[0][iid] == a and (got[0][iid] is cp.allocations.get(iid)) == (
                a is cp.allocations.get(iid)
            ), iid
        self.patched += self.memo.patched
        since = self.memo.since_for(got[0])
        assert (since is not None) is self.memo.patched
        written = Checkpoint("lin", cp.generation + 1, got[0], got[1], since=since)
        # as save_checkpoint (the encoder given what changed since), then read back
        raw = self.encoder.encode(written)
        assert raw == encode_checkpoint(written)
        self.encoded_patched += self.encoder.patched
        back = self.encoder.decoded(got[0])
        if back is not None:  # what decoding the bytes gives (an added id last: decoded())
            want_back = decode_checkpoint(raw, "lin").allocations
            assert back == want_back
            assert self.encoder.previous(back) == {i: a.previous() for i, a in want_back.items()}
        self.cp = Checkpoint(
            "lin",
            written.generation,
            back if back is not None else dict(got[0]),
            dict(got[1]),
            memo=self.encoder,
        )


def _assert_since_holds(got: BalanceResult, last: BalanceResult | None, incremental: bool) -> None:
    """An answer from the memo names the last result and every id whose placement is not that
    result's very object; a full run names nothing."""
    if got is last:
        return
    if not incremental:
        assert got.changes is None
        return
    assert got.changes is not None and last is not None
    assert got.changes.since == last.revision is not None  # counted from the last result
    ids = got.changes.ids
    for iid in (got.by_id.keys() | last.by_id.keys()) - ids:
        assert got.by_id.get(iid) is last.by_id.get(iid), iid


def _previous_since(
    data: st.DataObject,
    previous: dict[str, PreviousAllocation],
    given: dict[str, PreviousAllocation],
) -> tuple[dict[str, PreviousAllocation], frozenset[str]] | None:
    """What the checkpoint's memo may tell with ``previous`` (see ``balance``): nothing, or the
    mapping given last call and a superset of the ids whose entry is not its object there, or
    the same about another mapping (the memo must then check in full)."""
    how = data.draw(st.sampled_from(("none", "told", "told", "other")), label="previous since")
    if how == "none":
        return None
    # other: a copy of previous itself (previous is that copy unedited), not what the memo
    # checked last call: an entry tampered with since must still be found
    base = given if how == "told" else dict(previous)
    ids = {i for i in previous.keys() | base.keys() if previous.get(i) is not base.get(i)}
    extra = data.draw(st.lists(st.sampled_from(sorted(previous) or ["x"]), max_size=2))
    return base, frozenset(ids | set(extra))


def _as_the_checkpoint_gives(
    result: BalanceResult, last: dict[str, PreviousAllocation]
) -> dict[str, PreviousAllocation]:
    """``previous_of(result)``, with the very objects of ``last`` where they are equal (as the
    checkpoint's memo hands them out: the memo checks only what is not the same object)."""
    fresh = previous_of(result)
    return {iid: last[iid] if last.get(iid) == prev else prev for iid, prev in fresh.items()}


def _tamper(
    data: st.DataObject, previous: dict[str, PreviousAllocation], node_ids: list[str], step: int
) -> None:
    """Sometimes a previous that differs from the result in one entry, the others being the
    same objects: the memo must notice (a checkpoint written by another process)."""
    what = data.draw(
        st.sampled_from(("none", "none", "none", "move", "cause", "swap-id")),
        label=f"tamper {step}",
    )
    if what == "none" or not previous:
        return
    iid = data.draw(st.sampled_from(sorted(previous)), label="tampered id")
    prev = previous[iid]
    if what == "move":
        node = data.draw(st.sampled_from(node_ids), label="to node")
        previous[iid] = replace(prev, node_id=node)
    elif what == "cause":
        cause: Cause | None = None if prev.cause is not None else "rebalanced"
        previous[iid] = replace(prev, cause=cause)
    else:  # the same size, another id
        del previous[iid]
        previous[f"{iid}-other"] = prev


class TestTheMemoIsUsed:
    def setup_method(self) -> None:
        self.nodes = [make_node(f"n{i}") for i in range(4)]
        self.services = [make_service(f"s{i}", instances=3, cpu=100) for i in range(5)]
        self.memo = BalanceMemo()
        first = self.memo.balance(None, self.nodes, self.services, {}, "stable")
        assert not self.memo.incremental
        self.previous = previous_of(first)

    def test_unchanged_inputs_replace_nothing(self) -> None:
        again = self.memo.balance(None, self.nodes, self.services, self.previous, "stable")
        assert self.memo.incremental and self.memo.replaced == 0
        assert again == balance(None, self.nodes, self.services, self.previous, "stable")

    def test_one_edited_service_replaces_its_instances_only(self) -> None:
        edited = [*self.services[:2], make_service("s2", instances=5, cpu=50), *self.services[3:]]
        got = self.memo.balance(None, self.nodes, edited, self.previous, "stable")
        assert self.memo.incremental and self.memo.replaced == 5
        assert got == balance(None, self.nodes, edited, self.previous, "stable")
        assert len(got.placements) == 17

    def test_an_instance_placed_again_where_it_was_is_the_very_object(self) -> None:
        """The edited service's instances are released and placed again; those placed exactly
        where they were are the last result's objects, so the result names only the others."""
        first = self.memo.balance(None, self.nodes, self.services, self.previous, "stable")
        more = [
            *self.services[:2],
            make_service("s2", instances=4, cpu=100, quotas={"pidsLimit": 64}),
            *self.services[3:],
        ]
        got = self.memo.balance(None, self.nodes, more, previous_of(first), "stable")
        assert self.memo.incremental and self.memo.replaced == 4
        assert got == balance(None, self.nodes, more, previous_of(first), "stable")
        assert got.changes is not None
        assert got.changes.ids == {instance_id("s2", "default", 3)}
        for iid in got.by_id.keys() - got.changes.ids:
            assert got.by_id[iid] is first.by_id[iid]

    @pytest.mark.parametrize("count", [5, 1, 0])
    def test_a_scaled_service_places_only_the_instances_it_gains(self, count: int) -> None:
        """An edit of the instance count alone (kubectl scale): the instances both counts
        have keep their reservations, untouched, and only the new ones are placed."""
        first = self.memo.balance(None, self.nodes, self.services, self.previous, "stable")
        scaled = [*self.services[:2], make_service("s2", instances=count, cpu=100)]
        scaled += self.services[3:]
        got = self.memo.balance(None, self.nodes, scaled, previous_of(first), "stable")
        assert self.memo.incremental and self.memo.replaced == max(count - 3, 0)
        assert got == balance(None, self.nodes, scaled, previous_of(first), "stable")
        assert got.changes is not None
        named = {instance_id("s2", "default", k) for k in range(min(count, 3), max(count, 3))}
        assert got.changes.ids == named
        for iid in got.by_id.keys() - named:
            assert got.by_id[iid] is first.by_id[iid]
        # and the next edit of that service starts from reservations of its current spec
        edited = [*scaled[:2], make_service("s2", instances=count, cpu=60), *scaled[3:]]
        again = self.memo.balance(None, self.nodes, edited, previous_of(got), "stable")
        assert self.memo.incremental
        assert again == balance(None, self.nodes, edited, previous_of(got), "stable")

    def test_instances_a_later_phase_dropped_do_not_make_the_next_call_full(self) -> None:
        """The network phase (or the configs) took two placements out after the balance: the
        checkpoint holds the others. The next call, an edit of another service, is answered
        from the memo and places those two again, where the full run on that checkpoint puts
        them; the result names them as changed since what the later stages saw."""
        first = self.memo.balance(None, self.nodes, self.services, self.previous, "stable")
        dropped = [instance_id("s4", "default", 1), instance_id("s0", "default", 0)]
        errors = {i: "refused" for i in dropped}
        seen = self.memo.dropped(first, errors, "Network")
        assert len(seen.placements) == 13 and len(seen.failures) == 2
        assert seen.changed_since(first) == frozenset(dropped)
        edited = [*self.services[:2], make_service("s2", instances=4, cpu=100)]
        edited += self.services[3:]
        got = self.memo.balance(None, self.nodes, edited, previous_of(seen), "stable")
        assert self.memo.incremental and self.memo.replaced == 1
        assert got == balance(None, self.nodes, edited, previous_of(seen), "stable")
        assert set(dropped) <= got.by_id.keys() and not got.failures
        assert got.changes is not None and got.changes.since == seen.revision
        assert got.changes.ids == {*dropped, instance_id("s2", "default", 3)}
        # and unchanged inputs with the same phase refusing them again: still from the memo
        again = self.memo.dropped(got, errors, "Network")
        last = self.memo.balance(None, self.nodes, edited, previous_of(again), "stable")
        assert self.memo.incremental and self.memo.replaced == 0
        assert last == balance(None, self.nodes, edited, previous_of(again), "stable")

    def test_an_unplaceable_instance_failing_alike_is_the_very_failure(self) -> None:
        """An edit of another service: the unplaceable one is charged again (room was freed)
        and fails alike, so its failure is the last result's object; edited, its failure is a
        new one saying its new version, as the full run says."""
        big = make_service("big", instances=2, cpu=5000)
        services = [*self.services, big]
        first = self.memo.balance(None, self.nodes, services, self.previous, "stable")
        assert len(first.failures) == 2
        edited = [*services[:2], make_service("s2", instances=4, cpu=100), *services[3:]]
        got = self.memo.balance(None, self.nodes, edited, previous_of(first), "stable")
        assert self.memo.incremental
        assert got == balance(None, self.nodes, edited, previous_of(first), "stable")
        assert all(a is b for a, b in zip(got.failures, first.failures, strict=True))
        bigger = [*edited[:-1], make_service("big", instances=2, cpu=6000, version="1.1.0")]
        again = self.memo.balance(None, self.nodes, bigger, previous_of(got), "stable")
        assert again == balance(None, self.nodes, bigger, previous_of(got), "stable")
        assert [f.version for f in again.failures] == ["1.1.0", "1.1.0"]

    def test_a_service_no_node_can_serve_is_not_searched_again(self) -> None:
        """Too big for every empty node, or asking a label no node has: an edit of another
        service does not send its instances through pass 2 or pass 3 again (they would fail
        there again, evicting nobody); the result is the full run's. Edited, it is tried."""
        services = [
            *self.services,
            make_service("big", instances=2, cpu=5000, priority=10),
            make_service("odd", instances=2, labels=["nowhere"], priority=10),
        ]
        first = self.memo.balance(None, self.nodes, services, self.previous, "stable")
        assert {f.item_id for f in first.failures} == {"big", "odd"}
        tried: list[str] = []
        place, preempt = ClassIndex.place, Run.preempt

        def placing(index: ClassIndex, instances: Any, cause: Any) -> Any:
            tried.extend(i.item_id for i in instances)
            return place(index, instances, cause)

        def preempting(run: Run, instance: Any) -> Any:
            tried.append(instance.item_id)
            return preempt(run, instance)

        edited = [*services[:2], make_service("s2", instances=4, cpu=100), *services[3:]]
        odd = [*edited[:-1], make_service("odd", instances=2, labels=["other"], priority=10)]
        with pytest.MonkeyPatch.context() as m:
            m.setattr(ClassIndex, "place", placing)
            m.setattr(Run, "preempt", preempting)
            got = self.memo.balance(None, self.nodes, edited, previous_of(first), "stable")
            assert self.memo.incremental and set(tried) == {"s2"}
            tried.clear()
            again = self.memo.balance(None, self.nodes, odd, previous_of(got), "stable")
            assert self.memo.incremental and set(tried) == {"odd"}
        assert got == balance(None, self.nodes, edited, previous_of(first), "stable")
        assert again == balance(None, self.nodes, odd, previous_of(got), "stable")

    def test_the_failures_of_a_service_no_node_can_serve_are_kept_whole(self) -> None:
        """An edit of another service: such a service's failures are not made again instance
        by instance (its charge, once, is what the full run charges): they are the last
        result's objects, in their place among the other failures."""
        services = [
            make_service("a-small", instances=9, cpu=300),  # then 2 of s4's fail for room
            *self.services,
            make_service("big", instances=3, cpu=5000),
            make_service("odd", instances=2, labels=["nowhere"]),
            make_service("wide", instances=2, cpu=100, ram="2Gi"),
        ]
        nodes = self.nodes
        first = self.memo.balance(None, nodes, services, {}, "stable")
        failing = ["big"] * 3 + ["odd"] * 2 + ["s4"] * 2 + ["wide"] * 2
        assert sorted(f.item_id for f in first.failures) == failing
        edited = [*services[:2], make_service("s1", instances=2, cpu=100), *services[3:]]
        with pytest.MonkeyPatch.context() as m:
            given = _items_given(m, Run, "failures", lambda instances, *_: instances)
            charged = _items_given(m, Run, "charge", lambda instance: [instance])
            got = self.memo.balance(None, nodes, edited, previous_of(first), "stable")
        assert self.memo.incremental
        assert {"s1", "s4"} <= set(given) and not {"big", "odd", "wide"} & set(given)
        # (s4: failing for room.) wide is charged once: more RAM than any node has, but the CPU
        # filter, which comes first, reads the node's state; big (more CPU than any node has)
        # and odd (every node dropped by a static filter) are not charged at all
        assert charged.count("wide") == 1 and not {"big", "odd"} & set(charged)
        assert got == balance(None, nodes, edited, previous_of(first), "stable")
        old = {f.instance_id: f for f in first.failures if f.item_id in ("big", "odd", "wide")}
        assert len(old) == 7
        assert all(f is old[f.instance_id] for f in got.failures if f.instance_id in old)

    def test_other_nodes_run_in_full(self) -> None:
        nodes = [*self.nodes[:3], make_node("n3", ram="2Gi")]  # more than usage changed
        got = self.memo.balance(None, nodes, self.services, self.previous, "stable")
        assert not self.memo.incremental
        assert got == balance(None, nodes, self.services, self.previous, "stable")

    def test_equal_nodes_that_are_other_objects_replace_nothing(self) -> None:
        nodes = [*self.nodes[:3], make_node("n3")]  # equal, but not the objects the memo saw
        got = self.memo.balance(None, nodes, self.services, self.previous, "stable")
        assert self.memo.incremental and self.memo.replaced == 0
        assert got == balance(None, nodes, self.services, self.previous, "stable")

    def test_a_previous_other_than_the_result_runs_in_full(self) -> None:
        got = self.memo.balance(None, self.nodes, self.services, {}, "stable")
        assert not self.memo.incremental
        assert got == balance(None, self.nodes, self.services, {}, "stable")


@pytest.mark.parametrize("n_nodes", [1, 2])
def test_an_unchanged_call_after_an_eviction_evicts_nobody(n_nodes: int) -> None:
    """Evictions are the call's own: with nothing changed since a call in which hi evicted lo,
    the full run keeps every instance where it is and evicts nobody, whether lo found another
    node (2 nodes) or failed (1 node: it goes through pass 2 and 3 again, and evicts nobody)."""
    nodes = [make_node(f"n{i}") for i in range(n_nodes)]
    lo = make_service("lo", cpu=800)
    hi = make_service("hi", priority=1, node_id="n0", cpu=500)
    memo = BalanceMemo()
    previous = previous_of(memo.balance(None, nodes, [lo], {}, "stable"))
    evicting = memo.balance(None, nodes, [lo, hi], previous, "stable")
    assert evicting.preempted == {instance_id("lo", "default", 0)}
    previous = previous_of(evicting)
    got = memo.balance(None, nodes, [lo, hi], previous, "stable")
    assert memo.incremental
    assert got == balance(None, nodes, [lo, hi], previous, "stable")
    assert got.preempted == frozenset()


def test_the_loader_hands_out_the_same_node_for_the_same_content(demo_copy: Path) -> None:
    """The loader names a node whose object changed (``StateView.changes``), and the memo is
    told so: a node whose resourcesFile was read while it was too new to trust its stat key
    is parsed again, and must come out as the same object, not named, when its content is the
    same."""
    view, _ = load_state(demo_copy)
    again, _ = load_state(demo_copy, view)
    assert any(r.deps for r in view.files.values())  # the demo has a node with a resourcesFile
    for node_id, node in view.nodes.items():
        assert again.nodes[node_id] is node
    for key, service in view.services.items():
        assert again.services[key] is service
    assert again.changes is not None and again.changes.empty
    assert again.revision == view.revision


def test_a_stale_previous_of_an_evicted_instance_runs_in_full() -> None:
    """The checkpoint before the last one (a run that crashed before saving), of the same size
    and holding the very objects the memo checked on its last call: the instance that call
    moved (evicted, placed again elsewhere) must not be taken as still where it was."""
    nodes = [make_node("n0"), make_node("n1")]
    lo = make_service("lo", cpu=800)
    memo = BalanceMemo()
    first = memo.balance(None, nodes, [lo, make_service("x", cpu=100)], {}, "stable")
    lo_id = instance_id("lo", "default", 0)
    assert first.by_id[lo_id].node_id == "n0"
    stale = previous_of(first)
    now = [lo, make_service("hi", priority=1, node_id="n0", cpu=500)]  # x gone, hi added
    second = memo.balance(None, nodes, now, stale, "stable")
    assert memo.incremental and second.preempted == {lo_id}
    assert second.by_id[lo_id].node_id == "n1" and len(second.placements) == len(stale)
    third = memo.balance(None, nodes, now, dict(stale), "stable")
    assert not memo.incremental
    assert third == balance(None, nodes, now, dict(stale), "stable")


def test_uids_of_an_edit_are_assigned_on_the_nodes_it_touched_only() -> None:
    """After an edit the balancer's memo answers, the ids memo works on the nodes of the
    instances it names (``patched``), and gives what a call without memo gives: the new
    instances of a node take its free uids in placement order."""
    nodes = [make_node("n0", dmips=10_000), make_node("n1", dmips=10_000)]
    others = [make_service(f"o{i}", cpu=10, node_id="n1") for i in range(3)]
    memo, ids = BalanceMemo(), _Ids()
    got = memo.balance(
        None,
        nodes,
        [make_service("s", instances=2, cpu=10, node_id="n0"), *others],
        {},
        "stable",
    )
    ids.assign(got, tampered=False)
    assert not ids.memo.patched  # the first call: every node
    grown = [make_service("s", instances=8, cpu=10, node_id="n0"), *others]
    got = memo.balance(None, nodes, grown, previous_of(got), "stable")
    assert memo.incremental and got.changes is not None
    ids.assign(got, tampered=False)  # compares with a call without memo
    assert ids.memo.patched
    uids = {
        p.index: ids.cp.allocations[p.instance_id].uid for p in got.placements if p.item_id == "s"
    }
    assert uids == {k: 5000 + k for k in range(8)}  # in index order
    assert ids.encoded_patched == 1  # the encoder took the changed allocations only


def test_gids_of_an_edit_are_patched_from_the_last_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gids follow the items an edit adds or removes, without a pass over every
    placement: an item gone frees its gid, and a new item takes the smallest free one (what a
    call without memo gives, compared by ``_Ids``)."""
    nodes = [make_node(f"n{i}", dmips=10_000) for i in range(3)]
    svcs = [make_service(f"s{i}", instances=2, cpu=10) for i in range(4)]
    memo, ids = BalanceMemo(), _Ids()
    got = memo.balance(None, nodes, svcs, {}, "stable")
    ids.assign(got, tampered=False)
    assert ids.cp.gids == {"s0": 5000, "s1": 5001, "s2": 5002, "s3": 5003}
    full: list[int] = []  # the memo's calls of the full pass
    real = assign_gids

    def counted(
        ps: Sequence[Placement], old: Mapping[str, int]
    ) -> tuple[dict[str, int], list[str]]:
        full.append(len(ps))
        return real(ps, old)

    monkeypatch.setattr(ids_module, "assign_gids", counted)
    scaled = [*svcs[:2], make_service("s2", instances=5, cpu=10), svcs[3]]
    got = memo.balance(None, nodes, scaled, previous_of(got), "stable")
    ids.assign(got, tampered=False)
    # s1 gone (5001 freed), then "a" and "t" added: "a" takes 5001, "t" the next free one
    changed = [svcs[0], *scaled[2:], make_service("a", cpu=10), make_service("t", cpu=10)]
    got = memo.balance(None, nodes, changed, previous_of(got), "stable")
    assert memo.incremental
    ids.assign(got, tampered=False)
    assert ids.cp.gids == {"s0": 5000, "a": 5001, "s2": 5002, "s3": 5003, "t": 5004}
    assert full == []


def test_uids_after_an_instance_left_a_node() -> None:
    """An evicted instance moves from n0 to n1: the ids memo's view of n0 must lose it, so a
    later instance placed on n0 gets what a call without memo gives."""
    nodes = [make_node("n0"), make_node("n1")]
    lo, hi = make_service("lo", cpu=800), make_service("hi", priority=1, node_id="n0", cpu=500)
    memo, ids = BalanceMemo(), _Ids()
    got = memo.balance(None, nodes, [lo, make_service("x", cpu=100)], {}, "stable")
    ids.assign(got, tampered=False)
    got = memo.balance(None, nodes, [lo, hi], previous_of(got), "stable")
    assert memo.incremental and got.preempted
    ids.assign(got, tampered=False)
    small = make_service("small", cpu=100, node_id="n0")
    got = memo.balance(None, nodes, [lo, hi, small], previous_of(got), "stable")
    assert memo.incremental
    ids.assign(got, tampered=False)
    # small leaves n0 and nothing arrives there; then another arrives on n0
    for wanted in ([lo, hi], [lo, hi, make_service("small2", cpu=100, node_id="n0")]):
        got = memo.balance(None, nodes, wanted, previous_of(got), "stable")
        assert memo.incremental
        ids.assign(got, tampered=False)
    assert ids.patched == 4


def test_a_result_naming_its_changes_pickles_without_them() -> None:
    nodes = [make_node("n0")]
    memo = BalanceMemo()
    first = memo.balance(None, nodes, [make_service("a")], {}, "stable")
    got = memo.balance(None, nodes, [make_service("a"), make_service("b")], previous_of(first))
    assert got.changes is not None and got.revision is not None
    again = pickle.loads(pickle.dumps(got))
    assert again == got and again.changes is None and again.revision is None
    assert copy.deepcopy(got) == got


@pytest.mark.parametrize(
    "edit", ["instances", "priority", "two", "swap", "other-key", "removed", "added"]
)
def test_an_edit_among_many_services_is_found_by_position(edit: str) -> None:
    """With many services, the memo finds the edited ones by position (the caller passes them
    sorted, as ``reconcile`` does); anything but an edit in place (a service removed, added,
    or another key at a position) takes the plain key-by-key look. (Keys are unique, as the
    loader makes them.)"""
    nodes = [make_node(f"n{i}", dmips=4000) for i in range(3)]
    svcs = [make_service(f"s{i:02d}", instances=2, cpu=50) for i in range(24)]
    memo = BalanceMemo()
    first = memo.balance(None, nodes, svcs, {}, "stable")
    now = list(svcs)
    if edit == "instances":
        now[5] = make_service("s05", instances=4, cpu=50)
    elif edit == "priority":
        now[7] = make_service("s07", instances=2, cpu=50, priority=3)
    elif edit == "two":
        now[1] = make_service("s01", instances=1, cpu=50)
        now[20] = make_service("s20", instances=3, cpu=60)
    elif edit == "swap":  # the same services in another order: nothing changed
        now[2], now[3] = now[3], now[2]
    elif edit == "other-key":  # another service where s04 was (s04 removed, s04b added)
        now[4] = make_service("s04b", instances=5, cpu=50)
    elif edit == "removed":
        del now[9]
    else:
        now.append(make_service("s99", instances=2, cpu=50))
    got = memo.balance(None, nodes, now, previous_of(first), "stable")
    assert got == balance(None, nodes, now, previous_of(first), "stable")
    assert memo.incremental


@pytest.mark.parametrize("with_memo", [False, True], ids=["plain", "memo"])
def test_two_services_with_one_key_are_refused(with_memo: bool) -> None:
    """Their instances would have the same ids: refused with or without a memo (the loader
    never hands such services over: it reports the second file)."""
    nodes = [make_node("n0"), make_node("n1")]
    services = [make_service("a"), make_service("b"), make_service("a", instances=3)]
    with pytest.raises(ValueError, match="services defined twice: a:default"):
        if with_memo:
            BalanceMemo().balance(None, nodes, services, {}, "stable")
        else:
            balance(None, nodes, services, {}, "stable")


class TestPreviousSince:
    """``previous_since`` (what the checkpoint's memo tells) spares the memo its identity pass
    over ``previous``, never its checks: an entry the result changed since the mapping it
    checked last, or a mapping other than that one, is still compared."""

    def setup_method(self) -> None:
        self.nodes = [make_node(f"n{i}") for i in range(3)]
        self.services = [make_service(f"s{i}", instances=2, cpu=100) for i in range(3)]
        self.memo = BalanceMemo()
        first = self.memo.balance(None, self.nodes, self.services, {}, "stable")
        self.checked = previous_of(first)  # checked by the next call (nothing changed)
        self.memo.balance(None, self.nodes, self.services, self.checked, "stable")
        assert self.memo.incremental

    def _call(
        self,
        previous: dict[str, PreviousAllocation],
        since: frozenset[str],
        base: dict[str, PreviousAllocation] | None = None,
    ) -> BalanceResult:
        told = (self.checked if base is None else base, since)
        return self.memo.balance(
            None, self.nodes, self.services, previous, "stable", previous_since=told
        )

    def test_an_unchanged_previous_named_so_is_taken(self) -> None:
        self._call(dict(self.checked), frozenset())
        assert self.memo.incremental

    def test_a_placement_made_since_is_compared_though_not_named(self) -> None:
        self.services[0] = make_service("s0", instances=3, cpu=100)  # one more
        self.services[1] = make_service("s1", instances=1, cpu=100)  # one less
        moved = self.memo.balance(None, self.nodes, self.services, self.checked, "stable")
        assert self.memo.incremental and len(moved.placements) == len(self.checked)
        # the checkpoint of that call was not saved: the one checked before, unedited
        self._call(dict(self.checked), frozenset())
        assert not self.memo.incremental

    def test_a_mapping_other_than_the_one_checked_is_checked_in_full(self) -> None:
        tampered = dict(self.checked)
        iid = min(tampered)
        prev = tampered[iid]
        other = "n0" if prev.node_id != "n0" else "n1"
        tampered[iid] = PreviousAllocation(other, prev.runtime_id, prev.devices, prev.cause)
        self._call(tampered, frozenset(), base=dict(tampered))  # true of its own base
        assert not self.memo.incremental


def test_room_an_edit_frees_goes_to_the_unplaced_in_instance_order() -> None:
    """Pass 2 of a memo's call tries the instances without a place in instance order, as the
    full run does: room for two freed by an edit goes to the first two of sixteen services
    that failed, whatever order the memo keeps its sets in."""
    nodes = [make_node("n0", dmips=1000)]
    big = make_service("a-big", priority=1, cpu=1000)
    waiting = [make_service(f"w{i:02}", cpu=500) for i in range(16)]
    memo = BalanceMemo()
    first = memo.balance(None, nodes, [big, *waiting], {}, "stable")
    assert len(first.failures) == 16
    gone = [big.model_copy(update={"instances": 0}), *waiting]
    got = memo.balance(None, nodes, gone, previous_of(first), "stable")
    assert memo.incremental
    assert got == balance(None, nodes, gone, previous_of(first), "stable")
    assert [p.item_id for p in got.placements] == ["w00", "w01"]


def test_a_long_lived_memo_keeps_its_move_log_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A watcher's run lives for every call: the class index's log of the nodes moved (what
    its failure charges are brought up to date from) is started again past a bound, with the
    charges computed on it, and the answers stay the full run's."""
    monkeypatch.setattr(index_module, "MOVES_MAX", 8)
    nodes = [make_node(f"n{i}", dmips=1000) for i in range(4)]
    base = [make_service(f"s{i}", instances=3, cpu=100) for i in range(4)]
    big = make_service("big", instances=6, cpu=700)  # two fail on Cpu: their charges
    memo = BalanceMemo()
    previous: dict[str, PreviousAllocation] = {}
    lengths = []
    incremental = 0
    for step in range(30):
        edited = make_service("s1", instances=1 + step % 4, cpu=100, quotas={"pidsLimit": 1 + step})
        services = [base[0], edited, *base[2:], big]
        got = memo.balance(None, nodes, services, previous, "stable")
        assert got == balance(None, nodes, services, previous, "stable"), step
        incremental += memo.incremental
        assert got.failures, step
        run = memo._run  # white box: the run the next call starts from
        assert run is not None and isinstance(run.search, ClassIndex)
        lengths.append(len(run.search.moves))
        previous = previous_of(got)
    assert incremental == 29
    assert max(lengths) <= 8 + 2 * 20  # (the bound, then at most one call's moves)
    assert len(set(lengths)) > 1


def test_a_failing_service_is_tried_again_only_when_its_nodes_move() -> None:
    """``big`` (pinned to n0, which ``fill`` keeps full) fails on Cpu, not statically: the memo
    tries it once in its own run, then leaves it out while only other nodes move (edits of a
    service pinned to n1), and tries it again, as the full run would place it, once n0 moves
    (``fill`` edited to ask less)."""
    nodes = [make_node(f"n{i}", dmips=1000) for i in range(2)]
    big = make_service("big", cpu=500, node_id="n0")
    memo = BalanceMemo()
    previous: dict[str, PreviousAllocation] = {}
    for step, (count, fill_cpu) in enumerate([(1, 900), (2, 900), (3, 900), (1, 900), (2, 400)]):
        other = make_service("other", instances=count, cpu=100, node_id="n1")
        fill = make_service("fill", priority=5, cpu=fill_cpu, node_id="n0")
        services = [fill, other, big]
        with pytest.MonkeyPatch.context() as m:
            tried = _items_given(m, ClassIndex, "place", lambda instances, *_: instances)
            got = memo.balance(None, nodes, services, previous, "stable")
        assert got == balance(None, nodes, services, previous, "stable"), step
        if step == 0:
            assert "big" in tried and not memo.incremental  # (the full run)
        elif step == 1:
            assert "big" in tried and memo.incremental  # once in the memo's run
        elif step < 4:
            assert "big" not in tried and memo.incremental, step  # n0 did not move
        else:
            assert "big" in tried and memo.incremental  # n0 moved: placed beside fill
            assert "big" in {p.item_id for p in got.placements}
        previous = previous_of(got)
