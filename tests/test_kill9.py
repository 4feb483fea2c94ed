"""kill -9 at random moments while reconciling a changing state directory (SPEC §9).

A forked child (so it starts instantly, already imported) edits a desired file and reconciles in
a loop; the parent kills it with SIGKILL after a random delay, 200 times. After every kill the
checkpoint must load with a valid checksum (never quarantined) and a reconcile must converge: a
second one writes nothing.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import re
import signal
import time
from pathlib import Path

import pytest

from reconciler.checkpoint import CURRENT, decode_checkpoint, load_checkpoint
from reconciler.reconcile import ReconcileOptions, reconcile

KILLS = 200


def _churn(state: str, seed: int) -> None:  # pragma: no cover - runs in the child
    rng = random.Random(seed)
    root = Path(state)
    svc = root / "desired" / "apps" / "logger.yaml"
    text = svc.read_text()
    # a slower disk: every step of every atomic write takes 2 ms, so that kills land inside
    # writes often enough to matter
    opts = ReconcileOptions(write_hook=lambda _step: time.sleep(0.002))
    while True:
        n = rng.randrange(0, 5)
        svc.write_text(re.sub(r"instances: \d+", f"instances: {n}", text))
        reconcile(root, opts)


@pytest.mark.slow
def test_kill9_loop_never_corrupts_the_checkpoint(demo_copy: Path) -> None:
    if not hasattr(os, "fork"):
        pytest.skip("needs fork")
    ctx = multiprocessing.get_context("fork")
    rng = random.Random(4242)
    reconcile(demo_copy)
    lineage = (demo_copy / "checkpoint" / "LINEAGE").read_text().strip()
    killed_mid_write = 0
    for i in range(KILLS):
        child = ctx.Process(target=_churn, args=(str(demo_copy), i))
        child.start()
        time.sleep(rng.uniform(0.0, 0.15))
        assert child.pid is not None
        os.kill(child.pid, signal.SIGKILL)
        child.join()
        assert child.exitcode == -signal.SIGKILL
        raw = (demo_copy / "checkpoint" / CURRENT).read_bytes()
        decode_checkpoint(raw, lineage)  # valid checksum, right lineage, never torn
        report = load_checkpoint(demo_copy / "checkpoint", {}, quarantine=False)
        assert report.source == "current" and not report.problems
        dirs = (demo_copy / "checkpoint", demo_copy / "out", demo_copy / "out" / "nodes")
        leftovers = [p for d in dirs for p in d.iterdir() if ".tmp-" in p.name]
        killed_mid_write += bool(leftovers)  # the kill landed inside an atomic write
        first = reconcile(demo_copy)
        assert not first.problems
        second = reconcile(demo_copy)
        assert second.written == () and not second.checkpoint_written
        assert not [p for p in (demo_copy / "checkpoint").iterdir() if ".tmp-" in p.name]
    assert not (demo_copy / "checkpoint" / "quarantine").exists()
    print(f"{KILLS} kills, {killed_mid_write} inside an atomic write")
    assert killed_mid_write > 0  # the loop really hits the write path
