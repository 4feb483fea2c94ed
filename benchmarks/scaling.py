"""10x the instances against 10x the time, per fleet shape, for what a user runs: the balance
alone, a cold ``reconciler reconcile`` oneshot, and a warm watcher's edit.

.venv/bin/python -m benchmarks.scaling [--nodes 5000] [--instances 20000] [--shape S ...]
                                       [--json]

Per shape (``benchmarks.synth.SHAPES``, all by default), at the size asked and at a tenth of
its nodes and instances, taken together:

- ``balance``: ``benchmarks.balancer --json --repeat 3``, fresh and stable (the best of 3),
  and its linear control (expanding the instances: linear by construction, so its ratio is
  what the CPU's caches alone add at 10x the objects);
- ``oneshot``: ``reconciler reconcile`` in a fresh process on a generated state directory
  (interpreter start-up included, as a user or a systemd oneshot runs it), the best of 2 on
  two copies of the directory (the second run of one copy would be a warm one);
- ``warm``: ``benchmarks.warm --json``, one desired-file edit to ``plan.json`` in a warm
  watcher's run, the median of 4 edits.

Target (docs/performance.md): 10x the instances <= 11x the time.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .shapes import _run_json
from .statedir import write_state_dir
from .synth import SHAPES, fleet_arguments

REPO = Path(__file__).resolve().parent.parent


def _oneshot(root: Path) -> float:
    """The best of 2 cold ``reconciler reconcile`` runs, each on its own copy of ``root``."""
    best = float("inf")
    for k in range(2):
        copy = root.parent / f"copy-{k}"
        shutil.copytree(root, copy)
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "reconciler", "reconcile", "--state", str(copy)],
            cwd=REPO,
            capture_output=True,
            check=False,
            env={**os.environ, "RECONCILER_CACHE_DIR": ""},
        )
        best = min(best, time.perf_counter() - t0)
        shutil.rmtree(copy)
    return best


def measure(shape: str, n_nodes: int, n_instances: int) -> dict[str, Any]:
    figures: dict[str, dict[str, float]] = {}
    for label, nodes, instances in (
        ("tenth", max(1, n_nodes // 10), max(1, n_instances // 10)),
        ("full", n_nodes, n_instances),
    ):
        size = ["--nodes", str(nodes), "--instances", str(instances), "--shape", shape]
        bal = _run_json("balancer", *size, "--repeat", "3")
        warm = _run_json("warm", *size, "--edits", "4", "--edit", "placeable")
        with tempfile.TemporaryDirectory(prefix=f"scaling-{shape}-") as tmp:
            root = Path(tmp) / "state"
            write_state_dir(root, nodes, instances, 1, shape=shape)
            oneshot = _oneshot(root)
        figures[label] = {
            "balance_fresh_s": bal["fresh"]["seconds"],
            "balance_stable_s": bal["stable"]["seconds"],
            "linear_s": bal["linear"]["seconds"],
            "oneshot_s": oneshot,
            "warm_ms": statistics.median(warm["out_after_ms"]),
        }
    small, big = figures["tenth"], figures["full"]
    return {
        "shape": shape,
        "figures": figures,
        "ratios": {k: big[k] / small[k] for k in big},
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    fleet_arguments(parser)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    for shape in args.shape or SHAPES:
        row = measure(shape, args.nodes, args.instances)
        rows.append(row)
        if not args.json:
            r, f = row["ratios"], row["figures"]
            print(
                f"{shape:15s} balance {r['balance_fresh_s']:5.1f}x / {r['balance_stable_s']:5.1f}x"
                f" (linear control {r['linear_s']:4.1f}x)"
                f"  oneshot {r['oneshot_s']:5.1f}x ({f['tenth']['oneshot_s']:.2f} -> "
                f"{f['full']['oneshot_s']:.2f} s)  warm {r['warm_ms']:5.1f}x "
                f"({f['tenth']['warm_ms']:.0f} -> {f['full']['warm_ms']:.0f} ms)",
                flush=True,
            )
    if args.json:
        print(json.dumps({"rows": rows}, indent=2))


if __name__ == "__main__":
    main()
