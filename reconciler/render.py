"""Human renderings of plans, placements and explanations (rich), for the CLI."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from .balancer import Explanation
from .placement import BalanceResult
from .planner import Plan

__all__ = ["render_explanation", "render_placements", "render_plan"]

_ACTION_STYLE = {"start": ("+", "green"), "stop": ("-", "red")}


def render_placements(console: Console, result: BalanceResult) -> None:
    if not result.placements:
        console.print("No instance is placed.")
        return
    table = Table(title="Placements", title_justify="left", show_edge=False)
    for col in ("instance", "version", "node", "runtime", "cpu", "ram", "resources", "devices"):
        table.add_column(col, no_wrap=col in ("instance", "node"))
    for p in result.placements:
        devices = "; ".join(f"{r}={','.join(ids)}" for r, ids in p.devices)
        if p.unhealthy_devices:
            devices += f" (unhealthy: {','.join(p.unhealthy_devices)})"
        table.add_row(
            p.label,
            p.version,
            p.node_id,
            p.runtime_id,
            str(p.requested.cpu),
            _bytes(p.requested.ram),
            ",".join(p.resources),
            devices,
        )
    console.print(table)


def _bytes(n: int) -> str:
    for unit, size in (("Gi", 1024**3), ("Mi", 1024**2), ("Ki", 1024)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def render_plan(console: Console, plan: Plan) -> None:
    by_node: dict[str, list[str]] = {}
    for a in plan.actions:
        sign, style = _ACTION_STYLE[a.action]
        line = (
            f"  [{style}]{sign} {a.action}[/{style}] {a.item_id}:{a.subject_id}:{a.index} "
            f"{a.version} on {a.runtime_id} [dim]({a.reason}, {a.instance_id})[/dim]"
        )
        by_node.setdefault(a.node_id, []).append(line)
    for node_id in sorted(by_node):
        console.print(f"[bold]{node_id}[/bold]")
        for line in by_node[node_id]:
            console.print(line)
    if plan.failures:
        console.print("[bold]Unplaceable[/bold]")
        for f in plan.failures:
            console.print(f"  [yellow]![/yellow] {f.summary}", markup=True)
    starts, stops = len(plan.starts()), len(plan.stops())
    if not plan.actions:
        tail = f" {len(plan.failures)} unplaceable." if plan.failures else ""
        console.print(f"No changes.{tail}")
    else:
        console.print(
            f"Plan: {starts} to start, {stops} to stop; {len(plan.failures)} unplaceable."
        )


def render_explanation(console: Console, exp: Explanation) -> None:
    inst = exp.instance
    console.print(f"[bold]{inst.label}[/bold] ({inst.id}), priority {inst.priority}")
    if exp.placement is not None:
        p = exp.placement
        console.print(f"placed on [green]{p.node_id}[/green] runtime {p.runtime_id}")
    elif exp.failure is not None:
        console.print(f"[red]unplaceable[/red]: {exp.failure.summary}")
    table = Table(show_edge=False)
    table.add_column("node", no_wrap=True)
    for code in exp.filters:
        table.add_column(code, justify="center")
    table.add_column("dropped by")
    notes: list[str] = []
    for node_id, cells, dropped in exp.rows:
        row = [node_id]
        for code, why in zip(exp.filters, cells, strict=True):
            if why is None:
                row.append("[green]ok[/green]")
            else:
                row.append("[red]no[/red]")
                notes.append(f"{node_id} {code}: {why}")
        row.append(dropped or "[green]feasible[/green]")
        table.add_row(*row)
    console.print(table)
    for note in notes:
        console.print(f"  {note}", markup=False)
