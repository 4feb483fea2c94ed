"""Peak RSS of one cold ``reconcile`` without a cache: what the path-activated oneshot (or
``reconciler reconcile``) needs (issue 9's ≤ 500 MB target); ``benchmarks.reconcile`` measures
the watcher, whose warm-path caches stay in memory between runs.

.venv/bin/python -m benchmarks.oneshot_rss [--nodes 5000] [--instances 20000] [--seed 1]
    [--dir DIR]

The state directory is generated in a child process; this process imports the package, runs one
cold reconcile with OCI configs and prints ``ru_maxrss``.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import tempfile
import time
from pathlib import Path

from reconciler.controller.configs import default_config_builder
from reconciler.controller.reconcile import ReconcileOptions, reconcile

from .reconcile import _generate, machine_description


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--instances", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--node-format", choices=("yaml", "json"), default="yaml")
    parser.add_argument("--dir", type=Path, help="where to create the state dir (default: /tmp)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="oneshot-rss-", dir=args.dir))
    try:
        root = base / "state"
        _generate(root, args)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        t0 = time.perf_counter()
        report = reconcile(root, ReconcileOptions(configs=default_config_builder()))
        elapsed = time.perf_counter() - t0
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"machine: {machine_description()}")
        print(
            f"{args.nodes} nodes x {args.instances} instances: cold oneshot reconcile "
            f"{elapsed:.1f} s, {len(report.computed.result.placements)} placed; "
            f"peak RSS {peak:.0f} MiB (after imports: {before:.0f} MiB)"
        )
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
