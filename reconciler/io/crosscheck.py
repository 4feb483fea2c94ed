"""Checks across input files, for ``validate``.

Each file is valid on its own (the loader checked it); these checks compare files with one
another and find what would only show later, as an instance that cannot be placed or run:

- a service label that no node has (warning: the service waits for such a node);
- a runtime type that no node offers (error);
- a node whose type (or id) has no entry in unit.yaml (warning: it gets the defaults);
- an image with neither entrypoint nor cmd (error: nothing to run; a component runs nothing);
- a requested amount above its quota (warning: the quota is requested instead);
- an allowed connection to an item no service has (error), or to a port no service of that
  item exposes (warning: the consumer fails with ``Network`` until one does).

The label and runtime checks need nodes to compare with: with no node file they are skipped.
:func:`cross_checks` is a pure function of the view; where each finding sits in its file is
asked of a :data:`Locate` function (:func:`file_locator` reads the files again).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from reconciler.io.fsio import FileReadError, read_bytes_at
from reconciler.io.loader import Diagnostic, Severity, StateView
from reconciler.io.yamlsafe import DEFAULT_MAX_BYTES, Parsed, YamlRejected, parse_yaml
from reconciler.io.yamlsafe import Path as DocPath
from reconciler.model.documents import Node, Service, UnitConfig
from reconciler.model.human import human_amount

__all__ = ["Locate", "cross_checks", "file_locator"]

Locate = Callable[[str, DocPath, bool], tuple[int, int]]
"""(file relative to the state directory, path in its document, prefer the key) → line, col."""

_D = TypeVar("_D", Service, Node)

DEFAULT_RUNTIMES: tuple[str, ...] = Service.model_fields["runtimes"].default

_REQUEST_QUOTAS = (
    ("cpu", "cpuDMIPSLimit"),
    ("ram", "ramLimit"),
    ("storage", "storageLimit"),
    ("state", "stateLimit"),
)


def cross_checks(view: StateView, locate: Locate) -> list[Diagnostic]:
    """Every finding across the files of ``view`` whose current content is valid."""
    out: list[Diagnostic] = []

    def report(rel: str, where: DocPath, severity: Severity, message: str, key: bool) -> None:
        line, col = locate(rel, where, key)
        out.append(Diagnostic(str(view.root / rel), line, col, message, severity))

    nodes = list(view.nodes.values())
    labels = _node_labels(view.unit, nodes)
    offered = {runtime.type for node in nodes for runtime in node.runtimes}
    exposed: dict[str, set[str]] = {}
    for s in view.services.values():
        exposed.setdefault(s.id, set()).update(str(p) for p in s.ports)
    for rel, service in _current(view, Service):
        _check_connections(rel, service, exposed, report)
        if nodes:
            for n, label in enumerate(service.labels):
                if label not in labels:
                    report(
                        rel,
                        ("labels", n),
                        "warning",
                        f"labels: no node has the label {label!r} (a node's labels come from "
                        "its unit.yaml entry): no instance can be placed until one has",
                        False,
                    )
            _check_runtimes(rel, service, offered, report)
        image = service.image
        if not image.entrypoint and not image.cmd and service.type != "component":
            report(
                rel,
                ("image",),
                "error",
                "image: neither entrypoint nor cmd is set: an instance would have nothing to run",
                True,
            )
        if not service.skipResourceLimits:
            for field, limit in _REQUEST_QUOTAS:
                want = getattr(service.requestedResources, field)
                cap = getattr(service.quotas, limit)
                if want is not None and cap is not None and want > cap:
                    report(
                        rel,
                        ("requestedResources", field),
                        "warning",
                        f"requestedResources.{field}: {human_amount(field, want)} is above "
                        f"quotas.{limit} ({human_amount(field, cap)}): "
                        "the quota is requested instead",
                        False,
                    )
    if view.unit is not None:
        for rel, node in _current(view, Node):
            if view.unit.config_for(node.id, node.type) is None:
                report(
                    rel,
                    ("type",),
                    "warning",
                    f"type: unit.yaml has no entry for nodeType {node.type!r} (nor for nodeId "
                    f"{node.id!r}): the node gets priority 0, no labels, the default resource "
                    "ratios and no alert rules",
                    False,
                )
    return out


def _check_runtimes(
    rel: str,
    service: Service,
    offered: set[str],
    report: Callable[[str, DocPath, Severity, str, bool], None],
) -> None:
    known = ", ".join(sorted(offered)) or "none"
    if "runtimes" in service.model_fields_set:
        for n, kind in enumerate(service.runtimes):
            if kind not in offered:
                message = f"runtimes: no node offers a runtime of type {kind!r} (offered: {known})"
                report(rel, ("runtimes", n), "error", message, False)
    elif not offered.intersection(service.runtimes):
        defaults = " or ".join(DEFAULT_RUNTIMES)
        message = (
            f"runtimes: no node offers a runtime of type {defaults}, the default when the "
            f"service names none (offered: {known})"
        )
        report(rel, ("id",), "error", message, True)


def _check_connections(
    rel: str,
    service: Service,
    exposed: dict[str, set[str]],
    report: Callable[[str, DocPath, Severity, str, bool], None],
) -> None:
    for n, conn in enumerate(service.connections):
        ports = exposed.get(conn.item_id)
        if ports is None:
            message = f"allowedConnections: no service has the item {conn.item_id!r}"
            report(rel, ("allowedConnections", n), "error", message, False)
        elif str(conn.spec) not in ports:
            message = (
                f"allowedConnections: no service of {conn.item_id!r} exposes {conn.spec} "
                f"(exposed: {', '.join(sorted(ports)) or 'none'}): the instances fail Network"
            )
            report(rel, ("allowedConnections", n), "warning", message, False)


def _node_labels(unit: UnitConfig | None, nodes: list[Node]) -> set[str]:
    if unit is None:
        return set()
    labels: set[str] = set()
    for node in nodes:
        entry = unit.config_for(node.id, node.type)
        if entry is not None:
            labels.update(entry.labels)
    return labels


def _current(view: StateView, kind: type[_D]) -> Iterator[tuple[str, _D]]:
    """The files whose current content is a valid ``kind`` document."""
    for rel, rec in view.files.items():
        if rec.current and isinstance(rec.good, kind):
            yield rel, rec.good


def file_locator(root: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> Locate:
    """A :data:`Locate` that parses each file of ``root`` again (once) for its positions;
    a file that cannot be read again (changed meanwhile) gives 1:1."""
    parsed: dict[str, Parsed | None] = {}

    def locate(rel: str, where: DocPath, prefer_key: bool) -> tuple[int, int]:
        if rel not in parsed:
            try:
                raw, _key = read_bytes_at(root / rel, max_bytes)
                parsed[rel] = parse_yaml(raw, max_bytes=max_bytes, engine="ruamel")
            except (FileReadError, YamlRejected):
                parsed[rel] = None
        doc = parsed[rel]
        return (1, 1) if doc is None else doc.position(where, prefer_key=prefer_key)

    return locate
