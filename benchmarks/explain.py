"""``reconciler explain`` of one instance on each fleet shape, as a user runs it: after a
``reconcile``, each command in a fresh process (interpreter start-up included).

.venv/bin/python -m benchmarks.explain [--nodes 5000] [--instances 20000] [--shape S ...]
                                       [--state DIR] [--repeat 3] [--json]

Per shape (``benchmarks.synth.SHAPES``, all by default; or one existing ``--state DIR``, copied
to scratch): a generated state directory, one ``reconciler reconcile``, then with a read cache
of its own (``RECONCILER_CACHE_DIR``):

- ``first``: ``explain`` of an unplaceable instance (else the first placed one) with nothing
  cached: it reads every input file, balances, and writes the cache;
- ``next``: ``explain`` of another instance, then of the first one again (``--repeat`` times
  each, the best): the inputs only stat-ed, no balance;
- ``after reconcile``: one desired file edited (a service's instances + 1), a
  ``reconciler reconcile`` (which leaves its run in the cache explain made), then the first
  instance again: the inputs only stat-ed, no balance;
- ``uncached``: the first instance again with the cache turned off (best of two), what every
  explain cost before the cache.

Target (docs/performance.md): ``explain`` of one instance <= 1 s at 5,000 x 20,000.
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
from typing import Any

from .statedir import bump_instances, edit_target, write_state_dir
from .synth import SHAPES, fleet_arguments

REPO = Path(__file__).resolve().parent.parent


def _timed(args: list[str], env: dict[str, str]) -> tuple[float, str]:
    cmd = [sys.executable, "-m", "reconciler", *args]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False, env=env)
    return time.perf_counter() - t0, proc.stdout


def _targets(root: Path, env: dict[str, str]) -> tuple[str, str]:
    """An unplaceable instance (else the first one the plan starts), and another one it
    starts (no agent has run: the plan starts every placed instance)."""
    _s, out = _timed(["plan", "--state", str(root), "--json"], env)
    doc = json.loads(out)
    failures = [f["instanceId"] for f in doc.get("failures") or []]
    placed = [a["instanceId"] for a in doc.get("actions") or []]
    first = failures[0] if failures else placed[0]
    return first, placed[-1]


def measure(root: Path, repeat: int) -> dict[str, Any]:
    off = {**os.environ, "RECONCILER_CACHE_DIR": ""}
    reconcile = [sys.executable, "-m", "reconciler", "reconcile", "--state", str(root)]
    with tempfile.TemporaryDirectory(prefix="explain-cache-") as cache:
        env = {**os.environ, "RECONCILER_CACHE_DIR": cache}
        subprocess.run(reconcile, cwd=REPO, capture_output=True, check=False, env=env)
        first, other = _targets(root, off)
        first_s, _ = _timed(["explain", first, "--state", str(root)], env)
        nexts = [
            _timed(["explain", t, "--state", str(root)], env)[0]
            for _ in range(repeat)
            for t in (other, first)
        ]
        # an edit the controller runs on, which leaves its run in the cache explain made
        victim = edit_target(root)
        bump_instances(root, victim, +1)
        subprocess.run(reconcile, cwd=REPO, capture_output=True, check=False, env=env)
        after_s, _ = _timed(["explain", first, "--state", str(root)], env)
    uncached = min(_timed(["explain", first, "--state", str(root)], off)[0] for _ in range(2))
    return {
        "after_reconcile_s": after_s,
        "first_s": first_s,
        "next_s": min(nexts),
        "uncached_s": uncached,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    fleet_arguments(parser)
    parser.add_argument("--state", type=Path, help="an existing state directory instead")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-explain-") as tmp:
        if args.state is not None:
            root = Path(tmp) / "state"
            shutil.copytree(
                args.state, root, ignore=shutil.ignore_patterns("out", "checkpoint", ".lock")
            )
            rows.append({"shape": str(args.state), **measure(root, args.repeat)})
        else:
            for shape in args.shape or SHAPES:
                root = Path(tmp) / shape
                write_state_dir(root, args.nodes, args.instances, 1, shape=shape)
                rows.append({"shape": shape, **measure(root, args.repeat)})
                shutil.rmtree(root)
                if not args.json:
                    r = rows[-1]
                    print(
                        f"{shape:15s} after reconcile {r['after_reconcile_s']:.2f} s  "
                        f"next {r['next_s']:.2f} s  first {r['first_s']:.2f} s  "
                        f"uncached {r['uncached_s']:.2f} s",
                        flush=True,
                    )
    if args.json:
        print(json.dumps({"rows": rows}, indent=2))
    elif args.state is not None:
        r = rows[0]
        print(f"after reconcile {r['after_reconcile_s']:.2f} s  next {r['next_s']:.2f} s  ", end="")
        print(f"first {r['first_s']:.2f} s  ", end="")
        print(f"uncached {r['uncached_s']:.2f} s")


if __name__ == "__main__":
    main()
