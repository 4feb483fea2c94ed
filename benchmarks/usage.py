"""What a node agent's usage report costs a warm ``watch`` run (issue 28).

.venv/bin/python -m benchmarks.usage [--nodes 5000] [--instances 20000] [--edits 8]
    [--seed 1] [--dir DIR] [--json]

The state directory is generated and reconciled cold, the agents then report every instance
running where it is placed (the steady state); then one node's document is rewritten
``--edits`` times with only its measured ``usage`` and ``reportedAt`` changed (what the agent
writes every ``--usage-interval``), each followed by the ``reconcile()`` that ``watch`` runs
after its debounce (the same cache and config builder, the node file as the watcher's hint,
``verify=False``). For each it prints the run's time, the balance call's, and whether the
balancer's memo answered it (``incremental``) and how many instances it placed again
(``replaced``; a full run places all of them). Last, as a control, the same report once more
with an empty memo: the balance runs in full, as every usage report did before.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import json
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from reconciler.accel import BalanceMemo
from reconciler.controller.configs import default_config_builder
from reconciler.controller.reconcile import ReconcileCache, ReconcileOptions, reconcile

from .reconcile import _generate, _steady_actual, _write_actual, machine_description
from .warm import edit_parser, in_scratch_dir

__all__ = ["main"]


def main() -> None:
    args = edit_parser(__doc__, "usage reports of one node, each reconciled").parse_args()
    report = in_scratch_dir("usage-bench-", args.dir, functools.partial(_bench, args))
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
        return
    print(f"machine: {report['machine']}")
    print(f"inputs: {args.nodes} nodes x {args.instances} instances")
    print("report  run (ms)  balance (ms)  incremental  replaced")
    for k, row in enumerate(report["rows"]):
        print(
            f"{k + 1:>6}  {row['run_ms']:>8.1f}  {row['balance_ms']:>12.1f}  "
            f"{row['incremental']!s:>11}  {row['replaced']:>8}"
        )
    print(
        f"median run {report['median_run_ms']:.1f} ms, balance {report['median_balance_ms']:.1f} ms"
    )
    full = report["full"]
    print(
        f"control (balance in full): run {full['run_ms']:.1f} ms, "
        f"balance {full['balance_ms']:.1f} ms"
    )


def _node_file(root: Path) -> Path:
    return sorted((root / "nodes").glob("*.yaml"))[0]


def _report_usage(path: Path, k: int) -> None:
    """The node's document with new measured usage and report time only (as JSON, YAML 1.2)."""
    from reconciler.io.yamlsafe import parse_yaml

    doc = parse_yaml(path.read_bytes()).data
    assert isinstance(doc, dict)
    doc = json.loads(json.dumps(doc))
    doc["usage"] = {"cpu": 10 + k % 5, "ram": 1024 * (1 + k % 3), "instances": {}}
    doc["reportedAt"] = datetime.fromtimestamp(1_800_000_000 + 10 * k, UTC).isoformat()
    path.write_text(json.dumps(doc, indent=2) + "\n")


def _bench(args: Any, root: Path) -> dict[str, Any]:
    _generate(root, args)
    cache = ReconcileCache()
    opts = ReconcileOptions(configs=default_config_builder(), cache=cache)
    cold = reconcile(root, opts)
    _write_actual(root, _steady_actual(cold.computed.result))
    opts = dataclasses.replace(opts, recheck=False, verify=False)
    view = reconcile(root, opts, cold.computed.view).computed.view
    target = _node_file(root)
    edit = dataclasses.replace(opts, changed=frozenset({str(target.relative_to(root))}))
    original = BalanceMemo.balance
    spent: list[float] = []

    def timed(*a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return original(*a, **kw)
        finally:
            spent.append(time.perf_counter() - t0)

    rows = []
    BalanceMemo.balance = timed  # type: ignore[method-assign]
    try:
        for k in range(args.edits):
            _report_usage(target, k)
            gc.collect()
            spent.clear()
            t0 = time.perf_counter()
            view = reconcile(root, edit, view).computed.view
            run = time.perf_counter() - t0
            rows.append(
                {
                    "run_ms": run * 1000,
                    "balance_ms": sum(spent) * 1000,
                    "incremental": cache.balance.incremental,
                    "replaced": cache.balance.replaced,
                }
            )
        # the control: the same report once more with an empty memo, so balance runs in full
        # (what every usage report cost before the memo took usage-only changes in)
        _report_usage(target, args.edits)
        cache.balance = BalanceMemo()
        gc.collect()
        spent.clear()
        t0 = time.perf_counter()
        reconcile(root, edit, view)
        full = {"run_ms": (time.perf_counter() - t0) * 1000, "balance_ms": sum(spent) * 1000}
    finally:
        BalanceMemo.balance = original  # type: ignore[method-assign]
    return {
        "machine": machine_description(),
        "rows": rows,
        "median_run_ms": statistics.median(r["run_ms"] for r in rows),
        "median_balance_ms": statistics.median(r["balance_ms"] for r in rows),
        "full": full,
    }


if __name__ == "__main__":
    main()
