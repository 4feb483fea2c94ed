"""Invariants of the mirror (reconciler/store.py), on random histories (hypothesis).

The store here is an in-memory model of etcd's semantics (a revision per commit, guards that
refuse a whole commit, events in order): the same ``StateStore`` protocol the etcd store
implements, so the mirror's logic is checked on thousands of histories without a server (the
etcd store itself is checked against a real etcd in test_etcd_store.py).

Invariants:
- after ``resync``, or after applying every event since the last sync in any batching, the
  working directory holds exactly the store's documents;
- after ``push``, the store holds exactly the working directory's documents under the owned
  paths, and nothing else changed; staged documents split by any limits change nothing of
  that;
- a refused (guarded) push changes nothing in the store.
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from reconciler.stores.base import (
    Change,
    Entry,
    Guard,
    Mirror,
    RevisionGuard,
    Snapshot,
    StaleWrite,
    scan_unit,
    split_commit,
    under,
    write_unit,
)


class MemoryStore:
    """etcd's semantics for a unit, in memory: a global revision bumped by each commit."""

    def __init__(self, max_ops: int = 1 << 30, max_bytes: int = 1 << 30) -> None:
        self.docs: dict[str, Entry] = {}
        self.revision = 1
        self.log: list[Change] = []
        self.limits = (max_ops, max_bytes)

    @property
    def url(self) -> str:
        return "memory://"

    @property
    def txn_limits(self) -> tuple[int, int]:
        return self.limits

    def op_size(self, rel: str, data: bytes) -> int:
        return len(rel) + len(data)

    def snapshot(self, scope: Sequence[str] | None = None, revision: int | None = None) -> Snapshot:
        assert revision is None
        inside = under(*(s.rstrip("/") for s in scope)) if scope is not None else None
        docs = {r: e for r, e in self.docs.items() if inside is None or inside(r)}
        return Snapshot(self.revision, dict(sorted(docs.items())))

    def commit(
        self,
        puts: Mapping[str, bytes],
        deletes: Iterable[str] = (),
        guards: Sequence[Guard] = (),
    ) -> int:
        deletes = list(deletes)
        for g in guards:
            assert isinstance(g, RevisionGuard)
            have = self.docs.get(g.rel)
            if (have.mod_revision if have else 0) != g.mod_revision:
                raise StaleWrite(f"{g.rel} changed")
        if not puts and not deletes:
            return self.revision
        self.revision += 1
        for rel, data in sorted(puts.items()):
            self.docs[rel] = Entry(data, self.revision)
            self.log.append(Change(rel, data, self.revision))
        for rel in sorted(set(deletes)):
            if self.docs.pop(rel, None) is not None:
                self.log.append(Change(rel, None, self.revision))
        return self.revision

    def events_since(self, revision: int) -> list[Change]:
        return [c for c in self.log if c.mod_revision >= revision]


PATHS = [
    "unit.yaml",
    "desired/a.yaml",
    "desired/deep/b.yaml",
    "nodes/n1.yaml",
    "actual/n1.yaml",
    "resources/n1.json",
    "out/plan.json",
    "out/nodes/n1.json",
    "out/instances/i1/config.json",
    "out/instances/i1/hosts",
    "out/instances/i2/config.json",
    "checkpoint/allocations.json",
    "checkpoint/last-good/x.json",
]
content = st.binary(max_size=12)
edits = st.dictionaries(st.sampled_from(PATHS), st.one_of(st.none(), content), max_size=6)
"""One commit (or one local change): path -> new bytes, or None to delete."""


def commit_edit(store: MemoryStore, edit: Mapping[str, bytes | None]) -> None:
    store.commit(
        {r: d for r, d in edit.items() if d is not None}, [r for r, d in edit.items() if d is None]
    )


def documents(store: MemoryStore) -> dict[str, bytes]:
    return {r: e.data for r, e in store.docs.items()}


def batches(changes: list[Change], cuts: list[int]) -> list[list[Change]]:
    points = sorted({c % (len(changes) + 1) for c in cuts} | {0, len(changes)})
    return [changes[a:b] for a, b in itertools.pairwise(points) if b > a]


@contextlib.contextmanager
def unit_with_history(
    history: list[Mapping[str, bytes | None]], store: MemoryStore | None = None
) -> Iterator[tuple[MemoryStore, Path]]:
    """A store after ``history``'s commits, and an empty working directory (removed after)."""
    store = store or MemoryStore()
    for edit in history:
        commit_edit(store, edit)
    root = Path(tempfile.mkdtemp(prefix="mirror-"))
    try:
        yield store, root
    finally:
        shutil.rmtree(root)


@settings(max_examples=150, deadline=None)
@given(
    history=st.lists(edits, max_size=6),
    later=st.lists(edits, max_size=6),
    local=edits,
    cuts=st.lists(st.integers(0, 60), max_size=5),
)
def test_the_working_directory_follows_the_store_by_snapshot_and_by_events(
    history: list[Mapping[str, bytes | None]],
    later: list[Mapping[str, bytes | None]],
    local: Mapping[str, bytes | None],
    cuts: list[int],
) -> None:
    with unit_with_history(history) as (store, root):
        # a working directory with stale local files of its own
        write_unit(root, {r: d for r, d in local.items() if d is not None}, [])
        mirror = Mirror(store, root)
        mirror.resync()
        assert scan_unit(root) == documents(store)
        synced = mirror.synced
        for edit in later:
            commit_edit(store, edit)
        for batch in batches(store.events_since(synced + 1), cuts):
            mirror.apply(batch)
        assert scan_unit(root) == documents(store)
        assert mirror.local_changes(lambda _r: True) == ({}, [])


@settings(max_examples=150, deadline=None)
@given(
    history=st.lists(edits, max_size=5),
    run=edits,
    max_ops=st.integers(1, 4),
    max_bytes=st.integers(1, 80),
)
def test_a_push_makes_the_store_hold_the_owned_working_files_and_touches_nothing_else(
    history: list[Mapping[str, bytes | None]],
    run: Mapping[str, bytes | None],
    max_ops: int,
    max_bytes: int,
) -> None:
    with unit_with_history(history, MemoryStore(max_ops, max_bytes)) as (store, root):
        mirror = Mirror(store, root)
        mirror.resync()
        before = documents(store)
        # "a run": the controller changes its own paths in the working directory (and an
        # input edited locally by mistake must not be published)
        write_unit(
            root,
            {r: d for r, d in run.items() if d is not None},
            [r for r, d in run.items() if d is None],
        )
        owned = under("out", "checkpoint")
        staged = under("out/instances", "checkpoint/last-good")
        mirror.push(owned, [], staged)
        after = documents(store)
        local = scan_unit(root)
        assert {r: d for r, d in after.items() if owned(r)} == {
            r: d for r, d in local.items() if owned(r)
        }
        assert {r: d for r, d in after.items() if not owned(r)} == {
            r: d for r, d in before.items() if not owned(r)
        }
        assert mirror.local_changes(owned) == ({}, [])


@settings(max_examples=100, deadline=None)
@given(
    puts=st.dictionaries(st.sampled_from(PATHS), content, max_size=10),
    max_ops=st.integers(1, 5),
    max_bytes=st.integers(1, 60),
)
def test_split_commits_keep_every_document_once_in_order_within_the_limits(
    puts: dict[str, bytes], max_ops: int, max_bytes: int
) -> None:
    store = MemoryStore(max_ops, max_bytes)
    chunks = list(split_commit(store, puts))
    assert [r for c in chunks for r in c] == sorted(puts)
    for c in chunks:
        assert len(c) <= max_ops
        if len(c) > 1:
            assert sum(store.op_size(r, d) for r, d in c.items()) <= max_bytes


@settings(max_examples=100, deadline=None)
@given(history=st.lists(edits, min_size=1, max_size=5), mine=content, theirs=content)
def test_a_refused_guarded_push_changes_nothing(
    history: list[Mapping[str, bytes | None]], mine: bytes, theirs: bytes
) -> None:
    with unit_with_history(history) as (store, root):
        mirror = Mirror(store, root)
        mirror.resync()
        rel = "actual/n1.yaml"
        seen = mirror.known[rel].mod_revision if rel in mirror.known else 0
        # the agent has something to write: its document differs from the version it read
        assume(rel not in mirror.known or mirror.known[rel].data != mine)
        store.commit({rel: theirs})  # another writer, after the read
        write_unit(root, {rel: mine}, [])
        before = dict(store.docs)
        try:
            mirror.push(under(rel), [RevisionGuard(rel, seen)])
        except StaleWrite:
            pass
        else:
            raise AssertionError("a write guarded by an outdated revision went through")
        assert store.docs == before
