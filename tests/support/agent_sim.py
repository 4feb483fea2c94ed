"""A stand-in node agent for tests: applies out/nodes/<id>.json to actual/<id>.yaml."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonpatch

from reconciler.io.yamlsafe import parse_yaml
from reconciler.planning.plans import empty_actual_document


def read_actual(state: Path, node_id: str) -> dict[str, Any]:
    path = state / "actual" / f"{node_id}.yaml"
    if not path.exists():
        return empty_actual_document(node_id)
    data = parse_yaml(path.read_bytes()).data
    assert isinstance(data, dict)
    return data


def apply_all(state: Path, *, mark_active: bool = True) -> int:
    """Apply every node patch as an agent would; returns the number of operations applied."""
    applied = 0
    (state / "actual").mkdir(exist_ok=True)
    for patch_file in sorted((state / "out" / "nodes").glob("*.json")):
        node_id = patch_file.stem
        ops = json.loads(patch_file.read_text())
        if len(ops) <= 1:
            continue  # only the revision test: nothing to do on this node
        doc = read_actual(state, node_id)
        new = jsonpatch.apply_patch(doc, ops)
        new["revision"] = doc["revision"] + 1
        if mark_active:
            for record in new["instances"].values():
                record["state"] = "active"
        text = json.dumps(new, indent=2, sort_keys=True) + "\n"  # JSON is YAML 1.2
        (state / "actual" / f"{node_id}.yaml").write_text(text)
        applied += len(ops) - 1
    return applied
