"""Last good versions of input files, kept on disk for the oneshot controller (SPEC §5).

A watcher keeps the last good version of every input in memory: a file that becomes invalid
keeps its previous object. A path-activated oneshot process starts with nothing in memory, so
without help a desired file broken by a bad edit would read as "service absent" and its running
instances would be stopped. ``checkpoint/last-good/`` therefore holds, per input file, the last
version that validated (as the typed document, resources files resolved), written whenever a
file's valid content changes and removed when the file is deleted. The loader consults it only
for a file that is present but invalid and that no in-memory view knows.

Layout (format 2): the entries are spread over at most 256 shard files, ``shard-XX.json`` where
``XX`` is the low byte of the CRC-32 of the input's path relative to the state directory (so no
input name ever becomes a path here), each rewritten only when one of its entries changes, all
of a sync's in one durable batch (each shard old or new after a crash, never torn). A cold run
writes a few hundred files instead of one per input, and a change rewrites one shard of about
1/256 of the store. A shard is a JSON document laid out one entry per line so that its index can
be read alone, and an entry found, kept or replaced without parsing the others::

    {"format":2,"index":{"desired/a.yaml":"<version>",...},"entries":[
    {"document":{...},"path":"desired/a.yaml","version":"<version>"},
    ...
    ]}

where the ``index`` lists the entries in the order of the lines that follow, and an entry's
version is the sha256 of the input's content (with that of its resources file for a node that
names one). ``manifest.json``, written last, seals each shard: the sha256 of its first line and
its size. A sync without a memo reads every shard's first line, and reads whole only a shard
that changes or whose seal does not match (a damaged shard is rebuilt from the view, keeping
its entries that are whole); a :class:`LastGoodMemo` compares the manifest to the one it left
to know that nobody else changed the store since.

The layout before format 2 (a file per input named by the hash of its path, and ``index.json``)
is still read, and is converted by the first :meth:`LastGoodStore.sync`.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import operator
import os
import re
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson
from pydantic import ValidationError

from reconciler.io.fsio import (
    Commit,
    FileReadError,
    WriteHook,
    atomic_write_many,
    ensure_dir,
    read_bytes_at,
)
from reconciler.io.loader import Doc, FileRecord, StateView
from reconciler.model.documents import ActualState, Node, Service, UnitConfig

__all__ = ["LastGoodMemo", "LastGoodStore"]

_MODELS: dict[str, type[UnitConfig] | type[Service] | type[Node] | type[ActualState]] = {
    "unit.yaml": UnitConfig,
    "desired": Service,
    "nodes": Node,
    "actual": ActualState,
}
_MAX = 16 * 1024 * 1024  # a legacy entry
_MAX_SHARD = 1024 * 1024 * 1024
_HEAD_READ = 16 * 1024  # bytes read to find a shard's first line (its index)
FORMAT = 2
MANIFEST = "manifest.json"
_HEAD = b'{"format":2,"index":'
_OPEN = b',"entries":['
_CLOSE = b"]}"

LEGACY_INDEX = "index.json"  # format 1: input path -> sha256 of the content whose entry is stored
_LEGACY_ENTRY = re.compile(r"[0-9a-f]{40}\.json")


_HEX = [f"{b:02x}" for b in range(256)]


def shard_of(rel: str) -> str:
    """The shard (two hex digits) that holds ``rel``'s entry: the low byte of the CRC-32 of
    the path (stable across processes and versions, unlike ``hash``, and cheap)."""
    return _HEX[zlib.crc32(rel.encode()) & 0xFF]


def _shard_name(shard: str) -> str:
    return f"shard-{shard}.json"


def _legacy_name(rel: str) -> str:
    return hashlib.sha256(rel.encode()).hexdigest()[:40] + ".json"


def _model_for(rel: str) -> type[UnitConfig] | type[Service] | type[Node] | type[ActualState]:
    return _MODELS["unit.yaml"] if rel == "unit.yaml" else _MODELS[rel.split("/", 1)[0]]


def _version(rec: FileRecord) -> str:
    """What the entry of a current record is a function of: the file's content and, for a node
    with a resources file, that file's content."""
    return f"{rec.sha256}+{rec.deps_sha256}" if rec.deps_sha256 else rec.sha256


def _document_json(doc: Doc) -> bytes:
    if isinstance(doc, Node) and doc.resourcesFile is not None:
        # resolved: the resources are inline now
        doc = doc.model_copy(update={"resourcesFile": None, "resources": doc.resources or ()})
    return doc.model_dump_json().encode()


def _entry_line(rel: str, version: str, document: bytes) -> bytes:
    """One entry, on one line (JSON escapes every control character inside strings)."""
    return b"".join(
        (
            b'{"document":',
            document,
            b',"path":',
            orjson.dumps(rel),
            b',"version":',
            orjson.dumps(version),
            b"}",
        )
    )


class _Shard:
    """A shard's entries, by path (sorted when written): version and entry line."""

    __slots__ = ("entries", "head")

    def __init__(self, entries: dict[str, tuple[str, bytes]], head: bytes | None) -> None:
        self.entries = entries
        self.head = head  # the first line of a whole shard as read (None: no file, damaged)

    @staticmethod
    def parse(data: bytes) -> _Shard:
        """The entries of ``data`` that are whole and that its index lists; ``head`` is None
        unless the shard is whole (every entry, in a well-formed document)."""
        lines = data.split(b"\n")
        index = _parse_head(lines[0]) or {}
        body = lines[1:-2]
        whole = (
            bool(index)
            and len(body) == len(index)
            and lines[-2:] == [_CLOSE, b""]
            and all(line.endswith(b",") for line in body[:-1])
            and not body[-1].endswith(b",")
        )
        entries: dict[str, tuple[str, bytes]] = {}
        for line in lines[1:]:
            line = line.removesuffix(b",")
            try:
                entry = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(entry, dict) or "document" not in entry:
                continue
            rel, version = entry.get("path"), entry.get("version")
            if not isinstance(rel, str) or rel in entries:
                continue
            if isinstance(version, str) and index.get(rel) == version:
                entries[rel] = (version, line)
        whole = whole and len(entries) == len(index)
        return _Shard(entries, lines[0] if whole else None)

    def encode(self) -> tuple[bytes, bytes]:
        """(the shard's bytes, its first line)."""
        rels = sorted(self.entries)
        index = {rel: self.entries[rel][0] for rel in rels}
        head = _HEAD + orjson.dumps(index) + _OPEN
        body = b",\n".join(self.entries[rel][1] for rel in rels)
        return b"".join((head, b"\n", body, b"\n", _CLOSE, b"\n")), head


def _parse_head(head: bytes) -> dict[str, str] | None:
    """A shard's index from its first line (None: not a shard's first line)."""
    if not (head.startswith(_HEAD) and head.endswith(_OPEN)):
        return None
    try:
        index = orjson.loads(head[len(_HEAD) : -len(_OPEN)])
    except orjson.JSONDecodeError:
        return None
    if not isinstance(index, dict):
        return None
    return index  # (a version that is not a string never equals one: its entry is replaced)


def _digest(head: bytes) -> str:
    return hashlib.sha256(head).hexdigest()


Seal = tuple[str, int]
"""What the manifest records of a shard: the sha256 of its first line (its index), its size."""


def _manifest_bytes(seals: Mapping[str, Seal]) -> bytes:
    return orjson.dumps(
        {"format": FORMAT, "shards": {s: list(seals[s]) for s in sorted(seals)}},
        option=orjson.OPT_APPEND_NEWLINE,
    )


def _parse_manifest(raw: bytes | None) -> dict[str, Seal]:
    """The seals a manifest records ({} if there is none or it is not one)."""
    try:
        data = orjson.loads(raw) if raw is not None else None
        shards = data.get("shards") if isinstance(data, dict) else None
        if not isinstance(shards, dict):
            return {}
        return {str(k): (str(v[0]), int(v[1])) for k, v in shards.items()}
    except (orjson.JSONDecodeError, TypeError, ValueError, IndexError, KeyError):
        return {}


class LastGoodMemo:
    """What the last :meth:`LastGoodStore.sync` given this memo left in its directory, held by
    a long-running caller (``watch``) from one run to the next: the view's files it recorded
    (by identity) and each shard's seal (the manifest's content).

    The next sync uses it only if the manifest on disk is still the one that sync left (a sync
    of another process that changes anything rewrites it); a sync that fails leaves it empty.
    With it, a sync looks only at the inputs whose :class:`~reconciler.io.loader.FileRecord` is
    not the very object it recorded last time (the loader hands out the same record for an
    unchanged file) and at the inputs that are gone, and reads and rewrites only their shards;
    without it, every shard's first line is read. It holds a reference to the last view's
    ``files`` and a seal per shard."""

    def __init__(self) -> None:
        self._directory: str | None = None
        self._manifest: bytes | None = None  # the manifest's bytes as the last sync left them
        self._files: Mapping[str, FileRecord] = {}
        self._seals: dict[str, Seal] = {}
        self.looked_at = 0  # in the last sync: inputs checked against their shard

    def __len__(self) -> int:
        return len(self._files)

    def _take(
        self, directory: str, manifest: bytes | None
    ) -> tuple[Mapping[str, FileRecord], dict[str, Seal]] | None:
        """(the files, the seals) if the memo describes ``directory`` as it is; the memo is
        left empty either way (a sync fills it again once it completed)."""
        valid = self._directory == directory and manifest is not None and self._manifest == manifest
        taken = (self._files, self._seals) if valid else None
        self._directory = self._manifest = None
        self._files, self._seals = {}, {}
        return taken


class LastGoodStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._path = str(directory)

    # ------------------------------------------------------------------------------ reading

    def _read(self, name: str, limit: int) -> bytes | None:
        """The file's bytes (None: missing, unreadable, or over ``limit`` bytes)."""
        got = self._read_sized(name, limit, prefix=False)
        return got[0] if got is not None else None

    def _read_sized(self, name: str, limit: int, *, prefix: bool) -> tuple[bytes, int] | None:
        """The file's bytes and size (None: missing or unreadable; over ``limit`` bytes too,
        unless ``prefix``: then its first ``limit`` + 1 bytes whatever its size)."""
        try:
            raw, key = read_bytes_at(f"{self._path}/{name}", limit)
        except FileReadError:
            return None
        return (raw, key[2]) if prefix or len(raw) <= limit else None

    def _shard(self, shard: str) -> tuple[_Shard, int] | None:
        """A shard and its size (None: no shard, or unreadable)."""
        got = self._read_sized(_shard_name(shard), _MAX_SHARD, prefix=False)
        return (_Shard.parse(got[0]), got[1]) if got is not None else None

    def _head(self, shard: str) -> tuple[bytes, dict[str, str], int] | None:
        """A shard's first line, index and size, without reading its entries (None: no
        shard, or not one this module wrote)."""
        got = self._read_sized(_shard_name(shard), _HEAD_READ, prefix=True)
        if got is None:
            return None
        raw, size = got
        end = raw.find(b"\n")
        if end < 0 and len(raw) > _HEAD_READ:  # a long first line
            whole = self._read(_shard_name(shard), _MAX_SHARD)
            raw, end = (whole, whole.find(b"\n")) if whole is not None else (b"", -1)
        if end < 0:
            return None
        index = _parse_head(raw[:end])
        return None if index is None else (raw[:end], index, size)

    def get(self, rel: str) -> Doc | None:
        """The last good version of ``rel``, or None (never raises)."""
        raw = self._read(_shard_name(shard_of(rel)), _MAX_SHARD)
        if raw is None:
            return None if os.path.lexists(self.directory / MANIFEST) else self._legacy_get(rel)
        lines = raw.split(b"\n")
        index = _parse_head(lines[0])
        if index is None or rel not in index:
            return None
        k = list(index).index(rel) + 1  # its line (a damaged line elsewhere does not matter)
        if k >= len(lines):
            return None
        try:
            entry = json.loads(lines[k].removesuffix(b","))
            if entry.get("path") != rel or entry.get("version") != index[rel]:
                return None
            return _model_for(rel).model_validate(entry["document"])
        except (ValueError, KeyError, TypeError, AttributeError, ValidationError):
            return None

    def under(self, prefix: str) -> dict[str, Doc]:
        """The last good version of every input whose path starts with ``prefix`` (a
        directory's, ending in ``/``), for a directory that cannot be read: every shard is
        read (never raises; an entry that does not parse or validate is left out)."""
        if not os.path.lexists(self.directory / MANIFEST):
            index = self._legacy_index() or {}
            legacy = ((r, self._legacy_get(r)) for r in sorted(index) if r.startswith(prefix))
            return {rel: doc for rel, doc in legacy if doc is not None}
        try:
            present, _, _ = self._list()
        except OSError:
            return {}
        out: dict[str, Doc] = {}
        for shard in sorted(present):
            got = self._shard(shard)
            if got is None:
                continue
            for rel, (_version, line) in got[0].entries.items():
                if not rel.startswith(prefix):
                    continue
                try:
                    out[rel] = _model_for(rel).model_validate(orjson.loads(line)["document"])
                except (ValueError, KeyError, TypeError, ValidationError):
                    continue
        return out

    def _legacy_index(self) -> dict[str, str] | None:
        """The format-1 index (None: there is none)."""
        raw = self._read(LEGACY_INDEX, _MAX)
        if raw is None:
            return None
        try:
            index = json.loads(raw)
        except ValueError:
            return {}
        if not isinstance(index, dict):
            return {}
        return {str(k): str(v) for k, v in index.items()}

    def _legacy_entry(self, rel: str) -> dict[str, Any] | None:
        raw = self._read(_legacy_name(rel), _MAX)
        if raw is None:
            return None
        try:
            entry = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(entry, dict) or entry.get("path") != rel or "document" not in entry:
            return None
        return entry

    def _legacy_get(self, rel: str) -> Doc | None:
        """A format-1 entry, while the format-1 index is there (until the first sync)."""
        index = self._legacy_index()
        if index is None or rel not in index:
            return None
        entry = self._legacy_entry(rel)
        if entry is None:
            return None
        try:
            return _model_for(rel).model_validate(entry["document"])
        except (ValueError, TypeError, ValidationError):
            return None

    # ------------------------------------------------------------------------------ writing

    def sync(
        self,
        view: StateView,
        hook: WriteHook | None = None,
        memo: LastGoodMemo | None = None,
        commit: Commit | None = None,
    ) -> int:
        """Record every file whose current content is valid; forget deleted files; an invalid
        file keeps the entry it has. Only the shards whose entries change are written (one
        batch, the manifest last). Returns the number of entries written or removed.

        ``memo`` (held by the caller across runs, see :class:`LastGoodMemo`) limits the work
        to the inputs whose records changed since the sync that last used it. ``commit``: the
        shards and the manifest join it (visible at its flush, the caller's) instead of a
        commit of their own."""
        ensure_dir(self.directory)
        directory = str(self.directory)
        manifest = self._read(MANIFEST, _MAX)
        files = view.files
        legacy: dict[str, str] | None = None
        had_legacy = False
        gone: list[str] = []
        taken = memo._take(directory, manifest) if memo is not None else None
        suspect: set[str] = set()  # shards to read whole: damaged, or not the manifest's
        if taken is not None:
            # the inputs whose record is not the one recorded last time, and those gone
            last, recorded = taken
            index = view.records_memo
            named = None
            if index is not None and index.source is files:
                named = index.replaced_since(last)
            if index is not None and named is not None:
                # the loads since named them (the same paths): in ``files`` order, as below
                changed = sorted(
                    (rel for rel in named if files[rel] is not last.get(rel)),
                    key=index.at.__getitem__,
                )
            else:
                flags = map(operator.is_not, files.values(), map(last.get, files))
                changed = list(itertools.compress(files, flags))
            known = sum(1 for rel in changed if rel in last)
            # a new record of the very content last recorded (a file parsed again, e.g.
            # written within the racy window) needs no look at its shard: that sync wrote
            # the entry of this version, and the manifest says nothing changed since
            candidates = [rel for rel in changed if not _same_entry(last.get(rel), files[rel])]
            if len(last) != len(files) - len(changed) + known:
                gone = [rel for rel in last if rel not in files]
            present = set(recorded)
        else:
            present, stray, had_legacy = self._list()
            for name in stray:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f"{directory}/{name}")
            if manifest is None:  # no sync of this format completed yet
                legacy = self._legacy_index()
            recorded = _parse_manifest(manifest)
            stored: dict[str, str] = {}  # every entry's version, from the shards' indexes
            for shard in present:
                head = self._head(shard)
                if head is None or recorded.get(shard) != (_digest(head[0]), head[2]):
                    suspect.add(shard)
                else:
                    stored.update(head[1])
            candidates = _stale(files, stored, legacy)
            gone = list(stored.keys() - files.keys())
            if suspect:  # every input of theirs is looked at
                candidates += [r for r in files if r not in stored and shard_of(r) in suspect]
            recorded = {s: recorded[s] for s in present - suspect if s in recorded}
        seals = dict(recorded)
        by_shard: dict[str, list[str]] = {}
        for rel in candidates:
            by_shard.setdefault(shard_of(rel), []).append(rel)
        touched = by_shard.keys() | {shard_of(rel) for rel in gone} | suspect

        batch: list[tuple[Path, bytes, int]] = []
        emptied: list[str] = []
        changes = 0
        for shard in sorted(touched):
            rels = by_shard.get(shard, ())
            if shard in present and shard not in suspect:
                head = self._head(shard)
                # the shard as the manifest records it (else read whole: it may be damaged)
                if (
                    head is not None
                    and recorded.get(shard) == (_digest(head[0]), head[2])
                    and _up_to_date(head[1], rels, files, legacy)
                ):
                    continue  # as it is
            got = self._shard(shard) if shard in present else None
            old, size = got if got is not None else (_Shard({}, None), 0)
            new, n = _update(old.entries, rels, files, legacy, self)
            changes += n
            if not new:
                seals.pop(shard, None)
                if shard in present:
                    emptied.append(shard)
            elif old.head is not None and n == 0 and len(new) == len(old.entries):
                seals[shard] = (_digest(old.head), size)  # as it is
            else:
                data, first = _Shard(new, None).encode()
                seals[shard] = (_digest(first), len(data))
                batch.append((self.directory / _shard_name(shard), data, 0o600))
        manifest_now = _manifest_bytes(seals)
        for shard in emptied:  # its inputs were deleted: removed before the batch (old or new)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{directory}/{_shard_name(shard)}")
        if batch or manifest_now != manifest:
            batch.append((self.directory / MANIFEST, manifest_now, 0o600))
        atomic_write_many(batch, hook=hook, commit=commit)
        if had_legacy:
            self._drop_legacy()
        if memo is not None:
            memo._directory, memo._manifest = directory, manifest_now
            memo._files, memo._seals = files, seals
            memo.looked_at = len(candidates) + len(gone) if taken is not None else len(files)
        return changes

    def _list(self) -> tuple[set[str], list[str], bool]:
        """(the shards present, format-1 entries left without their index, whether the
        format-1 index is there)."""
        shards: set[str] = set()
        stray: list[str] = []
        legacy = os.path.lexists(self.directory / LEGACY_INDEX)
        with os.scandir(self.directory) as it:
            for e in it:
                name = e.name
                if name.startswith("shard-") and name.endswith(".json") and len(name) == 13:
                    shards.add(name[6:8])
                elif not legacy and _LEGACY_ENTRY.fullmatch(name):
                    stray.append(name)
        return shards, stray, legacy

    def _drop_legacy(self) -> None:
        """Remove the format-1 files, once their content is in the shards: the index first
        (it is what makes :meth:`get` consult them), then the entries."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.directory / LEGACY_INDEX)
        with os.scandir(self.directory) as it:
            names = [e.name for e in it if _LEGACY_ENTRY.fullmatch(e.name)]
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.directory / name)


def _stale(
    files: Mapping[str, FileRecord], stored: Mapping[str, str], legacy: Mapping[str, str] | None
) -> list[str]:
    """The inputs whose entry must change, given the versions ``stored``: valid with another
    version, or invalid with a format-1 entry to carry over."""
    out = []
    get = stored.get
    for rel, rec in files.items():
        version = get(rel)
        if version == rec.sha256 and not rec.deps_sha256:
            continue  # the entry of this very content (valid, since it was recorded)
        recorded = _recorded_version(rec)
        if recorded is not None:
            if version != recorded:
                out.append(rel)
        elif legacy is not None and rel in legacy and rel not in stored:
            out.append(rel)
    return out


def _recorded_version(rec: FileRecord) -> str | None:
    """The version of the entry a sync records for ``rec`` (None: an invalid file, whose entry
    stays as it was)."""
    return _version(rec) if rec.current and rec.good is not None else None


def _same_entry(last: FileRecord | None, rec: FileRecord) -> bool:
    """Whether ``rec`` is recorded by the very entry ``last`` was (both valid, one version)."""
    if last is None:
        return False
    version = _recorded_version(rec)
    return version is not None and version == _recorded_version(last)


def _up_to_date(
    index: Mapping[str, str],
    rels: Iterable[str],
    files: Mapping[str, FileRecord],
    legacy: Mapping[str, str] | None,
) -> bool:
    """Whether a shard whose index is ``index`` needs no change for the view's records of
    ``rels`` (the inputs of the shard to look at)."""
    return index.keys() <= files.keys() and not _stale({r: files[r] for r in rels}, index, legacy)


def _update(
    old: Mapping[str, tuple[str, bytes]],
    rels: Iterable[str],
    files: Mapping[str, FileRecord],
    legacy: Mapping[str, str] | None,
    store: LastGoodStore,
) -> tuple[dict[str, tuple[str, bytes]], int]:
    """A shard's new entries from its old ones and the view's records of its inputs, and the
    number of entries written or removed."""
    new: dict[str, tuple[str, bytes]] = {}
    changes = 0
    for rel, kept in old.items():
        if rel not in files:
            changes += 1  # deleted: forgotten
        else:
            new[rel] = kept
    for rel in rels:
        rec = files[rel]
        if rec.current and rec.good is not None:
            version = _version(rec)
            got = new.get(rel)
            if got is None or got[0] != version:
                new[rel] = (version, _entry_line(rel, version, _document_json(rec.good)))
                changes += 1
        elif rel not in new and legacy is not None and rel in legacy:
            # invalid now, its last good version still in the format-1 layout: carried over
            entry = store._legacy_entry(rel)
            if entry is not None:
                version = str(entry.get("sha256", legacy[rel]))
                new[rel] = (version, _entry_line(rel, version, orjson.dumps(entry["document"])))
    return new, changes
