"""What the controller's last plan was computed from (``out/plan.basis.json``), so that
``reconciler plan`` can show that plan instead of computing it again when nothing it depends
on has changed since.

A plan is a function of the input files, the checkpoint, the mode asked for, the clock (a node
whose report gets too old fails ``NodeState``; an alert's timer can trigger a rebalance) and,
for a few configs, the host (the group database and ``/dev``, read for a named resource's
groups and devices and a pool device's device strings). After each run the controller records
what its plan depends on; ``plan`` takes ``out/plan.json`` as it is only when

- the record says the plan is *reusable*: no input file had a problem, no node's report was
  too old and no alert timer ran (nothing moves with the clock, but nodes' reports getting
  too old: the record says until when every report stays young enough), no node declares host
  groups or devices, and the mass-deletion and instance-limit guards would let it through;
- it asks for the same mode (``--mode``) as the run did, and the time is before that bound;
- ``out/plan.json`` and the checkpoint hold the bytes the run left (sha256), the checkpoint's
  lineage file names the same lineage, and the input files hash to the same ``input_hash``
  (their bytes read and hashed, nothing parsed: ~0.5 s at 9,000 files).

Then a plan computed now would be the same bytes: a reconcile of unchanged inputs is
idempotent (the placements, ids and causes come back from the checkpoint it wrote). Anything
else, or ``plan --recompute``, computes the plan as usual.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler.io.checkpoint_files import CURRENT, DELTA, LINEAGE, CheckpointFiles, files_digest
from reconciler.io.fsio import FileReadError, read_bytes_at
from reconciler.io.loader import (
    input_hash_of,
    instance_limit_guard,
    mass_deletion_guard,
    resources_files,
)
from reconciler.model.documents import Node

if TYPE_CHECKING:
    from reconciler.controller.reconcile import Computed

__all__ = ["BASIS_FILE", "Reused", "basis_bytes", "digest", "not_reusable", "reusable_plan"]

BASIS_FILE = "plan.basis.json"
"""Under out/, beside plan.json."""

FORMAT_VERSION = 1

_MAX_PLAN_BYTES = 1 << 31  # a plan.json is read whole to be shown (13 MB at 20,000 actions)


def digest(data: bytes, known: bytes | tuple[str, bytes] | None = None) -> str:
    """``sha256:<hex>`` of ``data``; ``known``: the writer's content key of the same bytes
    (``reconcile.content_key``), whose sha256, when it holds one, is not computed again."""
    if isinstance(known, tuple) and known[0] == "sha256":
        return "sha256:" + known[1].hex()
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _host_dependent(node: Node) -> bool:
    """Whether a config built on ``node`` can read the host (groups or devices)."""
    if any(r.groups or r.devices for r in node.host_resources):
        return True
    return any(d.devices for pool in node.devicePools for d in pool.devices)


def not_reusable(c: Computed) -> str | None:
    """Why a later ``plan`` cannot show ``c``'s plan as it is (None: it can, within the
    bound :func:`basis_bytes` records)."""
    view = c.view
    if c.diagnostics:
        return "input files have problems"
    if c.built is None:
        return "the configs were not built"
    if c.checkpoint.alerts:
        return "alert timers are running (they move with the clock)"
    if c.mode != c.requested:
        return "an alert triggered a rebalance"
    nodes = c.nodes if c.nodes is not None else list(view.nodes.values())
    if any(view.nodes.get(n.id) is not n for n in nodes):
        return "a node's report is too old (its message counts the minutes)"
    if any(map(_host_dependent, view.nodes.values())):
        return "a node declares host groups or devices (configs read the host)"
    allocated = len(c.checkpoint.allocations)
    if mass_deletion_guard(view, allow_empty=False, allocated=allocated) is not None:
        return "the mass-deletion guard would refuse the inputs"
    if instance_limit_guard(view) is not None:
        return "the instance limit would refuse the inputs"
    return None


def basis_bytes(
    c: Computed, mode: str | None, checkpoint: CheckpointFiles, plan_digest: str
) -> bytes:
    """``out/plan.basis.json`` for the run ``c`` (``mode``: the mode the run was asked for,
    None for unit.yaml's; ``checkpoint``: the checkpoint files' bytes after the run;
    ``plan_digest``: :func:`digest` of the plan.json bytes it wrote). Deterministic: the same
    run gives the same bytes."""
    why = not_reusable(c)
    doc: dict[str, Any]
    if why is not None:
        doc = {"formatVersion": FORMAT_VERSION, "reusable": False, "reason": why}
    else:
        unit = c.view.unit
        timeout = unit.nodeTimeout if unit is not None else 60.0
        reported = [n.reportedAt.timestamp() for n in c.view.nodes.values() if n.reportedAt]
        doc = {
            "formatVersion": FORMAT_VERSION,
            "reusable": True,
            "inputHash": c.view.input_hash,
            "resourcesFiles": resources_files(c.view),
            "checkpoint": checkpoint.digest(),
            "lineage": c.checkpoint.lineage,
            "plan": plan_digest,
            "mode": mode,
            "instances": len(c.result.placements),
            # a report exactly nodeTimeout old is still young enough (StaleMarks)
            "validUntil": min(reported) + timeout if reported else None,
        }
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


@dataclass(frozen=True)
class Reused:
    """The controller's plan, shown as it is."""

    data: bytes  # out/plan.json's bytes
    document: Mapping[str, Any]
    instances: int  # how many instances it places


def _read(path: Path, limit: int = 1 << 20) -> bytes | None:
    try:
        raw, _key = read_bytes_at(path, limit)
    except FileReadError:
        return None
    return raw if len(raw) <= limit else None


def reusable_plan(state_dir: Path, mode: str | None, now: float) -> Reused | None:
    """``out/plan.json`` when it is the plan a computation now would give (see the module's
    docstring); None otherwise."""
    raw = _read(state_dir / "out" / BASIS_FILE)
    if raw is None:
        return None
    try:
        basis = json.loads(raw)
        if basis.get("formatVersion") != FORMAT_VERSION or basis.get("reusable") is not True:
            return None
        if basis["mode"] != mode:
            return None
        until = basis["validUntil"]
        if until is not None and not now <= float(until):
            return None
        deps = {str(k): [str(p) for p in v] for k, v in basis["resourcesFiles"].items()}
        want_plan, want_cp = str(basis["plan"]), str(basis["checkpoint"])
        want_hash, lineage = str(basis["inputHash"]), str(basis["lineage"])
        instances = int(basis["instances"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    checkpoint = _read(state_dir / "checkpoint" / CURRENT, _MAX_PLAN_BYTES)
    delta = _read(state_dir / "checkpoint" / DELTA, _MAX_PLAN_BYTES)
    if checkpoint is None or files_digest(checkpoint, delta) != want_cp:
        return None
    named = _read(state_dir / "checkpoint" / LINEAGE)
    if named is not None and named.decode(errors="replace").strip() != lineage:
        return None
    plan = _read(state_dir / "out" / "plan.json", _MAX_PLAN_BYTES)
    if plan is None or digest(plan) != want_plan:
        return None
    if input_hash_of(state_dir, deps) != want_hash:
        return None
    try:
        document = json.loads(plan)
    except ValueError:
        return None
    if not isinstance(document, dict):
        return None
    return Reused(plan, document, instances)
