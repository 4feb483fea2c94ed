"""kill -9 at random moments while reconciling a changing state directory (SPEC §9).

A forked child (so it starts instantly, already imported) edits a desired file and reconciles in
a loop; the parent kills it with SIGKILL, 200 times: every other kill lands at a random time,
the others at a chosen step of an atomic write (the child's write hook tells the parent where it
is), so the write path is hit however fast or loaded the machine is. After every kill the
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
from typing import Any

import pytest

from reconciler.controller.reconcile import ReconcileOptions, reconcile
from reconciler.io.checkpoint_files import (
    CURRENT,
    load_checkpoint,
)
from reconciler.planning.checkpoint import (
    decode_checkpoint,
)

KILLS = 200


def _churn(
    state: str, text: str, seed: int, target_step: int, at_step: Any
) -> None:  # pragma: no cover
    """The child: edit and reconcile forever; at write step ``target_step`` (0: never) tell the
    parent and wait to be killed. ``text`` is the service file as it was before any kill (a kill
    during the child's own non-atomic edit leaves a torn file, which the loader must survive)."""
    rng = random.Random(seed)
    root = Path(state)
    svc = root / "desired" / "apps" / "logger.yaml"
    steps = 0

    def hook(_step: str) -> None:
        nonlocal steps
        steps += 1
        if steps == target_step:
            at_step.set()
            time.sleep(60)  # the parent kills us here, inside the write

    opts = ReconcileOptions(write_hook=hook)
    while True:
        n = rng.randrange(0, 5)
        svc.write_text(re.sub(r"instances: \d+", f"instances: {n}", text))
        reconcile(root, opts)


def _temp_files(state: Path) -> list[Path]:
    dirs = (state / "checkpoint", state / "out", state / "out" / "nodes")
    return [p for d in dirs if d.is_dir() for p in d.iterdir() if ".tmp-" in p.name]


@pytest.mark.slow
def test_kill9_loop_never_corrupts_the_checkpoint(demo_copy: Path) -> None:
    if not hasattr(os, "fork"):
        pytest.skip("needs fork")
    ctx = multiprocessing.get_context("fork")
    rng = random.Random(4242)
    reconcile(demo_copy)
    lineage = (demo_copy / "checkpoint" / "LINEAGE").read_text().strip()
    text = (demo_copy / "desired" / "apps" / "logger.yaml").read_text()
    inside_writes = 0
    for i in range(KILLS):
        at_step = ctx.Event()
        target = rng.randrange(1, 30) if i % 2 == 0 else 0
        child = ctx.Process(target=_churn, args=(str(demo_copy), text, i, target, at_step))
        child.start()
        if target:
            deadline = time.monotonic() + 60
            while not at_step.wait(timeout=0.5):
                assert child.is_alive(), f"the child died on its own (exit {child.exitcode})"
                assert time.monotonic() < deadline, "the child never reached its write step"
        else:
            time.sleep(rng.uniform(0.0, 0.15))
        assert child.pid is not None
        os.kill(child.pid, signal.SIGKILL)
        child.join()
        assert child.exitcode == -signal.SIGKILL
        raw = (demo_copy / "checkpoint" / CURRENT).read_bytes()
        decode_checkpoint(raw, lineage)  # valid checksum, right lineage, never torn
        report = load_checkpoint(demo_copy / "checkpoint", {}, quarantine=False)
        assert report.source == "current" and not report.problems
        inside_writes += bool(_temp_files(demo_copy))
        first = reconcile(demo_copy)
        assert not first.problems
        second = reconcile(demo_copy)
        assert second.written == () and not second.checkpoint_written
        assert not _temp_files(demo_copy)  # the next writer cleaned up after the dead one
    assert not (demo_copy / "checkpoint" / "quarantine").exists()
    print(f"{KILLS} kills, {inside_writes} left a temp file behind (killed inside a write)")
    assert inside_writes >= KILLS // 8  # the step-targeted kills really land inside writes
