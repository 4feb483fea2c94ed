"""What changed since the previous view (``StateView.changes``, an ``InputChanges``): the loader
names every service, node and actual state whose document it hands out is not the previous
view's object (edited, added, removed), and whether unit.yaml's is; a view whose documents
are all the previous view's keeps its revision. Missing a change would let the balancer's memo
keep a placement the edit invalidates, so the property test checks that every document not
named is the very object of the previous view, along random edits, with and without a file
watcher's hint."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.io.loader import StateView, load_state
from reconciler.model.changes import InputChanges
from tests.support.state_files import (
    ACTUAL,
    NODE,
    SERVICE,
    UNIT,
    edit_batches,
    seed_three,
    write,
)

_UNIT = UNIT + "version: 1.0.0\n"


def _bump(p: Path) -> None:
    st_ = p.stat()
    os.utime(p, ns=(st_.st_atime_ns, st_.st_mtime_ns + 1_000_000_000))


def _seed(root: Path) -> StateView:
    seed_three(root)
    write(root, "unit.yaml", _UNIT.format(mode="stable"))
    view, diags = load_state(root)
    assert diags == []
    return view


def _load(root: Path, previous: StateView, hint: set[str] | None) -> StateView:
    view, _ = load_state(root, previous, changed=hint)
    return view


def _changes(view: StateView) -> InputChanges:
    assert view.changes is not None
    return view.changes


def test_a_first_load_knows_nothing_before_it(tmp_path: Path) -> None:
    view = _seed(tmp_path)
    changes = _changes(view)
    assert changes.everything and changes.since is None
    assert changes.revision == view.revision
    assert not changes.counts_from(view.revision)


def test_another_directory_is_everything(tmp_path: Path) -> None:
    view = _seed(tmp_path / "a")
    other = _seed(tmp_path / "b")
    again, _ = load_state(tmp_path / "b", view)
    assert _changes(again).everything and again.revision not in (view.revision, other.revision)


@pytest.mark.parametrize("hint", [False, True], ids=["full", "hinted"])
def test_nothing_changed_keeps_the_revision(tmp_path: Path, hint: bool) -> None:
    view = _seed(tmp_path)
    again = _load(tmp_path, view, {"desired/s0.yaml"} if hint else None)
    assert again.revision == view.revision
    assert _changes(again) == InputChanges(view.revision, view.revision)
    assert _changes(again).empty and _changes(again).counts_from(view.revision)
    # the same bytes written again (a new mtime): parsed again to an equal document, the
    # loader keeps the object, so nothing is named
    p = write(tmp_path, "desired/s1.yaml", SERVICE.format(id="s1", version="1.0.0"))
    _bump(p)
    rewritten = _load(tmp_path, again, {"desired/s1.yaml"} if hint else None)
    assert rewritten.revision == view.revision and _changes(rewritten).empty


def _named(**what: Any) -> Callable[[int, int], InputChanges]:
    """The changes an edit must give, from the revision before it to the one after."""

    def changes(since: int, revision: int) -> InputChanges:
        return replace(InputChanges(since, revision), **what)

    return changes


# (what to do: the path a watcher reports, what must be named)
_EDITS: dict[str, tuple[str, Callable[[int, int], InputChanges]]] = {
    "service edited": ("desired/s1.yaml", _named(services=frozenset({("s1", "default")}))),
    "service added": ("desired/new.yaml", _named(services=frozenset({("new", "default")}))),
    "service removed": ("desired/s2.yaml", _named(services=frozenset({("s2", "default")}))),
    "node edited": ("nodes/n0.yaml", _named(nodes=frozenset({"n0"}))),
    "node added": ("nodes/n9.yaml", _named(nodes=frozenset({"n9"}))),
    "node removed": ("nodes/n1.yaml", _named(nodes=frozenset({"n1"}))),
    "unit edited": ("unit.yaml", _named(unit=True)),
    "unit removed": ("unit.yaml", _named(unit=True)),
    "actual edited": ("actual/n2.yaml", _named(actual=frozenset({"n2"}))),
}


def _do(root: Path, what: str) -> None:
    rel = _EDITS[what][0]
    if what.endswith("removed"):
        (root / rel).unlink()
        return
    if what == "service edited":
        text = SERVICE.format(id="s1", version="2.0.0")
    elif what == "service added":
        text = SERVICE.format(id="new", version="1.0.0")
    elif what == "node edited":
        text = NODE.format(id="n0").replace("1000", "2000")
    elif what == "node added":
        text = NODE.format(id="n9")
    elif what == "unit edited":
        text = _UNIT.format(mode="fresh")
    else:
        text = ACTUAL.format(id="n2", rev=7)
    _bump(write(root, rel, text))


@pytest.mark.parametrize("hint", [False, True], ids=["full", "hinted"])
@pytest.mark.parametrize("what", sorted(_EDITS))
def test_an_edit_an_addition_and_a_removal_are_named(tmp_path: Path, what: str, hint: bool) -> None:
    view = _seed(tmp_path)
    _do(tmp_path, what)
    rel, named = _EDITS[what]
    now = _load(tmp_path, view, {rel} if hint else None)
    want = named(view.revision, now.revision)
    assert _changes(now) == want
    assert now.revision != view.revision
    # and the next load, with nothing changed, names nothing and keeps that revision
    again = _load(tmp_path, now, None)
    assert again.revision == now.revision and _changes(again).empty


@pytest.mark.parametrize("hint", [False, True], ids=["full", "hinted"])
def test_an_invalid_edit_keeps_the_last_good_version_and_names_nothing(
    tmp_path: Path, hint: bool
) -> None:
    """The documents the view hands out are the same (the last good one is kept), so the
    edit is no change to what later stages read: the revision stays. The edit that makes the
    file valid again is named."""
    view = _seed(tmp_path)
    _bump(write(tmp_path, "desired/s0.yaml", "kind: [oops\n"))
    broken, diags = load_state(tmp_path, view, changed={"desired/s0.yaml"} if hint else None)
    assert diags and broken.services[("s0", "default")] is view.services[("s0", "default")]
    assert broken.revision == view.revision and _changes(broken).empty
    _bump(write(tmp_path, "desired/s0.yaml", SERVICE.format(id="s0", version="3.0.0")))
    fixed = _load(tmp_path, broken, {"desired/s0.yaml"} if hint else None)
    assert _changes(fixed).services == {("s0", "default")}
    assert fixed.revision != view.revision
    # a broken node keeps its last good version alike
    _bump(write(tmp_path, "nodes/n1.yaml", "id: [\n"))
    node_broken = _load(tmp_path, fixed, None)
    assert node_broken.revision == fixed.revision and _changes(node_broken).empty


def test_a_duplicate_names_nothing_until_it_takes_over(tmp_path: Path) -> None:
    """A second file defining s0 is ignored (reported): s0 is the first file's, unchanged.
    When the first file goes, the second's s0 (another document) takes over: named."""
    view = _seed(tmp_path)
    write(tmp_path, "desired/z.yaml", SERVICE.format(id="s0", version="9.0.0"))
    dup, diags = load_state(tmp_path, view)
    assert dup.duplicates == 1 and any("already defined" in d.message for d in diags)
    assert _changes(dup).empty and dup.revision == view.revision
    (tmp_path / "desired/s0.yaml").unlink()
    took, _ = load_state(tmp_path, dup)
    assert took.services[("s0", "default")].version == "9.0.0"
    assert _changes(took).services == {("s0", "default")} and took.revision != view.revision
    again, _ = load_state(tmp_path, took)  # no duplicate left: the patched path
    assert _changes(again).empty and again.revision == took.revision


_KINDS = (
    "service",
    "service-same",
    "add",
    "delete",
    "broken",
    "duplicate",
    "node",
    "actual",
    "unit",
    "unit-delete",
    "node-delete",
)
_STEPS = edit_batches(_KINDS)


def _apply(root: Path, what: str, i: int, v: int) -> set[str]:
    """One edit; returns the paths (relative) a file watcher reports for it."""
    if what in ("service", "service-same", "add"):
        name = f"s{i}" if what != "add" else f"a{i}"
        version = f"1.{v}.0" if what != "service-same" else "1.0.0"
        p = write(root, f"desired/{name}.yaml", SERVICE.format(id=name, version=version))
    elif what == "broken":
        p = write(root, f"desired/s{i}.yaml", "kind: [oops\n")
    elif what == "duplicate":  # a second file defining s{v}
        p = write(root, f"desired/z{i}.yaml", SERVICE.format(id=f"s{v}", version="9.0.0"))
    elif what == "node":
        p = write(root, f"nodes/n{i}.yaml", NODE.format(id=f"n{i}").replace("1000", f"{1000 + v}"))
    elif what == "actual":
        p = write(root, f"actual/n{i}.yaml", ACTUAL.format(id=f"n{i}", rev=v))
    elif what == "unit":
        p = write(root, "unit.yaml", _UNIT.format(mode=["stable", "fresh", "stable"][v]))
    else:
        rel = {
            "delete": f"desired/s{i}.yaml",
            "unit-delete": "unit.yaml",
            "node-delete": f"nodes/n{i}.yaml",
        }[what]
        (root / rel).unlink(missing_ok=True)
        return {rel}
    _bump(p)
    return {str(p.relative_to(root))}


def _assert_named(before: StateView, now: StateView) -> None:
    """Every document not named is the previous view's very object; the revision is kept
    exactly when nothing is named."""
    changes = _changes(now)
    assert changes.since == before.revision and changes.revision == now.revision
    if now.unit is not before.unit:
        assert changes.unit
    for name, named in (
        ("services", changes.services),
        ("nodes", changes.nodes),
        ("actual", changes.actual),
    ):
        was, got = getattr(before, name), getattr(now, name)
        for key in was.keys() | got.keys():
            if key not in named:
                assert key in was and key in got and got[key] is was[key], (name, key)
    assert (now.revision == before.revision) is changes.empty


@given(steps=_STEPS, hinted=st.lists(st.booleans(), min_size=8, max_size=8))
@settings(max_examples=60, deadline=None)
def test_no_change_is_missed(steps: list[list[tuple[str, int, int]]], hinted: list[bool]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        view = _seed(root)
        for step, edits in enumerate(steps):
            paths: set[str] = set()
            for what, i, v in edits:
                paths |= _apply(root, what, i, v)
            now = _load(root, view, paths if hinted[step] else None)
            _assert_named(view, now)
            # the changes of two loads, one after the other, are those of both
            both = _changes(view).then(_changes(now))
            if not _changes(view).everything:
                assert both.since == _changes(view).since
                assert both.services == _changes(view).services | _changes(now).services
            view = now
