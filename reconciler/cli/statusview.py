"""``reconciler status`` in text: a summary, the nodes, and the instances when asked.

The summary comes first (when the report was made; nodes per state; instances per state;
unplaceable instances per reason; alerts; invalid inputs), then the node table with each node's
last agent report age. Instances are listed when the unit is small (at most
:data:`~reconciler.cli.render.SMALL_UNIT` of them), with ``--instances`` or with any filter:
on a large unit they would be tens of thousands of lines.

Filters (each repeatable; values of one filter are alternatives, different filters all apply):
``--node ID``, ``--service ITEM[:SUBJECT]``, ``--state STATE`` (an instance state) and
``--failed`` (failed instances and unplaceable ones)."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from reconciler.cli.render import SMALL_UNIT
from reconciler.cli.statusopts import INSTANCE_STATES
from reconciler.cli.suggest import did_you_mean
from reconciler.cli.textout import (
    Cell,
    Column,
    Painter,
    TextTable,
    wrap,
    wrap_marked,
    write_lines,
)
from reconciler.controller.reports import age_text

__all__ = [
    "INSTANCE_STATES",
    "StatusFilter",
    "StatusFilterError",
    "actual_file_mtime",
    "render_status",
]


_STATE_STYLE = {"active": "green", "failed": "red", "pending": "yellow"}


class StatusFilterError(ValueError):
    """A filter names nothing in the report (the message says what would)."""


@dataclass(frozen=True)
class StatusFilter:
    nodes: tuple[str, ...] = ()
    services: tuple[str, ...] = ()  # ITEM or ITEM:SUBJECT
    states: tuple[str, ...] = ()
    failed: bool = False
    instances: bool = False  # list the instances even unfiltered on a large unit

    @property
    def active(self) -> bool:
        return bool(self.nodes or self.services or self.states or self.failed)

    def check(self, doc: Mapping[str, Any]) -> None:
        """Raises StatusFilterError for a node, service or state the report does not know."""
        for node in self.nodes:
            if node not in doc["nodes"]:
                raise StatusFilterError(_unknown("node", node, doc["nodes"]))
        known = _services(doc) if self.services else set()
        for svc in self.services:
            if svc not in known:
                raise StatusFilterError(_unknown("service", svc, known))
        for state in self.states:
            if state not in INSTANCE_STATES:
                raise StatusFilterError(
                    f"unknown instance state {state!r}; the states are "
                    f"{', '.join(INSTANCE_STATES)}" + did_you_mean(state, INSTANCE_STATES)
                )

    def keeps(self, record: Mapping[str, Any]) -> bool:
        if self.nodes and record["nodeId"] not in self.nodes:
            return False
        if self.services and not _in_services(record, self.services):
            return False
        if self.states and record["state"] not in self.states:
            return False
        return not self.failed or record["state"] == "failed"

    def keeps_failure(self, failure: Mapping[str, Any]) -> bool:
        if self.nodes or self.states:  # an unplaceable instance is on no node, in no state
            return False
        return not self.services or _in_services(failure, self.services)


def _in_services(record: Mapping[str, Any], services: Sequence[str]) -> bool:
    item = record["itemId"]
    return item in services or f"{item}:{record['subjectId']}" in services


def _services(doc: Mapping[str, Any]) -> set[str]:
    known: set[str] = set()
    for r in (*doc["instances"].values(), *doc["failures"]):
        known.add(r["itemId"])
        known.add(f"{r['itemId']}:{r['subjectId']}")
    return known


def _unknown(what: str, word: str, choices: Iterable[str]) -> str:
    return f"no {what} {word!r} in the status report" + did_you_mean(word, choices)


def actual_file_mtime(state_dir: Path) -> Callable[[str], float | None]:
    """Per node id, the modification time of its actual/<id>.yaml (.yml, .json), or None
    (the directory is listed once, on the first question)."""
    actual = state_dir / "actual"
    times: dict[str, float] = {}
    listed = False

    def mtime(node_id: str) -> float | None:
        nonlocal listed
        if not listed:
            listed = True
            try:
                with os.scandir(actual) as entries:
                    for e in entries:
                        if e.is_file(follow_symlinks=False):
                            times[e.name] = e.stat(follow_symlinks=False).st_mtime
            except OSError:
                pass
        for ext in (".yaml", ".yml", ".json"):
            got = times.get(f"{node_id}{ext}")
            if got is not None:
                return got
        return None

    return mtime


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _parse_iso(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def render_status(
    console: Console,
    doc: Mapping[str, Any],
    *,
    made_at: float | None = None,
    now: float | None = None,
    file_mtime: Callable[[str], float | None] = lambda _node: None,
    select: StatusFilter = StatusFilter(),
) -> None:
    """The summary, the nodes, and the instances (see the module's docstring). ``made_at``:
    when the report was written; ``file_mtime``: a node's actual/ file's time, for the nodes
    whose report has no reportedAt."""
    paint = Painter(console)
    now = time.time() if now is None else now
    width = console.width
    lines = [w for line in _summary(doc, made_at, now) for w in wrap(line, width)]
    if lines and made_at is not None:
        lines[0] = lines[0].replace("Status", paint("Status", "bold"), 1)
    instances = doc["instances"]
    picked = [r for r in instances.values() if select.keeps(r)] if select.active else []
    if select.nodes:
        node_ids = sorted(select.nodes)
    elif select.active:
        node_ids = sorted({r["nodeId"] for r in picked})
    else:
        node_ids = list(doc["nodes"])
    lines.append("")
    lines.extend(_node_table(doc["nodes"], node_ids, now, file_mtime, paint, width))
    show = select.active or select.instances or len(instances) <= SMALL_UNIT
    if show:
        if not select.active:
            picked = list(instances.values())
        lines.append("")
        lines.extend(_instance_table(picked, paint, width))
    elif instances:
        lines.append("")
        lines.extend(
            wrap(
                f"{len(instances)} instances: list them with --instances, or pick some with "
                "--node, --service, --in-state or --failed.",
                width,
            )
        )
    failures = [f for f in doc["failures"] if select.keeps_failure(f)]
    if failures and (select.active or len(failures) <= SMALL_UNIT):
        lines.append("")
        lines.append(paint("Unplaceable", "bold"))
        for f in failures:
            lines.extend(wrap_marked(paint, f"! {f['summary']}", width, "  ", "!", "yellow"))
    elif failures:
        lines.append("")
        lines.append(f"{len(failures)} unplaceable instances: list them with --failed.")
    if doc.get("alerts"):
        lines.append("")
        lines.append(paint("Alerts", "bold"))
        for a in doc["alerts"]:
            raised = f"{a['node']} {a['resource']}"
            text = f"{raised} raised since {a['since']}"
            lines.extend(wrap_marked(paint, text, width, "  ", raised, "red"))
    if doc.get("invalidInputs"):
        lines.append("")
        lines.append(paint("Invalid inputs", "bold") + " (their last good version is in use)")
        for errors in doc["invalidInputs"].values():
            for e in errors:
                text = f"{e['path']}:{e['line']}:{e['col']}: {e['message']}"
                lines.extend(wrap(text, width, "  "))
    write_lines(console, lines)


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{k} {n}" for k, n in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])))


def _summary(doc: Mapping[str, Any], made_at: float | None, now: float) -> list[str]:
    lines = []
    if made_at is not None:
        age = age_text(max(0.0, now - made_at))
        lines.append(f"Status made {_iso(made_at)} ({age} ago, by the last reconcile)")
    nodes = doc["nodes"].values()
    node_states = Counter(
        n["state"] if n["connected"] else f"{n['state']} (disconnected)" for n in nodes
    )
    lines.append(
        f"Nodes: {len(doc['nodes'])}" + (f": {_counts(node_states)}" if node_states else "")
    )
    states = Counter(r["state"] for r in doc["instances"].values())
    lines.append(f"Instances: {len(doc['instances'])}" + (f": {_counts(states)}" if states else ""))
    reasons = Counter(f["reason"] for f in doc["failures"])
    lines.append(
        f"Unplaceable: {len(doc['failures'])}" + (f": {_counts(reasons)}" if reasons else "")
    )
    alerts = doc.get("alerts") or []
    raised = Counter(a["resource"] for a in alerts)
    lines.append(f"Alerts: {len(alerts)}" + (f": {_counts(raised)}" if raised else ""))
    invalid = doc.get("invalidInputs") or {}
    if invalid:
        lines.append(f"Invalid inputs: {len(invalid)} file(s)")
    return lines


def _bytes(n: int) -> str:
    for unit, size in (("Gi", 1024**3), ("Mi", 1024**2), ("Ki", 1024)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def _amount(entry: Mapping[str, Any] | None, as_bytes: bool = False) -> str:
    if entry is None:
        return "-"
    fmt = _bytes if as_bytes else str
    shown = f"{fmt(entry['reserved'])}/{fmt(entry['capacity'])}"
    beyond = entry.get("overcommitted")
    if beyond:
        ratio = entry["inventory"]["allocationRatio"]
        shown += f" (overcommitted x{ratio:g}: {fmt(beyond)} beyond the node's)"
    return shown


def _report_age(
    node_id: str, n: Mapping[str, Any], now: float, file_mtime: Callable[[str], float | None]
) -> tuple[str, bool]:
    """The age of the node's last agent report, and whether it is the file's time."""
    at = n.get("reportedAt")
    ts = _parse_iso(at) if isinstance(at, str) else None
    if ts is not None:
        return age_text(max(0.0, now - ts)), False
    mtime = file_mtime(node_id)
    if mtime is None:
        return "-", False
    return age_text(max(0.0, now - mtime)) + "*", True


def _node_table(
    nodes: Mapping[str, Any],
    node_ids: Sequence[str],
    now: float,
    file_mtime: Callable[[str], float | None],
    paint: Painter,
    width: int,
) -> list[str]:
    table = TextTable(
        [
            Column("node"),
            Column("type", min_width=4),
            Column("state", min_width=5),
            Column("prio", "pri", right=True),
            Column("cpu", min_width=4),
            Column("ram", min_width=4),
            Column("storage", "stor", min_width=4),
            Column("state dir", "sdir", min_width=4),
            Column("instances", "inst", right=True),
            Column("devices (allocated/healthy/total)", "devices", min_width=7),
            Column("last report", "report", min_width=4, right=True),
        ]
    )
    from_files = False
    for node_id in node_ids:
        n = nodes[node_id]
        state = n["state"] if n["connected"] else f"{n['state']} (disconnected)"
        devices = ", ".join(
            f"{r}: {d['allocated']}/{d['healthy']}/{d['total']}" for r, d in n["devices"].items()
        )
        age, from_file = _report_age(node_id, n, now, file_mtime)
        from_files = from_files or from_file
        table.add_row(
            node_id,
            n["type"],
            state if n["connected"] else (state, "red"),
            str(n["priority"]),
            _amount(n["cpu"]),
            _amount(n["ram"], True),
            _amount(n["partitions"]["storage"], True),
            _amount(n["partitions"]["state"], True),
            str(n["instances"]),
            devices,
            age,
        )
    lines = [paint(f"Nodes ({len(node_ids)}, reserved/capacity)", "bold")]
    lines.extend(table.render(width, paint))
    note = "last report: the age of the agent's reportedAt"
    if from_files:
        note += "; * the age of the node's actual/ file (its agent writes no reportedAt)"
    lines.extend(paint(chunk, "dim") for chunk in wrap(note, width, hang=""))
    return lines


def _restarts(instance: Mapping[str, Any]) -> str:
    """The restart count, with how its container last ended."""
    count = instance.get("restartCount", 0)
    last = instance.get("lastExit")
    if not count and last is None:
        return "0"
    return f"{count} (last: {last['reason']} at {last['at']})" if last else str(count)


def _instance_table(records: Sequence[Mapping[str, Any]], paint: Painter, width: int) -> list[str]:
    table = TextTable(
        [
            Column("instance"),
            Column("version", "ver", min_width=5),
            Column("node", min_width=6),
            Column("runtime", "rt", min_width=4),
            Column("state", min_width=6),
            Column("restarts", "rst", min_width=3),
            Column("devices", "dev", min_width=5),
        ]
    )
    reasons: list[str] = []
    for i in sorted(records, key=lambda r: (r["nodeId"], r["itemId"], r["subjectId"], r["index"])):
        devices = "; ".join(f"{r}={','.join(ids)}" for r, ids in i["devices"].items())
        if i.get("unhealthyDevices"):
            devices += f" (unhealthy: {','.join(i['unhealthyDevices'])})"
        state: Cell = (i["state"], _STATE_STYLE.get(i["state"], ""))
        name = f"{i['itemId']}:{i['subjectId']}:{i['index']}"
        table.add_row(name, i["version"], i["nodeId"], i["runtimeId"], state, _restarts(i), devices)
        if i["state"] == "failed" and i.get("reason"):
            reasons.extend(wrap(f"{name} on {i['nodeId']}: {i['reason']}", width, "  "))
    lines = [paint(f"Instances ({len(records)})", "bold")]
    if records:
        lines.extend(table.render(width, paint))
    else:
        lines.append("  none")
    if reasons:
        lines.append("")
        lines.append(paint("Failed instances", "bold"))
        lines.extend(reasons)
    return lines
