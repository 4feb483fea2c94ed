"""``watch``: reconcile on every input change, debounced, with a periodic full resync (SPEC §14).

Events wake the loop and name the files a run loads first, so the plan of an edit is out
without a stat of every input; after writing, the same run stats every input (level-triggered)
and runs again if anything else changed, so a lost, merged or overflowed event never loses an
edit: at worst the timer's resync picks it up (watchfiles
drops the kernel's queue-overflow notice, so the timer is the overflow's resync). When the
watcher itself fails (an error from its backend, the inotify watch limit), the loop resyncs at
once and starts a new watcher; a new watcher checks once whether an input changed while its
watches were being set up. The watcher watches the state directory itself (never single files:
an editor's atomic save replaces the file, and a watch on the old inode goes silent) and
ignores ``out/``, ``checkpoint/``, the lock and temp files, so the controller's own writes do
not wake it.

What the inputs are is level-triggered; what out/ holds is trusted between resyncs: a run woken
by an event does not look at the outputs whose content did not change (``verify=False``), the
first run and every resync check them all (a file edited in out/ by hand is repaired then).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import watchfiles

from reconciler.controller.explaincache import keep_for_explain
from reconciler.controller.reconcile import (
    ReconcileCache,
    ReconcileError,
    ReconcileOptions,
    ReconcileReport,
    reconcile,
)
from reconciler.io.loader import StateView, load_state
from reconciler.io.lock import LockTimeout
from reconciler.io.signals import stop_on_signals
from reconciler.model.gcpause import collect_idle

__all__ = [
    "WatchOptions",
    "changed_inputs",
    "changed_names",
    "input_filter",
    "run_logged",
    "summary",
    "watch_loop",
]

log = logging.getLogger("reconciler.watch")

_IGNORED_TOP = {"out", "checkpoint", ".lock"}


def input_filter(root: Path) -> Callable[[watchfiles.Change, str], bool]:
    """True for paths that are inputs: not out/, checkpoint/, the lock or hidden temp files."""
    root = root.resolve()

    def accept(change: watchfiles.Change, path: str) -> bool:
        p = Path(path)
        try:
            rel = p.resolve().relative_to(root) if p.is_absolute() else p
        except ValueError:
            return True  # outside the state dir (a resourcesFile elsewhere): an input
        if not rel.parts or rel.parts[0] in _IGNORED_TOP:
            return False
        return not p.name.startswith(".")

    return accept


def changed_inputs(root: Path, changes: Iterable[tuple[watchfiles.Change, str]]) -> frozenset[str]:
    """The paths of a batch of events relative to ``root`` (resolved, as the watcher reports
    them), the hint a run's first pass loads (:attr:`ReconcileOptions.changed`). The last
    component is kept as named (a symlink is not followed); paths outside ``root`` are left
    out (a node's resourcesFile elsewhere: the loader checks those every run)."""
    root = root.resolve()
    rels: set[str] = set()
    for _change, path in changes:
        p = Path(path)
        if not p.is_absolute():
            p = Path.cwd() / p
        try:
            rel = (p.parent.resolve() / p.name).relative_to(root)
        except ValueError:
            continue
        if rel.parts:
            rels.add(rel.as_posix())
    return frozenset(rels)


def changed_names(changes: Iterable[tuple[watchfiles.Change, str]]) -> list[str]:
    """The file names a run's log line gives for a batch of events, sorted: a file created
    and gone within the batch (an editor's or ``sed -i``'s temporary file) is left out, unless
    nothing else changed."""
    added = {p for change, p in changes if change == watchfiles.Change.added}
    kept = {p for _, p in changes if p not in added or Path(p).exists()}
    return sorted({Path(p).name for _, p in changes if p in kept or not kept})


@dataclass(frozen=True)
class WatchOptions:
    debounce: float = 0.2  # seconds of quiet before a run
    resync: float = 60.0  # seconds between full resyncs without events
    max_batch: float = 5.0  # never wait longer than this while events keep coming
    stream_idle: float = 300.0  # etcd: re-open a watch stream silent this long (ha.WATCH_IDLE)
    explain_idle: float = 2.0  # seconds of quiet after a run before explain's cache is written


def summary(report: ReconcileReport, elapsed: float) -> str:
    p = report.plan
    return (
        f"reconciled in {elapsed:.2f}s: {len(p.starts())} to start, {len(p.stops())} to stop, "
        f"{len(p.failures)} unplaceable; {len(report.written)} file(s) written"
        + (", new checkpoint" if report.checkpoint_written else "")
    )


def run_logged(
    state_dir: Path,
    opts: ReconcileOptions,
    last_view: list[StateView],
    reason: str,
    on_run: Callable[[ReconcileReport | None], None] | None,
    *,
    full_collect: bool = True,
) -> ReconcileReport | None:
    """One reconcile of a long-running loop: ``last_view`` (the view of the last run, its
    parse cache and last good versions) is passed in and replaced; a failure is logged and
    reported as ``on_run(None)``, never raised. After a run the collector runs, over every
    object with ``full_collect``, else over those allocated since the last collection
    (:func:`gcpause.collect_idle`)."""
    try:
        report = reconcile(state_dir, opts, last_view[0] if last_view else None)
    except (ReconcileError, LockTimeout, OSError) as e:
        log.error("reconcile failed (%s): %s", reason, e)
        if on_run is not None:
            on_run(None)
        return None
    last_view[:] = [report.computed.view]
    collect_idle(full=full_collect)  # reconcile runs with the collector paused: now, while idle
    return report


def watch_loop(
    state_dir: Path,
    opts: ReconcileOptions,
    wopts: WatchOptions | None = None,
    stop: threading.Event | None = None,
    on_run: Callable[[ReconcileReport | None], None] | None = None,
) -> int:
    """Run until ``stop`` is set (SIGTERM and SIGINT set it when run from the main thread)."""
    wopts = wopts or WatchOptions()
    if opts.cache is None:  # carried between runs: see ReconcileCache
        opts = dataclasses.replace(opts, cache=ReconcileCache())
    # an edit made during a run is an event the watcher reports after it: no second stat pass
    opts = dataclasses.replace(opts, recheck=False)
    stop = stop or threading.Event()
    stop_on_signals(stop, log)

    last_view: list[StateView] = []  # the view of the last run: parse cache, last good versions
    unkept: list[ReconcileReport] = []  # the last run, until it is in explain's read cache

    def run(reason: str, verify: bool = True, changed: frozenset[str] | None = None) -> None:
        """One run; ``verify=False`` (an event's run) trusts the cache that out/ holds what
        the last run wrote; the first run and every resync check it. ``changed``: the
        events' paths, loaded first (the run stats every input after writing)."""
        t0 = time.monotonic()
        unkept.clear()  # (a run superseded before it was kept: not held through this one)
        run_opts = opts if verify else dataclasses.replace(opts, verify=False)
        if changed is not None:
            run_opts = dataclasses.replace(run_opts, changed=changed)
        # an event's run collects only what was allocated since the last collection; the
        # runs that verify everything collect everything (gcpause.collect_idle)
        report = run_logged(state_dir, run_opts, last_view, reason, on_run, full_collect=verify)
        if report is None:
            return
        for d in report.computed.diagnostics:
            log.warning("%s", d)
        log.info("%s (%s)", summary(report, time.monotonic() - t0), reason)
        unkept[:] = [report]
        if on_run is not None:
            on_run(report)

    def keep_when_idle() -> None:
        """The last run in explain's read cache, once the unit has been quiet for a while
        (pickling a large unit's inputs takes a few hundred ms: not between an edit and its
        plan)."""
        if unkept and time.monotonic() - last >= wopts.explain_idle:
            keep_for_explain(state_dir, unkept.pop().computed, opts.mode)

    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    log.info(
        "watching %s (debounce %.0f ms, resync every %.0f s)",
        state_dir,
        wopts.debounce * 1000,
        wopts.resync,
    )

    def inputs_changed() -> bool:
        """Whether an input changed since the last run (cheap: unchanged files are not parsed)."""
        if not last_view:
            return True
        try:
            now, _ = load_state(state_dir, last_view[0])
        except OSError:
            return True
        return now.input_hash != last_view[0].input_hash

    run("start")
    last = time.monotonic()
    while not stop.is_set():
        changes_seen = watchfiles.watch(
            state_dir,
            watch_filter=input_filter(state_dir),
            debounce=int(wopts.max_batch * 1000),
            step=int(wopts.debounce * 1000),
            stop_event=stop,
            # wake up now and then without events: for the resync timer, and soon after the
            # watcher started, to catch an edit made before its watches were in place
            rust_timeout=int(min(wopts.resync, 0.5) * 1000),
            yield_on_timeout=True,
            raise_interrupt=False,
        )
        fresh = True  # this watcher has not yet checked what changed while it started
        while not stop.is_set():
            try:
                changes = next(changes_seen)
            except StopIteration:
                break
            except (RuntimeError, OSError) as e:
                # the watcher itself failed (an error of the kernel queue, the inotify watch
                # limit): events may have been lost, so resync now and watch afresh
                log.error("the file watcher failed (%s); resyncing and watching again", e)
                changes_seen.close()
                run("resync after a watcher error")
                last = time.monotonic()
                stop.wait(min(wopts.resync, 1.0))
                break
            if stop.is_set():
                break
            if changes:
                names = changed_names(changes)
                more = f" and {len(names) - 5} more" if len(names) > 5 else ""
                hint = changed_inputs(state_dir, changes)
                run(f"changed: {', '.join(names[:5])}{more}", verify=False, changed=hint)
                last = time.monotonic()
            elif time.monotonic() - last >= wopts.resync:
                run("periodic resync")
                last = time.monotonic()
            elif fresh and inputs_changed():
                run("changed while the watcher started")
                last = time.monotonic()
            else:
                keep_when_idle()
            fresh = False
    log.info("stopped")
    return 0
