"""``explain``'s lookup of an instance by what the user typed: a label is found by its service
alone, and names exactly the instance a scan of every instance finds."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.cli.explainview import find_instance
from reconciler.model.documents import Service
from reconciler.placement.instances import expand_instances
from tests.support.builders import make_service

ITEMS = ["a", "b", "a.b"]
SUBJECTS = ["default", "s1", "s2"]


def scan(services: Sequence[Service], needle: str) -> str | None:
    """The reference: the first instance, in placement order, that the needle names."""
    for inst in expand_instances(list(services)):
        if needle in (inst.id, inst.label, f"{inst.item_id}:{inst.index}"):
            return inst.id
    return None


@st.composite
def units(draw: st.DrawFn) -> list[Service]:
    keys = draw(st.lists(st.tuples(st.sampled_from(ITEMS), st.sampled_from(SUBJECTS)), unique=True))
    return [
        make_service(
            item,
            subject=subject,
            instances=draw(st.integers(0, 3)),
            priority=draw(st.sampled_from([0, 5, 10])),
        )
        for item, subject in keys
    ]


needles = st.one_of(
    st.builds(
        lambda i, s, n: f"{i}:{s}:{n}",
        st.sampled_from(ITEMS),
        st.sampled_from(SUBJECTS),
        st.sampled_from(["0", "1", "2", "3", "01", "-1", "x", "", "1.0"]),
    ),
    st.builds(
        lambda i, n: f"{i}:{n}",
        st.sampled_from([*ITEMS, "default", "s1"]),
        st.sampled_from(["0", "1", "2", "3", "00", "x", ""]),
    ),
    st.sampled_from(["a", "a:s1", "a:s1:0:0", ":", "::", "a::0", ""]),
    st.text(alphabet="ab:01-", max_size=8),
)


def near(services: list[Service]) -> st.SearchStrategy[str]:
    """Needles made of the unit's own ids: ITEM:INDEX and ITEM:SUBJECT:INDEX, in range or not."""
    if not services:
        return st.just("a:0")
    service = st.sampled_from(services)
    index = st.sampled_from(["0", "1", "2", "3"])
    return st.one_of(
        st.builds(lambda s, n: f"{s.id}:{n}", service, index),
        st.builds(lambda s, n: f"{s.id}:{s.subject}:{n}", service, index),
    )


@settings(max_examples=400)
@given(units(), st.data())
def test_a_needle_names_what_a_scan_of_every_instance_finds(
    services: list[Service], data: st.DataObject
) -> None:
    needle = data.draw(st.one_of(needles, near(services)))
    assert find_instance(services, needle) == scan(services, needle)
    # as explain gets them: in key order, with the services by key
    in_order = sorted(services, key=lambda s: s.key)
    by_key = {s.key: s for s in in_order}
    assert find_instance(in_order, needle, by_key) == scan(in_order, needle)


@settings(max_examples=100)
@given(units(), st.data())
def test_every_instance_id_finds_itself(services: list[Service], data: st.DataObject) -> None:
    instances = expand_instances(services)
    if instances:
        inst = data.draw(st.sampled_from(instances))
        assert find_instance(services, inst.id) == inst.id
        assert find_instance(services, inst.label) == inst.id
