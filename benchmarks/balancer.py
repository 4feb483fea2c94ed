"""Balancer throughput: placements per second in fresh and stable mode.

.venv/bin/python -m benchmarks.balancer [--nodes 5000] [--instances 20000]
"""

from __future__ import annotations

import argparse
import platform
import time

from reconciler.balancer import balance

from .synth import synth_unit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--instances", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    unit, nodes, services = synth_unit(args.nodes, args.instances, args.seed)
    machine = f"{platform.machine()} {platform.processor() or ''}".strip()
    print(f"machine: {machine}, python {platform.python_version()}")
    print(f"unit: {len(nodes)} nodes, {len(services)} services, {args.instances} instances")

    t0 = time.perf_counter()
    fresh = balance(unit, nodes, services, mode="fresh")
    t1 = time.perf_counter()
    n = len(fresh.placements)
    print(
        f"fresh:  {t1 - t0:8.3f} s  {n} placed, {len(fresh.failures)} failed  "
        f"{(n + len(fresh.failures)) / (t1 - t0):10.0f} instances/s"
    )
    previous = {p.instance_id: p.previous() for p in fresh.placements}
    t0 = time.perf_counter()
    stable = balance(unit, nodes, services, previous, mode="stable")
    t1 = time.perf_counter()
    n = len(stable.placements)
    print(
        f"stable: {t1 - t0:8.3f} s  {n} placed, {len(stable.failures)} failed  "
        f"{(n + len(stable.failures)) / (t1 - t0):10.0f} instances/s"
    )


if __name__ == "__main__":
    main()
