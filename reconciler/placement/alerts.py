"""Alerts on sustained load (SPEC §8), after the AosEdge resource monitor's alert processor.

One small state machine per (node, resource) for resource in ``cpu`` and ``ram``. A reading is the
node's measured usage as a percentage of its capacity (cpu: ``usage.cpu / maxDMIPS * 100``; ram:
``usage.ram / totalRAM * 100``), compared exactly (``used * 100 >= threshold * capacity`` in
integer arithmetic, no float rounding at the thresholds). With the node's
:class:`~reconciler.model.documents.AlertRule` (``minThreshold``, ``maxThreshold`` percent,
``minTimeout``
seconds):

- *normal*: the alert is **raised** at the first observation at which usage ≥ maxThreshold has held
  continuously for at least minTimeout;
- *raised*: usage ≥ minThreshold keeps it raised; it **falls** at the first observation at which
  usage < minThreshold has held continuously for at least minTimeout. A shorter dip changes nothing.
- A raise triggers a rebalance, and so does every further observation, while raised and with usage
  ≥ minThreshold, that comes at least minTimeout after the last trigger (AosEdge's ``continue``
  alert; an observation during a dip below minThreshold never triggers). A fall triggers nothing.

*Continuously* is judged from the controller's successive observations (each reconcile observes
once): a condition holds from the first observation at which it became true until an observation at
which it is false. Between two observations the earlier reading is assumed to hold, however long the
gap (a node agent rewrites its file when usage changes; an unchanged file means unchanged usage).

The timeline is a :class:`Timeline` per (node, resource), stored as plain JSON under
``Checkpoint.alerts`` (``{nodeId: {"cpu": {...}, "ram": {...}}}``), so a oneshot ``reconcile``
per file change sees the same history as a long-lived watcher. It holds only times at which
something started (a condition, a raise, a trigger), never the time of the last observation, so
observations that change nothing leave the checkpoint byte for byte unchanged.

The clock is injected: :func:`observe` takes ``now`` (seconds since the epoch) and never reads the
clock itself. Everything here is pure and deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from reconciler.model.documents import AlertRule, Node, UnitConfig

__all__ = [
    "RESOURCES",
    "AlertUpdate",
    "Resource",
    "State",
    "Step",
    "Timeline",
    "Transition",
    "iso_utc",
    "observe",
    "reading_of",
    "step",
]

Resource = Literal["cpu", "ram"]
State = Literal["normal", "raised"]
Transition = Literal["none", "raised", "continued", "fell"]
RESOURCES: tuple[Resource, ...] = ("cpu", "ram")

RuleKey = tuple[int, int, float]  # (minThreshold, maxThreshold, minTimeout)


def _rule_key(rule: AlertRule) -> RuleKey:
    return (rule.minThreshold, rule.maxThreshold, float(rule.minTimeout))


def _opt_time(value: Any, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} must be a number or null, not {value!r}")
    t = float(value)
    if not math.isfinite(t):
        raise ValueError(f"{what} must be finite")
    return t


@dataclass(frozen=True, slots=True)
class Timeline:
    """The alert timeline of one (node, resource).

    - ``state``: ``normal`` or ``raised``.
    - ``since``: when the condition that leads to the next transition started (normal: the first
      observation of the current run of readings ≥ maxThreshold; raised: the first observation of
      the current run of readings < minThreshold), or None when that condition does not hold.
    - ``raised_at``: when the alert was raised (None while normal).
    - ``last_trigger``: when the last rebalance was triggered by this alert (None while normal).
    - ``rule``: (minThreshold, maxThreshold, minTimeout) the timers were started under; when the
      rule changes, ``since`` restarts at the next observation (state and raise time are kept).
    """

    state: State = "normal"
    since: float | None = None
    raised_at: float | None = None
    last_trigger: float | None = None
    rule: RuleKey | None = None

    @property
    def raised(self) -> bool:
        return self.state == "raised"

    @property
    def trivial(self) -> bool:
        """Nothing to remember: normal with no timer running (not stored in the checkpoint)."""
        return self.state == "normal" and self.since is None

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "since": self.since,
            "raisedAt": self.raised_at,
            "lastTrigger": self.last_trigger,
            "rule": None
            if self.rule is None
            else {
                "minThreshold": self.rule[0],
                "maxThreshold": self.rule[1],
                "minTimeout": self.rule[2],
            },
        }

    @staticmethod
    def from_json(d: Any) -> Timeline:
        """Parse :meth:`to_json`'s output; raise ValueError for anything else."""
        if not isinstance(d, Mapping):
            raise ValueError(f"an alert timeline must be an object, not {d!r}")
        state = d.get("state", "normal")
        if state not in ("normal", "raised"):
            raise ValueError(f"invalid alert state {state!r}")
        rule: RuleKey | None = None
        r = d.get("rule")
        if r is not None:
            if not isinstance(r, Mapping):
                raise ValueError(f"an alert rule must be an object, not {r!r}")
            lo, hi = r.get("minThreshold"), r.get("maxThreshold")
            timeout = _opt_time(r.get("minTimeout"), "minTimeout")
            if not isinstance(lo, int) or not isinstance(hi, int) or timeout is None:
                raise ValueError(f"malformed alert rule {r!r}")
            rule = (lo, hi, timeout)
        raised_at = _opt_time(d.get("raisedAt"), "raisedAt")
        last_trigger = _opt_time(d.get("lastTrigger"), "lastTrigger")
        if state == "raised" and (raised_at is None or last_trigger is None):
            raise ValueError("a raised alert needs raisedAt and lastTrigger")
        if state == "normal":
            raised_at = last_trigger = None
        return Timeline(state, _opt_time(d.get("since"), "since"), raised_at, last_trigger, rule)


@dataclass(frozen=True, slots=True)
class Step:
    """One observation's outcome: the new timeline, what happened, and for how long the condition
    that caused it had held (seconds; for ``continued``, the time since the last trigger)."""

    timeline: Timeline
    transition: Transition
    held: float = 0.0

    @property
    def triggers(self) -> bool:
        """Whether this observation triggers a rebalance."""
        return self.transition in ("raised", "continued")


def step(timeline: Timeline, rule: AlertRule, used: int, capacity: int, now: float) -> Step:
    """Advance ``timeline`` by one observation of ``used`` out of ``capacity`` at time ``now``.

    ``capacity`` must be positive. A clock that stepped back (a stored time later than ``now``)
    restarts the affected timer at ``now``: it neither fires early nor stays stuck.
    """
    if capacity <= 0:
        raise ValueError("capacity must be positive")
    if not math.isfinite(now):
        raise ValueError("now must be finite")
    key = _rule_key(rule)
    timeout = key[2]
    since = timeline.since if timeline.rule == key else None
    if since is not None and since > now:
        since = now
    at_max = used * 100 >= rule.maxThreshold * capacity
    below_min = used * 100 < rule.minThreshold * capacity

    if not timeline.raised:
        if not at_max:
            return Step(Timeline(rule=key), "none")
        start = now if since is None else since
        held = now - start
        if held >= timeout:
            return Step(Timeline("raised", None, now, now, key), "raised", held)
        return Step(Timeline("normal", start, None, None, key), "none")

    raised_at = timeline.raised_at if timeline.raised_at is not None else now
    last = timeline.last_trigger if timeline.last_trigger is not None else raised_at
    if last > now:
        last = now
    if raised_at > now:
        raised_at = now
    if below_min:
        start = now if since is None else since
        held = now - start
        if held >= timeout:
            return Step(Timeline(rule=key), "fell", held)
        return Step(Timeline("raised", start, raised_at, last, key), "none")
    gap = now - last
    if now > last and gap >= timeout:
        return Step(Timeline("raised", None, raised_at, now, key), "continued", gap)
    return Step(Timeline("raised", None, raised_at, last, key), "none")


# ----------------------------------------------------------------------------- per node


@dataclass(frozen=True)
class AlertUpdate:
    """The outcome of one observation of every node.

    - ``timelines``: the JSON to store as ``Checkpoint.alerts`` (``{nodeId: {resource: {...}}}``).
    - ``overload``: node id → resources whose alert is raised after this observation; exactly the
      ``overload`` argument of :func:`reconciler.placement.balancer.balance`.
    - ``rebalance``: this observation triggers a rebalance (a raise, or a raised alert's further
      minTimeout since its last trigger).
    - ``raised``: status entries ``{node, resource, since (ISO 8601 UTC), usage (percent)}``,
      sorted by node then resource.
    - ``events``: human log lines, sorted by node then resource.
    """

    timelines: dict[str, Any] = field(default_factory=dict)
    overload: dict[str, frozenset[str]] = field(default_factory=dict)
    rebalance: bool = False
    raised: list[dict[str, Any]] = field(default_factory=list)
    events: list[str] = field(default_factory=list)


def iso_utc(t: float) -> str:
    """``2024-05-01T12:00:00Z`` (whole seconds; fractions are truncated)."""
    return datetime.fromtimestamp(math.floor(t), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def reading_of(node: Node, resource: Resource) -> tuple[int, int] | None:
    """(used, capacity) of ``resource`` on ``node``; None without usage or with zero capacity."""
    if node.usage is None:
        return None
    if resource == "cpu":
        used, capacity = node.usage.cpu, node.maxDMIPS
    else:
        used, capacity = node.usage.ram, node.totalRAM
    if capacity <= 0:
        return None
    return used, capacity


def _percent(used: int, capacity: int) -> float:
    """Usage percent rounded down to 0.1, so the shown value compares with an integer threshold
    the same way the exact reading does."""
    return (used * 1000 // capacity) / 10


def _num(value: float) -> str:
    return f"{value:g}"


def _no_alert(unit: UnitConfig | None, node: Node) -> bool:
    """``node`` has no alert rule or no usage reading (so no alert on any resource)."""
    if unit is None or node.usage is None:
        return True
    cfg = unit.config_for(node.id, node.type)
    return cfg is None or cfg.alertRules is None


def _quiet(unit: UnitConfig | None, node: Node) -> bool:
    """``node``, which has no stored timeline, has none after this observation either and
    raises nothing: no alert rule or no usage reading, or on every resource with a rule a
    reading below its ``maxThreshold`` (:func:`step` of a timeline that is not raised then
    gives the trivial one, whatever the time: most nodes of a unit at rest)."""
    if _no_alert(unit, node):
        return True
    assert unit is not None
    cfg = unit.config_for(node.id, node.type)
    assert cfg is not None and cfg.alertRules is not None
    for resource in RESOURCES:
        rule: AlertRule | None = getattr(cfg.alertRules, resource)
        reading = reading_of(node, resource) if rule is not None else None
        if rule is not None and reading is not None:
            used, capacity = reading
            if used * 100 >= rule.maxThreshold * capacity:
                return False
    return True


def _rule_for(unit: UnitConfig | None, node: Node, resource: Resource) -> AlertRule | None:
    if unit is None:
        return None
    cfg = unit.config_for(node.id, node.type)
    if cfg is None or cfg.alertRules is None:
        return None
    rule: AlertRule | None = getattr(cfg.alertRules, resource)
    return rule


def _why_gone(node: Node | None, resource: Resource, rule: AlertRule | None) -> str:
    if node is None:
        return "node gone"
    if rule is None:
        return "no alert rule"
    if node.usage is None:
        return "no usage reading"
    return "zero capacity"


def _previous_timeline(
    previous: Mapping[str, Any], node_id: str, resource: Resource, events: list[str]
) -> Timeline:
    per_node = previous.get(node_id)
    if per_node is None:
        return Timeline()
    try:
        if not isinstance(per_node, Mapping):
            raise ValueError(f"expected an object, not {per_node!r}")
        raw = per_node.get(resource)
        return Timeline() if raw is None else Timeline.from_json(raw)
    except ValueError as e:
        events.append(f"{node_id} {resource} alert timeline ignored (malformed: {e})")
        return Timeline()


def observe(
    previous: Mapping[str, Any],
    unit: UnitConfig | None,
    nodes: Sequence[Node],
    now: float,
) -> AlertUpdate:
    """Observe every node's usage once at time ``now`` and advance the alert timelines.

    ``previous`` is ``Checkpoint.alerts`` (possibly empty). A (node, resource) without an alert
    rule (no NodeConfig, no ``alertRules``, no rule for the resource), without a usage reading or
    with zero capacity has no alert and its timeline is dropped; so is every timeline of a node
    that is no longer in ``nodes``. A timeline that cannot be parsed restarts as normal (logged).
    """
    if not math.isfinite(now):
        raise ValueError("now must be finite")
    if not previous and (unit is None or all(c.alertRules is None for c in unit.nodes)):
        return AlertUpdate({}, {}, False, [], [])  # no rule, no timeline: what the loop finds
    by_id = {n.id: n for n in nodes}
    timelines: dict[str, Any] = {}
    overload: dict[str, frozenset[str]] = {}
    raised: list[dict[str, Any]] = []
    events: list[str] = []
    rebalance = False
    for node_id in sorted(set(by_id) | {str(k) for k in previous}):
        node = by_id.get(node_id)
        if node is not None and node_id not in previous and _quiet(unit, node):
            continue  # no timeline before, none now: what the loop below finds, quickly
        stored: dict[str, Any] = {}
        hot: list[str] = []
        for resource in RESOURCES:
            old = _previous_timeline(previous, node_id, resource, events)
            rule = _rule_for(unit, node, resource) if node is not None else None
            reading = reading_of(node, resource) if node is not None else None
            if node is None or rule is None or reading is None:
                if old.raised:
                    reason = _why_gone(node, resource, rule)
                    events.append(f"{node_id} {resource} alert dropped ({reason})")
                continue
            used, capacity = reading
            result = step(old, rule, used, capacity, now)
            new = result.timeline
            pct = _num(_percent(used, capacity))
            held = _num(result.held)
            if result.transition == "raised":
                events.append(
                    f"{node_id} {resource} alert raised "
                    f"(usage {pct}% >= {rule.maxThreshold}% for {held}s)"
                )
            elif result.transition == "continued":
                events.append(
                    f"{node_id} {resource} alert still raised "
                    f"(usage {pct}% >= {rule.minThreshold}%, {held}s since the last trigger)"
                )
            elif result.transition == "fell":
                events.append(
                    f"{node_id} {resource} alert fell "
                    f"(usage {pct}% < {rule.minThreshold}% for {held}s)"
                )
            rebalance = rebalance or result.triggers
            if not new.trivial:
                stored[resource] = new.to_json()
            if new.raised:
                hot.append(resource)
                assert new.raised_at is not None
                raised.append(
                    {
                        "node": node_id,
                        "resource": resource,
                        "since": iso_utc(new.raised_at),
                        "usage": _percent(used, capacity),
                    }
                )
        if stored:
            timelines[node_id] = stored
        if hot:
            overload[node_id] = frozenset(hot)
    return AlertUpdate(timelines, overload, rebalance, raised, events)
