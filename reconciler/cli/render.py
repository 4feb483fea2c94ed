"""Human renderings of plans, placements and explanations (rich), for the CLI."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from reconciler.cli.textout import (
    Cell,
    Column,
    Painter,
    TextTable,
    wrap,
    wrap_marked,
    write_lines,
)
from reconciler.placement.balancer import Explanation
from reconciler.placement.instances import BalanceResult
from reconciler.placement.pipeline import nodes_feasible, ordered_counts
from reconciler.planning.plans import Action, Plan

if TYPE_CHECKING:
    from reconciler.cli.plainconsole import TextConsole

__all__ = [
    "SMALL_UNIT",
    "render_explanation",
    "render_placements",
    "render_plan",
    "render_plan_document",
]

_ACTION_STYLE = {"start": ("+", "green"), "stop": ("-", "red")}


SMALL_UNIT = 100
"""Up to this many instances a view lists every one by default (above: only when asked)."""


def render_placements(console: TextConsole, result: BalanceResult) -> None:
    if not result.placements:
        console.print("No instance is placed.")
        return
    paint = Painter(console)
    table = TextTable(
        [
            Column("instance"),
            Column("version", min_width=5),
            Column("node", min_width=6),
            Column("runtime", "rt", min_width=4),
            Column("cpu", min_width=3, right=True),
            Column("ram", min_width=4, right=True),
            Column("resources", "res"),
            Column("devices", "dev"),
        ]
    )
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
    write_lines(console, [paint("Placements", "bold"), *table.render(console.width, paint)])


def _bytes(n: int) -> str:
    for unit, size in (("Gi", 1024**3), ("Mi", 1024**2), ("Ki", 1024)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


class FailureRow(Protocol):
    """What the plan's text shows of an unplaceable instance (a :class:`Failure`, or one read
    back from a plan document)."""

    @property
    def item_id(self) -> str: ...
    @property
    def subject_id(self) -> str: ...
    @property
    def index(self) -> int: ...
    @property
    def summary(self) -> str: ...


@dataclass(frozen=True)
class _SavedFailure:
    item_id: str
    subject_id: str
    index: int
    summary: str


def render_plan(console: TextConsole, plan: Plan) -> None:
    """The actions grouped by node, then by service (ITEM:SUBJECT), each instance on a line of
    its own; then the unplaceable instances grouped by service; then the totals."""
    _render_actions(console, plan.actions, plan.failures)


def render_plan_document(console: TextConsole, doc: Mapping[str, Any]) -> None:
    """:func:`render_plan` of a plan document (out/plan.json, ``plan --json``): the same
    lines as for the plan it was made of."""
    actions = [
        Action(
            a["action"],
            a["instanceId"],
            a["itemId"],
            a["subjectId"],
            a["index"],
            a["version"],
            a["nodeId"],
            a["runtimeId"],
            a["reason"],
        )
        for a in doc["actions"]
    ]
    failures = [
        _SavedFailure(f["itemId"], f["subjectId"], f["index"], f["summary"])
        for f in doc["failures"]
    ]
    _render_actions(console, actions, failures)


def _render_actions(
    console: TextConsole, actions: Sequence[Action], failures: Sequence[FailureRow]
) -> None:
    paint = Painter(console)
    width = console.width
    lines: list[str] = []
    by_node: dict[str, dict[tuple[str, str], list[Action]]] = {}
    for a in actions:
        by_node.setdefault(a.node_id, {}).setdefault((a.item_id, a.subject_id), []).append(a)
    for node_id in sorted(by_node):
        lines.append(paint(node_id, "bold"))
        services = by_node[node_id]
        for item, subject in sorted(services):
            lines.append(f"  {item}:{subject}")
            for a in sorted(services[(item, subject)], key=_action_order):
                sign, style = _ACTION_STYLE[a.action]
                lines.append(
                    f"    {paint(f'{sign} {a.action}', style)} {a.index} {a.version} on "
                    f"{a.runtime_id} {paint(f'({a.reason})', 'dim')}"
                )
    if failures:
        lines.append(paint("Unplaceable", "bold"))
        grouped: dict[tuple[str, str], list[FailureRow]] = {}
        for f in failures:
            grouped.setdefault((f.item_id, f.subject_id), []).append(f)
        for item, subject in sorted(grouped):
            lines.append(f"  {item}:{subject}")
            for f in sorted(grouped[(item, subject)], key=lambda f: f.index):
                lines.extend(wrap_marked(paint, f"! {f.summary}", width, "    ", "!", "yellow"))
    starts = sum(1 for a in actions if a.action == "start")
    stops = len(actions) - starts
    if not actions:
        tail = f" {len(failures)} unplaceable." if failures else ""
        lines.extend(wrap(f"No changes.{tail}", width))
    else:
        lines.extend(
            wrap(
                f"Plan: {starts} to start, {stops} to stop; {len(failures)} unplaceable.",
                width,
            )
        )
    write_lines(console, lines)


def _action_order(a: Action) -> tuple[int, bool, str]:
    return (a.index, a.action != "stop", a.instance_id)


MATRIX_NODES = 20
"""At most this many nodes in ``explain``'s matrix unless every node is asked for."""

Row = tuple[str, tuple[str | None, ...], str | None]


def matrix_rows(exp: Explanation, limit: int | None) -> tuple[list[Row], list[Row]]:
    """(the rows ``explain`` shows, in node order; the rows it leaves out). With ``limit``
    (None: every row), the nodes closest to taking the instance: the node it is placed on,
    then the nodes failing the fewest filters (the feasible ones first, then the near misses
    a user would fix), in node order among equals."""
    rows = list(exp.rows)
    if limit is None or len(rows) <= limit:
        return rows, []
    placed_on = exp.placement.node_id if exp.placement is not None else None

    def rank(k: int) -> tuple[bool, int, int]:
        node_id, cells, _dropped = rows[k]
        return (node_id != placed_on, sum(c is not None for c in cells), k)

    keep = set(sorted(range(len(rows)), key=rank)[: max(limit, 0)])
    return (
        [r for k, r in enumerate(rows) if k in keep],
        [r for k, r in enumerate(rows) if k not in keep],
    )


def hidden_nodes_line(hidden: Sequence[Row]) -> str:
    """``"4,980 more nodes not shown: 2,480 feasible, 2,500 Labels (--all-nodes lists every
    node)"``: the rows left out, counted as the summary counts (a node by the filter that
    dropped it)."""
    counts = Counter(dropped for _node, _cells, dropped in hidden if dropped is not None)
    feasible = len(hidden) - counts.total()
    parts = [f"{feasible:,} feasible"] if feasible else []
    what = ", ".join(parts + [f"{n:,} {code}" for code, n in ordered_counts(counts)])
    return f"{len(hidden):,} more nodes not shown: {what} (--all-nodes lists every node)"


def render_explanation(
    console: TextConsole, exp: Explanation, limit: int | None = MATRIX_NODES
) -> None:
    """The instance's placement or failure, the nodes' summary, and the node x filter matrix
    (``limit``: at most that many nodes, see :func:`matrix_rows`; None: every node)."""
    paint = Painter(console)
    width = console.width
    inst = exp.instance
    lines = [f"{paint(inst.label, 'bold')} ({inst.id}), priority {inst.priority}"]
    if exp.placement is not None and exp.failure is not None:  # held
        p = exp.placement
        text = (
            f"held at {p.version} on {p.node_id} runtime {p.runtime_id}: its current spec "
            f"({inst.version}) places nowhere (below), so it keeps running as it was placed"
        )
        lines.extend(wrap_marked(paint, text, width, "", "held", "yellow"))
        text = f"unplaceable: {exp.failure.summary}"
        lines.extend(wrap_marked(paint, text, width, "", "unplaceable", "red"))
    elif exp.placement is not None:
        p = exp.placement
        text = f"placed on {p.node_id} runtime {p.runtime_id}"
        lines.extend(wrap_marked(paint, text, width, "", p.node_id, "green"))
        # (a failure's summary says it: "0/N nodes feasible: ...")
        lines.extend(wrap(nodes_feasible(*exp.feasibility()), width))
    elif exp.failure is not None:
        text = f"unplaceable: {exp.failure.summary}"
        lines.extend(wrap_marked(paint, text, width, "", "unplaceable", "red"))
    table = TextTable(
        [
            Column("node"),
            *(Column(code, _SHORT_CODES.get(code, code[:3]), right=False) for code in exp.filters),
            Column("dropped by", "dropped", min_width=7),
        ],
        sep=" ",
    )
    notes: list[str] = []
    shown, hidden = matrix_rows(exp, limit)
    for node_id, cells, dropped in shown:
        row: list[Cell] = [node_id]
        for code, why in zip(exp.filters, cells, strict=True):
            if why is None:
                row.append(("ok", "green"))
            else:
                row.append(("no", "red"))
                notes.append(f"{node_id} {code}: {why}")
        row.append(dropped or ("feasible", "green"))
        table.add_row(*row)
    rendered = table.render(width, paint)
    lines.extend(rendered)
    if hidden:
        lines.extend(paint(line, "dim") for line in wrap(hidden_nodes_line(hidden), width))
    if rendered and any(code not in rendered[0] for code in exp.filters):
        shorts = ((_SHORT_CODES.get(c, c[:3]), c) for c in exp.filters)
        legend = ", ".join(f"{short} {code}" for short, code in shorts if short != code)
        lines.extend(wrap(f"Filters: {legend}", width))
    for note in notes:
        lines.extend(wrap(note, width, "  "))
    lines.extend(_runtime_breakdown(exp, paint, width, {node_id for node_id, _, _ in shown}))
    write_lines(console, lines)


_SHORT_CODES = {
    "NodeState": "NSt",
    "NodeId": "NId",
    "Labels": "Lab",
    "Resources": "Res",
    "Devices": "Dev",
    "RuntimeType": "RTy",
    "Platform": "Plt",
    "Cpu": "Cpu",
    "Ram": "Ram",
    "Storage": "Sto",
    "State": "Sta",
    "MaxInstances": "Max",
}


def _runtime_breakdown(exp: Explanation, paint: Painter, width: int, shown: set[str]) -> list[str]:
    """Per runtime, the runtime filters that fail on it, for each node with several runtimes
    that a runtime filter drops, and for the node the instance is placed on: a node is
    feasible only when one runtime passes every runtime filter, so a node whose every column
    is ok can still be dropped (each filter passes on some runtime, none passes all)."""
    lines: list[str] = []
    runtime_filters = set(exp.runtime_filters)
    dropped_by = {node_id: dropped for node_id, _cells, dropped in exp.rows}
    placed_on = exp.placement.node_id if exp.placement is not None else None
    for node_id, runtimes in exp.runtimes:
        if node_id not in shown:  # (a row the matrix leaves out)
            continue
        telling = dropped_by.get(node_id) in runtime_filters or node_id == placed_on
        if len(runtimes) < 2 or not telling:
            continue
        if not lines:
            lines.append(paint("Per runtime", "bold") + " (nodes with several runtimes)")
        lines.append(f"  {node_id}")
        for runtime_id, cells in runtimes:
            failing = [
                f"{code} ({why})"
                for code, why in zip(exp.runtime_filters, cells, strict=True)
                if why is not None
            ]
            if failing:
                text = f"{runtime_id}: fails {'; '.join(failing)}"
                lines.extend(wrap_marked(paint, text, width, "    ", "fails", "red"))
            else:
                text = f"{runtime_id}: passes every runtime filter"
                lines.extend(wrap_marked(paint, text, width, "    ", "passes", "green"))
    return lines
