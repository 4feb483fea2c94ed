"""The sharing-policy interface as the balancer uses it (SPEC §6.3): a request reaches a pool
only when its policy has it (``has_request``), and verdicts say whether a preemption could help
(``Unschedulable`` versus ``UnschedulableAndUnresolvable``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import pytest

from reconciler.accel import balance
from reconciler.placement import sharing
from reconciler.placement.filters import DevicesFilter, ResourcesFilter
from reconciler.placement.sharing import ExclusivePolicy, ShareRequest, Status, StatusCode
from reconciler.placement.sharing.base import PoolState
from tests.support.builders import make_node, make_service
from tests.support.filter_inputs import ask_of, slot_of


class SinglesPolicy(ExclusivePolicy):
    """``exclusive``, but a pool has only requests of one device (a test-only policy)."""

    name: ClassVar[str] = "singles"

    def has_request(self, state: PoolState, request: ShareRequest) -> bool:
        return super().has_request(state, request) and request.count == 1


@pytest.fixture
def singles() -> Iterator[None]:
    sharing.register(SinglesPolicy())
    try:
        yield
    finally:
        sharing.unregister(SinglesPolicy.name)


@pytest.mark.usefixtures("singles")
@pytest.mark.parametrize("exhaustive", [False, True])
def test_a_request_reaches_only_a_pool_whose_policy_has_it(exhaustive: bool) -> None:
    pool = {"resource": "gpu", "policy": "singles", "devices": [{"id": "g0"}, {"id": "g1"}]}
    node = make_node("n1", device_pools=[pool])
    one = make_service("one", devices=[{"resource": "gpu", "count": 1}])
    two = make_service("two", devices=[{"resource": "gpu", "count": 2}])
    result = balance(None, [node], [one, two], exhaustive=exhaustive)
    assert [p.item_id for p in result.placements] == ["one"]
    (failure,) = result.failures
    assert (failure.item_id, failure.reason) == ("two", "Devices")
    cell = DevicesFilter().check(slot_of(node), ask_of(two))
    assert cell == "no device pool gpu"


def _verdict(pool_devices: list[dict[str, object]], count: int, others: int = 0) -> Status:
    pool = {"resource": "gpu", "policy": "exclusive", "devices": pool_devices}
    node = make_node("n1", device_pools=[pool])
    held = [make_service("held", priority=100, devices=[{"resource": "gpu", "count": 1}])]
    slot = slot_of(node, others=held[:others])
    return DevicesFilter().verdict(
        slot, ask_of(make_service("s", devices=[{"resource": "gpu", "count": count}]))
    )


def test_verdicts_say_whether_a_preemption_could_help() -> None:
    taken = _verdict([{"id": "g0"}], 1, others=1)
    assert taken.code is StatusCode.UNSCHEDULABLE
    assert taken.preemption_may_help and not taken.unresolvable
    too_few = _verdict([{"id": "g0"}, {"id": "g1", "healthy": False}], 2)
    assert too_few.code is StatusCode.UNRESOLVABLE
    assert too_few.unresolvable and not too_few.preemption_may_help
    ok = _verdict([{"id": "g0"}], 1)
    assert ok.ok and not ok.preemption_may_help and not ok.unresolvable
    wrong = Status(StatusCode.ERROR, "memory asked of an exclusive pool")
    assert wrong.unresolvable and not wrong.preemption_may_help


def test_no_pool_and_no_resource_are_unresolvable() -> None:
    node = make_node("n1", resources=[{"name": "can0", "sharedCount": 1}])
    gpu = make_service("s", devices=[{"resource": "gpu", "count": 1}], resources=["usb"])
    assert DevicesFilter().verdict(slot_of(node), ask_of(gpu)).unresolvable
    assert ResourcesFilter().verdict(slot_of(node), ask_of(gpu)).unresolvable
    can = make_service("c", resources=["can0"])
    full = slot_of(node, others=[make_service("h", priority=100, resources=["can0"])])
    assert ResourcesFilter().verdict(full, ask_of(can)).preemption_may_help
