"""A view's service summary (the services in key order, the instances, networked services and
components counted): a warm load that replaces some services patches the previous view's
summary instead of counting every service again; along random edits it must equal the one
counted from nothing."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.io.loader import ServiceSummary, StateView, load_state
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
    st.sampled_from(["plain", "networked", "component", "broken", "delete"]),
    st.integers(0, 4),  # which service
    st.integers(0, 5),  # its instances
)


def _apply(root: Path, what: str, i: int, n: int) -> str:
    rel = f"desired/s{i}.yaml"
    if what == "delete":
        (root / rel).unlink(missing_ok=True)
    elif what == "broken":
        write(root, rel, "kind: [oops\n")
    else:
        write(root, rel, _TEXTS[what].format(id=f"s{i}", n=n))
    return rel


def _assert_counted(view: StateView) -> None:
    got = view.summary()
    assert got == ServiceSummary.of(view.services)
    assert got.source is view.services
    assert view.services_sorted() == [view.services[k] for k in sorted(view.services)]


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
        write(root, "nodes/n0.yaml", NODE.format(id="n0"))
        view, _ = load_state(root)
        _assert_counted(view)
        for step, edits in enumerate(steps):
            paths = {_apply(root, *edit) for edit in edits}
            view, _ = load_state(root, view, changed=paths if hinted[step] else None)
            if asked[step]:  # (a summary not asked for is not there to patch next time)
                _assert_counted(view)


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
