"""Small input documents and state-directory edits written by hand: node, service, actual and
unit texts to ``format``, :func:`write` to put one in place, and :func:`inline_resources` to move
the demo's resources file into its node."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from hypothesis import strategies as st


def inline_resources(state: Path) -> Path:
    """Move edge-1's resources file inline (SPEC §6.2 allows either form)."""
    node = state / "nodes" / "edge-1.yaml"
    entries = json.loads((state / "resources" / "edge-1.json").read_text())
    text = node.read_text()
    assert "resourcesFile: resources/edge-1.json" in text
    node.write_text(
        text.replace("resourcesFile: resources/edge-1.json", "resources: " + json.dumps(entries))
    )
    return state


NODE = """apiVersion: reconciler/v1
kind: Node
id: {id}
type: t
maxDMIPS: 1000
totalRAM: 1Gi
"""

SERVICE = """apiVersion: reconciler/v1
kind: Service
id: {id}
version: {version}
image: {{rootfs: /r}}
"""

RUNC_NODE = """apiVersion: reconciler/v1
kind: Node
id: {id}
type: edge
maxDMIPS: {dmips}
totalRAM: 64Gi
runtimes:
  - {{id: runc, type: runc, platform: {{architecture: x86_64}}}}
"""
"""A node with one runc runtime (``format`` it with ``id`` and ``dmips``)."""


def write(root: Path, rel: str, text: str | bytes) -> Path:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, str):
        text = text.encode()
    p.write_bytes(text)
    return p


ACTUAL = """apiVersion: reconciler/v1
kind: ActualState
nodeId: {id}
revision: {rev}
"""

UNIT = """apiVersion: reconciler/v1
kind: UnitConfig
placement: {mode}
"""


def seed_three(root: Path) -> None:
    """Services s0-s2, nodes n0-n2 and their actual documents (revision 0)."""
    for i in range(3):
        write(root, f"desired/s{i}.yaml", SERVICE.format(id=f"s{i}", version="1.0.0"))
        write(root, f"nodes/n{i}.yaml", NODE.format(id=f"n{i}"))
        write(root, f"actual/n{i}.yaml", ACTUAL.format(id=f"n{i}", rev=0))


def edit_batches(kinds: Sequence[str]) -> st.SearchStrategy[list[list[tuple[str, int, int]]]]:
    """Up to 8 batches of 1-3 edits (kind, which file 0-3, which variant 0-2): the edit
    sequences the loader's change and hint tests replay."""
    edit = st.tuples(st.sampled_from(kinds), st.integers(0, 3), st.integers(0, 2))
    return st.lists(st.lists(edit, min_size=1, max_size=3), min_size=1, max_size=8)
