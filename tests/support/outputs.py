"""What a reconcile wrote, compared between a watcher's warm runs and a process of its own."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from reconciler.controller.configs import default_config_builder
from reconciler.controller.reconcile import ReconcileCache, ReconcileOptions, reconcile
from reconciler.io.checkpoint_files import load_checkpoint


def fixed_clock() -> float:
    """The time of every run compared (the status page names it)."""
    return 1_700_000_000.0


def warm_options() -> tuple[ReconcileOptions, ReconcileCache]:
    """A watcher's options (the default configs builder, one cache kept across runs, the
    :func:`fixed_clock`) and that cache."""
    cache = ReconcileCache()
    return ReconcileOptions(configs=default_config_builder(), cache=cache, clock=fixed_clock), cache


def written(state: Path, *also: Path) -> dict[str, Any]:
    """Every file under out/ (but the basis, which names the checkpoint's lineage) and the
    checkpoint's allocations, gids and network state, with the state dir's own path (and those
    of ``also``) taken out (a config names it)."""
    roots = [str(d.resolve()).encode() for d in (state, *also)]
    files = [p for p in sorted((state / "out").rglob("*")) if p.is_file()]
    got: dict[str, Any] = {}
    for p in files:
        if p.name in (".manifest.json", "plan.basis.json"):
            continue
        data = p.read_bytes()
        for root in roots:
            data = data.replace(root, b"STATE")
        got[str(p.relative_to(state))] = data
    # (as any reader takes it: a watcher writes its changes as a delta beside the whole file)
    cp = load_checkpoint(state / "checkpoint", {}, quarantine=False).checkpoint
    got["checkpoint"] = (dict(cp.allocations), dict(cp.gids), cp.network)
    return got


def copied(state: Path, scratch: Path) -> Path:
    """A copy of ``state`` (its inputs, checkpoint and out/: a held instance's config is read
    from there, and names ``state``) in ``scratch``, emptied first: what a process of its own
    starts from when the run it is compared with starts."""
    shutil.rmtree(scratch, ignore_errors=True)
    fresh = scratch / "state"
    shutil.copytree(state, fresh, symlinks=True)
    return fresh


def written_afresh(copy: Path, origin: Path) -> dict[str, Any]:
    """:func:`written` of a :func:`copied` state (of ``origin``) reconciled once by options of
    its own (at the :func:`fixed_clock`)."""
    reconcile(copy, ReconcileOptions(configs=default_config_builder(), clock=fixed_clock))
    return written(copy, origin)
