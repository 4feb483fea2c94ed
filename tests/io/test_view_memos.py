"""A view's memos of its own values: the service summary (the services in key order, the
instances, networked services and components counted) and the record index (each path's
position, the records with deps, those with diagnostics). A warm load that replaces some
services or records patches the previous view's instead of a pass over every one; along
random edits each must equal the one made from nothing."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.io.loader import Diagnostic, RecordIndex, ServiceSummary, StateView, load_state
from tests.support.state_files import NODE, write

_PLAIN = """apiVersion: reconciler/v1
kind: Service
id: {id}
version: 1.0.0
instances: {n}
image: {{rootfs: /r}}
"""
_NETWORKED = _PLAIN + "exposedPorts: ['80']\n"
_COMPONENT = _PLAIN + "type: component\nruntimes: [rootfs]\n"
_TEXTS = {"plain": _PLAIN, "networked": _NETWORKED, "component": _COMPONENT}

_EDIT = st.tuples(
    st.sampled_from(
        ["plain", "networked", "component", "broken", "delete", "node", "resources", "bad-node"]
    ),
    st.integers(0, 4),  # which service
    st.integers(0, 5),  # its instances
)


_RESOURCES = '[{{"name": "r{n}", "sharedCount": {c}}}]'


def _apply(root: Path, what: str, i: int, n: int) -> str:
    if what == "node":  # a node that reads a resources file, or not
        text = NODE.format(id=f"n{i % 2}")
        if n % 2:
            text += f"resourcesFile: resources/n{i % 2}.json\n"
        return str(write(root, f"nodes/n{i % 2}.yaml", text).relative_to(root))
    if what == "bad-node":
        return str(write(root, f"nodes/n{i % 2}.yaml", "kind: [oops\n").relative_to(root))
    if what == "resources":  # (not an input: a node that reads it is looked at every load)
        write(root, f"resources/n{i % 2}.json", _RESOURCES.format(n=n, c=n + 1))
        return f"nodes/n{i % 2}.yaml"  # (a hint a watcher would not give: harmless)
    rel = f"desired/s{i}.yaml"
    if what == "delete":
        (root / rel).unlink(missing_ok=True)
    elif what == "broken":
        write(root, rel, "kind: [oops\n")
    else:
        write(root, rel, _TEXTS[what].format(id=f"s{i}", n=n))
    return rel


def _assert_counted(view: StateView, diagnostics: list[Diagnostic]) -> None:
    got = view.summary()
    assert got == ServiceSummary.of(view.services)
    assert got.source is view.services
    assert view.services_sorted() == [view.services[k] for k in sorted(view.services)]
    index = view.records()
    assert index == RecordIndex.of(view.files) and index.source is view.files
    assert index.diagnostics() == [d for r in view.files.values() for d in r.diagnostics]
    assert diagnostics == index.diagnostics()


@given(
    steps=st.lists(st.lists(_EDIT, min_size=1, max_size=3), min_size=1, max_size=8),
    hinted=st.lists(st.booleans(), min_size=8, max_size=8),
    asked=st.lists(st.booleans(), min_size=8, max_size=8),
)
@settings(max_examples=80, deadline=None)
def test_the_summary_equals_one_counted_from_nothing(
    steps: list[list[tuple[str, int, int]]], hinted: list[bool], asked: list[bool]
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i in range(5):
            write(root, f"desired/s{i}.yaml", _PLAIN.format(id=f"s{i}", n=i))
        for i in range(2):
            write(root, f"nodes/n{i}.yaml", NODE.format(id=f"n{i}"))
            write(root, f"resources/n{i}.json", _RESOURCES.format(n=0, c=1))
        view, diagnostics = load_state(root)
        _assert_counted(view, diagnostics)
        for step, edits in enumerate(steps):
            paths = {_apply(root, *edit) for edit in edits}
            view, diagnostics = load_state(root, view, changed=paths if hinted[step] else None)
            if asked[step]:  # (a memo not asked for is not there to patch next time)
                _assert_counted(view, diagnostics)
            else:  # (the diagnostics: always from the index when the load patched the view)
                assert diagnostics == [d for r in view.files.values() for d in r.diagnostics]


def test_a_warm_edit_patches_the_summary(tmp_path: Path) -> None:
    for i in range(3):
        write(tmp_path, f"desired/s{i}.yaml", _PLAIN.format(id=f"s{i}", n=1))
    view, _ = load_state(tmp_path)
    before = view.summary()
    write(tmp_path, "desired/s1.yaml", _NETWORKED.format(id="s1", n=4))
    view, _ = load_state(tmp_path, view, changed={"desired/s1.yaml"})
    got = view.summary_memo
    assert got is not None and got.source is view.services  # patched by the load
    assert got.keys is before.keys and got.at is before.at  # (shared: the same keys)
    assert (got.instances, got.networked, got.components) == (6, 1, 0)
    assert got == ServiceSummary.of(view.services)


def test_a_view_with_other_services_counts_them_again(tmp_path: Path) -> None:
    for i in range(2):
        write(tmp_path, f"desired/s{i}.yaml", _PLAIN.format(id=f"s{i}", n=1))
    view, _ = load_state(tmp_path)
    view.summary()
    key = next(iter(view.services))
    edited = view.services[key].model_copy(update={"instances": 7})
    other = replace(view, services={**view.services, key: edited})
    assert other.summary().instances == 8
