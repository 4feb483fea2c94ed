"""Acceptance tests of the balancer (SPEC §7), scenario by scenario.

Unless a test says otherwise the unit is four nodes A, B, C, D of 1000 DMIPS and 1 GiB RAM, with a
``runc`` runtime (type runc) on A, B and C and only a ``runx`` runtime (type runx) on D. Every
expected node, device id and failure summary below is worked out by hand from SPEC §7:
filters in the order of §7.4, choice by node priority, then most free CPU, most free RAM,
smallest node id (§7.5), instances in the order of §7.1.
"""

from __future__ import annotations

from typing import Any, ClassVar

from reconciler.accel import balance
from reconciler.model.documents import Node, NodeUsage, Service, UnitConfig
from reconciler.model.values import instance_id
from reconciler.placement.instances import BalanceResult
from reconciler.placement.sharing import REGISTRY, ShareRequest, SharingPolicy, StatusCode
from reconciler.placement.sharing.base import Item
from tests.support.builders import (
    failure,
    failures_of,
    four_nodes,
    make_node,
    make_service,
    make_unit,
    node_entry,
    nodes_of,
    placement,
    previous_of,
    runtime,
)

Mi = 1024**2
Gi = 1024**3


def run(
    unit: UnitConfig | None,
    nodes: list[Node],
    services: list[Service],
    **kwargs: Any,
) -> BalanceResult:
    return balance(unit, nodes, services, **kwargs)


def priority_entries() -> list[dict[str, Any]]:
    """A 50, B 100, C 100, D 0."""
    return [node_entry("A", 50), node_entry("B", 100), node_entry("C", 100), node_entry("D", 0)]


def scenario_priorities() -> UnitConfig:
    return make_unit(priority_entries())


# ---------------------------------------------------------------- 1. node priority and runtimes


class TestNodePriority:
    def test_highest_priority_nodes_then_most_free_cpu(self) -> None:
        s1 = make_service("s1", priority=100, instances=2, cpu=100)
        result = run(scenario_priorities(), four_nodes(), [s1])
        # #0: B and C tie on priority 100, CPU and RAM -> smallest id B; #1: C has 1000 free, B 900.
        assert nodes_of(result, "s1") == ["B", "C"]
        assert result.failures == ()

    def test_runtime_type_restricts_to_d(self) -> None:
        rx = make_service("rx", instances=2, runtimes=["runx"])
        result = run(scenario_priorities(), four_nodes(), [rx])
        assert nodes_of(result, "rx") == ["D", "D"]
        assert {p.runtime_id for p in result.placements} == {"runx"}

    def test_a_gets_nothing(self) -> None:
        s1 = make_service("s1", priority=100, instances=2, cpu=100)
        rx = make_service("rx", instances=2, runtimes=["runx"])
        result = run(scenario_priorities(), four_nodes(), [s1, rx])
        assert nodes_of(result, "s1") == ["B", "C"]
        assert nodes_of(result, "rx") == ["D", "D"]
        assert all(p.node_id != "A" for p in result.placements)
        assert result.failures == ()

    def test_placements_in_instance_order(self) -> None:
        # Priority descending, then itemId, subjectId, index (SPEC §7.1).
        low = make_service("a-low", priority=1, instances=2)
        high = make_service("z-high", priority=9, instances=2)
        other_subject = make_service("z-high", subject="alpha", priority=9)
        result = run(scenario_priorities(), four_nodes(), [low, high, other_subject])
        assert [(p.item_id, p.subject_id, p.index) for p in result.placements] == [
            ("z-high", "alpha", 0),
            ("z-high", "default", 0),
            ("z-high", "default", 1),
            ("a-low", "default", 0),
            ("a-low", "default", 1),
        ]
        for p in result.placements:
            assert p.instance_id == instance_id(p.item_id, p.subject_id, p.index)
            assert result.by_id[p.instance_id] is p


# ---------------------------------------------------------------- 2. labels


class TestLabels:
    @staticmethod
    def unit() -> UnitConfig:
        return make_unit(
            [
                node_entry("A", 100, ["label1"]),
                node_entry("B", 50, ["label2"]),
                node_entry("C", 0),
                node_entry("D", 0),
            ]
        )

    def test_label2_goes_to_b(self) -> None:
        svc = make_service("needs2", instances=2, labels=["label2"])
        result = run(self.unit(), four_nodes(), [svc])
        assert nodes_of(result, "needs2") == ["B", "B"]

    def test_label1_goes_to_a(self) -> None:
        svc = make_service("needs1", instances=2, labels=["label1"])
        result = run(self.unit(), four_nodes(), [svc])
        assert nodes_of(result, "needs1") == ["A", "A"]

    def test_missing_label_fails_on_every_node(self) -> None:
        svc = make_service("needs3", instances=2, labels=["label3"])
        result = run(self.unit(), four_nodes(), [svc])
        assert result.placements == ()
        fails = failures_of(result, "needs3")
        assert [f.index for f in fails] == [0, 1]
        for f in fails:
            # D (runx only) is charged Labels too: node-level filters come before RuntimeType.
            assert f.reason == "Labels"
            assert f.counts == (("Labels", 4),)
            assert f.summary == f"needs3:default:{f.index}: 0/4 nodes feasible: 4 Labels"
            assert f.instance_id == instance_id("needs3", "default", f.index)
            assert f.version == "1.0.0"

    def test_all_three_in_one_call(self) -> None:
        services = [
            make_service("needs1", instances=2, labels=["label1"]),
            make_service("needs2", instances=2, labels=["label2"]),
            make_service("needs3", instances=2, labels=["label3"]),
        ]
        result = run(self.unit(), four_nodes(), services)
        assert nodes_of(result, "needs1") == ["A", "A"]
        assert nodes_of(result, "needs2") == ["B", "B"]
        assert [f.reason for f in failures_of(result, "needs3")] == ["Labels", "Labels"]


# ---------------------------------------------------------------- 3. named host resources


class TestSharedResources:
    @staticmethod
    def unit() -> UnitConfig:
        return make_unit(
            [node_entry("A", 100), node_entry("B", 50), node_entry("C", 0), node_entry("D", 0)]
        )

    @staticmethod
    def nodes() -> list[Node]:
        return four_nodes(
            A={"resources": [{"name": "r1", "sharedCount": 2}, {"name": "r3", "sharedCount": 2}]},
            B={"resources": [{"name": "r1", "sharedCount": 2}, {"name": "r2", "sharedCount": 2}]},
        )

    def test_three_services_in_one_call(self) -> None:
        services = [
            make_service("both", priority=100, instances=2, resources=["r1", "r2"]),
            make_service("only-r1", priority=50, instances=2, resources=["r1"]),
            make_service("only-r3", instances=2, resources=["r3"]),
        ]
        result = run(self.unit(), self.nodes(), services)
        # Only B has r2; "both" then holds B's two r1 slots, so "only-r1" can only use A's.
        assert nodes_of(result, "both") == ["B", "B"]
        assert nodes_of(result, "only-r1") == ["A", "A"]
        assert nodes_of(result, "only-r3") == ["A", "A"]
        assert result.failures == ()
        assert placement(result, "both", 0).resources == ("r1", "r2")
        assert placement(result, "only-r1", 1).resources == ("r1",)

    def test_no_free_slot_anywhere_fails_with_resources(self) -> None:
        services = [
            make_service("both", priority=100, instances=2, resources=["r1", "r2"]),
            make_service("only-r1", priority=50, instances=3, resources=["r1"]),
        ]
        result = run(self.unit(), self.nodes(), services)
        assert nodes_of(result, "only-r1") == ["A", "A"]
        f = failure(result, "only-r1", 2)
        # A and B: r1 slots used up; C and D: no r1 at all. All charged to Resources.
        assert f.reason == "Resources"
        assert f.counts == (("Resources", 4),)
        assert f.summary == "only-r1:default:2: 0/4 nodes feasible: 4 Resources"

    def test_shared_count_zero_is_unlimited(self) -> None:
        nodes = four_nodes(A={"resources": [{"name": "r0", "sharedCount": 0}]})
        svc = make_service("many", instances=3, resources=["r0"])
        result = run(self.unit(), nodes, [svc])
        assert nodes_of(result, "many") == ["A", "A", "A"]
        assert result.failures == ()

    def test_shared_count_absent_is_unlimited(self) -> None:
        nodes = four_nodes(C={"resources": [{"name": "r0"}]})
        svc = make_service("many", instances=3, resources=["r0"])
        result = run(self.unit(), nodes, [svc])
        assert nodes_of(result, "many") == ["C", "C", "C"]


# ---------------------------------------------------------------- 4. CPU and RAM


class TestCpuAndRam:
    @staticmethod
    def unit() -> UnitConfig:
        return make_unit(
            [node_entry("A", 100), node_entry("B", 0), node_entry("C", 0), node_entry("D", 0)]
        )

    def test_cpu(self) -> None:
        svc = make_service("cpu", instances=5, cpu=300, quotas={"cpuDMIPSLimit": 500})
        result = run(self.unit(), four_nodes(), [svc])
        # A: 1000 -> 700 -> 400 -> 100, the 4th does not fit; B and C tie (by id: B);
        # the 5th goes to C, which has 1000 free against B's 700.
        assert nodes_of(result, "cpu") == ["A", "A", "A", "B", "C"]
        assert all(p.requested.cpu == 300 for p in result.placements)
        assert all(p.runtime_id == "runc" for p in result.placements)
        assert result.failures == ()

    def test_ram(self) -> None:
        svc = make_service("ram", instances=5, ram="300Mi", quotas={"ramLimit": "500Mi"})
        result = run(self.unit(), four_nodes(), [svc])
        # A: 1024Mi -> 724 -> 424 -> 124; then B/C tie on CPU and RAM (B), then C has more RAM.
        assert nodes_of(result, "ram") == ["A", "A", "A", "B", "C"]
        assert all(p.requested.ram == 300 * Mi for p in result.placements)
        assert all(p.requested.cpu == 0 for p in result.placements)

    def test_cpu_exhausted_everywhere(self) -> None:
        nodes = [make_node("A"), make_node("B")]
        svc = make_service("big", instances=3, cpu=600)
        result = run(None, nodes, [svc])
        assert nodes_of(result, "big") == ["A", "B"]
        f = failure(result, "big", 2)
        assert f.reason == "Cpu"
        assert f.counts == (("Cpu", 2),)
        assert f.summary == "big:default:2: 0/2 nodes feasible: 2 Cpu"


class TestRequestedAmounts:
    """SPEC §7.2, read back from ``Placement.requested``."""

    def test_request_capped_at_quota(self) -> None:
        svc = make_service("capped", cpu=300, ram="300Mi", quotas={"cpuDMIPSLimit": 200})
        result = run(None, [make_node("A")], [svc])
        assert placement(result, "capped", 0).requested.cpu == 200
        assert placement(result, "capped", 0).requested.ram == 300 * Mi

    def test_quota_times_default_ratio_rounds_half_up(self) -> None:
        svc = make_service("quota", quotas={"cpuDMIPSLimit": 333, "ramLimit": "500Mi"})
        result = run(None, [make_node("A")], [svc])
        req = placement(result, "quota", 0).requested
        assert req.cpu == 167  # 333 * 50 / 100 = 166.5 -> 167
        assert req.ram == 250 * Mi
        assert (req.storage, req.state) == (0, 0)

    def test_quota_times_node_ratio(self) -> None:
        unit = make_unit([node_entry("A", ratios={"cpu": 20, "ram": 10})])
        svc = make_service("quota", quotas={"cpuDMIPSLimit": 500, "ramLimit": "500Mi"})
        result = run(unit, [make_node("A")], [svc])
        req = placement(result, "quota", 0).requested
        assert req.cpu == 100
        assert req.ram == 50 * Mi

    def test_skip_resource_limits_requests_nothing(self) -> None:
        svc = make_service(
            "skip", cpu=5000, ram="4Gi", quotas={"cpuDMIPSLimit": 5000}, skip_limits=True
        )
        result = run(None, [make_node("A")], [svc])
        req = placement(result, "skip", 0).requested
        assert (req.cpu, req.ram, req.storage, req.state) == (0, 0, 0, 0)


# ---------------------------------------------------------------- 5. storage


class TestStorage:
    PARTITION: ClassVar[dict[str, Any]] = {
        "name": "p",
        "types": ["storages", "states"],
        "totalSize": "1Gi",
    }

    def test_one_node_partition_fills_up(self) -> None:
        node = make_node("A", partitions=[self.PARTITION])
        svc = make_service("st", instances=5, storage="300Mi", quotas={"storageLimit": "500Mi"})
        result = run(None, [node], [svc])
        assert nodes_of(result, "st") == ["A", "A", "A"]  # 900Mi of 1024Mi
        assert all(p.requested.storage == 300 * Mi for p in result.placements)
        fails = failures_of(result, "st")
        assert [f.index for f in fails] == [3, 4]
        for f in fails:
            assert f.reason == "Storage"
            assert f.counts == (("Storage", 1),)
            assert f.summary == f"st:default:{f.index}: 0/1 nodes feasible: 1 Storage"

    def test_nodes_without_partition_are_charged_storage(self) -> None:
        nodes = four_nodes(A={"partitions": [self.PARTITION]})
        svc = make_service("st", instances=5, storage="300Mi", quotas={"storageLimit": "500Mi"})
        result = run(None, nodes, [svc])
        assert nodes_of(result, "st") == ["A", "A", "A"]
        for f in failures_of(result, "st"):
            # A full, B and C have no partition typed storages, D has no accepted runtime.
            assert f.counts == (("Storage", 3), ("RuntimeType", 1))
            assert f.summary == (
                f"st:default:{f.index}: 0/4 nodes feasible: 3 Storage, 1 RuntimeType"
            )

    def test_storage_and_state_share_one_partition(self) -> None:
        node = make_node("A", partitions=[self.PARTITION])
        svc = make_service("st", instances=3, storage="300Mi", state="200Mi")
        result = run(None, [node], [svc])
        # 500Mi per instance from one 1024Mi pool: two fit, the third does not.
        assert nodes_of(result, "st") == ["A", "A"]
        assert len(failures_of(result, "st")) == 1


# ---------------------------------------------------------------- 6. platform


class TestPlatform:
    @staticmethod
    def nodes() -> list[Node]:
        return [
            make_node("arm", runtimes=[runtime(arch="arm64", os="linux")]),
            make_node("win", runtimes=[runtime(arch="x86_64", os="windows")]),
            make_node("lin", runtimes=[runtime(arch="x86_64", os="linux")]),
        ]

    def test_platform_matching(self) -> None:
        services = [
            make_service("img-arm", platform={"architecture": "arm", "os": "linux"}),
            make_service("img-mac", platform={"architecture": "x86_64", "os": "macos"}),
            make_service("img-linux", platform={"architecture": "x86_64", "os": "linux"}),
        ]
        result = run(None, self.nodes(), services)
        assert nodes_of(result, "img-linux") == ["lin"]
        for item in ("img-arm", "img-mac"):
            f = failure(result, item, 0)
            assert f.reason == "Platform"
            assert f.counts == (("Platform", 3),)
            assert f.summary == f"{item}:default:0: 0/3 nodes feasible: 3 Platform"

    def test_os_not_compared_when_image_omits_it(self) -> None:
        svc = make_service("any-os", instances=2, platform={"architecture": "x86_64"}, cpu=600)
        result = run(None, self.nodes(), [svc])
        # Both x86_64 nodes qualify; "lin" < "win" first, then "win" has more free CPU.
        assert nodes_of(result, "any-os") == ["lin", "win"]


# ---------------------------------------------------------------- 7. modes and preemption


class TestStableMode:
    @staticmethod
    def first_services() -> list[Service]:
        return [
            make_service("s1", priority=100, instances=2, cpu=100),
            make_service("rx", instances=2, runtimes=["runx"]),
            make_service("zz", cpu=500),
        ]

    def first(self) -> BalanceResult:
        result = balance(scenario_priorities(), four_nodes(), self.first_services(), mode="fresh")
        # s1 -> B, C; rx -> D, D; zz: B and C (priority 100) both have 900 free -> B.
        assert nodes_of(result, "s1") == ["B", "C"]
        assert nodes_of(result, "rx") == ["D", "D"]
        assert nodes_of(result, "zz") == ["B"]
        return result

    def test_adding_low_priority_service_moves_nothing(self) -> None:
        first = self.first()
        added = make_service("aa", cpu=900)
        second = balance(
            scenario_priorities(),
            four_nodes(),
            [*self.first_services(), added],
            previous=previous_of(first),
            mode="stable",
        )
        for p in first.placements:
            now = second.by_id[p.instance_id]
            assert (now.node_id, now.runtime_id) == (p.node_id, p.runtime_id), p.label
        # aa: B has only 400 free; of A (50) and C (100) the higher priority wins.
        assert nodes_of(second, "aa") == ["C"]
        assert second.failures == ()
        assert second.preempted == frozenset()

    def test_fresh_mode_would_move_an_instance(self) -> None:
        # The contrast that gives the stable test its teeth: placed from scratch, "aa" sorts
        # before "zz" (same priority), takes B, and pushes "zz" to C.
        first = self.first()
        added = make_service("aa", cpu=900)
        second = balance(
            scenario_priorities(),
            four_nodes(),
            [*self.first_services(), added],
            previous=previous_of(first),
            mode="fresh",
        )
        assert nodes_of(second, "aa") == ["B"]
        assert nodes_of(second, "zz") == ["C"]

    def test_mode_defaults_to_unit_placement(self) -> None:
        first = self.first()
        services = [*self.first_services(), make_service("aa", cpu=900)]
        fresh_unit = make_unit(priority_entries(), placement="fresh")
        as_fresh = balance(fresh_unit, four_nodes(), services, previous=previous_of(first))
        assert nodes_of(as_fresh, "zz") == ["C"]
        as_stable = balance(
            scenario_priorities(), four_nodes(), services, previous=previous_of(first)
        )
        assert nodes_of(as_stable, "zz") == ["B"]

    def test_same_inputs_keep_everything(self) -> None:
        first = self.first()
        second = balance(
            scenario_priorities(),
            four_nodes(),
            self.first_services(),
            previous=previous_of(first),
            mode="stable",
        )
        assert second.placements == first.placements
        assert second.failures == first.failures

    def test_previous_of_removed_service_is_ignored(self) -> None:
        first = self.first()
        second = balance(
            scenario_priorities(),
            four_nodes(),
            self.first_services()[:2],
            previous=previous_of(first),
            mode="stable",
        )
        assert nodes_of(second, "zz") == []
        assert len(second.placements) == 4
        assert second.failures == ()


class TestPreemption:
    def test_victim_replaced_elsewhere(self) -> None:
        nodes = four_nodes()
        lo = make_service("lo", cpu=800)
        first = balance(None, nodes, [lo], mode="fresh")
        assert nodes_of(first, "lo") == ["A"]
        hi = make_service("hi", priority=100, node_id="A", cpu=500)
        second = balance(None, nodes, [lo, hi], previous=previous_of(first), mode="stable")
        # hi fits on A only by evicting lo (200 free); lo then goes back through the pipeline:
        # A has 500 free (Cpu), B and C 1000 (tie -> B), D has no runc.
        assert second.preempted == frozenset({instance_id("lo", "default", 0)})
        assert nodes_of(second, "hi") == ["A"]
        assert nodes_of(second, "lo") == ["B"]
        assert second.failures == ()

    def test_victim_fails_when_nothing_is_left(self) -> None:
        nodes = [make_node("A"), make_node("B"), make_node("C")]
        lo = make_service("lo", instances=3, cpu=800)
        first = balance(None, nodes, [lo], mode="fresh")
        assert nodes_of(first, "lo") == ["A", "B", "C"]
        hi = make_service("hi", priority=100, node_id="A", cpu=500)
        second = balance(None, nodes, [lo, hi], previous=previous_of(first), mode="stable")
        victim = instance_id("lo", "default", 0)
        assert second.preempted == frozenset({victim})
        assert nodes_of(second, "hi") == ["A"]
        assert victim not in second.by_id
        assert [placement(second, "lo", i).node_id for i in (1, 2)] == ["B", "C"]
        f = failure(second, "lo", 0)
        # A keeps 500 free after hi, B and C 200: every node is charged Cpu.
        assert f.reason == "Cpu"
        assert f.counts == (("Cpu", 3),)
        assert f.summary == "lo:default:0: 0/3 nodes feasible: 3 Cpu"
        assert [x.instance_id for x in second.failures] == [victim]

    def test_equal_priority_is_not_evicted(self) -> None:
        nodes = [make_node("A"), make_node("B"), make_node("C")]
        lo = make_service("lo", instances=3, cpu=800)
        first = balance(None, nodes, [lo], mode="fresh")
        same = make_service("same", node_id="A", cpu=500)
        second = balance(None, nodes, [lo, same], previous=previous_of(first), mode="stable")
        assert second.preempted == frozenset()
        assert nodes_of(second, "lo") == ["A", "B", "C"]
        f = failure(second, "same", 0)
        assert f.counts == (("NodeId", 2), ("Cpu", 1))
        assert f.summary == "same:default:0: 0/3 nodes feasible: 2 NodeId, 1 Cpu"

    def test_node_with_fewest_victims_wins(self) -> None:
        nodes = [make_node("A"), make_node("B")]
        pa = make_service("pa", instances=3, node_id="A", cpu=300)  # A: 100 free
        pb = make_service("pb", node_id="B", cpu=900)  # B: 100 free
        first = balance(None, nodes, [pa, pb], mode="fresh")
        assert nodes_of(first, "pa") == ["A", "A", "A"]
        assert nodes_of(first, "pb") == ["B"]
        hi = make_service("hi", priority=100, cpu=500)
        second = balance(None, nodes, [pa, pb, hi], previous=previous_of(first), mode="stable")
        # A would need two victims (100 + 300 + 300 >= 500), B only one (100 + 900).
        assert nodes_of(second, "hi") == ["B"]
        assert second.preempted == frozenset({instance_id("pb", "default", 0)})
        assert nodes_of(second, "pa") == ["A", "A", "A"]
        assert [f.instance_id for f in second.failures] == [instance_id("pb", "default", 0)]

    def test_a_victim_not_needed_after_all_is_reprieved(self) -> None:
        nodes = [make_node("A")]
        lo1 = make_service("lo1", priority=1, node_id="A", cpu=100)
        lo2 = make_service("lo2", priority=2, node_id="A", cpu=800)
        first = balance(None, nodes, [lo1, lo2], mode="fresh")
        hi = make_service("hi", priority=100, cpu=850)
        services = [lo1, lo2, hi]
        second = balance(None, nodes, services, previous=previous_of(first), mode="stable")
        # lo1 goes first (lowest priority): 200 free, then lo2: 1000. With lo2 alone evicted
        # 900 are free, enough: lo1 is given back its place.
        assert nodes_of(second, "hi") == ["A"]
        assert second.preempted == frozenset({instance_id("lo2", "default", 0)})
        assert nodes_of(second, "lo1") == ["A"]
        slow = balance(None, nodes, services, previous_of(first), "stable", exhaustive=True)
        assert second == slow

    def test_room_a_preemption_leaves_goes_to_the_next_alike(self) -> None:
        # h, x and y ask the same, so the fast pass 2 shares what it learnt about them: A
        # refused (full of lo) and its walk of the class starts past A. x evicts lo from A;
        # y, which could evict nobody, then goes through pass 2 again and must see A's room.
        nodes = [make_node("A", dmips=1000), make_node("B", dmips=500)]
        lo = make_service("lo", cpu=1000)
        first = balance(None, nodes, [lo], mode="fresh")
        assert nodes_of(first, "lo") == ["A"]
        h = make_service("h", priority=2, cpu=400)
        x = make_service("x", priority=1, cpu=400)
        y = make_service("y", priority=1, cpu=400)
        services = [lo, h, x, y]
        second = balance(None, nodes, services, previous=previous_of(first), mode="stable")
        assert nodes_of(second, "h") == ["B"]
        assert nodes_of(second, "x") == ["A"]
        assert nodes_of(second, "y") == ["A"]
        assert second.preempted == frozenset({instance_id("lo", "default", 0)})
        slow = balance(None, nodes, services, previous_of(first), "stable", exhaustive=True)
        assert second == slow

    def test_the_latest_in_instance_order_goes_first_among_equal_priorities(self) -> None:
        # One node, two low-priority instances of equal size: evicting either makes room, so
        # the one latest in instance order goes. "lo.b" comes after "lo" ("lo" is a prefix
        # of it): an order made of negated characters would put "lo" last instead.
        nodes = [make_node("A", dmips=1000)]
        lo = make_service("lo", priority=1, cpu=400)
        lob = make_service("lo.b", priority=1, cpu=400)
        first = balance(None, nodes, [lo, lob], mode="fresh")
        assert nodes_of(first, "lo") == nodes_of(first, "lo.b") == ["A"]
        hi = make_service("hi", priority=100, cpu=500)
        services = [lo, lob, hi]
        for exhaustive in (False, True):
            second = balance(
                None, nodes, services, previous_of(first), "stable", exhaustive=exhaustive
            )
            assert second.preempted == frozenset({instance_id("lo.b", "default", 0)})
            assert nodes_of(second, "lo") == nodes_of(second, "hi") == ["A"]

    def test_fresh_mode_places_high_priority_first(self) -> None:
        nodes = four_nodes()
        lo = make_service("lo", cpu=800)
        hi = make_service("hi", priority=100, node_id="A", cpu=500)
        result = balance(None, nodes, [lo, hi], mode="fresh")
        assert nodes_of(result, "hi") == ["A"]
        assert nodes_of(result, "lo") == ["B"]
        assert result.preempted == frozenset()


# ---------------------------------------------------------------- 8. devices


def exclusive_pool() -> dict[str, Any]:
    return {
        "resource": "gpu",
        "policy": "exclusive",
        "devices": [
            {"id": "g0"},
            {"id": "g1", "healthy": False},
            {"id": "g2"},
            {"id": "g3"},
            {"id": "g4"},
        ],
    }


def fractional_pool() -> dict[str, Any]:
    return {
        "resource": "example.com/vgpu",
        "policy": "fractional",
        "devices": [{"id": "dev0", "memory": "16Gi"}, {"id": "dev1", "memory": "16Gi"}],
    }


class TestDevices:
    def test_exclusive_pool(self) -> None:
        nodes = four_nodes(A={"device_pools": [exclusive_pool()]})
        services = [
            make_service(
                "two", priority=10, instances=2, devices=[{"resource": "gpu", "count": 2}]
            ),
            make_service("one", devices=[{"resource": "gpu", "count": 1}]),
        ]
        result = run(None, nodes, services)
        assert nodes_of(result, "two") == ["A", "A"]
        # Smallest free healthy ids first; g1 is unhealthy and never given.
        assert placement(result, "two", 0).devices == (("gpu", ("g0", "g2")),)
        assert placement(result, "two", 1).devices == (("gpu", ("g3", "g4")),)
        f = failure(result, "one", 0)
        # A has no free healthy device left; B, C, D have no gpu pool at all.
        assert f.reason == "Devices"
        assert f.counts == (("Devices", 4),)
        assert f.summary == "one:default:0: 0/4 nodes feasible: 4 Devices"

    def test_fractional_pool_bin_packs(self) -> None:
        nodes = four_nodes(A={"device_pools": [fractional_pool()]})
        res = "example.com/vgpu"
        services = [
            make_service(
                "f8", priority=20, instances=2, devices=[{"resource": res, "memory": "8Gi"}]
            ),
            make_service("f16", priority=10, devices=[{"resource": res, "memory": "16Gi"}]),
            make_service("f1", devices=[{"resource": res, "memory": "1Gi"}]),
        ]
        result = run(None, nodes, services)
        # 8 -> dev0 (tie by id), 8 -> dev0 (least free memory that fits), 16 -> dev1.
        assert placement(result, "f8", 0).devices == ((res, ("dev0",)),)
        assert placement(result, "f8", 1).devices == ((res, ("dev0",)),)
        assert placement(result, "f16", 0).devices == ((res, ("dev1",)),)
        f = failure(result, "f1", 0)
        assert f.reason == "Devices"
        assert f.counts == (("Devices", 4),)
        assert f.summary == "f1:default:0: 0/4 nodes feasible: 4 Devices"

    def test_device_ids_are_sticky_in_stable_mode(self) -> None:
        nodes = four_nodes(A={"device_pools": [exclusive_pool()]})
        low = make_service("low", devices=[{"resource": "gpu", "count": 2}])
        first = balance(None, nodes, [low], mode="fresh")
        assert placement(first, "low", 0).devices == (("gpu", ("g0", "g2")),)
        high = make_service("high", priority=10, devices=[{"resource": "gpu", "count": 2}])
        second = balance(None, nodes, [low, high], previous=previous_of(first), mode="stable")
        assert placement(second, "low", 0).devices == (("gpu", ("g0", "g2")),)
        assert placement(second, "high", 0).devices == (("gpu", ("g3", "g4")),)
        assert second.preempted == frozenset()

    def test_held_device_turned_unhealthy_is_kept_and_flagged(self) -> None:
        nodes = four_nodes(A={"device_pools": [exclusive_pool()]})
        svc = make_service("low", devices=[{"resource": "gpu", "count": 2}])
        first = balance(None, nodes, [svc], mode="fresh")
        assert placement(first, "low", 0).devices == (("gpu", ("g0", "g2")),)
        assert placement(first, "low", 0).unhealthy_devices == ()
        pool = exclusive_pool()
        pool["devices"][2] = {"id": "g2", "healthy": False}
        sick = four_nodes(A={"device_pools": [pool]})
        second = balance(None, sick, [svc], previous=previous_of(first), mode="stable")
        p = placement(second, "low", 0)
        assert p.devices == (("gpu", ("g0", "g2")),)
        assert len(p.unhealthy_devices) == 1
        assert "g2" in p.unhealthy_devices[0]


# ---------------------------------------------------------------- failures (SPEC §7.7)


class TestFailureSummary:
    def test_spec_example(self) -> None:
        # A 1000 and B 500 DMIPS with label L; C without it; D disconnected.
        unit = make_unit(
            [
                node_entry("A", labels=["L"]),
                node_entry("B", labels=["L"]),
                node_entry("C"),
                node_entry("D", labels=["L"]),
            ]
        )
        nodes = [
            make_node("A"),
            make_node("B", dmips=500),
            make_node("C"),
            make_node("D", connected=False),
        ]
        svc = make_service("com.example.nav", instances=2, labels=["L"], cpu=600)
        result = run(unit, nodes, [svc])
        assert nodes_of(result, "com.example.nav") == ["A"]
        f = failure(result, "com.example.nav", 1)
        assert (
            f.summary
            == "com.example.nav:default:1: 0/4 nodes feasible: 2 Cpu, 1 Labels, 1 NodeState"
        )
        assert f.counts == (("Cpu", 2), ("Labels", 1), ("NodeState", 1))
        # Filters run in pipeline order over the candidate set: NodeState drops D, Labels drops
        # C, and Cpu drops the last two, so Cpu is the filter that removed the last node.
        assert f.reason == "Cpu"
        assert f.priority == 0
        assert (f.item_id, f.subject_id, f.index) == ("com.example.nav", "default", 1)

    def test_paused_node_and_node_id(self) -> None:
        nodes = [make_node("A", state="paused"), make_node("B")]
        svc = make_service("pinned", node_id="A")
        result = run(None, nodes, [svc])
        f = failure(result, "pinned", 0)
        assert f.counts == (("NodeId", 1), ("NodeState", 1))
        assert f.summary == "pinned:default:0: 0/2 nodes feasible: 1 NodeId, 1 NodeState"
        assert f.reason == "NodeId"

    def test_max_instances(self) -> None:
        nodes = [make_node("A", runtimes=[runtime(max_instances=2)])]
        svc = make_service("svc", instances=3)
        result = run(None, nodes, [svc])
        assert nodes_of(result, "svc") == ["A", "A"]
        f = failure(result, "svc", 2)
        assert f.reason == "MaxInstances"
        assert f.summary == "svc:default:2: 0/1 nodes feasible: 1 MaxInstances"


class TestDeterminism:
    def test_same_inputs_same_result(self) -> None:
        services = [
            make_service("s1", priority=100, instances=2, cpu=100),
            make_service("rx", instances=2, runtimes=["runx"]),
            make_service("bad", labels=["nope"]),
        ]
        a = run(scenario_priorities(), four_nodes(), services)
        b = run(scenario_priorities(), four_nodes(), services)
        assert a == b
        assert repr(a.placements) == repr(b.placements)
        assert repr(a.failures) == repr(b.failures)

    def test_unit_none_means_defaults(self) -> None:
        svc = make_service("s", instances=3, cpu=100)
        result = run(None, four_nodes(), [svc])
        # All priority 0: A, then B and C have more free CPU than A (by id B first), then C.
        assert nodes_of(result, "s") == ["A", "B", "C"]


# ---------------------------------------------------------------- available amounts (SPEC §7.3)


def with_usage(node: Node, usage: dict[str, Any]) -> Node:
    return node.model_copy(update={"usage": NodeUsage.model_validate(usage)})


class TestAvailableAmounts:
    @staticmethod
    def node() -> Node:
        # system usage: cpu 700 - 200 = 500, ram 512Mi - 128Mi = 384Mi (x's own usage is the
        # unit's); available: cpu 1000 - 500 = 500, ram 1024Mi - 384Mi = 640Mi
        x0 = instance_id("x", "default", 0)
        usage = {"cpu": 700, "ram": "512Mi", "instances": {x0: {"cpu": 200, "ram": "128Mi"}}}
        return with_usage(make_node("A"), usage)

    def test_system_usage_is_taken_off_the_node(self) -> None:
        services = [
            make_service("x", priority=10, cpu=200, ram="128Mi"),
            make_service("y", priority=5, cpu=300, ram="512Mi"),  # exactly what is left
            make_service("z", cpu=1),
        ]
        result = run(None, [self.node()], services)
        assert nodes_of(result, "x") == ["A"] and nodes_of(result, "y") == ["A"]
        assert failure(result, "z", 0).summary == "z:default:0: 0/1 nodes feasible: 1 Cpu"

    def test_one_more_dmips_or_byte_does_not_fit(self) -> None:
        x = make_service("x", priority=10, cpu=200, ram="128Mi")
        over_cpu = make_service("c", cpu=301, ram="512Mi")
        over_ram = make_service("r", cpu=300, ram=512 * Mi + 1)
        for svc, code in ((over_cpu, "Cpu"), (over_ram, "Ram")):
            result = run(None, [self.node()], [x, svc])
            assert nodes_of(result, "x") == ["A"]
            assert failure(result, svc.id, 0).reason == code

    def test_a_runtime_with_its_own_pool(self) -> None:
        crun = {**runtime("crun"), "allowedDMIPS": 300}
        node = with_usage(make_node("A", runtimes=[runtime("runc"), crun]), {"cpu": 900})
        services = [
            # crun's own pool of 300 (system usage not subtracted): one fits, the second not
            make_service("boxed", priority=10, instances=2, runtimes=["crun"], cpu=200),
            # the node pool (1000 - 900 = 100) is untouched by what crun holds
            make_service("plain", priority=5, runtimes=["runc"], cpu=100),
            make_service("plain2", runtimes=["runc"], cpu=1),
        ]
        result = run(None, [node], services)
        assert placement(result, "boxed", 0).runtime_id == "crun"
        assert placement(result, "plain", 0).runtime_id == "runc"
        assert failure(result, "boxed", 1).summary == "boxed:default:1: 0/1 nodes feasible: 1 Cpu"
        assert failure(result, "plain2", 0).reason == "Cpu"

    def test_choice_looks_at_the_node_pool_even_with_a_runtime_pool(self) -> None:
        nodes = [
            make_node("A", dmips=1000, runtimes=[{**runtime("crun"), "allowedDMIPS": 500}]),
            make_node("B", dmips=800, runtimes=[{**runtime("crun"), "allowedDMIPS": 600}]),
        ]
        svc = make_service("s", instances=6, runtimes=["crun"], cpu=100)
        result = run(None, nodes, [svc])
        # A's node pool (1000) beats B's (800) and never shrinks: A until crun's 500 are used
        assert nodes_of(result, "s") == ["A", "A", "A", "A", "A", "B"]


# ---------------------------------------------------------------- the sharing-policy interface


class TestSharingPolicies:
    """SPEC §6.3: one interface (filter -> Status, allocate, release, status), three policies."""

    def test_registry(self) -> None:
        assert set(REGISTRY) == {"shared-count", "exclusive", "fractional"}
        for name, policy in REGISTRY.items():
            assert isinstance(policy, SharingPolicy) and policy.name == name

    def test_exclusive(self) -> None:
        ex = REGISTRY["exclusive"]
        items = (Item("d3"), Item("d1", healthy=False), Item("d0"), Item("d2"))
        empty = ex.new_state("gpu", items)
        two = ShareRequest("gpu", count=2)
        assert ex.filter(empty, ShareRequest("gpu", memory=Gi)).code is StatusCode.ERROR
        assert ex.filter(empty, ShareRequest("gpu", count=4)).code is StatusCode.UNRESOLVABLE
        state, ids = ex.allocate(empty, two)
        assert ids == ("d0", "d2")  # smallest healthy ids, d1 is unhealthy
        assert ex.filter(state, two).code is StatusCode.UNSCHEDULABLE  # only d3 is free
        state2, ids2 = ex.allocate(state, ShareRequest("gpu", count=1))
        assert ids2 == ("d3",)
        assert ex.status(state2).allocated == 3 and ex.status(state2).healthy == 3
        assert ex.release(ex.release(state2, two, ids), two, ids2) == empty

    def test_fractional(self) -> None:
        fr = REGISTRY["fractional"]
        items = (Item("b", memory=16 * Gi), Item("a", memory=16 * Gi), Item("c", memory=8 * Gi))
        empty = fr.new_state("vgpu", items)
        assert fr.filter(empty, ShareRequest("vgpu", count=1)).code is StatusCode.ERROR
        too_big = ShareRequest("vgpu", memory=17 * Gi)
        assert fr.filter(empty, too_big).code is StatusCode.UNRESOLVABLE
        eight = ShareRequest("vgpu", memory=8 * Gi)
        s1, ids1 = fr.allocate(empty, eight)
        assert ids1 == ("c",)  # least free memory that fits: c (8) before a and b (16)
        s2, ids2 = fr.allocate(s1, eight)
        assert ids2 == ("a",)  # a and b tie on 16 free: by id
        s3, ids3 = fr.allocate(s2, eight)
        assert ids3 == ("a",)  # a has 8 free now, the fullest that fits
        sixteen = ShareRequest("vgpu", memory=16 * Gi)
        s4, ids4 = fr.allocate(s3, sixteen)
        assert ids4 == ("b",)
        assert fr.filter(s4, ShareRequest("vgpu", memory=1)).code is StatusCode.UNSCHEDULABLE
        back = fr.release(fr.release(s4, sixteen, ids4), eight, ids3)
        assert fr.release(fr.release(back, eight, ids2), eight, ids1) == empty

    def test_shared_count(self) -> None:
        sc = REGISTRY["shared-count"]
        one = ShareRequest("can0")
        limited = sc.new_state("can0", (Item("can0"),), 2)
        s1, _ = sc.allocate(limited, one)
        s2, _ = sc.allocate(s1, one)
        assert sc.filter(s2, one).code is StatusCode.UNSCHEDULABLE
        assert sc.release(s2, one, ("can0",)) == s1
        unlimited = sc.new_state("can0", (Item("can0"),), 0)
        state = unlimited
        for _ in range(100):
            state, _ = sc.allocate(state, one)
        assert sc.filter(state, one).ok
