"""Component instances' files in ``out/components/`` (SPEC §18).

A component (``type: component``: firmware, a rootfs, a boot image) gets no OCI config; its
node agent installs it with its runtime's ``handler``. For each placed component the controller
writes ``out/components/<instanceId>.json``: its identity, version, node, runtime, the handler
(argv, from the node's runtime entry) and the artifact (the image ``rootfs`` path, resolved
like a container's). Written atomically, only when the bytes change; files of components no
longer placed are removed."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reconciler.io.fsio import (
    Commit,
    FileReadError,
    atomic_write_many,
    ensure_dir,
    read_bytes_at,
)
from reconciler.model.documents import Node, Service
from reconciler.model.jsonbytes import pretty_json
from reconciler.model.values import validate_id
from reconciler.placement.instances import BalanceResult

__all__ = ["COMPONENTS_DIR", "component_documents", "write_component_files"]

COMPONENTS_DIR = "components"
_MAX = 1 << 20


def component_documents(
    state_dir: Path,
    services: Mapping[Any, Service],
    nodes: Mapping[str, Node],
    result: BalanceResult,
) -> dict[str, dict[str, Any]]:
    """Instance id → the component file's content, for every placed component."""
    by_key = {s.key: s for s in services.values()}
    root = state_dir.resolve()
    out: dict[str, dict[str, Any]] = {}
    for p in result.placements:
        service = by_key.get((p.item_id, p.subject_id))
        if service is None or service.type != "component":
            continue
        node = nodes.get(p.node_id)
        runtime = next((r for r in node.runtimes if r.id == p.runtime_id), None) if node else None
        rootfs = Path(service.image.rootfs)
        artifact = os.path.normpath(rootfs if rootfs.is_absolute() else root / rootfs)
        out[p.instance_id] = {
            "instanceId": p.instance_id,
            "itemId": p.item_id,
            "subjectId": p.subject_id,
            "index": p.index,
            "version": p.version,
            "nodeId": p.node_id,
            "runtimeId": p.runtime_id,
            "handler": list(runtime.handler) if runtime is not None else [],
            "artifact": artifact,
        }
    return out


def write_component_files(
    state_dir: Path,
    services: Mapping[Any, Service],
    nodes: Mapping[str, Node],
    result: BalanceResult,
    *,
    components: int | None = None,
    commit: Commit | None = None,
) -> list[str]:
    """Write ``out/components/``; returns what was written or removed (relative paths).
    ``components``: how many of ``services`` are components, when the caller has counted;
    ``commit``: the files join it (visible at its flush) instead of a commit of their own."""
    directory = state_dir / "out" / COMPONENTS_DIR
    if components is None:
        components = sum(1 for s in services.values() if s.type == "component")
    if not components and not directory.is_dir():
        return []  # (no component in the unit: no pass over the placements)
    docs = component_documents(state_dir, services, nodes, result)
    if not docs and not directory.is_dir():
        return []
    ensure_dir(directory)
    batch: list[tuple[Path, bytes, int]] = []
    for iid, doc in sorted(docs.items()):
        validate_id(iid, "instance id")
        path = directory / f"{iid}.json"
        data = pretty_json(doc)
        try:
            current, _ = read_bytes_at(path, _MAX)
        except FileReadError:
            current = None
        if current != data:
            batch.append((path, data, 0o644))
    atomic_write_many(batch, commit=commit)
    changed = [str(p.relative_to(state_dir)) for p, _d, _m in batch]
    for entry in sorted(os.listdir(directory)):
        if entry.endswith(".json") and entry[: -len(".json")] not in docs:
            os.unlink(directory / entry)
            changed.append(f"out/{COMPONENTS_DIR}/{entry}")
    return changed
