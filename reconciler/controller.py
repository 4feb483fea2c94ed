"""The controller's composition: load the state, recover previous allocations, balance, plan.

This module wires the pure pieces together; it reads files (through the loader) but writes
nothing. The commands that write (``reconcile``) build on :func:`compute`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .balancer import Overload, balance
from .loader import Diagnostic, StateView, load_state, mass_deletion_guard
from .models import ActualState
from .placement import BalanceResult, Mode, PreviousAllocation
from .planner import Plan, make_plan

__all__ = ["Computation", "compute", "fingerprint", "previous_from_actual"]


def previous_from_actual(actual: Mapping[str, ActualState]) -> dict[str, PreviousAllocation]:
    """Where each instance runs according to the node agents (the smallest node id wins when
    an instance is reported twice)."""
    out: dict[str, PreviousAllocation] = {}
    for node_id in sorted(actual, reverse=True):
        for iid, inst in actual[node_id].instances.items():
            devices = tuple(sorted((r, tuple(sorted(ids))) for r, ids in inst.devices.items()))
            out[iid] = PreviousAllocation(node_id, inst.runtimeId, devices)
    return out


def fingerprint(view: StateView, generation: int) -> str:
    """SPEC §10: a sha256 over the input files' contents and the checkpoint generation."""
    digest = hashlib.sha256(f"{view.input_hash}\0{generation}".encode()).hexdigest()
    return f"sha256:{digest}"


@dataclass(frozen=True)
class Computation:
    view: StateView
    diagnostics: list[Diagnostic]
    result: BalanceResult
    plan: Plan
    refused: Diagnostic | None  # the mass-deletion guard's refusal, if any


def compute(
    state_dir: Path,
    *,
    previous_view: StateView | None = None,
    previous: Mapping[str, PreviousAllocation] | None = None,
    mode: Mode | None = None,
    overload: Overload | None = None,
    allow_empty: bool = False,
    generation: int = 0,
) -> Computation:
    """Everything ``plan`` shows, from the files as they are now."""
    view, diags = load_state(state_dir, previous_view)
    if previous is None:
        previous = previous_from_actual(view.actual)
    refused = mass_deletion_guard(view, allow_empty=allow_empty)
    result = balance(
        view.unit, list(view.nodes.values()), view.services_sorted(), previous, mode, overload
    )
    if refused is not None:
        # keep everything that runs: plan as if the running instances were the desired ones
        result = BalanceResult((), ())
    plan = make_plan(
        result,
        view.actual,
        set(view.nodes),
        fingerprint=fingerprint(view, generation),
        rebalanced=mode == "rebalance",
    )
    if refused is not None:
        plan = Plan(plan.fingerprint, (), (), {n: ops[:1] for n, ops in plan.patches.items()})
    return Computation(view, diags, result, plan, refused)
