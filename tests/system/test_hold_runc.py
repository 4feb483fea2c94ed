"""Holds with real containers: a bad edit of a running service leaves its containers running
through ``reconcile`` and the agents (the same runc containers, the same pids), and deleting the
service stops them. Uses the end-to-end fixture ``e2e`` of tests/system/conftest.py (skips,
saying why, where runc cannot run)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from reconciler.controller.configs import default_config_builder
from reconciler.controller.reconcile import ReconcileOptions, reconcile
from tests.support.e2e import E2E, ITEM, SERVICE

pytestmark = pytest.mark.slow

BAD_EDITS: dict[str, Callable[[str], str]] = {
    "label no node has": lambda t: t + "labels: [lidar]\n",
    "more cpu than any node": lambda t: t.replace("{cpu: 100}", "{cpu: 99999}"),
    "device request with no pool": lambda t: (
        t + "devices:\n  - {resource: example.com/lidar, count: 1}\n"
    ),
    "misspelled runtime type": lambda t: t.replace("runtimes: [runc]", "runtimes: [runcc]"),
}


def pids(env: E2E) -> dict[str, tuple[str, int]]:
    """Every container of the test's runc roots: id -> (status, pid)."""
    return {cid: (st.status, st.pid) for c in env.containers().values() for cid, st in c.items()}


def test_bad_edits_keep_the_containers_running_and_a_deletion_stops_them(e2e: E2E) -> None:
    e2e.reconcile()
    e2e.agents()
    running = pids(e2e)
    assert len(running) == 2 and {s for s, _ in running.values()} == {"running"}
    good = SERVICE.format(item=ITEM, version="1.0.0", instances=2)
    path = e2e.state / "desired" / "sleeper.yaml"
    opts = ReconcileOptions(configs=default_config_builder())
    for name, edit in BAD_EDITS.items():
        path.write_text(edit(good.replace("version: 1.0.0", "version: 1.1.0")))
        report = reconcile(e2e.state, opts)
        plan = report.plan
        assert plan.stops() == [] and plan.starts() == [], (name, plan.actions)
        assert len(plan.failures) == 2, name
        for f in plan.failures:
            assert "new spec 1.1.0 unplaceable, keeping 1.0.0 on n" in f.summary, f.summary
        reports = e2e.agents()
        assert not any(r.stopped or r.started or r.failed for r in reports.values()), name
        assert pids(e2e) == running, f"{name}: containers changed"
    # deleting the service stops both (the only service: with the guard's consent)
    path.unlink()
    gone = e2e.reconcile(allow_empty=True)
    assert {a.reason for a in gone.plan.stops()} == {"not-desired"}
    assert len(gone.plan.stops()) == 2
    e2e.agents()
    assert pids(e2e) == {}
