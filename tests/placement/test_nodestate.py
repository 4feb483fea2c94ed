"""Node states during a balance call (``reconciler.placement.nodestate``): named resources
kept as integer pools must read as the shared-count policy's own states, the unit.yaml lookup
once per node type must give ``UnitConfig.config_for``'s entry, and empty pool states shared
between the nodes of a call must be the states each node would have built."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from reconciler.placement.nodestate import NodeConfigs, NodeSlot, StateCache, make_slot, node_basics
from reconciler.placement.sharing import REGISTRY, ShareRequest
from reconciler.placement.sharing.base import Item, PoolState
from tests.support.builders import make_node, make_unit

_SHARED = REGISTRY["shared-count"]
_NONE: frozenset[str] = frozenset()


def _slot(resources: list[dict[str, Any]], states: StateCache | None = None) -> NodeSlot:
    return make_slot(None, make_node("n", resources=resources), _NONE, None, states)


@given(
    shared=st.integers(0, 3),
    steps=st.lists(st.booleans(), max_size=8),  # True: take a slot, False: give one back
)
def test_a_named_resource_reads_as_the_policys_state(shared: int, steps: list[bool]) -> None:
    """Taking and giving back slots on the integer pool gives the state the policy's own
    ``allocate`` and ``release`` give, and a slot is free exactly when its ``filter`` says so."""
    slot = _slot([{"name": "can0", "sharedCount": shared}])
    request = ShareRequest("can0")
    state = _SHARED.new_state("can0", (Item("can0"),), shared)
    assert slot.resources == {"can0": state}
    held = 0
    ids: tuple[str, ...] = ("can0",)  # what the policy gave: the resource itself
    for take in steps:
        free = slot.free_slots((request,))
        assert (free is not None) == _SHARED.filter(state, request).ok
        if take and free is not None:
            slot.take_slots(free)
            state, ids = _SHARED.allocate(state, request)
            held += 1
        elif not take and held:
            slot.give_resources(ids)
            state = _SHARED.release(state, request, ids)
            held -= 1
        assert slot.resources == {"can0": state}


def test_a_resource_the_node_lacks_has_no_free_slot() -> None:
    slot = _slot([{"name": "can0", "sharedCount": 1}])
    assert slot.free_slots((ShareRequest("camera"),)) is None
    assert slot.free_slots((ShareRequest("can0"), ShareRequest("camera"))) is None
    assert slot.free_slots(()) == []


def test_a_clone_takes_its_own_slots() -> None:
    slot = _slot([{"name": "can0", "sharedCount": 2}])
    before = slot.resources
    clone = slot.clone()
    free = clone.free_slots((ShareRequest("can0"),))
    assert free is not None
    clone.take_slots(free)
    assert slot.resources == before
    assert clone.resources["can0"].slots.used == 1


def test_nodes_of_one_call_share_their_empty_pool_states() -> None:
    """Nodes declaring the same named resources and device pools get the same (immutable)
    empty states, equal to those a node builds on its own."""
    resources = [{"name": "can0", "sharedCount": 0}, {"name": "camera", "sharedCount": 2}]
    pools = [
        {
            "resource": "example.com/gpu",
            "policy": "fractional",
            "devices": [{"id": f"gpu{k}", "memory": "16Gi"} for k in range(2)],
        },
        {"resource": "npu", "policy": "exclusive", "devices": [{"id": "npu0"}]},
    ]
    states: StateCache = {}
    a, b = (
        make_slot(None, make_node(n, resources=resources, device_pools=pools), _NONE, None, states)
        for n in ("a", "b")
    )
    alone = make_slot(None, make_node("c", resources=resources, device_pools=pools), _NONE)
    assert a.pools == b.pools == alone.pools
    assert all(a.pools[r] is b.pools[r] for r in a.pools)
    assert a.resources == b.resources == alone.resources
    assert all(a.resource_pools[r].empty is b.resource_pools[r].empty for r in a.resources)
    assert all(isinstance(s, PoolState) for s in states.values())


@st.composite
def _units_and_nodes(draw: st.DrawFn) -> tuple[Any, list[Any]]:
    types = ("edge", "gpu", "gw")
    nodes = [
        make_node(f"n{i}", node_type=draw(st.sampled_from(types)))
        for i in range(draw(st.integers(1, 6)))
    ]
    keys = draw(  # (nodeType, nodeId or None), each once (the unit refuses duplicates)
        st.lists(
            st.tuples(
                st.sampled_from(types),
                st.none() | st.sampled_from([n.id for n in nodes] + ["other"]),
            ),
            max_size=5,
            unique=True,
        )
    )
    entries = []
    for node_type, node_id in keys:
        entry: dict[str, Any] = {
            "nodeType": node_type,
            "priority": draw(st.integers(0, 3)),
            "labels": draw(st.lists(st.sampled_from(["l1", "l2"]), unique=True)),
        }
        if node_id is not None:
            entry["nodeId"] = node_id
        entries.append(entry)
    return (make_unit(entries) if draw(st.booleans()) else None), nodes


@given(_units_and_nodes())
def test_unit_entries_looked_up_once_per_type(case: tuple[Any, list[Any]]) -> None:
    """``NodeConfigs`` gives each node ``UnitConfig.config_for``'s entry (the one naming its
    id, else the first for its type), so the same basics as a lookup of its own."""
    unit, nodes = case
    configs = NodeConfigs(unit)
    for node in nodes:
        cfg, settings = configs.entry(node)
        assert cfg is (unit.config_for(node.id, node.type) if unit is not None else None)
        assert node_basics(unit, node, _NONE, configs) == node_basics(unit, node, _NONE)
        assert settings == node_basics(unit, node, _NONE)[0]
