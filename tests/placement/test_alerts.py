"""The alert state machine on sustained load (SPEC §8; reconciler.placement.alerts).

Time is driven with freezegun: every observation passes ``time.time()`` as ``now``, and the
timelines cross a JSON round trip between observations, as they do through the checkpoint between
oneshot processes. The one-hour trace is checked against a hand count and against an independent
reference that re-scans the whole reading history at every observation.
"""

from __future__ import annotations

import json
import math
import random
import re
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from freezegun import freeze_time
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.model.documents import AlertRule, Node, UnitConfig
from reconciler.placement.alerts import (
    AlertUpdate,
    Timeline,
    iso_utc,
    observe,
    step,
)
from reconciler.planning.checkpoint import Checkpoint, decode_checkpoint, encode_checkpoint
from tests.support.load_traces import HOUR_REBALANCES, hour_trace

START = "2024-05-01 12:00:00"
T0 = 1714564800.0  # START as seconds since the epoch

# ----------------------------------------------------------------------------- builders


def rule(lo: int, hi: int, timeout: int | str = 60) -> dict[str, Any]:
    return {"minThreshold": lo, "maxThreshold": hi, "minTimeout": timeout}


def make_unit(
    cpu: dict[str, Any] | None = None,
    ram: dict[str, Any] | None = None,
    *,
    node_type: str = "edge",
    node_id: str | None = None,
    extra: Sequence[dict[str, Any]] = (),
) -> UnitConfig:
    entry: dict[str, Any] = {"nodeType": node_type}
    if node_id is not None:
        entry["nodeId"] = node_id
    rules = {k: v for k, v in (("cpu", cpu), ("ram", ram)) if v is not None}
    if rules:
        entry["alertRules"] = rules
    return UnitConfig.model_validate(
        {
            "apiVersion": "reconciler/v1",
            "kind": "UnitConfig",
            "version": "1.0.0",
            "nodes": [entry, *extra],
        }
    )


def make_node(
    node_id: str = "edge-1",
    cpu: int | None = 0,
    ram: int = 0,
    *,
    dmips: int = 1000,
    total_ram: int = 1000,
    node_type: str = "edge",
) -> Node:
    """A node whose usage is ``cpu`` DMIPS of ``dmips`` and ``ram`` bytes of ``total_ram``;
    ``cpu=None`` means no usage reading at all."""
    doc: dict[str, Any] = {
        "apiVersion": "reconciler/v1",
        "kind": "Node",
        "id": node_id,
        "type": node_type,
        "maxDMIPS": dmips,
        "totalRAM": total_ram,
    }
    if cpu is not None:
        doc["usage"] = {"cpu": cpu, "ram": ram}
    return Node.model_validate(doc)


def cpu_at(pct: int, node_id: str = "edge-1") -> Node:
    """A 1000-DMIPS node at ``pct`` percent cpu."""
    return make_node(node_id, pct * 10)


class Controller:
    """One observation per reconcile; the timelines cross processes as JSON text only."""

    def __init__(self, unit: UnitConfig | None) -> None:
        self.unit = unit
        self.stored = "{}"
        self.updates: list[AlertUpdate] = []

    def observe(self, *nodes: Node) -> AlertUpdate:
        update = observe(json.loads(self.stored), self.unit, nodes, time.time())
        self.stored = json.dumps(update.timelines, sort_keys=True)
        self.updates.append(update)
        return update

    @property
    def rebalances(self) -> int:
        return sum(u.rebalance for u in self.updates)

    def transitions(self) -> list[str]:
        """The raise/continue/fall words of every event, in order."""
        return [w for u in self.updates for w in kinds(u)]


def kinds(update: AlertUpdate) -> list[str]:
    """``raised``, ``still`` (a continued alert's trigger) or ``fell`` for each event."""
    words = {"raised": "raised", "still raised": "still", "fell": "fell"}
    return [words[m[1]] for e in update.events if (m := _KIND.search(e)) is not None]


_KIND = re.compile(r" alert (raised|still raised|fell) ")


def play(
    ctl: Controller,
    clock: Any,
    readings: Sequence[int],
    *,
    every: float = 10,
) -> list[AlertUpdate]:
    """Observe ``readings`` (cpu percent) ``every`` seconds apart, from the current frozen time;
    the clock is left at the last observation."""
    out = []
    for i, pct in enumerate(readings):
        if i:
            clock.tick(every)
        out.append(ctl.observe(cpu_at(pct)))
    return out


@pytest.fixture
def clock() -> Iterator[Any]:
    with freeze_time(START) as frozen:
        yield frozen


CPU = make_unit(cpu=rule(70, 85, 60))


# ----------------------------------------------------------------------------- raising


class TestRaise:
    def test_a_spike_shorter_than_min_timeout_triggers_nothing(self, clock: Any) -> None:
        ctl = Controller(CPU)
        updates = play(ctl, clock, [40, 95, 95, 95, 95, 95, 95, 40, 40])  # 95 % for 50 s
        assert ctl.rebalances == 0
        assert all(not u.overload and not u.raised for u in updates)
        assert updates[-1].timelines == {}

    def test_sustained_usage_raises_after_min_timeout_with_one_rebalance(self, clock: Any) -> None:
        ctl = Controller(CPU)
        updates = play(ctl, clock, [92] * 7)  # 0 s .. 60 s
        assert [u.rebalance for u in updates] == [False] * 6 + [True]
        last = updates[-1]
        assert last.overload == {"edge-1": frozenset({"cpu"})}
        assert last.raised == [
            {"node": "edge-1", "resource": "cpu", "since": "2024-05-01T12:01:00Z", "usage": 92.0}
        ]
        assert last.events == ["edge-1 cpu alert raised (usage 92% >= 85% for 60s)"]
        clock.tick(10)
        more = play(ctl, clock, [92] * 5)  # 50 s more: still inside the first minTimeout
        assert ctl.rebalances == 1
        assert all(u.overload == {"edge-1": frozenset({"cpu"})} for u in more)

    def test_the_raise_comes_at_exactly_min_timeout(self, clock: Any) -> None:
        ctl = Controller(CPU)
        ctl.observe(cpu_at(85))
        clock.tick(59.5)
        assert not ctl.observe(cpu_at(85)).rebalance
        clock.tick(0.5)
        assert ctl.observe(cpu_at(85)).rebalance

    def test_one_reading_below_max_restarts_the_timer(self, clock: Any) -> None:
        ctl = Controller(CPU)
        play(ctl, clock, [90, 90, 90, 90, 90, 84, 90, 90, 90, 90, 90, 90])
        assert ctl.rebalances == 0
        clock.tick(10)
        assert ctl.observe(cpu_at(90)).rebalance  # 60 s after the 84 % reading's successor

    def test_zero_min_timeout_raises_at_the_first_reading(self, clock: Any) -> None:
        ctl = Controller(make_unit(cpu=rule(70, 85, 0)))
        assert ctl.observe(cpu_at(90)).rebalance

    def test_an_observation_gap_assumes_the_reading_held(self, clock: Any) -> None:
        ctl = Controller(CPU)
        ctl.observe(cpu_at(90))
        clock.tick(3600)  # no observation for an hour
        update = ctl.observe(cpu_at(90))
        assert update.rebalance
        assert update.events == ["edge-1 cpu alert raised (usage 90% >= 85% for 3600s)"]


# ----------------------------------------------------------------------------- while raised


def raised_controller(clock: Any) -> Controller:
    """A controller whose edge-1 cpu alert was raised at the current time (after 60 s at 90 %)."""
    ctl = Controller(CPU)
    play(ctl, clock, [90] * 7)
    assert ctl.rebalances == 1
    return ctl


class TestWhileRaised:
    def test_usage_between_min_and_max_keeps_it_raised(self, clock: Any) -> None:
        ctl = raised_controller(clock)
        clock.tick(10)
        updates = play(ctl, clock, [75] * 60)  # ten minutes between min and max
        assert all(u.overload == {"edge-1": frozenset({"cpu"})} for u in updates)
        assert "fell" not in ctl.transitions()

    def test_each_further_min_timeout_triggers_one_more_rebalance(self, clock: Any) -> None:
        ctl = raised_controller(clock)  # raised at t = 60
        clock.tick(10)
        updates = play(ctl, clock, [80] * 30)  # t = 70 .. 360
        triggered = [70 + 10 * i for i, u in enumerate(updates) if u.rebalance]
        assert triggered == [120, 180, 240, 300, 360]
        assert ctl.rebalances == 6
        assert updates[5].events == [
            "edge-1 cpu alert still raised (usage 80% >= 70%, 60s since the last trigger)"
        ]
        assert updates[5].raised[0]["since"] == "2024-05-01T12:01:00Z"  # the raise, not a trigger

    def test_a_sparse_observation_triggers_once_not_once_per_missed_period(
        self, clock: Any
    ) -> None:
        ctl = raised_controller(clock)
        clock.tick(600)
        update = ctl.observe(cpu_at(80))
        assert update.rebalance
        assert ctl.rebalances == 2

    def test_an_observation_during_a_dip_never_triggers(self, clock: Any) -> None:
        ctl = raised_controller(clock)  # raised at t = 60
        clock.tick(60)
        update = ctl.observe(cpu_at(50))  # a full minTimeout later, but below min
        assert not update.rebalance
        assert update.overload == {"edge-1": frozenset({"cpu"})}
        clock.tick(10)
        assert ctl.observe(cpu_at(80)).rebalance  # back above min: overdue trigger

    def test_repeating_an_observation_at_the_same_instant_changes_nothing(self, clock: Any) -> None:
        ctl = Controller(make_unit(cpu=rule(70, 85, 0)))
        assert ctl.observe(cpu_at(90)).rebalance
        before = ctl.stored
        update = ctl.observe(cpu_at(90))
        assert not update.rebalance
        assert ctl.stored == before


# ----------------------------------------------------------------------------- falling


class TestFall:
    def test_it_falls_only_after_min_timeout_below_min(self, clock: Any) -> None:
        ctl = raised_controller(clock)
        clock.tick(10)
        updates = play(ctl, clock, [50] * 8)  # 0 s .. 70 s below min
        assert [bool(u.overload) for u in updates] == [True] * 6 + [False, False]
        assert updates[6].events == ["edge-1 cpu alert fell (usage 50% < 70% for 60s)"]
        assert updates[6].timelines == {}
        assert not any(u.rebalance for u in updates)  # a fall triggers nothing

    def test_a_dip_shorter_than_min_timeout_does_not_make_it_fall(self, clock: Any) -> None:
        ctl = raised_controller(clock)
        clock.tick(10)
        play(ctl, clock, [50, 50, 50, 50, 50, 72, 50, 50, 50, 50, 50, 72])  # two 40 s dips
        assert ctl.updates[-1].overload == {"edge-1": frozenset({"cpu"})}
        assert "fell" not in ctl.transitions()

    def test_after_a_fall_a_new_raise_needs_a_new_min_timeout(self, clock: Any) -> None:
        ctl = raised_controller(clock)
        clock.tick(10)
        play(ctl, clock, [50] * 7)
        assert ctl.transitions() == ["raised", "fell"]
        clock.tick(10)
        updates = play(ctl, clock, [90] * 7)
        assert [u.rebalance for u in updates] == [False] * 6 + [True]
        assert ctl.transitions() == ["raised", "fell", "raised"]


class TestEqualThresholds:
    UNIT = make_unit(cpu=rule(75, 75, 30))

    def test_min_equal_to_max_raises_holds_and_falls(self, clock: Any) -> None:
        ctl = Controller(self.UNIT)
        updates = play(ctl, clock, [75, 75, 75, 75])  # 30 s at 75 % raises
        assert [u.rebalance for u in updates] == [False, False, False, True]
        clock.tick(10)
        play(ctl, clock, [75, 75, 76, 100])  # at or above 75 keeps it raised
        assert ctl.updates[-1].overload
        clock.tick(10)
        updates = play(ctl, clock, [74, 74, 74, 74])  # 30 s below 75 makes it fall
        assert [bool(u.overload) for u in updates] == [True, True, True, False]
        assert ctl.transitions() == ["raised", "still", "fell"]

    def test_usage_exactly_at_the_threshold_never_oscillates(self, clock: Any) -> None:
        ctl = Controller(self.UNIT)
        play(ctl, clock, [75] * 360)
        assert "fell" not in ctl.transitions()
        assert ctl.transitions().count("raised") == 1


# ----------------------------------------------------------------------------- traces


def reference(obs: Sequence[tuple[float, int]], lo: int, hi: int, timeout: float) -> list[str]:
    """An independent, slow model of SPEC §8: per observation, ``raised``, ``continued``,
    ``fell`` or ``none``, found by re-scanning the readings backwards at every step."""

    def run_start(i: int, holds: Callable[[int], bool]) -> float:
        j = i
        while j > 0 and holds(obs[j - 1][1]):
            j -= 1
        return obs[j][0]

    out: list[str] = []
    state, last = "normal", -math.inf
    for i, (t, pct) in enumerate(obs):
        word = "none"
        if state == "normal":
            if pct >= hi and t - run_start(i, lambda q: q >= hi) >= timeout:
                state, last, word = "raised", t, "raised"
        elif pct < lo:
            if t - run_start(i, lambda q: q < lo) >= timeout:
                state, word = "normal", "fell"
        elif t > last and t - last >= timeout:
            last, word = t, "continued"
        out.append(word)
    return out


def machine(obs: Sequence[tuple[float, int]], lo: int, hi: int, timeout: int) -> list[str]:
    """The module under test on the same observations, through :func:`observe` and JSON."""
    unit = make_unit(cpu=rule(lo, hi, timeout))
    stored = "{}"
    out: list[str] = []
    for t, pct in obs:
        update = observe(json.loads(stored), unit, [cpu_at(pct)], t)
        stored = json.dumps(update.timelines)
        words = kinds(update)
        word = {"still": "continued"}.get(words[0], words[0]) if words else "none"
        assert update.rebalance == (word in ("raised", "continued"))
        assert bool(update.overload) == _raised_after(word, out)
        out.append(word)
    return out


def _raised_after(word: str, before: Sequence[str]) -> bool:
    """Whether the alert is raised after ``word``, given the earlier words."""
    state = False
    for w in [*before, word]:
        if w == "raised":
            state = True
        elif w == "fell":
            state = False
    return state


class TestTraces:
    def test_a_one_hour_trace_gives_exactly_the_rebalances_the_rules_imply(
        self, clock: Any
    ) -> None:
        trace = hour_trace()
        assert len(trace) == 361
        ctl = Controller(CPU)
        updates = play(ctl, clock, trace)
        assert ctl.rebalances == HOUR_REBALANCES == 27
        assert ctl.transitions().count("raised") == 2
        assert ctl.transitions().count("fell") == 1
        when = [i * 10 for i, u in enumerate(updates) if u.rebalance]
        assert when[:2] == [960, 1020] and 1800 not in when and 1830 in when
        obs = [(T0 + 10 * i, pct) for i, pct in enumerate(trace)]
        expected = reference(obs, 70, 85, 60)
        assert sum(w in ("raised", "continued") for w in expected) == ctl.rebalances

    def test_a_small_trace_counted_by_hand(self, clock: Any) -> None:
        # timeout 20 s, min 50, max 80, a reading every 10 s:
        #  t:   0  10  20  30  40  50  60  70  80  90 100 110
        #  %:  90  90  90  60  60  40  40  40  90  90  90  90
        #       .   .   R   .   C   .   .   F   .   .   R   .     -> 3 rebalances
        ctl = Controller(make_unit(cpu=rule(50, 80, 20)))
        updates = play(ctl, clock, [90, 90, 90, 60, 60, 40, 40, 40, 90, 90, 90, 90])
        assert [i * 10 for i, u in enumerate(updates) if u.rebalance] == [20, 40, 100]
        assert ctl.transitions() == ["raised", "still", "fell", "raised"]

    @pytest.mark.parametrize("seed", range(5))
    def test_a_noisy_hour_matches_the_reference(self, clock: Any, seed: int) -> None:
        rnd = random.Random(seed)
        level, trace = 50, []
        for _ in range(361):
            level = max(0, min(100, level + rnd.randint(-6, 6)))
            trace.append(level)
        ctl = Controller(CPU)
        updates = play(ctl, clock, trace)
        got = [
            {"still": "continued"}.get(w[0], w[0]) if (w := kinds(u)) else "none" for u in updates
        ]
        assert got == reference([(T0 + 10 * i, p) for i, p in enumerate(trace)], 70, 85, 60)

    @pytest.mark.parametrize("pct", range(0, 101, 5))
    @pytest.mark.parametrize(("lo", "hi"), [(70, 85), (75, 75), (0, 100)])
    def test_a_flat_usage_never_alternates(self, clock: Any, pct: int, lo: int, hi: int) -> None:
        ctl = Controller(make_unit(cpu=rule(lo, hi, 60)))
        play(ctl, clock, [pct] * 120)
        words = ctl.transitions()
        assert "fell" not in words
        assert words.count("raised") == (1 if pct >= hi else 0)
        assert all(bool(u.overload) == (pct >= hi) for u in ctl.updates[6:])


# ----------------------------------------------------------------------------- properties

percents = st.integers(min_value=0, max_value=100)
gaps = st.one_of(st.integers(min_value=0, max_value=90), st.floats(min_value=0, max_value=90))


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[int, int, int, list[tuple[float, int]]]:
    a, b = draw(percents), draw(percents)
    timeout = draw(st.integers(min_value=0, max_value=120))  # durations are whole seconds
    # runs of readings at one level, so that conditions are sustained as well as broken
    runs = draw(
        st.lists(
            st.tuples(st.integers(min_value=1, max_value=12), gaps, percents),
            min_size=1,
            max_size=12,
        )
    )
    t, obs = T0, []
    for count, dt, pct in runs:
        for _ in range(count):
            t += dt
            obs.append((t, pct))
    return min(a, b), max(a, b), timeout, obs


def _held_for(obs: Sequence[tuple[float, int]], i: int, holds: Callable[[int], bool]) -> float:
    """How long the readings up to ``i`` have satisfied ``holds`` without interruption."""
    j = i
    while j > 0 and holds(obs[j - 1][1]):
        j -= 1
    return obs[i][0] - obs[j][0]


class TestProperties:
    @settings(max_examples=300, deadline=None)
    @given(scenarios())
    def test_never_raises_or_falls_without_min_timeout_of_evidence(
        self, scenario: tuple[int, int, int, list[tuple[float, int]]]
    ) -> None:
        lo, hi, timeout, obs = scenario
        words = machine(obs, lo, hi, timeout)
        for i, word in enumerate(words):
            if word == "raised":
                assert obs[i][1] >= hi
                assert _held_for(obs, i, lambda q: q >= hi) >= timeout
            elif word == "fell":
                assert obs[i][1] < lo
                assert _held_for(obs, i, lambda q: q < lo) >= timeout
        raises_and_falls = [w for w in words if w in ("raised", "fell")]
        assert raises_and_falls[::2] == ["raised"] * len(raises_and_falls[::2])
        assert raises_and_falls[1::2] == ["fell"] * len(raises_and_falls[1::2])

    @settings(max_examples=300, deadline=None)
    @given(scenarios())
    def test_matches_the_reference_model(
        self, scenario: tuple[int, int, int, list[tuple[float, int]]]
    ) -> None:
        lo, hi, timeout, obs = scenario
        assert machine(obs, lo, hi, timeout) == reference(obs, lo, hi, timeout)

    @settings(max_examples=200, deadline=None)
    @given(percents, percents, percents, st.lists(gaps, min_size=1, max_size=60))
    def test_a_constant_usage_raises_at_most_once_and_never_falls(
        self, a: int, b: int, pct: int, dts: list[float]
    ) -> None:
        lo, hi = min(a, b), max(a, b)
        t, obs = T0, []
        for dt in dts:
            t += dt
            obs.append((t, pct))
        words = machine(obs, lo, hi, 30)
        assert "fell" not in words
        assert words.count("raised") <= 1


# ----------------------------------------------------------------------------- nodes and rules


class TestWhichNodes:
    def test_no_unit_config_means_no_alerts(self) -> None:
        update = observe({}, None, [cpu_at(100)], T0)
        assert update == AlertUpdate()

    def test_a_node_without_an_entry_or_rules_has_no_alert(self) -> None:
        unit = make_unit(cpu=rule(70, 85, 0), node_type="gateway")
        assert observe({}, unit, [cpu_at(100)], T0).overload == {}
        no_rules = make_unit()
        assert observe({}, no_rules, [cpu_at(100)], T0).overload == {}

    def test_only_resources_with_a_rule_are_watched(self) -> None:
        unit = make_unit(ram=rule(70, 85, 0))
        node = make_node("edge-1", cpu=1000, ram=900)
        update = observe({}, unit, [node], T0)
        assert update.overload == {"edge-1": frozenset({"ram"})}
        assert update.raised == [
            {"node": "edge-1", "resource": "ram", "since": "2024-05-01T12:00:00Z", "usage": 90.0}
        ]

    def test_ram_is_a_percentage_of_total_ram(self) -> None:
        unit = make_unit(ram=rule(70, 85, 0))
        gib = 1024**3
        below = make_node("edge-1", cpu=0, ram=gib * 84 // 100, total_ram=gib)
        at = make_node("edge-1", cpu=0, ram=gib * 85 // 100 + 1, total_ram=gib)
        assert observe({}, unit, [below], T0).overload == {}
        assert observe({}, unit, [at], T0).overload == {"edge-1": frozenset({"ram"})}

    def test_thresholds_compare_exactly_not_in_rounded_percent(self) -> None:
        unit = make_unit(cpu=rule(70, 85, 0))
        just_below = make_node("edge-1", cpu=8499, dmips=10000)  # 84.99 %
        update = observe({}, unit, [just_below], T0)
        assert update.overload == {}
        exactly = make_node("edge-1", cpu=8500, dmips=10000)
        assert observe({}, unit, [exactly], T0).raised[0]["usage"] == 85.0

    def test_the_exact_node_id_entry_wins_over_the_type_entry(self) -> None:
        unit = make_unit(
            cpu=rule(70, 85, 0),
            extra=[{"nodeType": "edge", "nodeId": "edge-2", "alertRules": {}}],
        )
        update = observe({}, unit, [cpu_at(100, "edge-1"), cpu_at(100, "edge-2")], T0)
        assert update.overload == {"edge-1": frozenset({"cpu"})}

    def test_a_node_without_usage_or_capacity_has_no_alert(self) -> None:
        unit = make_unit(cpu=rule(70, 85, 0), ram=rule(70, 85, 0))
        no_usage = make_node("edge-1", cpu=None)
        no_capacity = make_node("edge-2", cpu=5, ram=5, dmips=0, total_ram=0)
        update = observe({}, unit, [no_usage, no_capacity], T0)
        assert update == AlertUpdate()

    def test_a_node_that_disappears_drops_its_timeline(self) -> None:
        unit = make_unit(cpu=rule(70, 85, 0))
        first = observe({}, unit, [cpu_at(100, "edge-1"), cpu_at(100, "edge-2")], T0)
        assert set(first.timelines) == {"edge-1", "edge-2"}
        second = observe(first.timelines, unit, [cpu_at(100, "edge-2")], T0 + 10)
        assert set(second.timelines) == {"edge-2"}
        assert second.overload == {"edge-2": frozenset({"cpu"})}
        assert second.events[0] == "edge-1 cpu alert dropped (node gone)"

    def test_losing_the_rule_or_the_reading_drops_a_raised_alert(self) -> None:
        unit = make_unit(cpu=rule(70, 85, 0))
        first = observe({}, unit, [cpu_at(100)], T0)
        gone = observe(first.timelines, make_unit(), [cpu_at(100)], T0 + 1)
        assert (gone.timelines, gone.events) == ({}, ["edge-1 cpu alert dropped (no alert rule)"])
        blind = observe(first.timelines, unit, [make_node(cpu=None)], T0 + 1)
        assert blind.events == ["edge-1 cpu alert dropped (no usage reading)"]

    def test_several_nodes_and_resources_are_reported_sorted(self) -> None:
        unit = make_unit(cpu=rule(70, 85, 0), ram=rule(70, 85, 0))
        nodes = [make_node(n, cpu=900, ram=900) for n in ("edge-3", "edge-1", "edge-2")]
        update = observe({}, unit, nodes, T0)
        assert [(r["node"], r["resource"]) for r in update.raised] == [
            (n, r) for n in ("edge-1", "edge-2", "edge-3") for r in ("cpu", "ram")
        ]
        assert update.overload == {
            n: frozenset({"cpu", "ram"}) for n in ("edge-1", "edge-2", "edge-3")
        }
        assert update.rebalance
        assert len(update.events) == 6
        assert observe({}, unit, list(reversed(nodes)), T0) == update


# ----------------------------------------------------------------------------- persistence


class TestPersistence:
    def test_the_timeline_survives_the_real_checkpoint_encoding(self, clock: Any) -> None:
        alerts: dict[str, Any] = {}
        rebalances = 0
        for generation, pct in enumerate([90] * 7 + [80] * 6):
            cp = decode_checkpoint(
                encode_checkpoint(Checkpoint("lineage-1", generation, alerts=alerts)), None
            )
            update = observe(cp.alerts, CPU, [cpu_at(pct)], time.time())
            alerts, rebalances = update.timelines, rebalances + update.rebalance
            clock.tick(10)
        assert rebalances == 2  # the raise at 60 s and the continue at 120 s

    def test_unchanged_observations_leave_the_stored_timeline_unchanged(self, clock: Any) -> None:
        ctl = Controller(CPU)
        ctl.observe(cpu_at(90))
        stored = ctl.stored
        for _ in range(5):
            clock.tick(10)
            ctl.observe(cpu_at(90))
            assert ctl.stored == stored  # nothing new to checkpoint while a timer runs

    def test_timeline_json_round_trip(self) -> None:
        for tl in (
            Timeline(),
            Timeline("normal", T0, None, None, (70, 85, 60.0)),
            Timeline("raised", T0 + 5, T0, T0 + 1.5, (75, 75, 0.0)),
        ):
            assert Timeline.from_json(json.loads(json.dumps(tl.to_json()))) == tl

    @pytest.mark.parametrize(
        "bad",
        [
            "raised",
            {"state": "hot"},
            {"state": "raised", "since": None},
            {"state": "normal", "since": "yesterday"},
            {"state": "normal", "since": True},
            {"state": "normal", "rule": {"minThreshold": 1}},
        ],
    )
    def test_a_malformed_timeline_restarts_normal_and_is_logged(self, bad: Any) -> None:
        with pytest.raises(ValueError):
            Timeline.from_json(bad)
        update = observe({"edge-1": {"cpu": bad}}, CPU, [cpu_at(90)], T0)
        assert update.events[0].startswith("edge-1 cpu alert timeline ignored (malformed")
        assert update.timelines["edge-1"]["cpu"]["since"] == T0
        garbage = observe({"edge-1": 7}, CPU, [cpu_at(90)], T0)
        assert garbage.timelines["edge-1"]["cpu"]["state"] == "normal"

    def test_a_rule_change_restarts_the_running_timer(self, clock: Any) -> None:
        ctl = Controller(CPU)
        play(ctl, clock, [90] * 5)  # 40 s at 90 %
        ctl.unit = make_unit(cpu=rule(70, 88, 60))
        clock.tick(10)
        updates = play(ctl, clock, [90] * 7)  # the old 40 s do not count under the new rule
        assert [u.rebalance for u in updates] == [False] * 6 + [True]

    def test_a_clock_stepping_back_restarts_timers_instead_of_firing_or_sticking(
        self, clock: Any
    ) -> None:
        ctl = Controller(CPU)
        play(ctl, clock, [90] * 4)  # 30 s at 90 %
        clock.tick(-3600)
        assert not ctl.observe(cpu_at(90)).rebalance
        clock.tick(59)
        assert not ctl.observe(cpu_at(90)).rebalance
        clock.tick(1)
        assert ctl.observe(cpu_at(90)).rebalance

    def test_now_must_be_finite(self) -> None:
        with pytest.raises(ValueError):
            observe({}, CPU, [cpu_at(90)], math.nan)


class TestHelpers:
    def test_iso_utc(self) -> None:
        assert iso_utc(T0) == "2024-05-01T12:00:00Z"
        assert iso_utc(T0 + 0.9) == "2024-05-01T12:00:00Z"

    def test_step_rejects_zero_capacity(self) -> None:
        r = AlertRule(minThreshold=70, maxThreshold=85, minTimeout=60)
        with pytest.raises(ValueError):
            step(Timeline(), r, 1, 0, T0)

    def test_durations_in_rules_accept_strings(self) -> None:
        unit = make_unit(cpu=rule(70, 85, "1m"))
        first = observe({}, unit, [cpu_at(90)], T0)
        assert not observe(first.timelines, unit, [cpu_at(90)], T0 + 59).rebalance
        assert observe(first.timelines, unit, [cpu_at(90)], T0 + 60).rebalance


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["edge", "main"]),
            st.one_of(st.none(), st.integers(0, 1200)),  # cpu used (None: no usage reading)
            st.integers(0, 1200),  # ram used
            st.sampled_from([0, 1000]),  # capacity (0: no reading)
        ),
        max_size=8,
    ),
    st.one_of(st.none(), st.tuples(st.integers(0, 100), st.integers(0, 100))),
    st.one_of(st.none(), st.tuples(st.integers(0, 100), st.integers(0, 100))),
    st.floats(0, 1e9),
)
def test_a_node_without_a_timeline_is_observed_alike_by_the_quick_path(
    readings: list[tuple[str, int | None, int, int]],
    cpu: tuple[int, int] | None,
    ram: tuple[int, int] | None,
    now: float,
) -> None:
    """A node with no stored timeline whose readings are all below their maxThreshold is
    passed over without stepping its timelines; the answer is the one of the full pass (the
    same nodes, each given an empty stored entry, which the quick path does not take)."""
    unit = make_unit(
        None if cpu is None else rule(min(cpu), max(cpu), 30),
        None if ram is None else rule(min(ram), max(ram), 0),
        extra=[{"nodeType": "main"}],  # (no alert rules)
    )
    nodes = [
        make_node(f"n{k}", used, ram_used, dmips=capacity, total_ram=1000, node_type=node_type)
        for k, (node_type, used, ram_used, capacity) in enumerate(readings)
    ]
    quick = observe({}, unit, nodes, now)
    full = observe({n.id: {} for n in nodes}, unit, nodes, now)
    assert quick == full
