"""Every performance target on every named fleet shape: one table, one run each.

.venv/bin/python -m benchmarks.shapes [--nodes 5000] [--instances 20000] [--shape S ...]
                                      [--edits 4] [--writes-dir DIR] [--json]

For each shape (``benchmarks.synth.SHAPES``, all by default) it runs, each in a fresh process so
that no memory or cache carries over:

- ``benchmarks.balancer --json --repeat 3``: fresh and stable balance, instances per second
  (placed and failed), the best of three runs of each (as ``timeit`` reports: this VM's speed
  moves by 20 % from minute to minute), and again at a tenth of the nodes and instances: the
  time's ratio (10x the instances, target <= 11x), beside the ratio of the benchmark's linear
  control (expanding the instances: linear work on the same objects, which the CPU's caches
  alone make 10.3-13.1x on this VM) and the larger of the balance's two over it;
- ``benchmarks.warm --json`` with ``--edit placeable`` and, when the shape has unplaceable
  instances, ``--edit unplaceable``: a warm ``watch`` run after one desired-file edit, the
  median time until ``plan.json`` is written (the debounce excluded);
- ``benchmarks.reconcile --json``: the cold ``reconcile`` before its first write (everything but
  writing out/, the checkpoint and the status) against the C loader's parse of the same inputs,
  its writes against the filesystem floor (``--writes-dir DIR``: on DIR's filesystem), and
  the peak RSS;
- on a state directory of the shape: ``reconciler plan DIR --json`` in a fresh process
  (interpreter start-up included) against the parse floor; ``reconciler explain`` of one
  unplaceable instance (else the first instance) with a read cache of its own, the first one
  (nothing cached) and the next (another instance, then the same one again: the best of the
  two); then a ``reconciler reconcile`` in a fresh process (the oneshot a user runs: its own
  peak RSS), the first ``explain`` after it (the run it left in its read cache), and
  ``reconciler plan`` after it (the controller's plan, shown).

The targets (the last column) are the ones docs/performance.md states. Figures are this
machine's, now: compare runs taken together.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .reconcile import floor_parse, machine_description
from .statedir import iter_input_files, write_state_dir
from .synth import SHAPES, fleet_arguments

REPO = Path(__file__).resolve().parent.parent


def _run_json(module: str, *args: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", f"benchmarks.{module}", *args, "--json"]
    out = subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, text=True).stdout
    got: dict[str, Any] = json.loads(out[out.index("{") :])
    return got


def _cli(*args: str, env: dict[str, str] | None = None) -> float:
    """Seconds of one ``reconciler`` command in a fresh process (its exit code not checked:
    ``plan`` exits 3 when there are unplaceable instances)."""
    cmd = [sys.executable, "-m", "reconciler", *args]
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=REPO, capture_output=True, check=False, env=env)
    return time.perf_counter() - t0


def _cold_cli(root: Path) -> dict[str, Any]:
    files = list(iter_input_files(root))
    floor = min(floor_parse(files) for _ in range(3))
    # cold: no read cache (plan would start its second load from the first one's inputs)
    cold = {**os.environ, "RECONCILER_CACHE_DIR": ""}
    plan = min(_cli("plan", "--state", str(root), "--json", env=cold) for _ in range(2))
    out = subprocess.run(
        [sys.executable, "-m", "reconciler", "plan", "--state", str(root), "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    doc = json.loads(out) if out.strip().startswith("{") else {}
    failures = doc.get("failures") or []
    target = failures[0]["instanceId"] if failures else None
    if target is None:
        actions = doc.get("actions") or []
        target = actions[0]["instanceId"] if actions else None
    # explain with a read cache of its own: the first (nothing cached) and the next ones
    # (another instance, then the same again: the inputs only stat-ed, no balance)
    explain = explain_next = None
    with tempfile.TemporaryDirectory(prefix="explain-cache-") as cache:
        env = {**os.environ, "RECONCILER_CACHE_DIR": cache}
        if target:
            explain = _cli("explain", target, "--state", str(root), env=env)
            other = doc["actions"][-1]["instanceId"] if doc.get("actions") else target
            explain_next = min(
                _cli("explain", t, "--state", str(root), env=env) for t in (other, target)
            )
        # the oneshot a user runs (a fresh process), which leaves its run in the read cache
        # explain made: its own peak RSS; then the first explain after it (the inputs only
        # stat-ed, no balance: the run's balance, of the checkpoint it wrote)
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "reconciler", "reconcile", "--state", str(root)],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        _pid, _status, usage = os.wait4(proc.pid, 0)
        proc.returncode = 0  # (reaped by wait4)
        oneshot_s = time.perf_counter() - t0
        explain_after = _cli("explain", target, "--state", str(root), env=env) if target else None
    # then `plan` again: the controller's plan of these inputs, shown
    shown = min(_cli("plan", "--state", str(root), env=cold) for _ in range(2))
    return {
        "parse_floor_s": floor,
        "plan_json_s": plan,
        "explain_s": explain,
        "explain_next_s": explain_next,
        "explain_after_reconcile_s": explain_after,
        "oneshot_rss_mib": usage.ru_maxrss / 1024,
        "oneshot_s": oneshot_s,
        "plan_shown_s": shown,
    }


def measure(
    shape: str,
    n_nodes: int,
    n_instances: int,
    edits: int,
    quick: bool = False,
    writes_dir: Path | None = None,
) -> dict[str, Any]:
    size = ["--nodes", str(n_nodes), "--instances", str(n_instances), "--shape", shape]
    row: dict[str, Any] = {"shape": shape}
    bal = _run_json("balancer", *size, "--repeat", "3")
    row["fresh_per_s"] = bal["fresh"]["instances_per_s"]
    row["stable_per_s"] = bal["stable"]["instances_per_s"]
    # 10x the instances (and nodes) against the tenth: the time's ratio (target <= 11)
    tenth = ["--nodes", str(max(1, n_nodes // 10)), "--instances", str(max(1, n_instances // 10))]
    small = _run_json("balancer", *tenth, "--shape", shape, "--repeat", "3")
    row["scaling_fresh_x"] = bal["fresh"]["seconds"] / small["fresh"]["seconds"]
    row["scaling_stable_x"] = bal["stable"]["seconds"] / small["stable"]["seconds"]
    # the same ratio of linear work on the same objects (benchmarks.balancer's control)
    row["scaling_linear_x"] = bal["linear"]["seconds"] / small["linear"]["seconds"]
    worst = max(row["scaling_fresh_x"], row["scaling_stable_x"])
    row["scaling_over_linear"] = worst / row["scaling_linear_x"]
    row["failed"] = bal["stable"]["failed"]
    row["preempted"] = bal["stable"].get("preempted", 0)
    kinds = ["placeable", "unplaceable"] if row["failed"] else ["placeable"]
    for kind in kinds:
        warm = _run_json("warm", *size, "--edits", str(edits), "--edit", kind)
        row[f"warm_{kind}_ms"] = statistics.median(warm["out_after_ms"])
    if quick:
        return row
    rec = _run_json("reconcile", *size, *(["--dir", str(writes_dir)] if writes_dir else []))
    floors = rec["rows_s"]
    parse = floors["floor: PyYAML CSafeLoader parse of the inputs"]
    # two cold runs, each beside a filesystem floor (the disk's speed drifts): the best of each
    runs = [
        (
            floors[name],
            rec[key].get("write", 0.0),
            rec[key].get("status", 0.0) + rec[key].get("recheck", 0.0),
        )
        for name, key in (
            ("cold reconcile", "cold_stages_s"),
            ("cold reconcile again", "cold_again_stages_s"),
        )
    ]
    # the target: everything before its first write (loading, placing, building, planning)
    # against the parse; and all it computes (the status report it makes after writing the
    # plan, and the stat of every input after the writes, too); its writes (out/, the
    # checkpoint, the status files) against the floor
    row["cold_before_write_x"] = min(total - w - after for total, w, after in runs) / parse
    row["cold_compute_x"] = min(total - w for total, w, _after in runs) / parse
    row["cold_writes_x"] = min(w for _total, w, _after in runs) / min(rec["fs_floors_s"])
    row["peak_rss_mib"] = max(rec["peak_rss_mib"].values())
    with tempfile.TemporaryDirectory(prefix=f"shape-{shape}-") as tmp:
        root = Path(tmp) / "state"
        write_state_dir(root, n_nodes, n_instances, 1, shape=shape)
        cli = _cold_cli(root)
    row["plan_json_x"] = cli["plan_json_s"] / cli["parse_floor_s"]
    row["explain_s"] = cli["explain_s"]
    row["explain_next_s"] = cli["explain_next_s"]
    row["explain_after_reconcile_s"] = cli["explain_after_reconcile_s"]
    row["oneshot_rss_mib"] = cli["oneshot_rss_mib"]
    row["plan_shown_s"] = cli["plan_shown_s"]
    return row


_COLUMNS = [
    ("shape", "shape", "{}"),
    ("fresh_per_s", "fresh/s", "{:,}"),
    ("stable_per_s", "stable/s", "{:,}"),
    ("warm_placeable_ms", "warm edit ms", "{:.0f}"),
    ("warm_unplaceable_ms", "warm edit (unpl.) ms", "{:.0f}"),
    ("plan_json_x", "cold plan x parse", "{:.2f}"),
    ("cold_before_write_x", "cold before writes x parse", "{:.2f}"),
    ("cold_compute_x", "cold all but writes x parse", "{:.2f}"),
    ("cold_writes_x", "writes x fs floor", "{:.2f}"),
    ("plan_shown_s", "plan shown s", "{:.2f}"),
    ("explain_s", "explain s", "{:.2f}"),
    ("explain_next_s", "explain next s", "{:.2f}"),
    ("explain_after_reconcile_s", "explain after reconcile s", "{:.2f}"),
    ("oneshot_rss_mib", "oneshot RSS MiB", "{:.0f}"),
    ("peak_rss_mib", "benchmark RSS MiB", "{:.0f}"),
    ("scaling_fresh_x", "10x fresh", "{:.1f}"),
    ("scaling_stable_x", "10x stable", "{:.1f}"),
    ("scaling_linear_x", "10x linear control", "{:.1f}"),
    ("scaling_over_linear", "10x over the control", "{:.2f}"),
]


def _cell(row: dict[str, Any], key: str, fmt: str) -> str:
    value = row.get(key)
    return "-" if value is None else fmt.format(value)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    fleet_arguments(parser)
    parser.add_argument("--edits", type=int, default=4, help="warm edits per kind (default 4)")
    parser.add_argument(
        "--quick", action="store_true", help="the balance and the warm edits only (no cold runs)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--writes-dir",
        type=Path,
        help="where benchmarks.reconcile makes its state directories and filesystem floors "
        "(default: /tmp), e.g. an ext4 image in RAM, to judge the writes without a throttling disk",
    )
    args = parser.parse_args()
    rows = []
    for shape in args.shape or SHAPES:
        print(f"[{time.strftime('%H:%M:%S')}] {shape}", file=sys.stderr, flush=True)
        rows.append(
            measure(shape, args.nodes, args.instances, args.edits, args.quick, args.writes_dir)
        )
    described = {
        "machine": machine_description(),
        "load_average": round(os.getloadavg()[0], 2),
        "nodes": args.nodes,
        "instances": args.instances,
    }
    if args.json:
        print(json.dumps({"rows": rows, **described}, sort_keys=True))
        return
    print(f"{described['machine']}; load {described['load_average']}")
    print(f"{args.nodes} nodes x {args.instances} instances")
    print("| " + " | ".join(title for _, title, _ in _COLUMNS) + " |")
    print("|" + "---|" * len(_COLUMNS))
    for row in rows:
        print("| " + " | ".join(_cell(row, k, f) for k, _, f in _COLUMNS) + " |")


if __name__ == "__main__":
    main()
