"""An input edited while a run computes is never lost: a plain ``reconcile`` (the path-activated
oneshot) stats its inputs again after writing and runs once more; ``watch`` skips that second
stat pass (``recheck=False``) because its file watcher reports the edit and it runs again."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any

import pytest

from reconciler.controller.reconcile import (
    ReconcileCache,
    ReconcileOptions,
    ReconcileReport,
    reconcile,
)
from reconciler.controller.watch import WatchOptions, watch_loop
from reconciler.model.changes import InputChanges
from reconciler.placement.instances import BalanceResult

LOGGER = Path("desired") / "apps" / "logger.yaml"


def _logger_starts(report: ReconcileReport) -> int:
    return sum(1 for a in report.plan.starts() if a.item_id == "com.example.logger")


def _editing_once(state: Path) -> tuple[list[bool], ReconcileOptions]:
    """Options whose progress callback edits logger.yaml (3 -> 1 instance) the first time a
    run starts writing, i.e. after its inputs were read."""
    done: list[bool] = []

    def on_stage(text: str) -> None:
        if text.startswith("writing") and not done:
            svc = state / LOGGER
            svc.write_text(svc.read_text().replace("instances: 3", "instances: 1"))
            done.append(True)

    return done, ReconcileOptions(on_stage=on_stage)


def test_reconcile_runs_again_when_an_input_changed_during_the_run(demo_copy: Path) -> None:
    done, opts = _editing_once(demo_copy)
    report = reconcile(demo_copy, opts)
    assert done and report.passes == 2
    assert _logger_starts(report) == 1


def test_without_recheck_one_pass_and_the_edit_waits(demo_copy: Path) -> None:
    done, opts = _editing_once(demo_copy)
    report = reconcile(demo_copy, ReconcileOptions(on_stage=opts.on_stage, recheck=False))
    assert done and report.passes == 1
    assert _logger_starts(report) == 3  # planned from the inputs it read


def test_watch_runs_again_for_an_edit_made_during_its_run(demo_copy: Path) -> None:
    done, opts = _editing_once(demo_copy)
    reports: list[ReconcileReport | None] = []
    stop = threading.Event()

    def on_run(report: ReconcileReport | None) -> None:
        reports.append(report)
        if report is not None and _logger_starts(report) == 1:
            stop.set()

    wopts = WatchOptions(debounce=0.05, resync=3600.0)
    thread = threading.Thread(target=watch_loop, args=(demo_copy, opts, wopts, stop, on_run))
    thread.start()
    try:
        assert stop.wait(20), [r.passes if r else None for r in reports]
    finally:
        stop.set()
        thread.join(20)
    assert done
    first = reports[0]
    assert first is not None and first.passes == 1 and _logger_starts(first) == 3


def test_the_second_pass_tells_the_memo_what_changed_since_the_first(
    demo_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second pass loads from the view the recheck read, so the loader's changes count
    from that view; the run adds the recheck's own (an edit since the first pass), and the
    balancer's memo is told everything since its last call: it uses them rather than
    comparing every service and node."""
    done, opts = _editing_once(demo_copy)
    cache = ReconcileCache()
    told: list[tuple[int | None, InputChanges | None]] = []
    memo = cache.balance
    plain = memo.balance

    def spied(*args: Any, **kwargs: Any) -> BalanceResult:
        told.append((memo._seen, kwargs.get("inputs")))  # white box: the memo's last revision
        return plain(*args, **kwargs)

    monkeypatch.setattr(memo, "balance", spied)
    report = reconcile(demo_copy, dataclasses.replace(opts, cache=cache))
    assert done and report.passes == 2 and _logger_starts(report) == 1
    (_, first), (seen, second) = told
    assert first is not None and first.everything  # no previous view
    assert second is not None and second.counts_from(seen)
    assert ("com.example.logger", "default") in second.services
    assert cache.balance.incremental
