"""Nova/Placement inventories of a node (SPEC §6.1): ``inventories`` of the node file shape its
pools (``reserved``, ``allocationRatio``) and restrict its requests (``minUnit``, ``maxUnit``,
``stepSize``) in the balancer, ``explain`` and the node states status reads.

The numbers are worked out by hand: a node of 1000 DMIPS and 1 GiB, services asking 100 DMIPS
per instance.
"""

from __future__ import annotations

from typing import Any

import pytest

from reconciler.accel import balance, explain, node_states
from reconciler.model.values import instance_id
from reconciler.placement.filters import FILTER_CODES
from tests.support.builders import make_node, make_service

MI = 1024**2


def _placed(inventories: dict[str, Any] | None, *, instances: int = 40, cpu: int = 100) -> int:
    node = make_node("n1", inventories=inventories)
    result = balance(None, [node], [make_service("s", instances=instances, cpu=cpu)])
    return len(result.placements)


def test_allocation_ratio_2_places_twice_the_cpu_requests() -> None:
    assert _placed(None) == 10
    assert _placed({"cpu": {"allocationRatio": 2}}) == 20
    assert _placed({"cpu": {"allocationRatio": 0.5}}) == 5


def test_reserved_lowers_the_capacity() -> None:
    assert _placed({"cpu": {"reserved": 300}}) == 7
    # Placement's order: the reserved part first, then the ratio: (1000 - 300) * 2
    assert _placed({"cpu": {"reserved": 300, "allocationRatio": 2}}) == 14


def test_ram_storage_and_state_inventories_shape_their_pools() -> None:
    node = make_node(
        "n1",
        partitions=[
            {"name": "ps", "types": ["storages"], "totalSize": "1Gi"},
            {"name": "pt", "types": ["states"], "totalSize": "1Gi"},
        ],
        inventories={
            "ram": {"allocationRatio": 1.5},
            "storage": {"reserved": "512Mi"},
            "state": {"allocationRatio": 3},
        },
    )
    ram = balance(None, [node], [make_service("r", instances=20, ram="128Mi")])
    assert len(ram.placements) == 12  # 1.5 GiB / 128 MiB
    storage = balance(None, [node], [make_service("s", instances=20, storage="128Mi")])
    assert len(storage.placements) == 4  # 512 MiB left
    state = balance(None, [node], [make_service("t", instances=40, state="128Mi")])
    assert len(state.placements) == 24  # 3 GiB


@pytest.mark.parametrize(
    ("settings", "cpu", "cell"),
    [
        ({"minUnit": 200}, 150, "needs 150 DMIPS: below-min-unit (inventories.cpu.minUnit 200)"),
        ({"maxUnit": 400}, 500, "needs 500 DMIPS: above-max-unit (inventories.cpu.maxUnit 400)"),
        ({"stepSize": 100}, 250, "needs 250 DMIPS: step-size (inventories.cpu.stepSize 100)"),
    ],
)
def test_unit_rules_refuse_a_request_with_a_reason_explain_names(
    settings: dict[str, int], cpu: int, cell: str
) -> None:
    """The instance fits the node's free CPU but breaks a unit rule: it fails with the Cpu
    reason, and ``explain``'s Cpu cell names the rule; a node without the rule takes it."""
    strict = make_node("a-strict", dmips=4000, inventories={"cpu": settings})
    plain = make_node("b-plain", dmips=1000)
    service = make_service("s", cpu=cpu)
    alone = balance(None, [strict], [service])
    assert not alone.placements
    (failure,) = alone.failures
    assert failure.reason == "Cpu"
    assert failure.summary == "s:default:0: 0/1 nodes feasible: 1 Cpu"
    exhaustive = balance(None, [strict], [service], exhaustive=True)
    assert exhaustive == alone
    iid = instance_id("s", "default", 0)
    exp = explain(None, [strict], [service], iid)
    ((node_id, cells, dropped),) = exp.rows
    assert (node_id, dropped) == ("a-strict", "Cpu")
    assert cells[FILTER_CODES.index("Cpu")] == cell
    # the same request on a node that declares no rule (and has less CPU) is placed there
    both = balance(None, [strict, plain], [service])
    assert [p.node_id for p in both.placements] == ["b-plain"]


def test_unit_rules_say_nothing_of_what_is_not_asked_and_of_other_resources() -> None:
    node = make_node("n1", inventories={"cpu": {"minUnit": 200}, "ram": {"stepSize": "64Mi"}})
    placed = balance(None, [node], [make_service("s", instances=2, ram="128Mi")])
    assert len(placed.placements) == 2  # cpu 0: no rule applies; 128 MiB is 2 steps


def test_node_states_show_the_inventory() -> None:
    """What status reads: the node's CPU pool is the declared inventory, with the placements'
    amounts used."""
    node = make_node("n1", inventories={"cpu": {"reserved": 200, "allocationRatio": 2}})
    services = [make_service("s", instances=3, cpu=500)]
    result = balance(None, [node], services)
    cpu = node_states(None, [node], services, result)["n1"].cpu
    assert (cpu.total, cpu.reserved, cpu.allocation_ratio) == (1000, 200, 2)
    assert (cpu.capacity, cpu.used, cpu.free) == (1600, 1500, 100)


def test_no_inventories_and_default_ones_give_the_same_result() -> None:
    """Declaring every setting at its default changes nothing (and no declaration is the
    default)."""
    defaults = {"reserved": 0, "allocationRatio": 1, "minUnit": 1, "stepSize": 1}
    plain = make_node("n1", dmips=700)
    declared = make_node("n1", dmips=700, inventories={"cpu": defaults, "ram": {}})
    assert not declared.inventories.declared
    services = [make_service("s", instances=9, cpu=100), make_service("t", ram="256Mi")]
    assert balance(None, [declared], services) == balance(None, [plain], services)
