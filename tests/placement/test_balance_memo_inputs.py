"""The balancer's memo told what changed (``BalanceMemo.balance(..., inputs=InputChanges)``, as
the loader makes it): the memo knows which services and nodes changed from that value alone,
not from the objects it is handed, and gives what a full balance gives along random edit
sequences. Equal objects made anew (a loader's, a process's that parsed the same YAML again)
for unchanged services and nodes are answered from the memo; changes that count from another
revision than the memo's last call (a gap), or no changes at all, make the memo compare by
equality, and it is still right."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any, TypeVar

from hypothesis import given
from hypothesis import strategies as st

from reconciler.accel import BalanceMemo, balance
from reconciler.model.changes import InputChanges
from reconciler.model.documents import Node, NodeUsage, Service
from reconciler.placement.instances import BalanceResult, Mode, PreviousAllocation
from tests.support.balancer_scenarios import SETTINGS, Scenario, node_docs, scenarios, services
from tests.support.builders import make_node, make_service, make_unit, previous_of

_REVISIONS = itertools.count(1)

_T = TypeVar("_T", Service, Node)


def _anew(obj: _T) -> _T:
    """An equal object that is not ``obj`` (nor shares its parts): as a new load makes."""
    return obj.model_copy(deep=True)


def _edit(
    data: st.DataObject, svcs: list[Service], node_ids: list[str], step: int
) -> set[tuple[str, str]]:
    """One change to the desired services, in place; returns the keys it changed."""
    what = data.draw(
        st.sampled_from(("instances", "replace", "remove", "add", "priority", "none")),
        label=f"edit {step}",
    )
    if what == "add" or not svcs:
        added = data.draw(services(f"t{step}", node_ids), label="added")
        svcs.append(added)
        return {added.key}
    k = data.draw(st.integers(0, len(svcs) - 1), label="which")
    s = svcs[k]
    if what == "instances":
        svcs[k] = s.model_copy(update={"instances": data.draw(st.integers(0, 6), label="n")})
    elif what == "replace":
        svcs[k] = data.draw(services(s.id, node_ids), label="replacement")
    elif what == "remove":
        del svcs[k]
    elif what == "priority":
        svcs[k] = s.model_copy(update={"priority": (s.priority + 1) % 3})
    else:
        return set()
    return {s.key}


@SETTINGS
@given(scenario=scenarios(), data=st.data())
def test_a_memo_told_what_changed_gives_what_a_full_balance_gives(
    scenario: Scenario, data: st.DataObject
) -> None:
    nodes = scenario.nodes()
    node_ids = [n.id for n in nodes]
    unit = scenario.unit
    svcs = list(scenario.services)
    memo = BalanceMemo()
    previous: dict[str, PreviousAllocation] = {}
    last: BalanceResult | None = None
    last_revision: int | None = None  # of the last call's inputs, when told
    kept = False  # whether the last call left a run the next may start from
    # what changed since the last call (the first: everything)
    told = InputChanges.unknown(next(_REVISIONS))
    changed_any = True  # whether the changes since the last call name a service or node
    for step in range(data.draw(st.integers(1, 6), label="steps")):
        mode: Mode = data.draw(
            st.sampled_from(("stable", "stable", "stable", "fresh")), label="mode"
        )
        how = data.draw(
            st.sampled_from(("told", "told", "told", "gap", "none", "unknown")), label="how"
        )
        if how == "told":
            inputs: InputChanges | None = told
        elif how == "gap":  # counted from another revision, naming nothing: not to be used
            other = (last_revision or 0) - 1
            inputs = InputChanges(other, told.revision)
        elif how == "none":
            inputs = None
        else:
            inputs = InputChanges.unknown(told.revision)
        # every service and node an equal object made anew (a loader's)
        given_nodes = [_anew(n) for n in nodes]
        given_svcs = [_anew(s) for s in svcs]
        got = memo.balance(unit, given_nodes, given_svcs, previous, mode, inputs=inputs)
        want = balance(unit, nodes, svcs, previous, mode)
        assert got == want, f"step {step}"
        assert dict(got.by_id) == {p.instance_id: p for p in got.placements}, f"step {step}"
        if (
            mode == "stable"
            and kept
            and not changed_any
            and last is not None
            and previous == previous_of(last)
        ):
            # nothing named, every object new: answered from the memo, nothing placed again
            assert memo.incremental and memo.replaced == 0, f"step {step}"
        kept = memo._run is not None  # white box: a run the next call may start from
        last_revision = told.revision if inputs is not None else None
        last = got
        previous = previous_of(got)
        if data.draw(st.integers(0, 6), label="previous lost") == 0:
            previous = {}  # a lost checkpoint: not the memo's result
        # the edits before the next call, and what the loader would tell of them
        keys = _edit(data, svcs, node_ids, step)
        named_nodes: set[str] = set()
        if data.draw(st.integers(0, 4), label="nodes change") == 0:
            i = data.draw(st.integers(0, len(nodes) - 1), label="node")
            nodes = list(nodes)
            nodes[i] = Node.model_validate(data.draw(node_docs(node_ids[i]), label="node doc"))
            named_nodes.add(node_ids[i])
        # a loader may name more than changed (a file rewritten with the same meaning)
        if data.draw(st.booleans(), label="name more") and svcs:
            keys.add(data.draw(st.sampled_from([s.key for s in svcs]), label="extra"))
            named_nodes.add(data.draw(st.sampled_from(node_ids), label="extra node"))
        changed_any = bool(keys or named_nodes)
        since = told.revision
        told = InputChanges(
            since,
            next(_REVISIONS),
            unit=data.draw(st.booleans(), label="unit named"),
            services=frozenset(keys),
            nodes=frozenset(named_nodes),
        )


class TestToldByTheChangeValue:
    def setup_method(self) -> None:
        self.nodes = [make_node(f"n{i}") for i in range(4)]
        self.services = [make_service(f"s{i}", instances=3, cpu=100) for i in range(5)]
        self.memo = BalanceMemo()
        self.revision = 1
        first = self.memo.balance(
            None, self.nodes, self.services, {}, "stable", inputs=InputChanges.unknown(1)
        )
        assert not self.memo.incremental
        self.previous = previous_of(first)

    def _next(self, **named: Any) -> InputChanges:
        since, self.revision = self.revision, self.revision + 1
        return replace(InputChanges(since, self.revision), **named)

    def test_equal_services_made_anew_are_answered_from_the_memo(self) -> None:
        """Services parsed again from the same YAML (equal, other objects) and one edited:
        told so, the memo places the edited one's instances again, and only those."""
        anew = [make_service(f"s{i}", instances=3, cpu=100) for i in range(5)]
        anew[2] = make_service("s2", instances=5, cpu=50)
        nodes = [make_node(f"n{i}") for i in range(4)]  # equal, other objects
        inputs = self._next(services=frozenset({("s2", "default")}))
        got = self.memo.balance(None, nodes, anew, self.previous, "stable", inputs=inputs)
        assert self.memo.incremental and self.memo.replaced == 5
        assert got == balance(None, nodes, anew, self.previous, "stable")

    def test_without_changes_equal_objects_are_found_equal(self) -> None:
        """Not told (no changes, or changes from another revision): the memo compares by
        equality, and an equal object made anew is no change."""
        anew = [make_service(f"s{i}", instances=3, cpu=100) for i in range(5)]
        anew[2] = make_service("s2", instances=5, cpu=50)
        for inputs in (None, InputChanges(self.revision + 7, self.revision + 8)):
            memo = BalanceMemo()
            first = memo.balance(None, self.nodes, self.services, {}, "stable")
            got = memo.balance(None, self.nodes, anew, previous_of(first), "stable", inputs=inputs)
            assert memo.incremental and memo.replaced == 5
            assert got == balance(None, self.nodes, anew, previous_of(first), "stable")

    def test_the_memo_believes_the_change_value(self) -> None:
        """Told that nothing changed, the memo does not look at the services: it answers for
        the ones it has (the change value is the caller's word, as the loader's is)."""
        edited = [*self.services[:2], make_service("s2", instances=5, cpu=50), *self.services[3:]]
        got = self.memo.balance(
            None, self.nodes, edited, self.previous, "stable", inputs=self._next()
        )
        assert self.memo.incremental and self.memo.replaced == 0
        assert got == balance(None, self.nodes, self.services, self.previous, "stable")

    def test_changes_from_another_revision_are_not_used(self) -> None:
        """Changes that count from a revision other than the memo's last call (a view loaded
        after a run the memo did not see) may miss an edit: the memo compares instead."""
        inputs = self._next(services=frozenset({("s0", "default")}))
        first = self.memo.balance(
            None, self.nodes, self.services, self.previous, "stable", inputs=inputs
        )
        edited = [*self.services[:3], make_service("s3", instances=1, cpu=90), self.services[4]]
        stale = InputChanges(inputs.since, inputs.revision + 1)  # from the revision before
        got = self.memo.balance(
            None, self.nodes, edited, previous_of(first), "stable", inputs=stale
        )
        assert got == balance(None, self.nodes, edited, previous_of(first), "stable")
        assert self.memo.incremental and self.memo.replaced == 1
        # everything (no previous view): compared too
        again = [make_service("s0", instances=2, cpu=90), *edited[1:]]
        anew = InputChanges.unknown(stale.revision + 1)
        got2 = self.memo.balance(None, self.nodes, again, previous_of(got), "stable", inputs=anew)
        assert got2 == balance(None, self.nodes, again, previous_of(got), "stable")
        assert self.memo.incremental and self.memo.replaced == 2

    def test_a_call_that_was_not_told_breaks_the_chain(self) -> None:
        """A call without changes leaves the memo no revision: the next changes, though
        counted from the revision before, are not used."""
        edited = [make_service("s0", instances=1, cpu=90), *self.services[1:]]
        mid = self.memo.balance(None, self.nodes, edited, self.previous, "stable")
        inputs = self._next()  # (from the first call's revision, naming nothing)
        got = self.memo.balance(
            None, self.nodes, self.services, previous_of(mid), "stable", inputs=inputs
        )
        assert got == balance(None, self.nodes, self.services, previous_of(mid), "stable")
        assert self.memo.replaced == 3  # s0 found changed by comparison

    def test_nodes_named_are_looked_at(self) -> None:
        """A node named whose measured usage alone changed is taken in without placing
        anything again; one named but equal changes nothing; one named with more changed
        runs in full."""
        unit = make_unit()
        memo = BalanceMemo()
        first = memo.balance(
            unit, self.nodes, self.services, {}, "stable", inputs=InputChanges.unknown(1)
        )
        busier = self.nodes[1].model_copy(update={"usage": NodeUsage(cpu=300, ram=0)})
        nodes = [self.nodes[0], busier, *self.nodes[2:]]
        second = memo.balance(
            unit,
            nodes,
            self.services,
            previous_of(first),
            "stable",
            inputs=InputChanges(1, 2, nodes=frozenset({"n1"})),
        )
        assert memo.incremental and memo.replaced == 0
        assert second == balance(unit, nodes, self.services, previous_of(first), "stable")
        same = [_anew(n) for n in nodes]
        third = memo.balance(
            unit,
            same,
            self.services,
            previous_of(second),
            "stable",
            inputs=InputChanges(2, 3, nodes=frozenset({"n0", "n3"})),
        )
        assert memo.incremental and memo.replaced == 0 and third == second
        bigger = [*same[:3], make_node("n3", dmips=2000)]
        fourth = memo.balance(
            unit,
            bigger,
            self.services,
            previous_of(third),
            "stable",
            inputs=InputChanges(3, 4, nodes=frozenset({"n3"})),
        )
        assert not memo.incremental
        assert fourth == balance(unit, bigger, self.services, previous_of(third), "stable")

    def test_a_node_removed_or_added_runs_in_full(self) -> None:
        fewer = self.nodes[:3]
        got = self.memo.balance(
            None,
            fewer,
            self.services,
            self.previous,
            "stable",
            inputs=self._next(nodes=frozenset({"n3"})),
        )
        assert not self.memo.incremental
        assert got == balance(None, fewer, self.services, self.previous, "stable")
        more = [*fewer, make_node("n3"), make_node("n4")]
        again = self.memo.balance(
            None,
            more,
            self.services,
            previous_of(got),
            "stable",
            inputs=self._next(nodes=frozenset({"n3", "n4"})),
        )
        assert not self.memo.incremental
        assert again == balance(None, more, self.services, previous_of(got), "stable")

    def test_services_added_and_removed_are_told(self) -> None:
        """Named keys that were added or removed (the list's length and places change): the
        memo finds them by key, and the others are its own."""
        now = [*self.services[:1], *self.services[2:], make_service("z", instances=2, cpu=100)]
        inputs = self._next(services=frozenset({("s1", "default"), ("z", "default")}))
        got = self.memo.balance(None, self.nodes, now, self.previous, "stable", inputs=inputs)
        assert self.memo.incremental and self.memo.replaced == 2
        assert got == balance(None, self.nodes, now, self.previous, "stable")
