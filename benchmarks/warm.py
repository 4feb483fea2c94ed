"""Where a warm ``watch`` run's time to ``plan.json`` goes, stage by stage (issue 9).

.venv/bin/python -m benchmarks.warm [--nodes 5000] [--instances 20000] [--edits 8]
    [--seed 1] [--dir DIR] [--json]

The state directory is generated and reconciled cold, the agents then report every instance
running where it is placed (the steady state), and one desired file is edited ``--edits`` times
(its ``instances`` one up, then one down, ...), each followed by the ``reconcile()`` that
``watch`` runs after its debounce: the same ``ReconcileCache`` and config builder, the edited
path as the watcher's hint, ``verify=False`` and no second stat pass. For each edit it prints
the time from the run's start to the batch that writes ``plan.json`` ("out after") and to the
run's end, and the time spent in each stage function (the functions ``reconcile`` calls,
wrapped in timers: ``load_state``, ``load_checkpoint``, ``balance``, ``assign_ids``, the config
builder, ``make_plan``, the last-good sync, ``save_checkpoint``, ``write_instance_outputs``,
``status_bytes``; ``load_state`` counts both the hinted load and the stat pass after writing;
the functions that write only put their files in the run's commit, and "commit flush (plan)" is
the flush that makes them and ``plan.json`` visible);
then the median and range of each. The machine's noise shows in the range:
compare medians of runs taken together, and read the parse floor (PyYAML's C loader over the
same inputs, measured in the same run) as the machine's speed at the time.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import json
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import reconciler.controller.reconcile as rec
from reconciler.accel import BalanceMemo
from reconciler.accel.ids import IdsMemo
from reconciler.accel.plans import PlanMemo
from reconciler.controller.configs import default_config_builder
from reconciler.controller.reconcile import ReconcileCache, ReconcileOptions, reconcile
from reconciler.io.fsio import Commit
from reconciler.io.lastgood import LastGoodStore

from .reconcile import (
    _generate,
    _steady_actual,
    _write_actual,
    add_unit_options,
    floor_parse,
    machine_description,
)
from .statedir import bump_instances, edit_target, iter_input_files

__all__ = ["main"]

# the functions reconcile calls by these names (module reconciler.controller.reconcile), timed per
# call
_TIMED = (
    "load_state",
    "load_checkpoint",
    "save_checkpoint",
    "write_instance_outputs",
    "status_bytes",
)


def _timer(times: dict[str, list[float]], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            times[name].append(time.perf_counter() - t0)

    return timed


def failing_services(result: Any) -> frozenset[str]:
    """The ids of the services with an unplaceable instance in a balance result."""
    return frozenset(f.item_id for f in result.failures)


def edit_parser(doc: str, edits_help: str) -> argparse.ArgumentParser:
    """The options of the benchmarks that edit a desired file (this one and
    ``benchmarks.watch``); ``doc``: the module's docstring."""
    parser = argparse.ArgumentParser(
        description=doc.split("\n\n")[0],
        epilog="Figures are milliseconds on this machine now; compare runs taken together.",
    )
    parser.add_argument("--nodes", type=int, default=5000, help="nodes (default: 5000)")
    parser.add_argument(
        "--instances", type=int, default=20000, help="instances over all services (default: 20000)"
    )
    parser.add_argument("--edits", type=int, default=8, help=f"{edits_help} (default: 8)")
    parser.add_argument("--seed", type=int, default=1, help="the generator's seed (default: 1)")
    parser.add_argument(
        "--node-format",
        choices=("yaml", "json"),
        default="yaml",
        help="how node files are written (default: yaml)",
    )
    add_unit_options(parser)
    parser.add_argument(
        "--edit",
        choices=("placeable", "unplaceable"),
        default="placeable",
        help="edit a service whose instances all have a place, or one with an unplaceable "
        "instance (default: placeable)",
    )
    parser.add_argument("--dir", type=Path, help="where to create the state dir (default: /tmp)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    return parser


def in_scratch_dir(
    prefix: str, directory: Path | None, bench: Callable[[Path], dict[str, Any]]
) -> dict[str, Any]:
    """``bench`` on a state directory path in a new scratch directory, removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix=prefix, dir=directory))
    try:
        return bench(base / "state")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    args = edit_parser(__doc__, "desired-file edits, each reconciled").parse_args()
    report = in_scratch_dir("warm-bench-", args.dir, functools.partial(_bench, args))
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
        return
    print(f"machine: {report['machine']}")
    size = f"{args.nodes} nodes x {args.instances} instances"
    print(f"inputs: {size}; parse floor {report['floor_ms']:.0f} ms")
    print("edit  out after (ms)  run (ms)")
    for k, (out, run) in enumerate(zip(report["out_after_ms"], report["run_ms"], strict=True)):
        print(f"{k + 1:>4}  {out:>14.1f}  {run:>8.1f}")
    print("stage                     median    min    max (ms)")
    for name, figures in report["stages_ms"].items():
        print(f"{name:<24} {figures['median']:>7.1f} {figures['min']:>6.1f} {figures['max']:>6.1f}")


def _bench(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    _generate(root, args)
    floor = min(floor_parse(list(iter_input_files(root))) for _ in range(3))
    builder = default_config_builder()
    times: dict[str, list[float]] = defaultdict(list)
    opts = ReconcileOptions(configs=_timer(times, "configs", builder), cache=ReconcileCache())
    cold = reconcile(root, opts)
    view = cold.computed.view
    victim = edit_target(root, failing_services(cold.computed.result), args.edit == "unplaceable")
    _write_actual(root, _steady_actual(cold.computed.result))
    opts = dataclasses.replace(opts, recheck=False, verify=False)
    view = reconcile(root, opts, view).computed.view
    edit = dataclasses.replace(opts, changed=frozenset({victim}))
    out_at: list[float] = []
    originals = {name: getattr(rec, name) for name in (*_TIMED, "atomic_write_many")}
    sync = LastGoodStore.sync
    # the stages a watcher runs through its memos' methods
    methods: list[tuple[Any, str, str]] = [
        (BalanceMemo, "balance", "balance"),
        (IdsMemo, "assign", "assign_ids"),
        (PlanMemo, "make_plan", "make_plan"),
    ]
    method_originals = {(cls, name): getattr(cls, name) for cls, name, _ in methods}

    plan_queued: list[bool] = []  # plan.json is in the run's commit, not yet visible
    real_flush = Commit.flush

    def write_many(batch: Any, hook: Any = None, commit: Commit | None = None) -> None:
        originals["atomic_write_many"](batch, hook=hook, commit=commit)
        if any(path.name == "plan.json" for path, _data, _mode in batch):
            if commit is None:
                out_at.append(time.perf_counter())
            else:
                plan_queued.append(True)

    def flush(self: Commit) -> None:
        t0 = time.perf_counter()
        real_flush(self)
        if plan_queued:  # plan.json renamed into place and flushed
            plan_queued.clear()
            out_at.append(time.perf_counter())
            times["commit flush (plan)"].append(out_at[-1] - t0)

    out_after: list[float] = []
    runs: list[float] = []
    try:
        for name in _TIMED:
            setattr(rec, name, _timer(times, name, originals[name]))
        setattr(rec, "atomic_write_many", write_many)  # noqa: B010 (reconcile calls it by name)
        Commit.flush = flush  # type: ignore[method-assign]
        LastGoodStore.sync = _timer(times, "last-good sync", sync)  # type: ignore[method-assign]
        for cls, name, stage in methods:
            setattr(cls, name, _timer(times, stage, method_originals[(cls, name)]))
        times.clear()
        for k in range(args.edits):
            bump_instances(root, victim, -1 if k % 2 == 0 else +1)
            gc.collect()
            out_at.clear()
            t0 = time.perf_counter()
            view = reconcile(root, edit, view).computed.view
            t1 = time.perf_counter()
            out_after.append(((out_at[0] if out_at else t1) - t0) * 1000)
            runs.append((t1 - t0) * 1000)
    finally:
        for name, fn in originals.items():
            setattr(rec, name, fn)
        LastGoodStore.sync = sync  # type: ignore[method-assign]
        Commit.flush = real_flush  # type: ignore[method-assign]
        for (cls, name), fn in method_originals.items():
            setattr(cls, name, fn)
    stages = {
        name: {
            "median": statistics.median(v) * 1000,
            "min": min(v) * 1000,
            "max": max(v) * 1000,
        }
        for name, v in sorted(times.items())
    }
    return {
        "machine": machine_description(),
        "floor_ms": floor * 1000,
        "out_after_ms": out_after,
        "run_ms": runs,
        "stages_ms": stages,
    }


if __name__ == "__main__":
    main()
