"""Fixtures of the whole-system tests: ``e2e``, a two-node state directory with one runc root
per node (skips, saying why, where runc cannot run)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.agent.runc import Runc, RuncError
from tests.support.e2e import (
    E2E,
    NODES,
    make_e2e_rootfs,
    runtime_architecture,
    skip_unless_runc_works,
    write_service,
)
from tests.support.runc import require_runc_and_busybox


@pytest.fixture
def e2e(tmp_path: Path) -> Iterator[E2E]:
    busybox = require_runc_and_busybox()
    skip_unless_runc_works(tmp_path, busybox)

    state = tmp_path / "state"
    (state / "desired").mkdir(parents=True)
    (state / "nodes").mkdir()
    make_e2e_rootfs(state / "rootfs", busybox)
    (state / "unit.yaml").write_text(
        "apiVersion: reconciler/v1\nkind: UnitConfig\nversion: 1.0.0\n"
        "nodes:\n  - {nodeType: edge}\n"
    )
    for n in NODES:
        node = {
            "apiVersion": "reconciler/v1",
            "kind": "Node",
            "id": n,
            "type": "edge",
            "maxDMIPS": 1000,
            "totalRAM": "1Gi",
            "runtimes": [
                {
                    "id": "runc",
                    "type": "runc",
                    "platform": {"architecture": runtime_architecture(), "os": "linux"},
                }
            ],
        }
        (state / "nodes" / f"{n}.yaml").write_text(json.dumps(node))  # JSON is YAML 1.2
    write_service(state)
    runcs = {n: Runc(root=tmp_path / f"runc-{n}", timeout=30) for n in NODES}
    env = E2E(state, runcs, tmp_path / "logs", {})
    try:
        yield env
    finally:
        for runc in runcs.values():  # leave nothing behind, whatever happened
            try:
                left = runc.list()
            except RuncError:
                continue
            for st in left:
                with contextlib.suppress(RuncError):
                    runc.kill(st.id, "KILL")
                with contextlib.suppress(RuncError):
                    runc.delete(st.id, force=True)
        print(f"e2e timings (s): {env.timings}")
        remaining = {n: [st.id for st in runc.list()] for n, runc in runcs.items()}
        assert remaining == {n: [] for n in NODES}, f"containers left behind: {remaining}"
