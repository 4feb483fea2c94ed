"""Last good versions of input files, kept on disk for the oneshot controller (SPEC §5).

A watcher keeps the last good version of every input in memory: a file that becomes invalid
keeps its previous object. A path-activated oneshot process starts with nothing in memory, so
without help a desired file broken by a bad edit would read as "service absent" and its running
instances would be stopped. ``checkpoint/last-good/`` therefore holds, per input file, the last
version that validated (as the typed document, resources files resolved), written whenever a
file's valid content changes and removed when the file is deleted. The loader consults it only
for a file that is present but invalid and that no in-memory view knows.

Entries are named by the sha256 of the file's path relative to the state directory, so no input
name ever becomes a path here.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .fsio import FileReadError, WriteHook, atomic_write_many, ensure_dir, read_bytes_at
from .loader import Doc, StateView
from .models import ActualState, Node, Service, UnitConfig

__all__ = ["LastGoodStore"]

_MODELS: dict[str, type[UnitConfig] | type[Service] | type[Node] | type[ActualState]] = {
    "unit.yaml": UnitConfig,
    "desired": Service,
    "nodes": Node,
    "actual": ActualState,
}
_MAX = 16 * 1024 * 1024
INDEX = "index.json"  # input path -> sha256 of the content whose entry is stored


def _name(rel: str) -> str:
    return hashlib.sha256(rel.encode()).hexdigest()[:40] + ".json"


def _model_for(rel: str) -> type[UnitConfig] | type[Service] | type[Node] | type[ActualState]:
    return _MODELS["unit.yaml"] if rel == "unit.yaml" else _MODELS[rel.split("/", 1)[0]]


def _dump(doc: Doc) -> dict[str, Any]:
    data = doc.model_dump(mode="json")
    if isinstance(doc, Node) and doc.resourcesFile is not None:
        data["resourcesFile"] = None  # resolved: the resources are inline now
        data["resources"] = data["resources"] or []
    return data


class LastGoodStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def get(self, rel: str) -> Doc | None:
        """The last good version of ``rel``, or None (never raises)."""
        try:
            raw, _ = read_bytes_at(self.directory / _name(rel), _MAX)
            entry = json.loads(raw)
            if entry.get("path") != rel:
                return None
            return _model_for(rel).model_validate(entry["document"])
        except (FileReadError, ValueError, KeyError, TypeError, ValidationError):
            return None

    def _index(self) -> dict[str, str]:
        try:
            raw, _ = read_bytes_at(self.directory / INDEX, _MAX)
            index = json.loads(raw)
        except (FileReadError, ValueError):
            return {}
        if not isinstance(index, dict):
            return {}
        return {str(k): str(v) for k, v in index.items()}

    def sync(self, view: StateView, hook: WriteHook | None = None) -> int:
        """Record every file whose current content is valid; forget deleted files.
        Only entries whose input changed are written (one batch), then the index.
        Returns the number of entries written or removed."""
        ensure_dir(self.directory)
        old = self._index()
        index = {rel: sha for rel, sha in old.items() if rel in view.files}
        batch: list[tuple[Path, bytes, int]] = []
        for rel, rec in sorted(view.files.items()):
            if not rec.current or rec.good is None:
                continue  # invalid now: the entry keeps the last good version
            if old.get(rel) == rec.sha256:
                continue
            entry = {"path": rel, "sha256": rec.sha256, "document": _dump(rec.good)}
            data = (json.dumps(entry, sort_keys=True, separators=(",", ":")) + "\n").encode()
            batch.append((self.directory / _name(rel), data, 0o600))
            index[rel] = rec.sha256
        removed = 0
        for rel in sorted(set(old) - set(index)):
            with contextlib.suppress(FileNotFoundError):
                (self.directory / _name(rel)).unlink()
                removed += 1
        if batch or removed or index != old:
            index_bytes = (json.dumps(index, sort_keys=True, indent=0) + "\n").encode()
            batch.append((self.directory / INDEX, index_bytes, 0o600))
        atomic_write_many(batch, hook=hook)
        return len(batch) - (1 if batch else 0) + removed
