"""The collector pause around balance and reconcile (reconciler.gcpause) never leaks: the
collector is enabled again afterwards, after an error too, and a pause inside a pause is a
no-op that does not re-enable it early."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from reconciler.gcpause import collector_paused
from reconciler.reconcile import ReconcileError, ReconcileOptions, reconcile

from .agent_sim import apply_all


def test_paused_inside_and_restored_after() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner block did not re-enable it
    assert gc.isenabled()


def test_restored_after_an_exception() -> None:
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_a_disabled_collector_stays_disabled() -> None:
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_reconcile_runs_paused_and_leaves_the_collector_enabled(demo_copy: Path) -> None:
    seen: list[bool] = []
    opts = ReconcileOptions(on_stage=lambda _stage: seen.append(gc.isenabled()))
    reconcile(demo_copy, opts)
    assert seen and not any(seen)  # every stage ran with the collector paused
    assert gc.isenabled()
    # a refused run (the mass-deletion guard raises inside the pause) restores it too
    apply_all(demo_copy)  # the agents start what the first run planned
    for f in (demo_copy / "desired").rglob("*.yaml"):
        f.unlink()
    with pytest.raises(ReconcileError):
        reconcile(demo_copy)
    assert gc.isenabled()
