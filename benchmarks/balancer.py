"""Balancer throughput: placements per second in fresh and stable mode.

.venv/bin/python -m benchmarks.balancer [--nodes 5000] [--instances 20000] [--repeat 1]

Each repeat times one fresh run and one stable run (every instance kept); with ``--repeat N``
the best of the N runs of each mode is printed last.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from reconciler.placement.balancer import balance

from .synth import synth_unit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--instances", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    unit, nodes, services = synth_unit(args.nodes, args.instances, args.seed)
    machine = f"{platform.machine()} {platform.processor() or ''}".strip()
    print(f"machine: {machine}, python {platform.python_version()}")
    print(f"unit: {len(nodes)} nodes, {len(services)} services, {args.instances} instances")

    best: dict[str, float] = {}

    def report(mode: str, seconds: float, placed: int, failed: int) -> None:
        best[mode] = min(best.get(mode, seconds), seconds)
        print(
            f"{mode + ':':7} {seconds:8.3f} s  {placed} placed, {failed} failed  "
            f"{(placed + failed) / seconds:10.0f} instances/s"
        )

    for _ in range(max(1, args.repeat)):
        t0 = time.perf_counter()
        fresh = balance(unit, nodes, services, mode="fresh")
        t1 = time.perf_counter()
        report("fresh", t1 - t0, len(fresh.placements), len(fresh.failures))
        previous = {p.instance_id: p.previous() for p in fresh.placements}
        t0 = time.perf_counter()
        stable = balance(unit, nodes, services, previous, mode="stable")
        t1 = time.perf_counter()
        report("stable", t1 - t0, len(stable.placements), len(stable.failures))
    if args.repeat > 1:
        print(f"best of {args.repeat} (load average {os.getloadavg()[0]:.2f}):")
        for mode, seconds in best.items():
            print(
                f"  {mode + ':':7} {seconds:8.3f} s  {args.instances / seconds:10.0f} instances/s"
            )


if __name__ == "__main__":
    main()
