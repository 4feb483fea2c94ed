"""The node agent's Prometheus metrics (SPEC §20), served by ``agent --watch --metrics-addr``.

- ``reconciler_agent_restarts_total{instance}``: containers this agent found down and started
  again, per instance (the instances of one node: a bounded set);
- ``reconciler_agent_apply_duration_seconds``: how long each run (applying the node's plan,
  looking at every container, writing ``actual/``) took.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from reconciler.agent.node import AgentReport

__all__ = ["APPLY_BUCKETS", "AgentMetrics"]

APPLY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class AgentMetrics:
    """An agent's metrics in their own registry; :meth:`observe` after each run."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.restarts = Counter(
            "reconciler_agent_restarts",
            "Containers found stopped or missing and started again, per instance.",
            ["instance"],
            registry=self.registry,
        )
        self.apply_duration = Histogram(
            "reconciler_agent_apply_duration_seconds",
            "How long one agent run took: apply the node's plan, look at each container, "
            "write actual/.",
            buckets=APPLY_BUCKETS,
            registry=self.registry,
        )

    def registry_text(self) -> str:
        """The metrics in the text exposition format (what the endpoint serves)."""
        return generate_latest(self.registry).decode()

    def observe(self, report: AgentReport | None) -> None:
        if report is None:
            return
        for iid in report.restarted:
            self.restarts.labels(instance=iid).inc()
        if report.elapsed is not None:
            self.apply_duration.observe(report.elapsed)
