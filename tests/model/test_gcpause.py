"""The collector pause around balance and reconcile (reconciler.model.gcpause) never leaks: the
collector is enabled again afterwards, after an error too, and a pause inside a pause is a
no-op that does not re-enable it early. The idle collection of a long-running loop freezes what
survives, so an event's run does not walk the whole state again, and a full one frees what the
frozen objects left behind."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

import pytest

from reconciler.controller import watch
from reconciler.controller.reconcile import ReconcileError, ReconcileOptions, reconcile
from reconciler.model.gcpause import collect_idle, collector_paused
from tests.support.agent_sim import apply_all


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


class _Cell:
    other: Any = None


def _cycle() -> tuple[_Cell, weakref.ref[_Cell]]:
    a, b = _Cell(), _Cell()
    a.other, b.other = b, a
    return a, weakref.ref(a)


def test_an_idle_collection_freezes_what_survives_and_a_full_one_looks_again() -> None:
    young, young_ref = _cycle()
    kept, kept_ref = _cycle()
    plain = _Cell()
    plain_ref = weakref.ref(plain)
    collect_idle(full=False)  # all three survive (referenced here) and are frozen
    assert gc.get_freeze_count() > 0
    assert gc.isenabled()
    del plain
    assert plain_ref() is None  # frozen objects are still freed by reference counting
    del kept
    collect_idle(full=False)
    assert kept_ref() is not None  # a cycle of frozen objects: not looked at by an event's run
    del young
    fresh, fresh_ref = _cycle()
    del fresh
    collect_idle(full=False)
    assert fresh_ref() is None  # allocated since the last collection: looked at, freed
    assert young_ref() is not None  # frozen: still there
    collect_idle(full=True)
    assert kept_ref() is None and young_ref() is None  # a full collection looks at everything


def test_run_logged_collects_fully_unless_told_otherwise(
    demo_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fulls: list[bool] = []
    monkeypatch.setattr(watch, "collect_idle", lambda *, full: fulls.append(full))
    last: list[Any] = []
    assert watch.run_logged(demo_copy, ReconcileOptions(), last, "start", None) is not None
    assert watch.run_logged(
        demo_copy, ReconcileOptions(), last, "changed", None, full_collect=False
    )
    assert fulls == [True, False]
