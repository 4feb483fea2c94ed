"""One desired-file edit through the real ``watch`` loop, end to end (issue 9).

.venv/bin/python -m benchmarks.watch [--nodes 5000] [--instances 20000] [--edits 8]
    [--debounce 0.2] [--seed 1] [--dir DIR] [--json]

``benchmarks.warm`` calls ``reconcile()`` the way ``watch`` does; this one runs the watcher
itself: :func:`reconciler.controller.watch.watch_loop` with the options ``reconciler watch`` gives
it (the default OCI config builder, ``--debounce``, no resync during the benchmark), in a thread of
this process, on real inotify events. The state directory is generated, the watcher's first run
reconciles it cold, the agents then report every instance running where it is placed (one
``actual/<node>.yaml`` each, written as an agent does: a temp file renamed), and once the watcher is
quiet one desired file is edited ``--edits`` times as an editor saves it (its ``instances`` one up,
then one down, ...), waiting for the watcher's run after each and a second of quiet after that.

For each edit it prints, from the watcher's own stage reports (``ReconcileOptions.on_stage``):
how long the watcher waited before its run began (the kernel's event, watchfiles' debounce:
``--debounce`` of quiet), the time from the run's start to ``plan.json`` written (the batch is
done when the run reports its next stage, "reporting status"): issue 9's "debounce excluded"
figure; the edit to ``plan.json`` in all; the whole run, until the watcher is ready for the
next event (the status report and the watcher's collection come after the plan); and the time
the cyclic collector ran in it. Medians and ranges follow. Compare runs taken together: this
machine's speed varies, and the parse floor (PyYAML's C loader over the same inputs, measured
in the same run) shows how fast it is at the time. The process's RSS before and after the edits
shows whether event runs leave memory behind (the watcher freezes what survives its
collections: see ``reconciler.model.gcpause``).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import queue
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from reconciler.controller.configs import default_config_builder
from reconciler.controller.reconcile import ReconcileOptions, ReconcileReport
from reconciler.controller.watch import WatchOptions, watch_loop
from reconciler.model.documents import ActualState

from .reconcile import _generate, _steady_actual, floor_parse, machine_description
from .statedir import bump_instances, edit_target, iter_input_files
from .warm import edit_parser, failing_services, in_scratch_dir

__all__ = ["main"]

_PLAN_OUT = "reporting status"  # the stage a run reports once plan.json is written
_RUN_START = "loading inputs"  # a run's first stage


class _Watcher:
    """``watch_loop`` in a thread, its stage reports and finished runs time-stamped."""

    def __init__(self, root: Path, debounce: float) -> None:
        self.stages: list[tuple[float, str]] = []
        self.runs: queue.Queue[tuple[float, ReconcileReport | None]] = queue.Queue()
        self.stop = threading.Event()
        self.gc_spans: list[tuple[float, float]] = []  # the collector's runs, start and end
        self._gc_start = 0.0
        opts = ReconcileOptions(configs=default_config_builder(), on_stage=self._stage)
        wopts = WatchOptions(debounce=debounce, resync=24 * 3600.0)
        self.thread = threading.Thread(
            target=watch_loop,
            args=(root, opts, wopts),
            kwargs={"stop": self.stop, "on_run": self._ran},
            name="watch",
            daemon=True,
        )

    def collections(self, since: float) -> float:
        """Seconds the cyclic collector ran since ``since`` (any generation)."""
        return sum(stop - start for start, stop in list(self.gc_spans) if start >= since)

    def _gc(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.gc_spans.append((self._gc_start, time.perf_counter()))

    def _stage(self, text: str) -> None:
        self.stages.append((time.perf_counter(), text))

    def _ran(self, report: ReconcileReport | None) -> None:
        self.runs.put((time.perf_counter(), report))

    def next_run(self, timeout: float) -> tuple[float, ReconcileReport]:
        try:
            at, report = self.runs.get(timeout=timeout)
        except queue.Empty:
            raise SystemExit(
                f"benchmarks.watch: no run of the watcher within {timeout:.0f} s"
            ) from None
        if report is None:
            raise SystemExit("benchmarks.watch: a run of the watcher failed (see its log)")
        return at, report

    def quiet(self, seconds: float, timeout: float) -> ReconcileReport | None:
        """Wait until no run has ended for ``seconds``; the last report seen, if any."""
        last: ReconcileReport | None = None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                _at, report = self.runs.get(timeout=seconds)
            except queue.Empty:
                return last
            last = report if report is not None else last
        raise SystemExit(f"benchmarks.watch: the watcher did not settle within {timeout:.0f} s")

    def first_after(self, since: float, text: str) -> float | None:
        return next((at for at, t in list(self.stages) if at >= since and t == text), None)


def _write_actual_as_agents(root: Path, actual: dict[str, ActualState]) -> None:
    """``actual/<node>.yaml`` for every node, each a hidden temp file renamed into place (what
    an agent does; the watcher ignores hidden files, so it never reads one half-written)."""
    for node_id in sorted(actual):
        doc = actual[node_id].model_dump(mode="json", exclude_none=True)
        path = root / "actual" / f"{node_id}.yaml"
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(doc, sort_keys=True) + "\n")
        os.replace(tmp, path)


def _rss_mib() -> float:
    """This process's resident set size now (VmRSS), MiB; 0 where /proc has none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _bench(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    _generate(root, args)
    floor = min(floor_parse(list(iter_input_files(root))) for _ in range(3))
    w = _Watcher(root, args.debounce)
    t0 = time.perf_counter()
    gc.callbacks.append(w._gc)
    w.thread.start()
    try:
        at, cold = w.next_run(timeout=1800)
        cold_ms = (at - t0) * 1000
        victim = edit_target(
            root, failing_services(cold.computed.result), args.edit == "unplaceable"
        )
        _write_actual_as_agents(root, _steady_actual(cold.computed.result))
        _at, settled = w.next_run(timeout=600)  # the agents' files: at least one run
        settled = w.quiet(seconds=max(2.0, 5 * args.debounce), timeout=600) or settled
        steady = not settled.plan.starts() and not settled.plan.stops()
        rss_before = _rss_mib()  # after the steady run and its full collection
        edits: list[dict[str, float]] = []
        for k in range(args.edits):
            edited = time.perf_counter()
            bump_instances(root, victim, -1 if k % 2 == 0 else +1)
            ended, _report = w.next_run(timeout=60)
            began = w.first_after(edited, _RUN_START)
            out = w.first_after(edited, _PLAN_OUT)
            if began is None or out is None:
                raise SystemExit("benchmarks.watch: the run reported no stages")
            edits.append(
                {
                    "wait_ms": (began - edited) * 1000,
                    "plan_out_ms": (out - began) * 1000,
                    "edit_to_plan_ms": (out - edited) * 1000,
                    "run_ms": (ended - began) * 1000,
                    "collector_ms": w.collections(edited) * 1000,
                }
            )
            w.quiet(seconds=1.0, timeout=60)  # its gc.collect, any second run
            edits[-1]["rss_mib"] = _rss_mib()
        rss_after = _rss_mib()
    finally:
        w.stop.set()
        w.thread.join(timeout=60)
        gc.callbacks.remove(w._gc)
    return {
        "machine": machine_description(),
        "nodes": args.nodes,
        "instances": args.instances,
        "debounce_ms": args.debounce * 1000,
        "floor_ms": floor * 1000,
        "cold_run_ms": cold_ms,
        "steady_before_edits": steady,
        "rss_mib": {"before_edits": rss_before, "after_edits": rss_after},
        "edits": edits,
        "summary_ms": {
            key: _summary([e[key] for e in edits]) for key in edits[0] if key != "rss_mib"
        }
        if edits
        else {},
    }


def main() -> None:
    parser = edit_parser(__doc__, "desired-file edits, each one run")
    parser.add_argument(
        "--debounce",
        type=float,
        default=0.2,
        help="the watcher's quiet time before a run, seconds (default: 0.2, as reconciler watch)",
    )
    args = parser.parse_args()
    if args.edits < 1:
        parser.error("--edits must be at least 1")
    report = in_scratch_dir("watch-bench-", args.dir, functools.partial(_bench, args))
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
        return
    print(f"machine: {report['machine']}")
    print(
        f"inputs: {args.nodes} nodes x {args.instances} instances; parse floor "
        f"{report['floor_ms']:.0f} ms; debounce {report['debounce_ms']:.0f} ms; "
        f"cold first run {report['cold_run_ms'] / 1000:.2f} s; steady before the edits: "
        f"{'yes' if report['steady_before_edits'] else 'NO (the plan had actions)'}"
    )
    rss = report["rss_mib"]
    each = [e["rss_mib"] for e in report["edits"]]
    print(
        f"RSS: {rss['before_edits']:.0f} MiB before the edits, {min(each):.0f}-{max(each):.0f} "
        f"after each, {rss['after_edits']:.0f} at the end"
    )
    print("edit  wait (ms)  run start -> plan.json  edit -> plan.json  run (ms)  collector (ms)")
    for k, e in enumerate(report["edits"]):
        print(
            f"{k + 1:>4}  {e['wait_ms']:>9.1f}  {e['plan_out_ms']:>21.1f}  "
            f"{e['edit_to_plan_ms']:>17.1f}  {e['run_ms']:>8.1f}  {e['collector_ms']:>14.1f}"
        )
    print("measure               median    min    max (ms)")
    for name, fig in report["summary_ms"].items():
        print(f"{name:<20} {fig['median']:>7.1f} {fig['min']:>6.1f} {fig['max']:>6.1f}")


if __name__ == "__main__":
    main()
