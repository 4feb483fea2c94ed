"""A big state directory grown from a small one: every benchmark's ``--state`` on a unit that
the generator did not make.

.venv/bin/python -m benchmarks.grow SOURCE DEST [--nodes 5000] [--instances 20000]

``SOURCE`` is any state directory (the bundled ``state/``, an ``examples/`` unit, your own).
Its nodes are copied until there are at least ``--nodes`` of them, and its services until they
ask at least ``--instances`` instances. Copy ``k`` of a node takes the id ``<id>-<k>`` (five
digits). The services are copied as the source's whole set of services, ``SUBJECTS`` (5) copies
to an item: copy ``k`` of a service is item ``<id>-<k // 5>`` (five digits), subject
``<subject>-<k % 5>``, so that a unit of 20,000 services stays within the 5,000 gids (one per
item) as a real fleet of tenants does. What a copy names follows it: its ``hostname`` takes
the suffix ``-<k>`` (each copy its own DNS name), an ``allowedConnections`` entry naming one
of the source's items names that item's copy of the same group (the copies of a group talk
to each other, as the source's services do), and a service naming its node (``nodeId``)
names copy ``k mod (the node copies)`` of that node; a unit.yaml entry for one node id gets
an entry per copy. Everything else is kept as written: node types, runtimes, partitions,
device pools, usage, a node's ``resourcesFile`` (every copy reads the one file), labels,
requests, quotas, named resources, devices, owners and ports. The node status, the actual
state, the checkpoint and ``out/`` are not copied (the grown unit starts where a first run
starts); ``rootfs/`` and ``resources/`` are linked, not copied.

Node files are written as one line of JSON each (valid YAML, as a node agent writes them),
services and unit.yaml as YAML in block style, under the same relative paths with the copy's
suffix. Deterministic: the same source and sizes give the same bytes.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

__all__ = ["grow"]

_LINKED = ("rootfs", "resources")
SUBJECTS = 5
"""Copies of the source's services per item (as subjects): see the module docstring."""


def _yaml() -> YAML:
    """The project's YAML library, safe types only, block style when it writes."""
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    return yaml


def _documents(root: Path, folder: str) -> list[tuple[Path, dict[str, Any]]]:
    """Each YAML document under ``root/folder``, by relative path (sorted)."""
    yaml = _yaml()
    out = []
    for path in sorted((root / folder).rglob("*")):
        if path.suffix in (".yaml", ".yml") and path.is_file():
            doc = yaml.load(path.read_text(encoding="utf-8"))
            if isinstance(doc, dict):
                out.append((path.relative_to(root), doc))
    return out


def _write(path: Path, doc: dict[str, Any], *, block: bool = False) -> None:
    """One line of JSON (as a node agent writes), or YAML in block style (as a person does)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not block:
        path.write_text(json.dumps(doc, sort_keys=True) + "\n", encoding="utf-8")
        return
    # (through JSON: copies share nested values, which would be written as aliases, and the
    # loader refuses aliases)
    with path.open("w", encoding="utf-8") as out:
        _yaml().dump(json.loads(json.dumps(doc)), out)


def _copy_path(rel: Path, k: int) -> Path:
    return rel.with_name(f"{rel.stem}-{k:05d}{rel.suffix}")


def _service_copy(doc: dict[str, Any], k: int, items: set[str], node_copies: int) -> dict[str, Any]:
    """Copy ``k`` of a service (see the module docstring)."""
    group = f"-{k // SUBJECTS:05d}"
    copy = {
        **doc,
        "id": f"{doc['id']}{group}",
        "subject": f"{doc.get('subject', 'default')}-{k % SUBJECTS}",
    }
    if doc.get("nodeId"):
        copy["nodeId"] = f"{doc['nodeId']}-{k % node_copies:05d}"
    if doc.get("hostname"):
        copy["hostname"] = f"{doc['hostname']}-{k:05d}"
    if doc.get("allowedConnections"):
        copy["allowedConnections"] = [
            f"{target}{group}/{rest}" if target in items else entry
            for entry in doc["allowedConnections"]
            for target, _, rest in [str(entry).partition("/")]
        ]
    return copy


def grow(source: Path, dest: Path, n_nodes: int, n_instances: int) -> dict[str, int]:
    """Write the grown state directory (see the module docstring); returns its sizes."""
    nodes = _documents(source, "nodes")
    services = _documents(source, "desired")
    if not nodes or not services:
        raise SystemExit(f"{source}: no nodes/ or no desired/ documents to grow from")
    node_copies = -(-n_nodes // len(nodes))
    per_copy = sum(int(doc.get("instances", 1)) for _, doc in services)
    service_copies = -(-n_instances // max(1, per_copy))
    dest.mkdir(parents=True)
    (dest / "actual").mkdir()  # (what the agents report: nothing yet)
    for name in _LINKED:
        if (source / name).exists():
            os.symlink((source / name).resolve(), dest / name)
    for rel, doc in nodes:
        for k in range(node_copies):
            _write(dest / _copy_path(rel, k), {**doc, "id": f"{doc['id']}-{k:05d}"})
    items = {str(doc["id"]) for _, doc in services}
    for rel, doc in services:
        for k in range(service_copies):
            _write(dest / _copy_path(rel, k), _service_copy(doc, k, items, node_copies), block=True)
    unit_path = source / "unit.yaml"
    if unit_path.exists():
        unit = _yaml().load(unit_path.read_text(encoding="utf-8"))
        entries = []
        for entry in unit.get("nodes") or []:
            if entry.get("nodeId"):
                entries += [
                    {**entry, "nodeId": f"{entry['nodeId']}-{k:05d}"} for k in range(node_copies)
                ]
            else:
                entries.append(entry)
        if entries:
            unit["nodes"] = entries
        _write(dest / "unit.yaml", unit, block=True)
    return {
        "nodes": node_copies * len(nodes),
        "services": service_copies * len(services),
        "instances": service_copies * per_copy,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("source", type=Path)
    parser.add_argument("dest", type=Path, help="a new directory")
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--instances", type=int, default=20000)
    args = parser.parse_args(argv)
    sizes = grow(args.source, args.dest, args.nodes, args.instances)
    print(json.dumps(sizes, sort_keys=True))


if __name__ == "__main__":
    main()
