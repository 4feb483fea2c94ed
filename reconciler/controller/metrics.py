"""The controller's Prometheus metrics (SPEC §20), from its runs and their status reports.

:class:`ControllerMetrics` is a ``prometheus_client`` collector: each run hands it its report
(:meth:`ControllerMetrics.observe`), which costs a few counters; the gauges are made from the
last run's status report when scraped. ``watch`` serves them on ``--metrics-addr``;
``reconcile --metrics-file`` writes them once per run, carrying the run counters and the last
success over from the file it wrote before (a oneshot process has no memory of its own).

Label cardinality is bounded: by state, reason or action (a handful of values each), by
node and resource (each node's CPU, RAM, storage, state and device pools), and by raised
alert. No controller metric has an instance label: at 20,000 instances that would be 20,000
series per metric.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.samples import Sample

from reconciler.controller.reconcile import ReconcileReport

__all__ = [
    "DURATION_BUCKETS",
    "INSTANCE_STATES",
    "ControllerMetrics",
    "RunStats",
    "StatusSnapshot",
    "status_samples",
]

DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
"""Seconds: a warm run at 5,000 nodes takes about 0.1-1 s, a cold one about 6-20 s."""

INSTANCE_STATES = ("desired", "placed", "unplaceable", "active", "failed")
"""``reconciler_instances{state}``: desired = placed + unplaceable; active and failed as the
agents report the placed instances."""

RESULTS = ("success", "error")


@dataclass
class RunStats:
    """Runs by result, the histogram of their durations and the time of the last success;
    plain numbers, so that a oneshot can continue the series of the file it wrote before."""

    runs: dict[str, float] = field(default_factory=lambda: dict.fromkeys(RESULTS, 0.0))
    buckets: list[float] = field(default_factory=lambda: [0.0] * (len(DURATION_BUCKETS) + 1))
    """Non-cumulative counts per bucket; the last is +Inf."""
    duration_sum: float = 0.0
    last_success: float | None = None

    def observe(self, ok: bool, elapsed: float | None, now: float) -> None:
        self.runs["success" if ok else "error"] += 1
        if elapsed is not None:
            self.buckets[bisect.bisect_left(DURATION_BUCKETS, elapsed)] += 1
            self.duration_sum += elapsed
        if ok:
            self.last_success = now

    @classmethod
    def from_samples(cls, samples: Iterable[Sample]) -> RunStats:
        """The stats a metrics file holds (its ``reconciler_runs_total``, duration histogram
        and last success); anything else in it is ignored."""
        stats = cls()
        cumulative: dict[float, float] = {}
        for s in samples:
            if s.name == "reconciler_runs_total" and s.labels.get("result") in RESULTS:
                stats.runs[s.labels["result"]] = s.value
            elif s.name == "reconciler_run_duration_seconds_bucket":
                le = s.labels.get("le", "")
                cumulative[float("inf") if le == "+Inf" else float(le)] = s.value
            elif s.name == "reconciler_run_duration_seconds_sum":
                stats.duration_sum = s.value
            elif s.name == "reconciler_last_success_timestamp_seconds":
                stats.last_success = s.value
        bounds = (*DURATION_BUCKETS, float("inf"))
        if all(b in cumulative for b in bounds):  # the same buckets: carry them over
            below = 0.0
            for i, b in enumerate(bounds):
                stats.buckets[i] = max(0.0, cumulative[b] - below)
                below = cumulative[b]
        return stats

    def families(self) -> Iterator[Metric]:
        runs = CounterMetricFamily(
            "reconciler_runs", "Reconcile runs, by result (success or error).", labels=["result"]
        )
        for result in RESULTS:
            runs.add_metric([result], self.runs[result])
        yield runs
        cumulative, acc = [], 0.0
        for b, n in zip((*DURATION_BUCKETS, float("inf")), self.buckets, strict=True):
            acc += n
            cumulative.append(("+Inf" if b == float("inf") else repr(b), acc))
        yield HistogramMetricFamily(
            "reconciler_run_duration_seconds",
            "How long a successful reconcile run took.",
            buckets=cumulative,
            sum_value=self.duration_sum,
        )
        last = GaugeMetricFamily(
            "reconciler_last_success_timestamp_seconds",
            "When the last successful reconcile run ended (seconds since the epoch).",
        )
        if self.last_success is not None:
            last.add_metric([], self.last_success)
        yield last


@dataclass(frozen=True)
class StatusSnapshot:
    """What the gauges are made of: a run's status report (the value of out/status.json), its
    plan's action counts and the checkpoint generation."""

    status: Mapping[str, Any]
    actions: Mapping[str, int]
    generation: int

    @classmethod
    def of(cls, report: ReconcileReport) -> StatusSnapshot | None:
        status = report.status()
        if status is None:
            return None
        actions: dict[str, int] = {"start": 0, "stop": 0}
        for a in report.plan.actions:
            actions[a.action] = actions.get(a.action, 0) + 1
        return cls(status, actions, report.computed.checkpoint.generation)


def _inventories(entry: Mapping[str, Any]) -> Iterator[tuple[str, int, int]]:
    """(resource, capacity, reserved) of a node's status entry."""
    for resource, inv in (
        ("cpu", entry.get("cpu")),
        ("ram", entry.get("ram")),
        ("storage", (entry.get("partitions") or {}).get("storage")),
        ("state", (entry.get("partitions") or {}).get("state")),
    ):
        if isinstance(inv, dict):
            yield resource, int(inv["capacity"]), int(inv["reserved"])
    for resource, pool in (entry.get("devices") or {}).items():
        yield resource, int(pool["total"]), int(pool["allocated"])


def status_samples(snapshot: StatusSnapshot) -> Iterator[Metric]:
    """The gauges of one status report (SPEC §20), in a fixed order, each sorted by labels."""
    status = snapshot.status
    instances: Mapping[str, Mapping[str, Any]] = status["instances"]
    failures: Sequence[Mapping[str, Any]] = status["failures"]
    observed: dict[str, int] = {}
    for rec in instances.values():
        observed[rec["state"]] = observed.get(rec["state"], 0) + 1
    counts = {
        "desired": len(instances) + len(failures),
        "placed": len(instances),
        "unplaceable": len(failures),
        "active": observed.get("active", 0),
        "failed": observed.get("failed", 0),
    }
    inst = GaugeMetricFamily(
        "reconciler_instances",
        "Instances: desired, placed, unplaceable, and active and failed as the agents report.",
        labels=["state"],
    )
    for state in INSTANCE_STATES:
        inst.add_metric([state], counts[state])
    yield inst

    reasons: dict[str, int] = {}
    for f in failures:
        reasons[f["reason"]] = reasons.get(f["reason"], 0) + 1
    unplaceable = GaugeMetricFamily(
        "reconciler_unplaceable", "Unplaceable instances by reason code.", labels=["reason"]
    )
    for reason in sorted(reasons):
        unplaceable.add_metric([reason], reasons[reason])
    yield unplaceable

    actions = GaugeMetricFamily(
        "reconciler_plan_actions", "Actions of the last plan, by action.", labels=["action"]
    )
    for action in sorted(snapshot.actions):
        actions.add_metric([action], snapshot.actions[action])
    yield actions

    capacity = GaugeMetricFamily(
        "reconciler_node_capacity",
        "What a node offers: cpu (DMIPS), ram, storage and state (bytes), device pools (devices).",
        labels=["node", "resource"],
    )
    reserved = GaugeMetricFamily(
        "reconciler_node_reserved",
        "What the placed instances reserve of it, in the same units.",
        labels=["node", "resource"],
    )
    devices = GaugeMetricFamily(
        "reconciler_devices",
        "Devices of a node's pools by state (healthy, unhealthy, allocated).",
        labels=["node", "resource", "state"],
    )
    nodes: Mapping[str, Mapping[str, Any]] = status["nodes"]
    for node_id in sorted(nodes):
        entry = nodes[node_id]
        for resource, cap, res in _inventories(entry):
            capacity.add_metric([node_id, resource], cap)
            reserved.add_metric([node_id, resource], res)
        for resource, pool in sorted((entry.get("devices") or {}).items()):
            total, healthy = int(pool["total"]), int(pool["healthy"])
            devices.add_metric([node_id, resource, "healthy"], healthy)
            devices.add_metric([node_id, resource, "unhealthy"], total - healthy)
            devices.add_metric([node_id, resource, "allocated"], int(pool["allocated"]))
    yield capacity
    yield reserved
    yield devices

    alerts = GaugeMetricFamily(
        "reconciler_alert_raised",
        "1 for each raised load alert (a node's resource over its threshold).",
        labels=["node", "resource"],
    )
    for node, resource in sorted({(a["node"], a["resource"]) for a in status["alerts"]}):
        alerts.add_metric([node, resource], 1)
    yield alerts

    generation = GaugeMetricFamily(
        "reconciler_checkpoint_generation", "The allocation checkpoint's generation."
    )
    generation.add_metric([], snapshot.generation)
    yield generation


class ControllerMetrics:
    """The controller's metrics in their own registry. ``observe`` after each run (``None``: a
    failed run); the gauges show the last successful run's report."""

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        *,
        before: Sequence[Metric] = (),
    ) -> None:
        """``before``: the metric families a oneshot wrote last time; its run counters go on,
        and its gauges are shown until a run succeeds (a failed run leaves them as they were:
        an alert on unplaceable instances does not resolve because the controller broke)."""
        self.clock = clock
        self.runs = RunStats.from_samples(s for f in before for s in f.samples)
        self._before = [f for f in before if f.name not in _RUN_FAMILIES]
        self.snapshot: StatusSnapshot | None = None
        self._lock = threading.Lock()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def observe(self, report: ReconcileReport | None) -> None:
        """Count a run; a successful one's report becomes what the gauges show (the report's
        value is taken now: it is made of caches the next run changes)."""
        snapshot = StatusSnapshot.of(report) if report is not None else None
        with self._lock:
            ok = report is not None
            self.runs.observe(ok, report.elapsed if report is not None else None, self.clock())
            if snapshot is not None:
                self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            runs = RunStats(
                dict(self.runs.runs),
                list(self.runs.buckets),
                self.runs.duration_sum,
                self.runs.last_success,
            )
            snapshot = self.snapshot
        yield from runs.families()
        if snapshot is not None:
            yield from status_samples(snapshot)
        else:
            yield from self._before


_RUN_FAMILIES = frozenset(
    {
        "reconciler_runs",
        "reconciler_run_duration_seconds",
        "reconciler_last_success_timestamp_seconds",
    }
)
