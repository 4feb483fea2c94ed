"""State stores: where a unit's documents live (issue 11, docs/etcd.md).

A *unit* is one controller's state: ``unit.yaml`` and every regular file under ``desired/``,
``nodes/``, ``actual/``, ``resources/``, ``out/`` and ``checkpoint/`` whose path has no hidden
name (:func:`is_unit_path`),
keyed by its path relative to the state directory with ``/`` separators. Values are the
documents' bytes, exactly as in a state directory, so every rule of SPEC §5 (the safe loader,
last good versions) applies unchanged whichever store holds them.

:class:`StateStore` is the interface the controller and the agent use to read, watch and write
a unit. Two implementations:

- :class:`FileStore`: the state directory itself, the embedded default. The controller and the
  agent run directly in it, under its flock, exactly as without a store.
- :class:`reconciler.stores.etcd.EtcdStore`: keys ``<prefix>/<path>`` in etcd v3.

The controller's core reads and writes a local *working directory*. With etcd that directory is
a :class:`Mirror` of the unit: brought up to date from the store (a full snapshot, then watch
events), and after a run its changes under the paths the writer owns are published by guarded
commits (the leader key for the controller, the revision read for an agent's actual state):
the documents nothing refers to yet (OCI configs, last good inputs) may go first, in as many
transactions as the server's limits need; the checkpoint with its node patches, status, plan
and every deletion is **one** final transaction. A run that dies before that final commit
leaves the unit's plans and checkpoint as they were.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from reconciler.io.fsio import (
    StatKey,
    atomic_write_many,
    ensure_dir,
    read_bytes_at,
    settled_key,
    stat_key,
)

__all__ = [
    "CONTROLLER_OWNED",
    "INPUT_DIRS",
    "UNIT_DIRS",
    "Change",
    "Entry",
    "FileStore",
    "LeaderGuard",
    "Mirror",
    "RevisionGuard",
    "Snapshot",
    "StaleWrite",
    "StateStore",
    "StoreError",
    "copy_unit",
    "is_input_path",
    "is_unit_path",
    "list_unit",
    "scan_unit",
    "split_commit",
    "under",
    "write_unit",
]

UNIT_FILES = ("unit.yaml",)
INPUT_DIRS = ("desired", "nodes", "actual", "resources")
UNIT_DIRS = (*INPUT_DIRS, "out", "checkpoint")
CONTROLLER_OWNED = ("out", "checkpoint")
"""Top-level directories only the controller writes: the paths it publishes after a run."""

MAX_DOCUMENT_BYTES = 64 << 20
"""A unit file larger than this is refused on scan (inputs are capped at 1 MiB by the loader;
the checkpoint of a large fleet is the biggest document)."""


class StoreError(Exception):
    """The store cannot be reached, or refused a request (the message says which and why)."""


class StaleWrite(StoreError):
    """A guarded commit was refused: what it was computed from changed in the store meanwhile
    (another writer, or this controller is no longer the leader). Nothing was written."""


def is_unit_path(rel: str) -> bool:
    """Whether ``rel`` (relative, ``/``-separated) is one of a unit's documents. Hidden names
    never are, as the loader ignores them: temp files, editor swap files, and the writers'
    local caches (``out/instances/.manifest.json`` records inodes of this machine's files)."""
    parts = rel.split("/")
    if any(not p or p.startswith(".") for p in parts):
        return False
    if len(parts) == 1:
        return parts[0] in UNIT_FILES
    return parts[0] in UNIT_DIRS


def is_input_path(rel: str) -> bool:
    """A unit path the controller reads as input (not one it writes)."""
    return is_unit_path(rel) and rel.split("/")[0] not in CONTROLLER_OWNED


def _file_mode(rel: str) -> int:
    """As ``reconcile`` and the agent write them: what agents and runc read is 0644."""
    return 0o644 if rel.startswith(("out/nodes/", "out/instances/", "actual/")) else 0o600


@dataclass(frozen=True)
class Entry:
    data: bytes
    mod_revision: int  # the store's revision of its last change (0 for the file store)


@dataclass(frozen=True)
class Snapshot:
    revision: int  # the store revision the snapshot was read at
    entries: Mapping[str, Entry]


@dataclass(frozen=True)
class Change:
    rel: str
    data: bytes | None  # None: deleted
    mod_revision: int


@dataclass(frozen=True)
class RevisionGuard:
    """Commit only if ``rel`` was last changed at ``mod_revision`` (0: it must not exist): the
    check the JSON Patch ``test`` of ``/revision`` makes, done by the store."""

    rel: str
    mod_revision: int


@dataclass(frozen=True)
class LeaderGuard:
    """Commit only if ``identity`` still holds the unit's leader key (fencing a controller
    whose lease expired while it computed)."""

    identity: str


Guard = RevisionGuard | LeaderGuard


class StateStore(Protocol):
    """Every read, watch and write of a unit's documents."""

    @property
    def url(self) -> str: ...

    @property
    def txn_limits(self) -> tuple[int, int]:
        """(operations, request bytes) one commit may hold."""
        ...

    def op_size(self, rel: str, data: bytes) -> int:
        """What writing ``data`` at ``rel`` adds to a commit's request bytes."""
        ...

    def snapshot(self, scope: Sequence[str] | None = None, revision: int | None = None) -> Snapshot:
        """The unit's documents read at one revision (the newest unless given): all, or those
        ``scope`` names (documents, or directories ending in ``/``)."""
        ...

    def commit(
        self,
        puts: Mapping[str, bytes],
        deletes: Iterable[str] = (),
        guards: Sequence[Guard] = (),
    ) -> int:
        """Write ``puts`` and delete ``deletes`` all at once, only if every guard holds
        (:class:`StaleWrite` otherwise); returns the new revision."""
        ...


# ---------------------------------------------------------------- the file store


def list_unit(root: Path) -> dict[str, StatKey]:
    """Every unit document under ``root`` with its stat key, by relative path, sorted
    (symlinks are not followed; only regular files count). One ``scandir`` per directory and
    one ``lstat`` per file, on strings: a big unit has tens of thousands of files."""
    found: dict[str, StatKey] = {}
    base = os.fspath(root)
    for rel in UNIT_FILES:
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(f"{base}/{rel}")
            if stat.S_ISREG(st.st_mode):
                found[rel] = stat_key(st)
    pending = []
    for top in UNIT_DIRS:
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISDIR(os.lstat(f"{base}/{top}").st_mode):  # a symlink is not followed
                pending.append(top)
    while pending:
        rel_dir = pending.pop()
        try:
            entries = os.scandir(f"{base}/{rel_dir}")
        except (FileNotFoundError, NotADirectoryError):
            continue
        with entries:
            for entry in entries:
                if entry.name.startswith("."):
                    continue  # never a document (is_unit_path)
                rel = f"{rel_dir}/{entry.name}"
                if entry.is_dir(follow_symlinks=False):
                    pending.append(rel)
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    found[rel] = stat_key(st)
    return dict(sorted(found.items()))


def scan_unit(root: Path) -> dict[str, bytes]:
    """Every unit document under ``root`` with its content, by relative path, sorted."""
    return {rel: _read(root / rel)[0] for rel in list_unit(root)}


def _read(path: Path) -> tuple[bytes, StatKey]:
    data, key = read_bytes_at(path, MAX_DOCUMENT_BYTES)
    if len(data) > MAX_DOCUMENT_BYTES:
        raise StoreError(f"{path}: larger than {MAX_DOCUMENT_BYTES} bytes")
    return data, key


def write_unit(root: Path, puts: Mapping[str, bytes], deletes: Iterable[str]) -> None:
    """Write documents into a state directory atomically (each file old or new, one batched
    sync) and delete others, removing directories the deletions leave empty."""
    items: list[tuple[Path, bytes, int]] = []
    for rel, data in sorted(puts.items()):
        if not is_unit_path(rel):
            raise StoreError(f"{rel!r} is not a path of a unit's document")
        path = root / rel
        ensure_dir(path.parent)
        items.append((path, data, _file_mode(rel)))
    atomic_write_many(items)
    for rel in sorted(set(deletes)):
        if not is_unit_path(rel):
            continue
        path = root / rel
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        parent = path.parent
        while parent != root and parent.parent != root:  # keep the top-level directories
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent


class FileStore:
    """A state directory as a store. Its documents carry no revisions (guards are not
    supported: writers serialize on the directory's flock instead)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def url(self) -> str:
        return self.root.resolve().as_uri()

    @property
    def txn_limits(self) -> tuple[int, int]:
        return (sys.maxsize, sys.maxsize)

    def op_size(self, rel: str, data: bytes) -> int:
        return len(data)

    def snapshot(self, scope: Sequence[str] | None = None, revision: int | None = None) -> Snapshot:
        inside = under(*(s.rstrip("/") for s in scope)) if scope is not None else is_unit_path
        found = {rel: Entry(data, 0) for rel, data in scan_unit(self.root).items() if inside(rel)}
        return Snapshot(0, found)

    def commit(
        self,
        puts: Mapping[str, bytes],
        deletes: Iterable[str] = (),
        guards: Sequence[Guard] = (),
    ) -> int:
        if guards:
            raise StoreError("the file store has no revisions to guard a write with")
        ensure_dir(self.root)
        write_unit(self.root, puts, deletes)
        return 0


def copy_unit(source: StateStore, target: StateStore) -> tuple[int, int]:
    """Make ``target`` hold exactly ``source``'s unit (``export`` / ``import``): the documents
    in as many commits as the target's limits need, the deletions in the last one.
    Returns (documents written, documents deleted)."""
    wanted = {rel: e.data for rel, e in source.snapshot().entries.items()}
    have = target.snapshot().entries
    puts = {rel: data for rel, data in wanted.items() if rel not in have or have[rel].data != data}
    deletes = sorted(rel for rel in have if rel not in wanted)
    chunks = list(split_commit(target, puts))
    for chunk in chunks[:-1]:
        target.commit(chunk)
    target.commit(chunks[-1] if chunks else {}, deletes)
    return len(puts), len(deletes)


def split_commit(store: StateStore, puts: Mapping[str, bytes]) -> Iterator[dict[str, bytes]]:
    """``puts`` in path order, cut into commits within the store's transaction limits (each at
    least one document, however large: the store then says why it refused it)."""
    max_ops, max_bytes = store.txn_limits
    chunk: dict[str, bytes] = {}
    size = 0
    for rel, data in sorted(puts.items()):
        cost = store.op_size(rel, data)
        if chunk and (len(chunk) >= max_ops or size + cost > max_bytes):
            yield chunk
            chunk, size = {}, 0
        chunk[rel] = data
        size += cost
    if chunk:
        yield chunk


# ---------------------------------------------------------------- the mirror


class Mirror:
    """A local working directory kept equal to a store's unit (see the module docstring)."""

    def __init__(self, store: StateStore, workdir: Path) -> None:
        self.store = store
        self.workdir = workdir
        self.known: dict[str, Entry] = {}
        self.revision = 0
        self.synced = 0
        """The revision of the last snapshot: a watch from ``synced + 1`` misses nothing since."""
        self.verified: dict[str, StatKey] = {}
        """Settled stat keys of working files whose content was found equal to ``known``: such
        a file is not read again while its key stays (an atomic rewrite changes the inode)."""

    def _local(self, owned: Callable[[str], bool]) -> dict[str, bytes | None]:
        """The working files under ``owned``: their content, or None for a file unchanged
        since it was verified equal to the store's version."""
        out: dict[str, bytes | None] = {}
        for rel, key in list_unit(self.workdir).items():
            if not owned(rel):
                continue
            if self.verified.get(rel) == key and rel in self.known:
                out[rel] = None
                continue
            read_at = time.time_ns()
            data, key = _read(self.workdir / rel)
            out[rel] = data
            known = self.known.get(rel)
            settled = settled_key(key, read_at)
            if known is not None and known.data == data and settled is not None:
                self.verified[rel] = settled
            else:
                self.verified.pop(rel, None)
        return out

    def resync(
        self, snap: Snapshot | None = None, managed: Callable[[str], bool] = is_unit_path
    ) -> set[str]:
        """Make the working directory equal to a fresh snapshot (or to ``snap``, a snapshot of
        part of the unit, for the working files ``managed``: others are left alone); returns the
        paths that changed (every path after a restart)."""
        ensure_dir(self.workdir)
        snap = snap if snap is not None else self.store.snapshot()
        local = self._local(managed)
        puts = {
            r: e.data
            for r, e in snap.entries.items()
            if r not in local
            or (local[r] is None and self.known[r].data != e.data)
            or (local[r] is not None and local[r] != e.data)
        }
        deletes = [r for r in local if r not in snap.entries]
        write_unit(self.workdir, puts, deletes)
        for rel in (*puts, *deletes):
            self.verified.pop(rel, None)
        self.known = {r: e for r, e in self.known.items() if not managed(r)} | dict(snap.entries)
        self.revision = self.synced = snap.revision
        return set(puts) | set(deletes)

    def apply(self, changes: Sequence[Change]) -> set[str]:
        """Apply watch events (in order); returns the paths whose content changed."""
        final: dict[str, Change] = {}
        for ch in changes:
            final[ch.rel] = ch
            self.revision = max(self.revision, ch.mod_revision)
        puts: dict[str, bytes] = {}
        deletes: list[str] = []
        for rel, ch in final.items():
            self.verified.pop(rel, None)
            old = self.known.get(rel)
            if ch.data is None:
                if old is not None:
                    deletes.append(rel)
                    del self.known[rel]
            else:
                if old is None or old.data != ch.data:
                    puts[rel] = ch.data
                self.known[rel] = Entry(ch.data, ch.mod_revision)
        write_unit(self.workdir, puts, deletes)
        return set(puts) | set(deletes)

    def local_changes(self, owned: Callable[[str], bool]) -> tuple[dict[str, bytes], list[str]]:
        """What the working directory holds, under the paths ``owned``, that the store does not."""
        local = self._local(owned)
        puts = {
            r: d
            for r, d in local.items()
            if d is not None and (r not in self.known or self.known[r].data != d)
        }
        deletes = sorted(r for r in self.known if owned(r) and r not in local)
        return puts, deletes

    def push(
        self,
        owned: Callable[[str], bool],
        guards: Sequence[Guard],
        staged: Callable[[str], bool] | None = None,
    ) -> int:
        """Publish the local changes under ``owned``, every commit guarded; returns how many
        documents were written or deleted. Everything goes in one commit, except new or changed
        documents that are ``staged``: those go first, in as many commits as the store's
        transaction limits need (documents nothing refers to yet, such as the OCI configs of
        instances the final commit's plans start). The final commit holds the rest and every
        deletion. On :class:`StaleWrite` the working directory is ahead of the store: call
        :meth:`resync` before the next run."""
        puts, deletes = self.local_changes(owned)
        if not puts and not deletes:
            return 0
        early = {r: d for r, d in puts.items() if staged is not None and staged(r)}
        final = {r: d for r, d in puts.items() if r not in early}
        for chunk in split_commit(self.store, early):
            self._committed(chunk, (), self.store.commit(chunk, (), guards))
        self._committed(final, deletes, self.store.commit(final, deletes, guards))
        return len(puts) + len(deletes)

    def _committed(self, puts: Mapping[str, bytes], deletes: Iterable[str], revision: int) -> None:
        for rel, data in puts.items():
            self.known[rel] = Entry(data, revision)
        for rel in deletes:
            self.known.pop(rel, None)
        self.revision = max(self.revision, revision)


def under(*tops: str) -> Callable[[str], bool]:
    """An ownership test: unit paths under the given top-level directories (or equal to one
    of them as a file path, for a single document)."""

    def owned(rel: str) -> bool:
        return any(rel == t or rel.startswith(t + "/") for t in tops)

    return owned
