"""The balancer's value types (``reconciler.placement.instances``): the instance order of
SPEC §7.1 as ``expand_instances`` produces it, and the fast constructors, which must build
exactly the objects the dataclasses' own constructors build."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reconciler.model.documents import Service
from reconciler.model.values import instance_id
from reconciler.placement.instances import (
    Instance,
    Placement,
    Requested,
    expand_instances,
    new_instance,
    new_placement,
    new_requested,
)
from tests.support.builders import make_service


def _sorted_instances(services: list[Service]) -> list[Instance]:
    """SPEC §7.1 the straightforward way: every instance, then one stable sort."""
    out = [
        Instance(instance_id(s.id, s.subject, i), s.id, s.subject, i, s)
        for s in services
        for i in range(s.instances)
    ]
    out.sort(key=Instance.order_key)
    return out


@st.composite
def _services(draw: st.DrawFn) -> list[Service]:
    """Services with few distinct priorities, ids and subjects, so that ties are common, and
    sometimes two with the same (itemId, subjectId), told apart by their version."""
    out = []
    for n in range(draw(st.integers(0, 8))):
        out.append(
            make_service(
                draw(st.sampled_from(["a", "b", "b.c", "c"])),
                subject=draw(st.sampled_from(["default", "s1", "s2"])),
                priority=draw(st.integers(-1, 2)),
                instances=draw(st.integers(0, 4)),
                version=f"1.0.{n}",
            )
        )
    return out


class TestExpandInstances:
    @given(_services())
    def test_the_order_of_one_sort_of_every_instance(self, services: list[Service]) -> None:
        got, want = expand_instances(services), _sorted_instances(services)
        assert got == want
        # the same service objects, also between services with the same key
        assert [i.service for i in got] == [i.service for i in want]
        assert all(a.service is b.service for a, b in zip(got, want, strict=True))

    def test_instances_of_a_service_come_together_by_index(self) -> None:
        services = [
            make_service("b", instances=2),
            make_service("a", instances=3, priority=1),
            make_service("a", instances=2, subject="x"),
        ]
        got = [(i.item_id, i.subject_id, i.index) for i in expand_instances(services)]
        assert got == [
            ("a", "default", 0),
            ("a", "default", 1),
            ("a", "default", 2),
            ("a", "x", 0),
            ("a", "x", 1),
            ("b", "default", 0),
            ("b", "default", 1),
        ]


_requested = st.builds(Requested, *[st.integers(0, 2**40)] * 4)
_device_ids = st.lists(
    st.tuples(st.text(max_size=5), st.lists(st.text(max_size=5), max_size=3).map(tuple)),
    max_size=2,
).map(tuple)
_placement_fields = st.tuples(
    st.text(max_size=8),
    st.text(max_size=8),
    st.text(max_size=8),
    st.integers(0, 100),
    st.text(max_size=8),
    st.integers(-5, 5),
    st.text(max_size=8),
    st.text(max_size=8),
    _requested,
    st.lists(st.text(max_size=5), max_size=3).map(tuple),
    _device_ids,
    st.lists(st.text(max_size=5), max_size=3).map(tuple),
    st.sampled_from([None, "rebalanced", "preempted"]),
)


def _same_object(built: Any, constructed: Any) -> None:
    """``built`` is what the dataclass's constructor made: same class, fields, equality, hash
    (or none), representation; frozen; and it copies, pickles and ``replace``s alike."""
    assert type(built) is type(constructed)
    assert built == constructed and constructed == built
    try:
        assert hash(built) == hash(constructed)
    except TypeError:  # an Instance holds its Service, a pydantic model with a dict field
        with pytest.raises(TypeError):
            hash(constructed)
    assert repr(built) == repr(constructed)
    assert dataclasses.astuple(built) == dataclasses.astuple(constructed)
    assert pickle.loads(pickle.dumps(built)) == constructed
    assert copy.copy(built) == constructed
    first = dataclasses.fields(built)[0].name
    assert dataclasses.replace(built, **{first: 0}) == dataclasses.replace(
        constructed, **{first: 0}
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(built, first, 0)


class TestFastConstructors:
    @given(_placement_fields)
    def test_new_placement_builds_what_placement_builds(self, fields: tuple[Any, ...]) -> None:
        _same_object(new_placement(*fields), Placement(*fields))

    @given(*[st.integers(0, 2**40)] * 4)
    def test_new_requested_builds_what_requested_builds(
        self, cpu: int, ram: int, storage: int, state: int
    ) -> None:
        _same_object(new_requested(cpu, ram, storage, state), Requested(cpu, ram, storage, state))

    @given(st.text(max_size=8), st.integers(0, 100))
    def test_new_instance_builds_what_instance_builds(self, iid: str, index: int) -> None:
        s = make_service("a")
        _same_object(
            new_instance(iid, s.id, s.subject, index, s), Instance(iid, s.id, s.subject, index, s)
        )

    def test_they_take_every_field(self) -> None:
        # a field added to a dataclass must be added to its constructor here too
        for build, cls in ((new_instance, Instance), (new_placement, Placement)):
            params = list(build.__code__.co_varnames[: build.__code__.co_argcount])
            assert params == [f.name for f in dataclasses.fields(cls)]
        params = list(new_requested.__code__.co_varnames[: new_requested.__code__.co_argcount])
        assert params == [f.name for f in dataclasses.fields(Requested)]
