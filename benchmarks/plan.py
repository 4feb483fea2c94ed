"""Planning time: stop N instances and start N others (SPEC §10), per-instance JSON Patch.

.venv/bin/python -m benchmarks.plan [--instances 10000] [--nodes 100]
"""

from __future__ import annotations

import argparse
import time

from reconciler.model.documents import ActualState
from reconciler.model.values import instance_id
from reconciler.placement.instances import BalanceResult, Placement, Requested
from reconciler.planning.plans import make_plan


def scenario(n: int, nodes: int) -> tuple[BalanceResult, dict[str, ActualState]]:
    actual: dict[str, dict[str, object]] = {}
    for i in range(n):
        node = f"node-{i % nodes:04d}"
        doc = actual.setdefault(
            node,
            {
                "apiVersion": "reconciler/v1",
                "kind": "ActualState",
                "nodeId": node,
                "revision": 1,
                "instances": {},
            },
        )
        inst = doc["instances"]
        assert isinstance(inst, dict)
        inst[instance_id("old", "default", i)] = {
            "itemId": "old",
            "subjectId": "default",
            "index": i,
            "version": "1.0.0",
            "runtimeId": "runc",
            "state": "active",
        }
    parsed = {k: ActualState.model_validate(v) for k, v in actual.items()}
    placements = tuple(
        Placement(
            instance_id("new", "default", i),
            "new",
            "default",
            i,
            "1.0.0",
            0,
            f"node-{(i + 1) % nodes:04d}",
            "runc",
            Requested(),
            (),
            (),
        )
        for i in range(n)
    )
    return BalanceResult(placements, ()), parsed


def steady(n: int, nodes: int) -> tuple[BalanceResult, dict[str, ActualState]]:
    """n instances running exactly where they are placed: the diff finds nothing to do."""
    actual: dict[str, dict[str, object]] = {}
    placements = []
    for i in range(n):
        node = f"node-{i % nodes:04d}"
        iid = instance_id("svc", "default", i)
        doc = actual.setdefault(
            node,
            {
                "apiVersion": "reconciler/v1",
                "kind": "ActualState",
                "nodeId": node,
                "revision": 3,
                "instances": {},
            },
        )
        inst = doc["instances"]
        assert isinstance(inst, dict)
        inst[iid] = {
            "itemId": "svc",
            "subjectId": "default",
            "index": i,
            "version": "1.0.0",
            "runtimeId": "runc",
            "state": "active",
        }
        placements.append(
            Placement(iid, "svc", "default", i, "1.0.0", 0, node, "runc", Requested(), (), ())
        )
    parsed = {k: ActualState.model_validate(v) for k, v in actual.items()}
    return BalanceResult(tuple(placements), ()), parsed


def _best_ms(result: BalanceResult, actual: dict[str, ActualState], nodes: set[str]) -> float:
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        make_plan(result, actual, nodes)
        best = min(best, time.perf_counter() - t0)
    return best * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--instances", type=int, default=10000)
    parser.add_argument("--nodes", type=int, default=100)
    args = parser.parse_args()
    result, actual = steady(20000, 5000)
    ms = _best_ms(result, actual, set(actual))
    print(f"diff of 20000 running instances on 5000 nodes, nothing to do: {ms:8.1f} ms")
    for n in (args.instances // 2, args.instances):
        result, actual = scenario(n, args.nodes)
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            plan = make_plan(result, actual, {f"node-{k:04d}" for k in range(args.nodes)})
            best = min(best, time.perf_counter() - t0)
        print(
            f"stop {n} + start {n} on {args.nodes} nodes: {best * 1000:8.1f} ms "
            f"({len(plan.actions)} actions)"
        )


if __name__ == "__main__":
    main()
