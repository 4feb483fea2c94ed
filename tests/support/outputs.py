"""What a reconcile wrote, compared between a watcher's warm runs and a process of its own."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reconciler.controller.configs import default_config_builder
from reconciler.controller.reconcile import ReconcileOptions, reconcile


def written(state: Path) -> dict[str, Any]:
    """Every file under out/ (but the basis, which names the checkpoint's lineage) and the
    checkpoint's data, with the state dir's own path taken out (a config names it)."""
    root = str(state.resolve()).encode()
    files = [p for p in sorted((state / "out").rglob("*")) if p.is_file()]
    got: dict[str, Any] = {
        str(p.relative_to(state)): p.read_bytes().replace(root, b"STATE")
        for p in files
        if p.name not in (".manifest.json", "plan.basis.json")
    }
    got["checkpoint"] = json.loads((state / "checkpoint" / "allocations.json").read_text())["data"]
    return got


def copied(state: Path, scratch: Path) -> Path:
    """A copy of ``state``'s inputs and checkpoint (not out/) in ``scratch``, emptied first:
    what a process of its own starts from when the run it is compared with starts."""
    shutil.rmtree(scratch, ignore_errors=True)
    fresh = scratch / "state"
    shutil.copytree(state, fresh, ignore=shutil.ignore_patterns("out"))
    return fresh


def written_afresh(copy: Path, clock: Callable[[], float]) -> dict[str, Any]:
    """:func:`written` of a :func:`copied` state reconciled once by options of its own."""
    reconcile(copy, ReconcileOptions(configs=default_config_builder(), clock=clock))
    return written(copy)
