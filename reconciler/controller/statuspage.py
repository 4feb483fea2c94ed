"""The status page (SPEC §20): ``out/status.html`` and ``reconciler status --html FILE``.

:func:`render_status_page` is a pure function from the status report (the value
``out/status.json`` holds) and the time it was made to the bytes of one self-contained HTML
page: inline CSS, inline SVG bars, no script and no external asset. What it shows:

- a summary: instances by state, nodes by state, the fleet's CPU, RAM, storage and state
  reserved, in system use and free;
- the unplaceable instances with their summaries, the raised alerts and the invalid inputs,
  each a table;
- one table row per node with bars of reserved / system usage / free for CPU, RAM, storage,
  state and each device pool, and its instances, colored by state, folded in a ``<details>``.

Every bar is drawn for the eye only (``aria-hidden``) and said in text beside it, and every
table has a caption and header cells, so a screen reader reads the same page as a table. At
narrow widths (a phone) the node table's rows become stacked blocks whose cells are labelled by
CSS, without a byte more per row.

At 5,000 nodes by 20,000 instances the page is a few MB: a node row is built from its status
entry and its instances' records; with a :class:`PageMemo` a row is built again only when
one of those objects changed (a long-running controller hands the same objects while their
inputs are the same, see :func:`reconciler.controller.status.cached_status`).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any

__all__ = ["PageMemo", "page_source", "render_status_page"]

_SOURCE = b'<meta name="reconciler-report" content="'
"""The page's head names the report it was made from (see :func:`page_source`)."""

_STATE_ORDER = ("failed", "pending", "activating", "active")
"""States first in each node's list (the ones to look at), then any other by name."""

_CSS = """
:root{color-scheme:light dark;--bg:#fff;--fg:#1b1f23;--mut:#57606a;--line:#d0d7de;
--trk:#e6e9ed;--res:#2f6fdb;--sys:#b35900;--ok:#1a7f37;--bad:#cf222e;--wait:#6e7781;
--act:#8250df;--oth:#9a6700}
@media (prefers-color-scheme:dark){:root{--bg:#0d1117;--fg:#e6edf3;--mut:#9198a1;
--line:#30363d;--trk:#262c34;--res:#4c8df6;--sys:#e3882f;--ok:#3fb950;--bad:#f85149;
--wait:#8b949e;--act:#a371f7;--oth:#d29922}}
*{box-sizing:border-box}
body{margin:0 auto;max-width:1400px;padding:12px 16px;background:var(--bg);color:var(--fg);
font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif}
h1{font-size:1.5em;margin:.2em 0}h2{font-size:1.2em;margin:1.2em 0 .4em}
p.meta{color:var(--mut);margin:0 0 .6em}
nav a{margin-right:1em}
table{border-collapse:collapse;width:100%}
caption{text-align:left;color:var(--mut);padding:.2em 0}
th,td{border-bottom:1px solid var(--line);padding:4px 6px;text-align:left;vertical-align:top}
thead th{font-weight:600;border-bottom:2px solid var(--line)}
td.n{text-align:right;font-variant-numeric:tabular-nums}
code{font:12px ui-monospace,SFMono-Regular,Menlo,monospace;overflow-wrap:anywhere}
svg.b{display:block;width:100%;height:8px;background:var(--trk);border-radius:2px}
svg.b rect{height:100%}
.r{fill:var(--res)}.u{fill:var(--sys)}
small{color:var(--mut)}
.sw{display:inline-block;width:.8em;height:.8em;border-radius:2px;margin-right:.3em;
vertical-align:-.05em}
.k-r{background:var(--res)}.k-u{background:var(--sys)}.k-f{background:var(--trk)}
.s-active{--c:var(--ok)}.s-failed{--c:var(--bad)}.s-pending{--c:var(--wait)}
.s-activating{--c:var(--act)}.s-other{--c:var(--oth)}
.st{color:var(--c)}.st::before{content:"";display:inline-block;width:.7em;height:.7em;
border-radius:50%;background:var(--c);margin-right:.3em}
p.i{margin:.3em 0;overflow-wrap:anywhere;font-size:.9em}
th small{display:block;font-weight:400}
details summary{cursor:pointer}
table.nodes{table-layout:fixed}
table.nodes th:nth-child(1){width:14%}table.nodes th:nth-child(2){width:8%}
table.nodes th:nth-child(7){width:12%}table.nodes th:nth-child(8){width:22%}
.dv{margin-bottom:.3em}
.sum{display:grid;grid-template-columns:repeat(auto-fill,minmax(220px,1fr));gap:8px 24px}
.empty{color:var(--mut)}
@media (max-width:700px){
body{padding:8px}
table.nodes,table.nodes tbody,table.nodes tr,table.nodes td,table.nodes th{display:block;
width:auto!important}
table.nodes caption{display:block}
table.nodes thead{position:absolute;width:1px;height:1px;overflow:hidden;clip:rect(0 0 0 0)}
table.nodes tr{border:1px solid var(--line);border-radius:6px;margin:8px 0;padding:4px}
table.nodes td,table.nodes th{border:0;padding:2px 4px}
table.nodes td::before{display:block;color:var(--mut);font-size:.85em}
table.nodes td:nth-child(2)::before{content:"State"}
table.nodes td:nth-child(3)::before{content:"CPU"}
table.nodes td:nth-child(4)::before{content:"RAM"}
table.nodes td:nth-child(5)::before{content:"Storage"}
table.nodes td:nth-child(6)::before{content:"State partition"}
table.nodes td:nth-child(7)::before{content:"Devices"}
table.nodes td:nth-child(8)::before{content:"Instances"}
.wide{overflow-x:auto}
}
"""


Totals = dict[tuple[str, str], int]
"""What the summary adds up, by (what, which): a node's share of it (see :func:`_share`)."""

_Row = tuple[Mapping[str, Any], list[tuple[str, Mapping[str, Any]]], bytes, Totals]
"""A node's row: its status entry and instances (id, record), the row's HTML, its share."""


class PageMemo:
    """What :func:`render_status_page` made of each node last time: its row, with the status
    entry and the instance records it was made from (compared by identity: equal objects
    made again are built again, which costs time, never correctness)."""

    def __init__(self) -> None:
        self._rows: dict[str, _Row] = {}
        self._totals: Totals | None = None  # the summary's, over the rows
        self.rebuilt = 0  # in the last call: node rows built again
        self.source: str | None = None  # the report digest of the page last written (the shell's)


def page_source(head: bytes) -> str | None:
    """The report digest a page's first bytes name (``render_status_page``'s ``source``)."""
    at = head.find(_SOURCE)
    if at < 0:
        return None
    start = at + len(_SOURCE)
    end = head.find(b'"', start)
    return head[start:end].decode("ascii", "replace") if end > 0 else None


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _pct(part: int, total: int) -> str:
    if total <= 0:
        return "0%"
    p = part * 100 / total
    if 0 < p < 1:
        return "<1%"
    if 99 < p < 100:
        return ">99%"
    return f"{p:.0f}%"


def _num(value: int, unit: str) -> str:
    if unit == "B":
        for suffix, size in (
            ("TiB", 1 << 40),
            ("GiB", 1 << 30),
            ("MiB", 1 << 20),
            ("KiB", 1 << 10),
        ):
            if value >= size:
                return f"{value / size:.1f} {suffix}"
        return f"{value} B"
    return f"{value:,} {unit}" if unit else f"{value:,}"


def _bar(reserved: int, system: int, free: int, unit: str, *, words: str = "reserved") -> str:
    """An SVG bar (reserved, system usage, free) and the same in words."""
    total = reserved + system + free
    if total <= 0:
        return '<span class="empty">none</span>'
    r = reserved * 100 / total
    svg = f'<svg class="b" aria-hidden="true"><rect class="r" width="{r:.1f}%"/>'
    text = f"{_pct(reserved, total)} {words}"
    if system:
        svg += f'<rect class="u" x="{r:.1f}%" width="{system * 100 / total:.1f}%"/>'
        text += f", {_pct(system, total)} system"
    return f"{svg}</svg>{text} of {_num(total, unit)}"


def _inv_bar(inv: Any, system: int, unit: str) -> str:
    if not isinstance(inv, Mapping):
        return '<span class="empty">none</span>'
    return _bar(int(inv["reserved"]), system, max(0, int(inv["free"])), unit)


def _pool_bars(devices: Mapping[str, Any]) -> str:
    parts = []
    for resource, pool in devices.items():
        total, healthy, allocated = int(pool["total"]), int(pool["healthy"]), int(pool["allocated"])
        unhealthy = max(0, total - healthy)
        free = max(0, healthy - allocated)
        bar = _bar(allocated, unhealthy, free, "", words="allocated")
        if unhealthy:
            bar = bar.replace(" system", " unhealthy", 1)
        parts.append(
            f'<div class="dv">{_e(resource)} <small>({_e(pool["policy"])})</small>{bar}</div>'
        )
    return "".join(parts) or '<span class="empty">none</span>'


def _first(item: tuple[str, object]) -> str:
    return item[0]


def _state_class(state: str) -> str:
    return f"s-{state}" if state in _STATE_ORDER else "s-other"


def _by_state(records: Sequence[tuple[str, Mapping[str, Any]]]) -> list[tuple[str, list[Any]]]:
    groups: dict[str, list[tuple[str, Mapping[str, Any]]]] = {}
    for iid, rec in records:
        groups.setdefault(str(rec.get("state", "unknown")), []).append((iid, rec))
    order = {s: i for i, s in enumerate(_STATE_ORDER)}
    return sorted(groups.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0]))


def _counts_text(groups: Sequence[tuple[str, Sequence[object]]]) -> str:
    return ", ".join(
        f'<span class="st {_state_class(s)}">{len(items)} {_e(s)}</span>' for s, items in groups
    )


def _node_row(
    node_id: str, entry: Mapping[str, Any], records: Sequence[tuple[str, Mapping[str, Any]]]
) -> tuple[bytes, Totals]:
    system = entry.get("systemUsage") or {}
    parts = entry.get("partitions") or {}
    nid = _e(node_id)
    state = _e(entry.get("state", ""))
    if entry.get("connected") is False:
        state += " <small>disconnected</small>"
    cells = [
        f'<tr id="node-{nid}"><th scope="row">{nid} <small>{_e(entry.get("type", ""))}</small>'
        f"</th><td>{state}</td>",
        f"<td>{_inv_bar(entry.get('cpu'), int(system.get('cpu', 0)), 'DMIPS')}</td>",
        f"<td>{_inv_bar(entry.get('ram'), int(system.get('ram', 0)), 'B')}</td>",
        f"<td>{_inv_bar(parts.get('storage'), 0, 'B')}</td>",
        f"<td>{_inv_bar(parts.get('state'), 0, 'B')}</td>",
        f"<td>{_pool_bars(entry.get('devices') or {})}</td>",
    ]
    if not records:
        cells.append('<td><span class="empty">no instances</span></td></tr>')
        return "".join(cells).encode(), _share(entry, ())
    groups = _by_state(sorted(records, key=_first))
    n = len(records)
    lists = []
    for state_name, items in groups:  # one paragraph per state: few elements at 20,000
        text = ", ".join(
            f"{_e(rec.get('itemId', ''))}/{_e(rec.get('subjectId', ''))}"
            f"#{_e(rec.get('index', ''))} ({_e(iid)})"
            for iid, rec in items
        )
        lists.append(f'<p class="i st {_state_class(state_name)}">{_e(state_name)}: {text}</p>')
    cells.append(
        f"<td><details><summary>{n} instance{'s' if n != 1 else ''}: {_counts_text(groups)}"
        f"</summary>{''.join(lists)}</details></td></tr>"
    )
    return "".join(cells).encode(), _share(entry, groups)


def _table(caption: str, headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    head = "".join(f'<th scope="col">{h}</th>' for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return (
        f'<div class="wide"><table><caption>{caption}</caption><thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table></div>"
    )


def _failures(failures: Sequence[Mapping[str, Any]]) -> str:
    if not failures:
        return '<p class="empty">Every instance is placed.</p>'
    rows = (
        (
            f"<code>{_e(f.get('instanceId', ''))}</code>",
            f"{_e(f.get('itemId', ''))}/{_e(f.get('subjectId', ''))}#{_e(f.get('index', ''))}",
            _e(f.get("reason", "")),
            _e(f.get("summary", "")),
        )
        for f in failures
    )
    return _table(
        "Instances no node can take, with why", ("Instance", "Service", "Reason", "Summary"), rows
    )


def _alerts(alerts: Sequence[Mapping[str, Any]]) -> str:
    if not alerts:
        return '<p class="empty">No alert is raised.</p>'
    rows = (
        (
            f'<a href="#node-{_e(a.get("node", ""))}"><code>{_e(a.get("node", ""))}</code></a>',
            _e(a.get("resource", "")),
            _e(a.get("since", "")),
            f"{_e(a.get('usage', ''))}%",
        )
        for a in alerts
    )
    return _table("Raised load alerts", ("Node", "Resource", "Since", "Usage"), rows)


def _invalid(invalid: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    if not invalid:
        return '<p class="empty">Every input file is valid.</p>'
    rows = (
        (
            f"<code>{_e(path)}:{_e(d.get('line', ''))}:{_e(d.get('col', ''))}</code>",
            _e(d.get("severity", "")),
            _e(d.get("message", "")),
        )
        for path, diags in invalid.items()
        for d in diags
    )
    return _table(
        "Input files with errors (the last good version of each is used)",
        ("Where", "Severity", "Message"),
        rows,
    )


_RESOURCES = (
    ("CPU", "cpu", "DMIPS"),
    ("RAM", "ram", "B"),
    ("Storage", "storage", "B"),
    ("State", "state", "B"),
)


def _share(entry: Mapping[str, Any], groups: Sequence[tuple[str, Sequence[object]]]) -> Totals:
    """One node's share of the summary: its state, its reserved / system / free amounts, its
    device pools' allocated / unhealthy / free devices, and its instances by state."""
    share: Totals = {("node", str(entry.get("state", ""))): 1}
    system = entry.get("systemUsage") or {}
    parts = entry.get("partitions") or {}
    for key, inv in (
        ("cpu", entry.get("cpu")),
        ("ram", entry.get("ram")),
        ("storage", parts.get("storage")),
        ("state", parts.get("state")),
    ):
        if isinstance(inv, dict):
            share[(key, "r")] = int(inv["reserved"])
            share[(key, "s")] = int(system.get(key, 0))
            share[(key, "f")] = max(0, int(inv["free"]))
    for resource, pool in (entry.get("devices") or {}).items():
        total, healthy, allocated = int(pool["total"]), int(pool["healthy"]), int(pool["allocated"])
        share[("pool " + resource, "r")] = allocated
        share[("pool " + resource, "s")] = max(0, total - healthy)
        share[("pool " + resource, "f")] = max(0, healthy - allocated)
    for state, items in groups:
        share[("instances", state)] = len(items)
    return share


def _add(totals: Totals, share: Totals, sign: int) -> None:
    for key, value in share.items():
        totals[key] = totals.get(key, 0) + sign * value


def _summary(totals: Totals, n_nodes: int, n_failed: int) -> str:
    def get(what: str, which: str) -> int:
        return totals.get((what, which), 0)

    states = sorted((k[1], n) for k, n in totals.items() if k[0] == "instances" and n)
    node_states = sorted((k[1], n) for k, n in totals.items() if k[0] == "node" and n)
    pools = sorted({k[0] for k in totals if k[0].startswith("pool ")})
    placed = sum(n for _, n in states)
    inst = ", ".join(f'<span class="st {_state_class(s)}">{n} {_e(s)}</span>' for s, n in states)
    bars = [
        (name, _bar(get(key, "r"), get(key, "s"), get(key, "f"), unit))
        for name, key, unit in _RESOURCES
    ]
    for pool in pools:
        u = get(pool, "s")
        bar = _bar(get(pool, "r"), u, get(pool, "f"), "", words="allocated")
        bars.append((_e(pool[5:]), bar.replace(" system", " unhealthy", 1) if u else bar))
    cells = "".join(f"<div><b>{name}</b>{bar}</div>" for name, bar in bars)
    node_text = ", ".join(f"{n} {_e(s)}" for s, n in node_states)
    return (
        f"<p>{placed + n_failed} instances desired: {placed} placed"
        f"{' (' + inst + ')' if inst else ''}, "
        f'<a href="#unplaceable">{n_failed} unplaceable</a>. '
        f"{n_nodes} nodes{' (' + node_text + ')' if node_text else ''}.</p>"
        '<p><span class="sw k-r"></span>reserved <span class="sw k-u"></span>system usage '
        '(devices: unhealthy) <span class="sw k-f"></span>free</p>'
        f'<div class="sum">{cells}</div>'
    )


def render_status_page(
    status: Mapping[str, Any],
    *,
    made_at: float,
    memo: PageMemo | None = None,
    source: str | None = None,
) -> bytes:
    """The page of ``status`` (the status report's value), made at ``made_at`` (seconds since
    the epoch). Raises KeyError, TypeError or ValueError on a value not shaped like a report.
    ``memo``: rows of the last call, reused for nodes whose entry and instance records are
    the same objects. ``source``: a digest of the report, named in the page's head (how a
    run tells that the page on disk was made from the report it has)."""
    nodes: Mapping[str, Mapping[str, Any]] = status["nodes"]
    instances: Mapping[str, Mapping[str, Any]] = status["instances"]
    failures: Sequence[Mapping[str, Any]] = status.get("failures", [])
    alerts: Sequence[Mapping[str, Any]] = status.get("alerts", [])
    invalid: Mapping[str, Sequence[Mapping[str, Any]]] = status.get("invalidInputs", {})

    on_node: dict[str, list[tuple[str, Mapping[str, Any]]]] = {}
    for item in instances.items():
        node_id = item[1]["nodeId"]
        got_list = on_node.get(node_id)
        if got_list is None:
            on_node[node_id] = [item]
        else:
            got_list.append(item)

    old = memo._rows if memo is not None else {}
    # the summary's totals: the last call's, less the shares of rows made again, plus theirs
    known = memo is not None and memo._totals is not None
    totals: Totals = dict(memo._totals) if memo is not None and memo._totals is not None else {}
    rows: dict[str, _Row] = {}
    rebuilt = 0
    empty: list[tuple[str, Mapping[str, Any]]] = []
    for node_id in sorted(nodes):
        entry = nodes[node_id]
        recs = on_node.get(node_id, empty)
        got = old.get(node_id)
        if got is None or got[0] is not entry or got[1] != recs:
            new = (entry, recs, *_node_row(node_id, entry, recs))
            if known and got is not None:
                _add(totals, got[3], -1)
            _add(totals, new[3], 1)
            got = new
            rebuilt += 1
        elif not known:
            _add(totals, got[3], 1)
        rows[node_id] = got
    if known:
        for gone in old.keys() - rows.keys():
            _add(totals, old[gone][3], -1)
    if memo is not None:
        memo._rows, memo._totals = rows, totals
        memo.rebuilt = rebuilt

    made = datetime.datetime.fromtimestamp(made_at, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    n_nodes = len(nodes)
    head = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        + (f'{_SOURCE.decode()}{_e(source)}">' if source is not None else "")
        + f"<title>reconciler status: {n_nodes} nodes, {len(failures)} unplaceable</title>"
        f"<style>{_CSS}</style></head><body>"
        f'<header><h1>Unit status</h1><p class="meta">Made <time datetime="{made}">{made}</time>'
        " by reconciler from the last reconcile&#8217;s status report.</p>"
        '<nav aria-label="Sections"><a href="#summary">Summary</a>'
        f'<a href="#unplaceable">Unplaceable ({len(failures)})</a>'
        f'<a href="#alerts">Alerts ({len(alerts)})</a>'
        f'<a href="#invalid">Invalid inputs ({len(invalid)})</a>'
        f'<a href="#nodes">Nodes ({n_nodes})</a></nav></header><main>'
        f'<section id="summary"><h2>Summary</h2>{_summary(totals, n_nodes, len(failures))}'
        "</section>"
        f'<section id="unplaceable"><h2>Unplaceable instances ({len(failures)})</h2>'
        f"{_failures(failures)}</section>"
        f'<section id="alerts"><h2>Alerts ({len(alerts)})</h2>{_alerts(alerts)}</section>'
        f'<section id="invalid"><h2>Invalid inputs ({len(invalid)})</h2>'
        f"{_invalid(invalid)}</section>"
        f'<section id="nodes"><h2>Nodes ({n_nodes})</h2>'
        '<table class="nodes"><caption>Per node: CPU, RAM, storage, state and device pools '
        "(reserved, system usage, free), and its instances by state (open a row&#8217;s list to "
        'see them)</caption><thead><tr><th scope="col">Node</th><th scope="col">State</th>'
        '<th scope="col">CPU</th><th scope="col">RAM</th><th scope="col">Storage</th>'
        '<th scope="col">State partition</th><th scope="col">Devices</th>'
        '<th scope="col">Instances</th></tr></thead><tbody>'
    )
    tail = "</tbody></table></section></main></body></html>\n"
    return b"".join([head.encode(), *[r[2] for r in rows.values()], tail.encode()])
