"""``reconciler explain``'s lookups: an instance or a whole item by what the user typed, the
ids a misspelled one was likely meant to be, and the view of an item's instances."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from reconciler.cli.suggest import closest
from reconciler.cli.textout import Column, Painter, TextTable, wrap, write_lines
from reconciler.io.loader import FileRecord
from reconciler.model.documents import Service, UnitConfig
from reconciler.model.values import instance_id
from reconciler.placement.balancer import Explanation
from reconciler.placement.instances import (
    BalanceResult,
    Instance,
    expand_instances,
    service_order,
)
from reconciler.planning.network import assign_networks
from reconciler.planning.plans import failure_json

__all__ = [
    "ItemView",
    "find_instance",
    "find_item",
    "item_json",
    "item_view",
    "render_item",
    "runtime_json",
    "suggestions",
]


def find_instance(
    services: Sequence[Service],
    needle: str,
    by_key: Mapping[tuple[str, str], Service] | None = None,
) -> str | None:
    """The id of the instance ``needle`` names: its id, ITEM:SUBJECT:INDEX, or ITEM:INDEX (the
    first such instance in placement order, whatever its subject); None when none.

    Ids hold no ``:``, so a needle with one is a label: its service is looked up and only that
    id computed, rather than every instance's (20,000 uuid5 hashes at 5,000 x 20,000);
    ``by_key``: the services by (item, subject), for ITEM:SUBJECT:INDEX without a scan."""
    parts = needle.split(":")
    if len(parts) == 1:
        return next((i.id for i in expand_instances(list(services)) if i.id == needle), None)
    index, subject = parts[-1], parts[1] if len(parts) == 3 else None
    if len(parts) > 3 or not index.isdecimal() or index != str(int(index)):
        return None
    n = int(index)
    if subject is not None and by_key is not None:  # (ITEM:SUBJECT:INDEX: one service)
        service = by_key.get((parts[0], subject))
        if service is None or n >= service.instances:
            return None
        return instance_id(service.id, service.subject, n)
    named = [
        s
        for s in services
        if s.id == parts[0] and (subject is None or s.subject == subject) and n < s.instances
    ]
    if not named:
        return None
    first = min(named, key=service_order)
    return instance_id(first.id, first.subject, n)


def find_item(services: Sequence[Service], needle: str) -> list[Instance]:
    """The instances of the item ``needle`` names (ITEM, or ITEM:SUBJECT), in index order;
    empty when it names no item."""
    return [
        i
        for i in expand_instances(list(services))
        if needle in (i.item_id, f"{i.item_id}:{i.subject_id}")
    ]


def item_of_file(
    files: Mapping[str, FileRecord], needle: str, state_dir: str
) -> tuple[str, Service] | None:
    """(the file, its service) when ``needle`` names a desired file rather than an id: its path
    (relative to the state directory or to the working directory), or its name under
    ``desired/`` with or without ``.yaml``/``.yml`` (``navigation`` for
    ``desired/navigation.yaml``); None when it names none, or one with no valid service."""
    rel = os.path.relpath(os.path.abspath(needle), os.path.abspath(state_dir))
    if rel.startswith("../"):  # not under the state directory: a name
        rel = needle
    tried = [rel, f"desired/{rel}"]
    tried += [f"{t}{ext}" for t in tried[:2] for ext in (".yaml", ".yml")]
    for path in tried:
        rec = files.get(path)
        if rec is not None and path.startswith("desired/") and isinstance(rec.good, Service):
            return path, rec.good
    return None


def suggestions(services: Sequence[Service], needle: str, n: int = 3) -> list[str]:
    """The desired ids closest to ``needle``: items, ITEM:SUBJECT, and instances in the
    forms explain accepts (ITEM:SUBJECT:INDEX, ITEM:INDEX for the default subject)."""
    names: set[str] = set()
    for i in expand_instances(list(services)):
        names.update((i.item_id, f"{i.item_id}:{i.subject_id}", i.label))
        if i.subject_id == "default":
            names.add(f"{i.item_id}:{i.index}")
    shaped = sorted(name for name in names if name.count(":") == needle.count(":"))
    for pool in (shaped, sorted(names)):  # first the ids of the same form as the needle
        close = closest(needle, pool, n)
        if close:
            return close
    # a part of an id: "logger" for com.example.logger
    parts = [name for name in shaped if needle.lower() in name.lower()][:n]
    if parts:
        return parts
    # a misspelt last part of a dotted item id: "telemetri" for com.example.telemetry (the
    # whole id, a long shared prefix, is too far from it to be close)
    short: dict[str, list[str]] = {}
    for name in shaped:
        item, sep, rest = name.partition(":")
        short.setdefault(item.rsplit(".", 1)[-1] + sep + rest, []).append(name)
    return sorted(full for name in closest(needle, short, n) for full in short[name])[:n]


@dataclass(frozen=True)
class ItemView:
    """Where each instance of an item is, or why it has no place."""

    needle: str
    instances: tuple[Instance, ...]
    result: BalanceResult
    network_failures: Mapping[str, str]  # instance id -> why the network phase fails it


def item_view(
    needle: str,
    instances: Sequence[Instance],
    unit: UnitConfig | None,
    services: Sequence[Service],
    result: BalanceResult,
    network: Mapping[str, Any],
) -> ItemView:
    """An item's instances in ``result``, the unit's balance as reconcile makes it, with the
    network phase after placement (``network``: the checkpoint's network state)."""
    failed = assign_networks(unit, services, result, network).failures
    wanted = {i.id for i in instances}
    nets = {iid: why for iid, why in failed.items() if iid in wanted}
    return ItemView(needle, tuple(instances), result, nets)


def _where(view: ItemView, inst: Instance) -> tuple[str, str]:
    """(the instance's state word, where it is or why it is not)."""
    failure = next((f for f in view.result.failures if f.instance_id == inst.id), None)
    p = view.result.by_id.get(inst.id)
    net = view.network_failures.get(inst.id)
    if net is not None:
        return "unplaceable", f"network: {net}"
    if p is not None and failure is not None:
        return "held", (
            f"on {p.node_id} runtime {p.runtime_id} at {p.version}; its current spec "
            f"places nowhere: {_why(failure.summary, inst)}"
        )
    if p is not None:
        return "placed", f"on {p.node_id} runtime {p.runtime_id}"
    if failure is not None:
        return "unplaceable", _why(failure.summary, inst)
    return "unplaceable", "no place"


def _why(summary: str, inst: Instance) -> str:
    prefix = f"{inst.item_id}:{inst.subject_id}:{inst.index}: "
    return summary.removeprefix(prefix)


def render_item(console: Console, view: ItemView) -> None:
    paint = Painter(console)
    styles = {"placed": "green", "held": "yellow", "unplaceable": "red"}
    table = TextTable(
        [Column("instance"), Column("state", min_width=6), Column("where, or why not", "where")]
    )
    counts: dict[str, int] = {}
    for inst in view.instances:
        state, where = _where(view, inst)
        counts[state] = counts.get(state, 0) + 1
        table.add_row(
            f"{inst.item_id}:{inst.subject_id}:{inst.index}", (state, styles[state]), where
        )
    total = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    lines = [f"{paint(view.needle, 'bold')}: {len(view.instances)} instance(s): {total}"]
    lines.extend(table.render(console.width, paint))
    hint = "explain ITEM:SUBJECT:INDEX (or ITEM:INDEX) shows one instance's node x filter matrix"
    lines.extend(paint(line, "dim") for line in wrap(hint, console.width))
    write_lines(console, lines)


def item_json(view: ItemView) -> dict[str, Any]:
    out = []
    failures = {f.instance_id: f for f in view.result.failures}
    for inst in view.instances:
        p = view.result.by_id.get(inst.id)
        failure = failures.get(inst.id)
        net = view.network_failures.get(inst.id)
        state, where = _where(view, inst)
        out.append(
            {
                "instanceId": inst.id,
                "label": inst.label,
                "state": state,
                "placement": None
                if p is None or net is not None
                else {
                    "nodeId": p.node_id,
                    "runtimeId": p.runtime_id,
                    "version": p.version,
                    "held": failure is not None,
                },
                "failure": None if failure is None else failure_json(failure),
                "network": net,
                "why": None if state == "placed" else where,
            }
        )
    return {"item": view.needle, "instances": out}


def runtime_json(exp: Explanation) -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
    """Per node, per runtime, per runtime filter: whether it passes and why not."""
    return {
        node_id: {
            runtime_id: {
                code: {"pass": why is None, "reason": why}
                for code, why in zip(exp.runtime_filters, cells, strict=True)
            }
            for runtime_id, cells in runtimes
        }
        for node_id, runtimes in exp.runtimes
    }
