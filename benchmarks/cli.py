"""Start-up of the command line: wall time of ``python -c pass``, ``reconciler --help`` and
``validate`` / ``plan`` on the demo unit (the repository's ``state/``), best of N runs each.

.venv/bin/python -m benchmarks.cli [--runs 10] [--state state] [--json]

Each command runs as a child process of this one (``python -m reconciler …`` with the same
interpreter and environment, so ``PYTHONPATH`` picks the checkout, but with byte-code caching
on, as an installed package has it), its output thrown away; the time is the child's wall time
from spawn to exit, after one uncounted run. The demo is copied into a temporary
directory first, so the runs read the same files and write nothing into the checkout. The
targets: ``--help`` ≤ 150 ms, ``validate`` and ``plan`` ≤ 300 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .reconcile import machine_description as reconcile_machine

TARGETS_MS = {"reconciler --help": 150.0, "validate": 300.0, "plan": 300.0}


def machine_description() -> str:
    """``benchmarks.reconcile``'s description of the machine, with its load now."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{reconcile_machine()}; load {load:.2f}"


def child_env() -> dict[str, str]:
    """This environment, with byte-code caching on (as in an installed package: a wheel's
    installer compiles it), so a run does not compile every module from source."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["RECONCILER_CACHE_DIR"] = ""  # (cold commands: no read cache)
    return env


def wall(argv: list[str], runs: int) -> tuple[float, list[float], int]:
    """Best and every wall time (seconds) of ``runs`` runs of ``argv`` (after one run that is
    not counted: it writes the byte-code caches), and its last exit code."""
    env = child_env()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    times: list[float] = []
    rc = 0
    for _ in range(runs):
        t0 = time.perf_counter()
        done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        times.append(time.perf_counter() - t0)
        rc = done.returncode
    return min(times), times, rc


def commands(state: Path) -> dict[str, list[str]]:
    py = sys.executable
    rec = [py, "-m", "reconciler"]
    return {
        "python -c pass": [py, "-c", "pass"],
        "reconciler --help": [*rec, "--help"],
        "validate": [*rec, "validate", "--state", str(state)],
        "plan": [*rec, "plan", "--state", str(state)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="runs per command (best is kept)")
    parser.add_argument(
        "--state", type=Path, default=Path("state"), help="the demo unit (default: ./state)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as scratch:
        demo = Path(scratch) / "state"
        shutil.copytree(args.state, demo, symlinks=True)
        results = {}
        for name, argv in commands(demo).items():
            best, times, rc = wall(argv, args.runs)
            results[name] = {
                "bestMs": round(best * 1000, 1),
                "medianMs": round(sorted(times)[len(times) // 2] * 1000, 1),
                "exitCode": rc,
                "targetMs": TARGETS_MS.get(name),
            }
    if args.json:
        out = {"machine": machine_description(), "runs": args.runs, "results": results}
        print(json.dumps(out, indent=2, sort_keys=True))
        return
    print(f"machine: {machine_description()}")
    print(f"best of {args.runs} runs, wall time:")
    for name, r in results.items():
        target = f"  (target ≤ {r['targetMs']:.0f} ms)" if r["targetMs"] is not None else ""
        print(
            f"  {name:<18} {r['bestMs']:7.1f} ms  (median {r['medianMs']:.1f}, "
            f"exit {r['exitCode']}){target}"
        )


if __name__ == "__main__":
    main()
