"""Human renderings of plans, placements and explanations (rich), for the CLI."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from reconciler.placement.balancer import Explanation
from reconciler.placement.instances import BalanceResult
from reconciler.planning.plans import Plan

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
    if exp.placement is not None and exp.failure is not None:  # held
        p = exp.placement
        console.print(
            f"[yellow]held[/yellow] at {p.version} on [green]{p.node_id}[/green] runtime "
            f"{p.runtime_id}: its current spec ({inst.version}) places nowhere (below), so it "
            "keeps running as it was placed"
        )
        console.print(f"[red]unplaceable[/red]: {exp.failure.summary}")
    elif exp.placement is not None:
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


def _amount(entry: dict[str, Any] | None, as_bytes: bool = False) -> str:
    if entry is None:
        return "-"
    fmt = _bytes if as_bytes else str
    shown = f"{fmt(entry['reserved'])}/{fmt(entry['capacity'])}"
    beyond = entry.get("overcommitted")
    if beyond:
        ratio = entry["inventory"]["allocationRatio"]
        shown += f" (overcommitted x{ratio:g}: {fmt(beyond)} beyond the node's)"
    return shown


def _restarts(instance: dict[str, Any]) -> str:
    """The restart count, with how its container last ended."""
    count = instance.get("restartCount", 0)
    last = instance.get("lastExit")
    if not count and last is None:
        return "0"
    return f"{count} (last: {last['reason']} at {last['at']})" if last else str(count)


def render_status(console: Console, doc: dict[str, Any]) -> None:
    """Tables of nodes, instances, failures, alerts and invalid inputs from status.json."""
    nodes = Table(title="Nodes (reserved/capacity)", title_justify="left", show_edge=False)
    for col in (
        "node",
        "type",
        "state",
        "prio",
        "cpu",
        "ram",
        "storage",
        "state dir",
        "instances",
        "devices (allocated/healthy/total)",
    ):
        nodes.add_column(col, no_wrap=True)
    for node_id, n in doc["nodes"].items():
        state = n["state"] if n["connected"] else f"{n['state']} (disconnected)"
        devices = ", ".join(
            f"{r}: {d['allocated']}/{d['healthy']}/{d['total']}" for r, d in n["devices"].items()
        )
        nodes.add_row(
            node_id,
            n["type"],
            state,
            str(n["priority"]),
            _amount(n["cpu"]),
            _amount(n["ram"], True),
            _amount(n["partitions"]["storage"], True),
            _amount(n["partitions"]["state"], True),
            str(n["instances"]),
            devices,
        )
    console.print(nodes)
    console.print()
    inst = Table(title="Instances", title_justify="left", show_edge=False)
    for col in ("instance", "version", "node", "runtime", "state", "restarts", "devices"):
        inst.add_column(col, no_wrap=col != "devices")
    reasons: list[str] = []
    for i in sorted(
        doc["instances"].values(), key=lambda r: (r["nodeId"], r["itemId"], r["index"])
    ):
        devices = "; ".join(f"{r}={','.join(ids)}" for r, ids in i["devices"].items())
        if i.get("unhealthyDevices"):
            devices += f" [red](unhealthy: {','.join(i['unhealthyDevices'])})[/red]"
        style = {"active": "green", "failed": "red", "pending": "yellow"}.get(i["state"], "")
        state = f"[{style}]{i['state']}[/{style}]" if style else i["state"]
        name = f"{i['itemId']}:{i['subjectId']}:{i['index']}"
        inst.add_row(name, i["version"], i["nodeId"], i["runtimeId"], state, _restarts(i), devices)
        if i["state"] == "failed" and i.get("reason"):
            reasons.append(f"{name} on {i['nodeId']}: {i['reason']}")
    console.print(inst)
    if reasons:
        console.print("\n[bold]Failed instances[/bold]")
        for line in reasons:
            console.print(f"  {line}", markup=False)
    if doc["failures"]:
        console.print("\n[bold]Unplaceable[/bold]")
        for f in doc["failures"]:
            console.print(f"  [yellow]![/yellow] {f['summary']}")
    if doc.get("alerts"):
        console.print("\n[bold]Alerts[/bold]")
        for a in doc["alerts"]:
            console.print(f"  [red]{a['node']} {a['resource']}[/red] raised since {a['since']}")
    if doc.get("invalidInputs"):
        console.print("\n[bold]Invalid inputs[/bold] (their last good version is in use)")
        for errors in doc["invalidInputs"].values():
            for e in errors:
                console.print(f"  {e['path']}:{e['line']}:{e['col']}: {e['message']}", markup=False)
