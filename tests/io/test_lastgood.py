"""checkpoint/last-good (SPEC §5): the sharded store, its crash safety, the memo of a watcher,
and the conversion of the one-file-per-input layout."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from reconciler.io import fsio, lastgood
from reconciler.io.lastgood import MANIFEST, LastGoodMemo, LastGoodStore, shard_of
from reconciler.io.loader import Doc, StateView, load_state
from reconciler.model.documents import Node
from tests.support.faults import FailAt
from tests.support.paths import DEMO

SERVICE = """apiVersion: reconciler/v1
kind: Service
id: {id}
version: {version}
image: {{rootfs: /r}}
"""

STEPS = ["open", "write", "fsync", "rename", "fsync-dir"]


class Boom(Exception):
    pass


def _state(root: Path, n: int = 60) -> Path:
    """The demo's inputs plus ``n`` services: enough inputs for most shards to hold several."""
    shutil.copytree(DEMO, root, ignore=shutil.ignore_patterns("out", "checkpoint", ".lock"))
    for i in range(n):
        _service(root, f"svc-{i:03d}", "1.0.0")
    return root


def _service(root: Path, sid: str, version: str) -> Path:
    path = root / "desired" / "many" / f"{sid}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(SERVICE.format(id=sid, version=version))
    _bump(path)
    return path


_tick = [0]


def _bump(path: Path) -> None:
    """A distinct mtime for each write, so the loader never takes a rewrite for unchanged."""
    _tick[0] += 1
    t = 1_600_000_000 + _tick[0] * 10
    os.utime(path, (t, t))


def _view(root: Path, previous: StateView | None = None) -> StateView:
    return load_state(root, previous)[0]


def _expected(view: StateView) -> dict[str, Doc]:
    out: dict[str, Doc] = {}
    for rel, rec in view.files.items():
        doc = rec.good
        if doc is None:
            continue
        if isinstance(doc, Node) and doc.resourcesFile is not None:
            doc = doc.model_copy(update={"resourcesFile": None, "resources": doc.resources or ()})
        out[rel] = doc
    return out


def _all(store: LastGoodStore, rels: list[str]) -> dict[str, Doc]:
    out: dict[str, Doc] = {}
    for rel in rels:
        got = store.get(rel)
        if got is not None:
            out[rel] = got
    return out


def _tree(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def _edit(root: Path) -> list[str]:
    """Change, break, delete and add inputs; the rels concerned."""
    _service(root, "svc-001", "2.0.0")  # changed
    broken = _service(root, "svc-002", "3.0.0")
    broken.write_text("kind: [")  # invalid: keeps its entry
    _bump(broken)
    (root / "desired" / "many" / "svc-003.yaml").unlink()  # deleted: forgotten
    _service(root, "svc-new", "1.0.0")  # added
    return [f"desired/many/svc-{s}.yaml" for s in ("001", "002", "003", "new")]


# ------------------------------------------------------------------------------ the layout


def test_entries_round_trip_and_only_changes_are_written(tmp_path: Path) -> None:
    root = _state(tmp_path / "state")
    view = _view(root)
    store = LastGoodStore(tmp_path / "lg")
    assert store.sync(view) == len(view.files)
    rels = sorted(view.files)
    assert _all(store, rels) == _expected(view)
    assert store.sync(view) == 0  # nothing rewritten
    names = sorted(p.name for p in store.directory.iterdir())
    shards = {shard_of(rel) for rel in rels}
    assert names == sorted([MANIFEST, *(f"shard-{s}.json" for s in shards)])
    for p in store.directory.iterdir():
        json.loads(p.read_bytes())  # every file is a whole JSON document
        assert p.stat().st_mode & 0o777 == 0o600

    before = _all(store, rels)
    edited = _edit(root)
    view2 = _view(root, view)
    # svc-001 rewritten, svc-003 removed, svc-new added; svc-002 keeps its last good version
    assert store.sync(view2) == 3
    after = _all(store, sorted(set(rels) | set(edited)))
    assert after["desired/many/svc-002.yaml"] == before["desired/many/svc-002.yaml"]
    assert "desired/many/svc-003.yaml" not in after
    assert after["desired/many/svc-001.yaml"] == view2.files["desired/many/svc-001.yaml"].good
    assert after["desired/many/svc-new.yaml"] == view2.files["desired/many/svc-new.yaml"].good
    # a new process that knows only the disk keeps the broken file's last good version
    cold = load_state(root, None, _options(store))[0]
    assert cold.services[("svc-002", "default")].version == "1.0.0"


def _options(store: LastGoodStore) -> Any:
    from reconciler.io.loader import LoadOptions

    return LoadOptions(fallback=store.get)


def test_a_shard_whose_inputs_are_all_deleted_is_removed(tmp_path: Path) -> None:
    root = tmp_path / "state"
    _service(root, "only", "1.0.0")
    view = _view(root)
    store = LastGoodStore(tmp_path / "lg")
    store.sync(view)
    (root / "desired" / "many" / "only.yaml").unlink()
    assert store.sync(_view(root, view)) == 1
    assert sorted(p.name for p in store.directory.iterdir()) == [MANIFEST]
    assert store.get("desired/many/only.yaml") is None


def test_the_same_inputs_give_the_same_bytes(tmp_path: Path) -> None:
    root = _state(tmp_path / "state")
    view = _view(root)
    a, b = LastGoodStore(tmp_path / "a"), LastGoodStore(tmp_path / "b")
    a.sync(view)
    b.sync(_view(root))  # another load of the same files
    assert _tree(a.directory) == _tree(b.directory)


def test_a_resources_file_change_rewrites_the_nodes_entry(tmp_path: Path) -> None:
    root = _state(tmp_path / "state", 0)
    view = _view(root)
    node = view.nodes["edge-1"]
    assert node.resourcesFile is not None and node.resources
    store = LastGoodStore(tmp_path / "lg")
    store.sync(view)
    resources = root / "resources" / "edge-1.json"
    data = json.loads(resources.read_bytes())
    data = data[:1] if isinstance(data, list) else data
    resources.write_text(json.dumps(data))
    _bump(resources)
    view2 = _view(root, view)
    assert view2.nodes["edge-1"].resources != node.resources
    assert store.sync(view2) == 1
    got = store.get("nodes/edge-1.yaml")
    assert isinstance(got, Node) and got.resources == view2.nodes["edge-1"].resources


@pytest.mark.parametrize("damage", ["truncated", "first line", "an entry"])
def test_a_damaged_shard_is_rewritten_from_the_view(tmp_path: Path, damage: str) -> None:
    root = _state(tmp_path / "state")
    view = _view(root)
    store = LastGoodStore(tmp_path / "lg")
    store.sync(view)
    reference = _tree(store.directory)
    rel = "desired/many/svc-010.yaml"
    shard = store.directory / f"shard-{shard_of(rel)}.json"
    data = shard.read_bytes()
    if damage == "truncated":
        data = data[:-10]
    elif damage == "first line":
        data = b"{" + data[2:]
    else:
        lines = data.split(b"\n")
        lines[1] = lines[1][:20] + b"garbage"
        data = b"\n".join(lines)
    shard.write_bytes(data)
    expected = _expected(view)
    for other in view.files:
        if shard_of(other) == shard_of(rel):
            assert store.get(other) in (None, expected[other])  # never a wrong entry
    store.sync(view)
    assert _tree(store.directory) == reference


# ------------------------------------------------------------------------------ crashes


@pytest.fixture
def edited(tmp_path: Path) -> Iterator[tuple[Path, StateView, StateView]]:
    """A store synced from a state, and the view of that state after :func:`_edit`; plus a
    reference directory: the store after an uninterrupted sync of the new view."""
    root = _state(tmp_path / "state")
    view = _view(root)
    base = LastGoodStore(tmp_path / "base")
    base.sync(view)
    _edit(root)
    view2 = _view(root, view)
    ref = tmp_path / "reference"
    shutil.copytree(base.directory, ref)
    LastGoodStore(ref).sync(view2)
    yield base.directory, view, view2


def _check_old_or_new(
    directory: Path, base: Path, reference: Path, view: StateView, view2: StateView
) -> None:
    rels = sorted(set(view.files) | set(view2.files))
    old, new = LastGoodStore(base), LastGoodStore(reference)
    store = LastGoodStore(directory)
    for rel in rels:
        assert store.get(rel) in (old.get(rel), new.get(rel)), rel
    assert not [p.name for p in directory.iterdir() if ".tmp-" in p.name]
    # the next sync converges to exactly the uninterrupted result
    store.sync(view2)
    assert _tree(directory) == _tree(reference)


@pytest.mark.parametrize("step", STEPS)
def test_a_sync_interrupted_at_each_step_leaves_old_or_new(
    edited: tuple[Path, StateView, StateView], tmp_path: Path, step: str
) -> None:
    base, view, view2 = edited
    state = tmp_path / f"crash-{step}"
    shutil.copytree(base, state)

    def hook(name: str) -> None:
        if name == step:
            raise Boom(name)

    with pytest.raises(Boom):
        LastGoodStore(state).sync(view2, hook)
    _check_old_or_new(state, base, tmp_path / "reference", view, view2)


@pytest.mark.parametrize("what", ["replace", "syncfs"])
def test_a_failing_rename_or_sync_at_each_call_leaves_old_or_new(
    edited: tuple[Path, StateView, StateView],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    what: str,
) -> None:
    base, view, view2 = edited
    k = 0
    while True:
        k += 1
        state = tmp_path / f"{what}-{k}"
        shutil.copytree(base, state)
        fault = FailAt(k, OSError(5, "Input/output error"))
        if what == "replace":
            monkeypatch.setattr(os, "replace", fault.wrap(os.replace))
        else:
            monkeypatch.setattr(fsio, "_sync_filesystem_of", fault.wrap(fsio._sync_filesystem_of))
        try:
            LastGoodStore(state).sync(view2)
        except OSError as e:
            assert e is fault.error
        else:
            break
        finally:
            monkeypatch.undo()
        _check_old_or_new(state, base, tmp_path / "reference", view, view2)
    assert k > 2


# ------------------------------------------------------------------------------ the memo


@pytest.fixture(autouse=True)
def settled(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """The memo's tests: files count as settled at once, so that the loader hands out the same
    record for an unchanged file (as it does two seconds after a file was written)."""
    if "memo" in request.node.name:
        monkeypatch.setattr(fsio, "RACY_WINDOW_NS", 0)


def _memo_setup(tmp_path: Path) -> tuple[Path, StateView, LastGoodStore, LastGoodMemo]:
    """A state directory, its view, an empty last-good store and a memo."""
    root = _state(tmp_path / "state")
    return root, _view(root), LastGoodStore(tmp_path / "lg"), LastGoodMemo()


def test_a_memo_sync_looks_only_at_changed_inputs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, view, store, memo = _memo_setup(tmp_path)
    assert store.sync(view, memo=memo) == len(view.files)
    assert memo.looked_at == len(view.files) and len(memo) == len(view.files)

    same = _view(root, view)
    assert store.sync(same, memo=memo) == 0
    assert memo.looked_at == 0

    edited = _edit(root)
    view2 = _view(root, same)
    read: set[str] = set()
    real = lastgood.LastGoodStore._read_sized

    def spy(self: LastGoodStore, name: str, limit: int, *, prefix: bool) -> Any:
        if name.startswith("shard-"):
            read.add(name[6:8])
        return real(self, name, limit, prefix=prefix)

    monkeypatch.setattr(lastgood.LastGoodStore, "_read_sized", spy)
    assert store.sync(view2, memo=memo) == 3
    assert memo.looked_at == 4  # the edited inputs, nothing else
    # the shards of the edited inputs (those that exist), nothing else
    existing = {shard_of(rel) for rel in view.files}
    assert sorted(read) == sorted({shard_of(rel) for rel in edited} & existing)
    monkeypatch.undo()
    # the same bytes as a sync without a memo leaves
    plain = LastGoodStore(tmp_path / "plain")
    plain.sync(view)
    plain.sync(view2)
    assert _tree(store.directory) == _tree(plain.directory)


def test_a_memo_sync_skips_inputs_parsed_again_to_the_same_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a view loaded from nothing: a new record for every file (as for files written within
    # the racy window, parsed again), each of the content the last sync recorded
    root, view, store, memo = _memo_setup(tmp_path)
    store.sync(view, memo=memo)
    again = _view(root)
    assert all(again.files[rel] is not rec for rel, rec in view.files.items())
    read: list[str] = []
    real = lastgood.LastGoodStore._read_sized

    def spy(self: LastGoodStore, name: str, limit: int, *, prefix: bool) -> Any:
        read.append(name)
        return real(self, name, limit, prefix=prefix)

    monkeypatch.setattr(lastgood.LastGoodStore, "_read_sized", spy)
    before = _tree(store.directory)
    assert store.sync(again, memo=memo) == 0
    assert memo.looked_at == 0
    assert [n for n in read if n.startswith("shard-")] == []
    assert _tree(store.directory) == before
    monkeypatch.undo()
    # and an edit after it is still seen (the memo holds the new records)
    edited = _edit(root)
    assert store.sync(_view(root, again), memo=memo) == 3
    assert memo.looked_at == len(edited)


def test_a_memo_sync_after_a_watchers_two_loads_takes_the_paths_they_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a watcher's runs: each a hinted load and its sync, then the stat pass after its writes.
    # The loads name the paths whose record they replaced, so the next sync looks at those
    # without comparing every record, and misses none of them.
    root, view, store, memo = _memo_setup(tmp_path)
    store.sync(view, memo=memo)
    first = load_state(root, _view(root, view), changed=[])[0]  # the next run
    store.sync(first, memo=memo)
    after = _view(root, first)  # its stat pass
    rels = [f"desired/many/svc-{s}.yaml" for s in ("001", "004")]
    _service(root, "svc-001", "2.0.0")
    broken = _service(root, "svc-004", "3.0.0")
    broken.write_text("kind: [")  # invalid: keeps its entry
    _bump(broken)
    hinted = load_state(root, after, changed=rels)[0]
    assert hinted.records_memo is not None
    assert hinted.records_memo.replaced_since(first.files) == frozenset(rels)
    compared: list[int] = []

    def compress(data: Any, selectors: Any) -> Any:
        compared.append(1)
        return itertools.compress(data, selectors)

    monkeypatch.setattr(lastgood, "itertools", SimpleNamespace(compress=compress))
    assert store.sync(hinted, memo=memo) == 1  # svc-001's entry; svc-004 keeps its own
    assert memo.looked_at == 2 and compared == []
    monkeypatch.undo()
    plain = LastGoodStore(tmp_path / "plain")
    plain.sync(view)
    plain.sync(hinted)
    assert _tree(store.directory) == _tree(plain.directory)
    assert store.get(rels[0]) == hinted.files[rels[0]].good
    # a view the loads did not come from: every record compared, with the same answer
    again = _view(root)
    _service(root, "svc-005", "2.0.0")
    assert store.sync(_view(root, again), memo=memo) == 1


def test_another_writer_makes_the_memo_unusable(tmp_path: Path) -> None:
    root, view, store, memo = _memo_setup(tmp_path)
    store.sync(view, memo=memo)
    _edit(root)
    view2 = _view(root, view)
    LastGoodStore(store.directory).sync(view2)  # e.g. a oneshot `reconcile` run meanwhile
    # back to the first content: the records are new objects, but so would be an unchanged one
    # if the other process's edit had been undone; the memo must notice the manifest changed
    assert store.sync(view, memo=memo) > 0
    assert memo.looked_at == len(view.files)
    plain = LastGoodStore(tmp_path / "plain")
    plain.sync(view)
    assert _tree(store.directory) == _tree(plain.directory)


def test_a_failed_sync_leaves_the_memo_empty(tmp_path: Path) -> None:
    root, view, store, memo = _memo_setup(tmp_path)
    store.sync(view, memo=memo)
    _edit(root)
    view2 = _view(root, view)

    def hook(name: str) -> None:
        if name == "fsync-dir":
            raise Boom(name)

    with pytest.raises(Boom):
        store.sync(view2, hook, memo)
    assert len(memo) == 0
    assert store.sync(view2, memo=memo) == 0  # everything was renamed; a full look finds it
    assert memo.looked_at == len(view2.files)


def test_a_memo_of_another_directory_is_not_used(tmp_path: Path) -> None:
    root = _state(tmp_path / "state")
    view = _view(root)
    memo = LastGoodMemo()
    LastGoodStore(tmp_path / "a").sync(view, memo=memo)
    assert LastGoodStore(tmp_path / "b").sync(view, memo=memo) == len(view.files)
    assert _tree(tmp_path / "a") == _tree(tmp_path / "b")


# ------------------------------------------------------------------------------ format 1


def _write_format_1(directory: Path, view: StateView) -> None:
    """The layout before shards: a file per input, named by the hash of its path, and an
    index (as the previous LastGoodStore.sync wrote it)."""
    directory.mkdir(parents=True)
    index = {}
    for rel, rec in view.files.items():
        if rec.good is None:
            continue
        data = rec.good.model_dump(mode="json")
        if isinstance(rec.good, Node) and rec.good.resourcesFile is not None:
            data["resourcesFile"] = None
            data["resources"] = data["resources"] or []
        entry = {"path": rel, "sha256": rec.sha256, "document": data}
        name = hashlib.sha256(rel.encode()).hexdigest()[:40] + ".json"
        (directory / name).write_text(json.dumps(entry, sort_keys=True, separators=(",", ":")))
        index[rel] = rec.sha256
    (directory / "index.json").write_text(json.dumps(index, sort_keys=True, indent=0) + "\n")


def test_the_one_file_per_input_layout_is_read_and_converted(tmp_path: Path) -> None:
    root = _state(tmp_path / "state")
    view = _view(root)
    directory = tmp_path / "lg"
    _write_format_1(directory, view)
    store = LastGoodStore(directory)
    before = _all(store, sorted(view.files))
    assert before == _expected(view)  # read as it is

    edited = _edit(root)
    view2 = load_state(root, None, _options(store))[0]  # a new process: the disk only
    assert view2.services[("svc-002", "default")].version == "1.0.0"
    store.sync(view2)
    names = sorted(p.name for p in directory.iterdir())
    assert all(n == MANIFEST or n.startswith("shard-") for n in names), names
    after = _all(store, sorted(set(view.files) | set(edited)))
    assert after["desired/many/svc-002.yaml"] == before["desired/many/svc-002.yaml"]
    assert "desired/many/svc-003.yaml" not in after
    assert after["desired/many/svc-001.yaml"] == view2.files["desired/many/svc-001.yaml"].good
    assert store.sync(view2) == 0


def test_format_1_entries_left_by_a_crash_are_removed(tmp_path: Path) -> None:
    root = _state(tmp_path / "state")
    view = _view(root)
    directory = tmp_path / "lg"
    _write_format_1(directory, view)
    (directory / "index.json").unlink()  # a conversion killed after it removed the index
    store = LastGoodStore(directory)
    store.sync(view)
    names = sorted(p.name for p in directory.iterdir())
    assert all(n == MANIFEST or n.startswith("shard-") for n in names), names
