"""Every sharing policy of ``reconciler.placement.sharing.REGISTRY`` (SPEC §6.2, §6.3) as a
table of its own answers: for a pool (its items, its shared count, what earlier requests took)
and one request (with the ids a kept allocation asks for again), the :class:`Status` of
``filter`` (its code and its exact reason) and, where it succeeds, what ``allocate`` gives (the
ids, and the pool's holders, memory used and slots used afterwards); ``release`` of what was
given is the pool as it was before.

The pools: ``gpu`` (exclusive) with devices g0, g1 (unhealthy), g2, g3; ``vgpu`` (fractional)
with dev0 of 16 GiB, dev1 of 8 GiB and dev2 of 32 GiB (unhealthy); ``can0`` (shared-count) with
2 concurrent users or, shared count 0, unlimited. Every expected value is worked out by hand
(1 GiB = 1073741824 bytes).

A policy added to ``REGISTRY`` fails ``test_every_policy_has_a_table`` until its rows are here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from reconciler.placement.sharing import REGISTRY, ShareRequest, Status, StatusCode
from reconciler.placement.sharing.base import Item, PoolState

GI = 1024**3
OK = Status(StatusCode.SUCCESS)
ERROR = StatusCode.ERROR
NOT_NOW = StatusCode.UNSCHEDULABLE
NEVER = StatusCode.UNRESOLVABLE


@dataclass(frozen=True)
class Pool:
    policy: str
    resource: str
    items: tuple[Item, ...]
    limit: int = 0
    taken: tuple[ShareRequest, ...] = ()  # allocated first, in order, nothing kept

    def state(self) -> PoolState:
        policy = REGISTRY[self.policy]
        state = policy.new_state(self.resource, self.items, self.limit)
        for request in self.taken:
            state, _ = policy.allocate(state, request)
        return state


@dataclass(frozen=True)
class Given:
    """What ``allocate`` gives: the ids, then the pool's holders, memory used and slots used."""

    ids: tuple[str, ...]
    holders: tuple[tuple[str, int], ...]
    memory_used: tuple[tuple[str, int], ...]
    slots_used: int


@dataclass(frozen=True)
class Row:
    case: str
    pool: Pool
    request: ShareRequest
    expected: Status
    given: Given | None = None  # when expected is Success
    keep: tuple[str, ...] = ()


def gpu(*taken: int) -> Pool:
    items = (Item("g0"), Item("g1", healthy=False), Item("g2"), Item("g3"))
    return Pool("exclusive", "gpu", items, taken=tuple(ShareRequest("gpu", n) for n in taken))


def vgpu(*taken_gi: int) -> Pool:
    items = (
        Item("dev0", memory=16 * GI),
        Item("dev1", memory=8 * GI),
        Item("dev2", healthy=False, memory=32 * GI),
    )
    taken = tuple(ShareRequest("vgpu", memory=n * GI) for n in taken_gi)
    return Pool("fractional", "vgpu", items, taken=taken)


def can0(limit: int, users: int = 0) -> Pool:
    return Pool("shared-count", "can0", (Item("can0"),), limit, (ShareRequest("can0"),) * users)


def exclusive(n: int) -> ShareRequest:
    return ShareRequest("gpu", n)


def fractional(gi: int) -> ShareRequest:
    return ShareRequest("vgpu", memory=gi * GI)


ROWS: tuple[Row, ...] = (
    # ------------------------------------------------------------ exclusive
    Row(
        "one of an empty pool: the smallest id",
        gpu(),
        exclusive(1),
        OK,
        Given(("g0",), (("g0", 1),), (), 1),
    ),
    Row(
        "every healthy device",
        gpu(),
        exclusive(3),
        OK,
        Given(("g0", "g2", "g3"), (("g0", 1), ("g2", 1), ("g3", 1)), (), 3),
    ),
    Row(
        "more than the healthy devices",
        gpu(),
        exclusive(4),
        Status(NEVER, "gpu: 4 requested, 3 healthy devices"),
    ),
    Row(
        "the free ones after two taken",
        gpu(2),
        exclusive(1),
        OK,
        Given(("g3",), (("g0", 1), ("g2", 1), ("g3", 1)), (), 3),
    ),
    Row("more than are free", gpu(2), exclusive(2), Status(NOT_NOW, "gpu: 2 requested, 1 free")),
    Row(
        "memory asked",
        gpu(),
        ShareRequest("gpu", memory=GI),
        Status(ERROR, "gpu is exclusive: request a count"),
    ),
    Row(
        "kept ids, sorted",
        gpu(),
        exclusive(2),
        OK,
        Given(("g0", "g3"), (("g0", 1), ("g3", 1)), (), 2),
        keep=("g3", "g0"),
    ),
    Row(
        # health is not asked of kept ids: the placement that keeps it lists it as unhealthy
        "a kept unhealthy device is given",
        gpu(),
        exclusive(1),
        OK,
        Given(("g1",), (("g1", 1),), (), 1),
        keep=("g1",),
    ),
    Row(
        "a kept device that vanished",
        gpu(),
        exclusive(1),
        Status(NEVER, "gpu: g9 vanished"),
        keep=("g9",),
    ),
    Row(
        "a kept device now taken",
        gpu(1),
        exclusive(1),
        Status(NOT_NOW, "gpu: g0 is taken"),
        keep=("g0",),
    ),
    Row(
        "kept ids of another count",
        gpu(),
        exclusive(2),
        Status(NOT_NOW, "gpu: count changed"),
        keep=("g0",),
    ),
    # ------------------------------------------------------------ fractional
    Row(
        "the fullest device that fits",
        vgpu(),
        fractional(8),
        OK,
        Given(("dev1",), (("dev1", 1),), (("dev1", 8 * GI),), 1),
    ),
    Row(
        "the only device big enough",
        vgpu(),
        fractional(12),
        OK,
        Given(("dev0",), (("dev0", 1),), (("dev0", 12 * GI),), 1),
    ),
    Row(
        "a device already in use is fuller (6 GiB free on dev0, 8 on dev1)",
        vgpu(10),
        fractional(4),
        OK,
        Given(("dev0",), (("dev0", 2),), (("dev0", 14 * GI),), 1),
    ),
    Row(
        "bigger than any healthy device (the unhealthy one is not counted)",
        vgpu(),
        fractional(20),
        Status(NEVER, "vgpu: no healthy device with 20 GiB free"),
    ),
    Row(
        "not now: dev0 has 6 GiB free, dev1 is too small",
        vgpu(10),
        fractional(12),
        Status(NOT_NOW, "vgpu: no healthy device with 12 GiB free"),
    ),
    Row(
        "a count asked",
        vgpu(),
        ShareRequest("vgpu", 1),
        Status(ERROR, "vgpu is fractional: request memory"),
    ),
    Row(
        "a kept device",
        vgpu(),
        fractional(8),
        OK,
        Given(("dev0",), (("dev0", 1),), (("dev0", 8 * GI),), 1),
        keep=("dev0",),
    ),
    Row(
        "a kept device that vanished",
        vgpu(),
        fractional(8),
        Status(NEVER, "vgpu: dev9 vanished"),
        keep=("dev9",),
    ),
    Row(
        "a kept device that lacks memory now",
        vgpu(10),
        fractional(8),
        Status(NOT_NOW, "vgpu: dev0 lacks free memory"),
        keep=("dev0",),
    ),
    # ------------------------------------------------------------ shared-count
    Row("a free slot", can0(2), ShareRequest("can0"), OK, Given(("can0",), (), (), 1)),
    Row("the last free slot", can0(2, 1), ShareRequest("can0"), OK, Given(("can0",), (), (), 2)),
    Row(
        "every slot in use",
        can0(2, 2),
        ShareRequest("can0"),
        Status(NOT_NOW, "can0: all 2 shared slots in use"),
    ),
    Row(
        "shared count 0 is unlimited",
        can0(0, 5),
        ShareRequest("can0"),
        OK,
        Given(("can0",), (), (), 6),
    ),
)

IDS = [f"{r.pool.policy}: {r.case}" for r in ROWS]


@pytest.mark.parametrize("row", ROWS, ids=IDS)
def test_filter_gives_the_status(row: Row) -> None:
    assert REGISTRY[row.pool.policy].filter(row.pool.state(), row.request, row.keep) == row.expected


@pytest.mark.parametrize(
    "row",
    [r for r in ROWS if r.expected.ok],
    ids=[i for i, r in zip(IDS, ROWS, strict=True) if r.expected.ok],
)
def test_allocate_gives_and_release_gives_back(row: Row) -> None:
    policy, before = REGISTRY[row.pool.policy], row.pool.state()
    after, ids = policy.allocate(before, row.request, row.keep)
    assert row.given is not None
    assert (ids, after.holders, after.memory_used, after.slots.used) == (
        row.given.ids,
        row.given.holders,
        row.given.memory_used,
        row.given.slots_used,
    )
    assert policy.release(after, row.request, ids) == before


REFUSED = [pytest.param(r, id=i) for i, r in zip(IDS, ROWS, strict=True) if not r.expected.ok]


@pytest.mark.parametrize("row", REFUSED)
def test_allocate_refuses_with_the_filters_reason(row: Row) -> None:
    policy, before = REGISTRY[row.pool.policy], row.pool.state()
    with pytest.raises(ValueError, match=f"^{re.escape(row.expected.reason)}$"):
        policy.allocate(before, row.request, row.keep)


def test_every_policy_has_a_table() -> None:
    """Each registered policy has rows here, at least one success and one refusal."""
    assert {r.pool.policy for r in ROWS} == set(REGISTRY)
    for name in REGISTRY:
        codes = {r.expected.code for r in ROWS if r.pool.policy == name}
        assert StatusCode.SUCCESS in codes and len(codes) > 1, name


def test_every_status_code_is_in_the_table() -> None:
    assert {r.expected.code for r in ROWS} == set(StatusCode)


def test_the_rows_are_distinct() -> None:
    assert len(IDS) == len(set(IDS))
