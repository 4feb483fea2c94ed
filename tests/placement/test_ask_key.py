"""The ask key (``ask.ask_key``) holds everything an ask is made of: an ask built from it
equals one read from the service field by field, services with equal keys have asks of one
shape, and the class index's memo of groups by ask key gives each instance the group of its
own ask's shape."""

from __future__ import annotations

from functools import partial

from hypothesis import given
from hypothesis import strategies as st

from reconciler.accel import ClassIndex
from reconciler.accel.classes import shape_of
from reconciler.model.documents import Service
from reconciler.placement.ask import Ask, ask_for, ask_key, request_inputs
from reconciler.placement.balancer import Run
from reconciler.placement.instances import Instance, expand_instances
from reconciler.placement.sharing import ShareRequest
from tests.support.balancer_scenarios import SETTINGS, Scenario, scenarios, services

NODE_IDS = ["n0", "n1", "n2"]


def _reference_ask(instance: Instance, usage: tuple[int, int] | None) -> Ask:
    """What an instance asks, read from its service field by field (no key)."""
    s = instance.service
    p = s.image.platform
    platform = None if p is None else (p.architecture, p.os, p.variant, p.osVersion, p.osFeatures)
    return Ask(
        instance,
        frozenset(s.labels),
        frozenset(s.runtimes),
        s.nodeId,
        platform,  # type: ignore[arg-type]  # (a Platform is this tuple)
        tuple(ShareRequest(r.name) for r in s.resources),
        tuple(
            ShareRequest(d.resource, d.count or 1, d.memory)
            for d in sorted(s.devices, key=lambda d: d.resource)
        ),
        request_inputs(s),
        usage=usage,
    )


def _first(service: Service) -> Instance:
    return expand_instances([service.model_copy(update={"instances": 1})])[0]


@SETTINGS
@given(services("s", NODE_IDS), st.none() | st.tuples(st.integers(0, 9), st.integers(0, 9)))
def test_the_ask_made_from_the_key_is_the_services(
    service: Service, usage: tuple[int, int] | None
) -> None:
    instance = _first(service)
    assert ask_for(instance, usage) == _reference_ask(instance, usage)
    assert ask_for(instance, usage, ask_key(service)) == _reference_ask(instance, usage)


@SETTINGS
@given(services("a", NODE_IDS), services("b", NODE_IDS), st.data())
def test_equal_keys_mean_one_shape(a: Service, b: Service, data: st.DataObject) -> None:
    shape = shape_of()
    # b asks as a does, under another name, priority and count: their keys are equal
    twin = a.model_copy(
        update={
            "id": "b",
            "priority": data.draw(st.integers(0, 5)),
            "instances": data.draw(st.integers(1, 3)),
        }
    )
    assert ask_key(twin) == ask_key(a)
    assert shape(_reference_ask(_first(twin), None)) == shape(_reference_ask(_first(a), None))
    # and services asking differently never share a key
    if shape(_reference_ask(_first(a), None)) != shape(_reference_ask(_first(b), None)):
        assert ask_key(a) != ask_key(b)


@SETTINGS
@given(scenarios(), st.booleans())
def test_the_index_gives_each_instance_the_group_of_its_shape(
    scenario: Scenario, told: bool
) -> None:
    # told: the index reads the services' ask keys up front (as accel.balance has it do)
    search = partial(ClassIndex, services=scenario.services) if told else ClassIndex
    run = Run(scenario.unit, scenario.nodes(), {}, search=search)
    index = run.search
    assert isinstance(index, ClassIndex)
    assert len(index.ask_keys) == (len(scenario.services) if told else 0)
    shape = shape_of()
    # twins of every service (asking the same under another id, not told) hit the memo; and
    # edited ones (another object, asking otherwise) do not find the key of the one told
    twins = [s.model_copy(update={"id": f"{s.id}-twin"}) for s in scenario.services]
    edited = [
        s.model_copy(update={"labels": ("l3",), "id": f"{s.id}-edited"}) for s in scenario.services
    ]
    for s, e in zip(scenario.services, edited, strict=True):  # (as if e had taken s's id)
        index.ask_keys[id(e)] = (s, ask_key(s))
    for instance in expand_instances([*scenario.services, *twins, *edited]):
        group = index.group(instance)
        assert index.shapes[shape(_reference_ask(instance, None))] is group
        assert group.static_key == shape(_reference_ask(instance, None))[0]
