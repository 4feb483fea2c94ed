"""Property tests of the balancer (SPEC §6, §7) over random small units.

The invariants are computed independently of the balancer, from the placements it returns and the
documents it was given: capacities (a node's CPU and RAM pools lose the measured system usage, a
runtime with allowedDMIPS/allowedRAM has its own pools, a node's inventories reserve a part and
overcommit by their ratio, and their unit rules hold for every amount), shared-resource slots,
device ids and memory, §7.2 requested amounts, filters every placement must have passed, and the
shape of results and failures.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from fractions import Fraction
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from reconciler.accel import balance, node_states
from reconciler.model.documents import AlertRules, Node, Service, UnitConfig
from reconciler.model.nodeinventories import ByteInventory, CpuInventory
from reconciler.model.values import instance_id
from reconciler.placement.filters import FILTER_CODES
from reconciler.placement.instances import BalanceResult, Mode, PreviousAllocation
from tests.support.balancer_scenarios import (
    SETTINGS,
    Scenario,
    scenarios,
)
from tests.support.builders import previous_of

# ---------------------------------------------------------------- strategies


# ---------------------------------------------------------------- independent checks


def _round_half_up(quota: int, ratio: int) -> int:
    return (2 * quota * ratio + 100) // 200


def expected_amount(service: Service, what: str, ratio: int) -> int:
    """SPEC §7.2 for one of cpu, ram, storage, state."""
    if service.skipResourceLimits:
        return 0
    quota_field = {
        "cpu": "cpuDMIPSLimit",
        "ram": "ramLimit",
        "storage": "storageLimit",
        "state": "stateLimit",
    }[what]
    requested: int | None = getattr(service.requestedResources, what)
    quota: int | None = getattr(service.quotas, quota_field)
    if requested is not None:
        return min(requested, quota) if quota is not None else requested
    if quota is not None:
        return _round_half_up(quota, ratio)
    return 0


def order_key(priority: int, item: str, subject: str, index: int) -> tuple[int, str, str, int]:
    return (-priority, item, subject, index)


def capacity(total: int, settings: CpuInventory | ByteInventory) -> int:
    """SPEC §6.1 by hand: floor((total - reserved) * allocationRatio), reserved at most total."""
    ratio = Fraction(str(settings.allocationRatio))
    return math.floor((total - min(settings.reserved, total)) * ratio)


def check_result(
    unit: UnitConfig,
    nodes: list[Node],
    services: tuple[Service, ...] | list[Service],
    result: BalanceResult,
    mode: Mode,
) -> None:
    by_node = {n.id: n for n in nodes}
    by_item = {s.key: s for s in services}
    desired = {iid for s in services for iid in s.instance_ids()}

    # (f) every desired instance is placed or failed, exactly once, in instance order.
    placed = [p.instance_id for p in result.placements]
    failed = [f.instance_id for f in result.failures]
    assert len(placed) == len(set(placed))
    assert len(failed) == len(set(failed))
    assert not set(placed) & set(failed)
    assert set(placed) | set(failed) == desired
    for seq in (result.placements, result.failures):
        keys = [order_key(x.priority, x.item_id, x.subject_id, x.index) for x in seq]
        assert keys == sorted(keys)
    assert result.preempted <= desired
    if mode == "fresh":
        assert result.preempted == frozenset()
    assert set(result.by_id) == set(placed)

    # keyed by node id (the node pool) or (node id, runtime id) (a runtime's own pool)
    cpu: Counter[str | tuple[str, str]] = Counter()
    ram: Counter[str | tuple[str, str]] = Counter()
    storage: Counter[str] = Counter()
    state: Counter[str] = Counter()
    per_runtime: Counter[tuple[str, str]] = Counter()
    resource_users: Counter[tuple[str, str]] = Counter()
    exclusive_ids: dict[str, list[str]] = defaultdict(list)
    fractional_memory: Counter[tuple[str, str]] = Counter()

    for p in result.placements:
        svc = by_item[(p.item_id, p.subject_id)]
        assert p.instance_id == instance_id(p.item_id, p.subject_id, p.index)
        assert (p.priority, p.version) == (svc.priority, svc.version)
        node = by_node[p.node_id]
        cfg = unit.config_for(node.id, node.type)
        # The filters every placement must pass (SPEC §7.4).
        assert node.connected and node.state == "provisioned"
        assert svc.nodeId is None or svc.nodeId == node.id
        assert set(svc.labels) <= set(cfg.labels if cfg else ())
        rt = {r.id: r for r in node.runtimes}[p.runtime_id]
        assert rt.type in svc.runtimes
        if svc.image.platform is not None:
            assert svc.image.platform.architecture == rt.platform.architecture
        # Requested amounts (SPEC §7.2), with the node's ratios.
        ratios = cfg.resourceRatios if cfg else None
        for what in ("cpu", "ram", "storage", "state"):
            ratio = getattr(ratios, what) if ratios else 50
            assert getattr(p.requested, what) == expected_amount(svc, what, ratio), what
        # every non-zero amount respects the node's unit rules (SPEC §6.1)
        for what in ("cpu", "ram", "storage", "state"):
            low, high, step = getattr(node.inventories, what).units
            amount = getattr(p.requested, what)
            if amount:
                assert low <= amount and (high is None or amount <= high), what
                assert amount % step == 0, what
        # CPU and RAM come from the runtime's own pool when it has one, else the node's
        cpu[(node.id, rt.id) if rt.allowedDMIPS is not None else node.id] += p.requested.cpu
        ram[(node.id, rt.id) if rt.allowedRAM is not None else node.id] += p.requested.ram
        storage[node.id] += p.requested.storage
        state[node.id] += p.requested.state
        per_runtime[(node.id, rt.id)] += 1
        # Named resources (SPEC §6.2).
        assert p.resources == tuple(r.name for r in svc.resources)
        for name in p.resources:
            resource_users[(node.id, name)] += 1
        # Devices (SPEC §6.3).
        assert p.unhealthy_devices == ()  # health never changes between runs here
        given_devices = dict(p.devices)
        assert sorted(given_devices) == sorted(d.resource for d in svc.devices)
        pools = {pool.resource: pool for pool in node.devicePools}
        for req in svc.devices:
            ids = given_devices[req.resource]
            pool = pools[req.resource]
            devs = {d.id: d for d in pool.devices}
            assert all(devs[i].healthy for i in ids)
            if pool.policy == "exclusive":
                assert req.count is not None
                assert len(ids) == req.count == len(set(ids))
                assert list(ids) == sorted(ids)
                exclusive_ids[node.id].extend(ids)
            else:
                assert req.memory is not None
                assert len(ids) == 1
                fractional_memory[(node.id, ids[0])] += req.memory

    # (a) capacity: nothing reserved beyond what the node has.
    for node in nodes:
        # SPEC §7.3: the node pools lose the system usage (measured minus the unit's own)
        usage = node.usage
        own_cpu = sum(u.cpu for u in usage.instances.values()) if usage else 0
        own_ram = sum(u.ram for u in usage.instances.values()) if usage else 0
        system_cpu = max(0, usage.cpu - own_cpu) if usage else 0
        system_ram = max(0, usage.ram - own_ram) if usage else 0
        inv = node.inventories
        assert cpu[node.id] <= capacity(max(0, node.maxDMIPS - system_cpu), inv.cpu)
        assert ram[node.id] <= capacity(max(0, node.totalRAM - system_ram), inv.ram)
        for rt in node.runtimes:
            if rt.allowedDMIPS is not None:
                assert cpu[(node.id, rt.id)] <= rt.allowedDMIPS
            if rt.allowedRAM is not None:
                assert ram[(node.id, rt.id)] <= rt.allowedRAM
        typed = {
            t: next((p for p in node.partitions if t in p.types), None)
            for t in ("storages", "states")
        }
        st_part, sa_part = typed["storages"], typed["states"]
        if st_part is not None and st_part is sa_part:
            both = capacity(st_part.totalSize, inv.storage)
            assert storage[node.id] + state[node.id] <= both
        else:
            assert storage[node.id] <= (capacity(st_part.totalSize, inv.storage) if st_part else 0)
            assert state[node.id] <= (capacity(sa_part.totalSize, inv.state) if sa_part else 0)
        for rt in node.runtimes:
            if rt.maxInstances:
                assert per_runtime[(node.id, rt.id)] <= rt.maxInstances
        # (b) shared resources: at most sharedCount users (0 = unlimited).
        shared = {r.name: r.sharedCount for r in node.host_resources}
        for (nid, name), users in resource_users.items():
            if nid == node.id:
                assert name in shared
                assert shared[name] == 0 or users <= shared[name]
        # (c) devices: exclusive ids once per node, fractional memory within the device.
        held = exclusive_ids[node.id]
        assert len(held) == len(set(held))
        for pool in node.devicePools:
            for dev in pool.devices:
                if pool.policy == "fractional":
                    assert dev.memory is not None
                    assert fractional_memory[(node.id, dev.id)] <= dev.memory

    # Failures (SPEC §7.7).
    for f in result.failures:
        svc = by_item[(f.item_id, f.subject_id)]
        assert (f.priority, f.version) == (svc.priority, svc.version)
        assert f.instance_id == instance_id(f.item_id, f.subject_id, f.index)
        assert f.reason in FILTER_CODES
        assert all(code in FILTER_CODES for code, _ in f.counts)
        assert f.reason in {code for code, _ in f.counts}
        assert sum(n for _, n in f.counts) == len(nodes)
        assert list(f.counts) == sorted(f.counts, key=lambda c: (-c[1], c[0]))
        detail = ", ".join(f"{n} {code}" for code, n in f.counts)
        label = f"{f.item_id}:{f.subject_id}:{f.index}"
        assert f.summary == f"{label}: 0/{len(nodes)} nodes feasible: {detail}"


def permuted_nodes(data: st.DataObject, docs: tuple[dict[str, Any], ...]) -> list[Node]:
    """The node list in another order, and every list inside each node document too:
    runtimes, partitions, named resources, device pools and each pool's devices."""
    out: list[Node] = []
    for doc in data.draw(st.permutations(docs), label="node order"):
        copy = dict(doc)
        for key in ("runtimes", "partitions", "resources"):
            if key in doc:
                copy[key] = data.draw(st.permutations(doc[key]), label=f"{key} order")
        pools = data.draw(st.permutations(doc["devicePools"]), label="pool order")
        copy["devicePools"] = [
            {**pool, "devices": data.draw(st.permutations(pool["devices"]), label="devices")}
            for pool in pools
        ]
        out.append(Node.model_validate(copy))
    return out


def permuted_unit(data: st.DataObject, unit: UnitConfig) -> UnitConfig:
    """The unit's node entries, and each entry's labels, in another order."""
    entries = data.draw(st.permutations(unit.nodes), label="unit entry order")
    entries = [
        e.model_copy(update={"labels": tuple(data.draw(st.permutations(e.labels)))})
        for e in entries
    ]
    return unit.model_copy(update={"nodes": tuple(entries)})


def permuted_services(data: st.DataObject, services: tuple[Service, ...]) -> list[Service]:
    """The service list in another order; in each service, the labels, accepted runtime types
    and device requests in another order (named resources keep theirs: a placement lists them
    in the service's order)."""
    out = []
    for svc in data.draw(st.permutations(services), label="service order"):
        update = {
            key: tuple(data.draw(st.permutations(getattr(svc, key)), label=f"service {key}"))
            for key in ("labels", "runtimes", "devices")
        }
        out.append(svc.model_copy(update=update))
    return out


def shuffled_previous(
    data: st.DataObject, previous: dict[str, PreviousAllocation]
) -> dict[str, PreviousAllocation]:
    items = data.draw(st.permutations(list(previous.items())), label="previous order")
    return dict(items)


# ---------------------------------------------------------------- properties


@SETTINGS
@given(scenario=scenarios())
def test_fresh_invariants_and_determinism(scenario: Scenario) -> None:
    nodes = scenario.nodes()
    result = balance(scenario.unit, nodes, scenario.services, mode="fresh")
    check_result(scenario.unit, nodes, scenario.services, result, "fresh")
    # (d) the same inputs give an identical result.
    again = balance(scenario.unit, scenario.nodes(), scenario.services, mode="fresh")
    assert again == result
    assert repr(again.placements) == repr(result.placements)
    assert repr(again.failures) == repr(result.failures)


@SETTINGS
@given(scenario=scenarios(), data=st.data())
def test_fresh_is_order_independent(scenario: Scenario, data: st.DataObject) -> None:
    nodes = scenario.nodes()
    result = balance(scenario.unit, nodes, scenario.services, mode="fresh")
    # (e) every list of the inputs in another order (node, service and unit entry lists, and
    # the lists inside each document).
    other_nodes = permuted_nodes(data, scenario.node_docs)
    svcs = permuted_services(data, scenario.services)
    other = balance(permuted_unit(data, scenario.unit), other_nodes, svcs, mode="fresh")
    assert other == result


@SETTINGS
@given(scenario=scenarios(), data=st.data())
def test_stable_invariants(scenario: Scenario, data: st.DataObject) -> None:
    nodes = scenario.nodes()
    dropped = data.draw(st.integers(0, len(scenario.services) - 1), label="dropped")
    fewer = tuple(s for i, s in enumerate(scenario.services) if i != dropped)
    removing = data.draw(st.booleans(), label="removing")
    first_services, second_services = (
        (scenario.services, fewer) if removing else (fewer, scenario.services)
    )
    first = balance(scenario.unit, nodes, first_services, mode="fresh")
    check_result(scenario.unit, nodes, first_services, first, "fresh")
    previous = previous_of(first)
    second = balance(scenario.unit, nodes, second_services, previous=previous, mode="stable")
    check_result(scenario.unit, nodes, second_services, second, "stable")

    # Stable mode: every earlier instance still desired keeps node, runtime and devices unless a
    # higher-priority instance preempted it (SPEC §7.6). Its node had room for it alongside a
    # superset of what is kept there now, so pass 1 must keep it.
    desired = {iid for s in second_services for iid in s.instance_ids()}
    for p in first.placements:
        if p.instance_id in desired and p.instance_id not in second.preempted:
            now = second.by_id.get(p.instance_id)
            assert now is not None, p.label
            assert (now.node_id, now.runtime_id, now.devices) == (
                p.node_id,
                p.runtime_id,
                p.devices,
            ), p.label

    # (d) deterministic, and (e) independent of input order, previous-mapping order included.
    again = balance(scenario.unit, nodes, second_services, previous=previous, mode="stable")
    assert again == second
    other_nodes = permuted_nodes(data, scenario.node_docs)
    svcs = permuted_services(data, second_services)
    prev = shuffled_previous(data, previous)
    unit = permuted_unit(data, scenario.unit)
    other = balance(unit, other_nodes, svcs, previous=prev, mode="stable")
    assert other == second


@SETTINGS
@given(scenario=scenarios(), data=st.data(), mode=st.sampled_from(["fresh", "stable"]))
def test_a_balance_is_a_fixed_point_of_its_own_allocations(
    scenario: Scenario, data: st.DataObject, mode: Mode
) -> None:
    """Balancing again with a result's own allocations as the previous ones gives the same
    placements (node, runtime, devices, amounts), the same failures (reasons and counts) and
    the same held instances: a reconcile on unchanged inputs changes nothing, and the
    controller may leave its own result in explain's read cache under the key of the
    checkpoint it wrote (reconciler/controller/explaincache.py). Only who was preempted on the
    way is the first run's own."""
    nodes = scenario.nodes()
    dropped = data.draw(st.integers(0, len(scenario.services) - 1), label="dropped")
    fewer = tuple(s for i, s in enumerate(scenario.services) if i != dropped)
    earlier = previous_of(balance(scenario.unit, nodes, fewer, mode="fresh"))
    first = balance(scenario.unit, nodes, scenario.services, earlier, mode)
    again = balance(scenario.unit, scenario.nodes(), scenario.services, previous_of(first), mode)
    assert repr(again.placements) == repr(first.placements)
    assert repr(again.failures) == repr(first.failures)
    assert again.held == first.held
    assert again.preempted <= first.preempted


@SETTINGS
@given(scenario=scenarios(), data=st.data())
def test_class_indexes_give_the_exhaustive_result(scenario: Scenario, data: st.DataObject) -> None:
    """The fast pass 2 (node classes, sorted indexes, refused-node memory) must equal evaluating
    every filter on every node for every instance, in fresh and in stable mode."""
    nodes = scenario.nodes()
    fast = balance(scenario.unit, nodes, scenario.services, mode="fresh")
    slow = balance(scenario.unit, nodes, scenario.services, mode="fresh", exhaustive=True)
    assert fast == slow
    dropped = data.draw(st.integers(0, len(scenario.services) - 1), label="dropped")
    fewer = tuple(s for i, s in enumerate(scenario.services) if i != dropped)
    previous = previous_of(balance(scenario.unit, nodes, fewer, mode="fresh"))
    fast = balance(scenario.unit, nodes, scenario.services, previous, mode="stable")
    slow = balance(scenario.unit, nodes, scenario.services, previous, "stable", exhaustive=True)
    assert fast == slow


@SETTINGS
@given(scenario=scenarios(), data=st.data())
def test_services_asking_the_same_give_the_exhaustive_result(
    scenario: Scenario, data: st.DataObject
) -> None:
    """Services that ask the same of every node (copies under other ids and priorities) share
    one group in the fast pass 2, with the nodes known to refuse it and where its walks of a
    class start; the result must still be what evaluating every filter on every node gives."""
    nodes = scenario.nodes()
    copies = tuple(
        s.model_copy(
            update={
                "id": f"{s.id}x{k}",
                "priority": data.draw(st.integers(0, 2), label="priority"),
                "instances": data.draw(st.integers(1, 3), label="instances"),
            }
        )
        for k in range(data.draw(st.integers(1, 3), label="copies"))
        for s in scenario.services
    )
    many = scenario.services + copies
    fast = balance(scenario.unit, nodes, many, mode="fresh")
    assert fast == balance(scenario.unit, nodes, many, mode="fresh", exhaustive=True)
    previous = previous_of(balance(scenario.unit, nodes, scenario.services, mode="fresh"))
    fast = balance(scenario.unit, nodes, many, previous, mode="stable")
    assert fast == balance(scenario.unit, nodes, many, previous, "stable", exhaustive=True)


def with_alert_rules(data: st.DataObject, unit: UnitConfig) -> UnitConfig:
    """The unit with cpu and ram alert rules on every entry, so that an overloaded node's pools
    are lowered in a rebalance (SPEC §8)."""
    entries = []
    for entry in unit.nodes:
        low = {k: data.draw(st.integers(0, 100), label=f"{k} minThreshold") for k in ("cpu", "ram")}
        rules = AlertRules.model_validate(
            {k: {"minThreshold": v, "maxThreshold": 100, "minTimeout": 60} for k, v in low.items()}
        )
        entries.append(entry.model_copy(update={"alertRules": rules}))
    return unit.model_copy(update={"nodes": tuple(entries)})


@SETTINGS
@given(scenario=scenarios(), data=st.data())
def test_groups_and_rebalances_give_the_exhaustive_result(
    scenario: Scenario, data: st.DataObject
) -> None:
    """Services with many instances (the fast path places a service's instances together over a
    heap of candidate nodes) must give what evaluating every filter on every node gives, in fresh
    and stable mode; and so must a rebalance with overloaded nodes (lowered pools, requests
    raised to the measured usage, whose instances the fast path groups apart)."""
    nodes = scenario.nodes()
    factor = data.draw(st.integers(2, 4), label="instances factor")
    many = tuple(
        s.model_copy(update={"instances": s.instances * factor + data.draw(st.integers(0, 2))})
        for s in scenario.services
    )
    fast = balance(scenario.unit, nodes, many, mode="fresh")
    assert fast == balance(scenario.unit, nodes, many, mode="fresh", exhaustive=True)
    check_result(scenario.unit, nodes, many, fast, "fresh")
    previous = previous_of(balance(scenario.unit, nodes, scenario.services, mode="fresh"))
    fast = balance(scenario.unit, nodes, many, previous, mode="stable")
    assert fast == balance(scenario.unit, nodes, many, previous, "stable", exhaustive=True)

    unit = with_alert_rules(data, scenario.unit)
    overloaded = data.draw(st.sets(st.sampled_from([n.id for n in nodes])), label="overloaded")
    overload = {
        node_id: frozenset(
            data.draw(st.sets(st.sampled_from(("cpu", "ram")), min_size=1), label="alerts")
        )
        for node_id in sorted(overloaded)
    }
    previous = previous_of(balance(unit, nodes, many, mode="fresh"))
    fast = balance(unit, nodes, many, previous, "rebalance", overload)
    slow = balance(unit, nodes, many, previous, "rebalance", overload, exhaustive=True)
    assert fast == slow


@SETTINGS
@given(scenario=scenarios())
def test_node_states_hold_exactly_the_placements(scenario: Scenario) -> None:
    """``node_states`` (what status shows) has every node, and on each the result's placements
    reserved: the pools' used amounts are the sums of what the placements requested."""
    nodes = scenario.nodes()
    result = balance(scenario.unit, nodes, scenario.services, mode="fresh")
    slots = node_states(scenario.unit, nodes, scenario.services, result)
    assert sorted(slots) == sorted(n.id for n in nodes)
    for node in nodes:
        slot = slots[node.id]
        placed = [p for p in result.placements if p.node_id == node.id]
        assert sorted(slot.placed) == sorted(p.instance_id for p in placed)
        own_cpu = {rt.id for rt in node.runtimes if rt.allowedDMIPS is not None}
        own_ram = {rt.id for rt in node.runtimes if rt.allowedRAM is not None}
        assert slot.cpu.used == sum(p.requested.cpu for p in placed if p.runtime_id not in own_cpu)
        assert slot.ram.used == sum(p.requested.ram for p in placed if p.runtime_id not in own_ram)
        for rt in slot.runtimes:
            on_it = [p for p in placed if p.runtime_id == rt.runtime.id]
            if rt.slots is not None:
                assert rt.slots.used == len(on_it)
            if rt.cpu is not None:
                assert rt.cpu.used == sum(p.requested.cpu for p in on_it)
            if rt.ram is not None:
                assert rt.ram.used == sum(p.requested.ram for p in on_it)
        storage, state = slot.partition("storages"), slot.partition("states")
        stored = sum(p.requested.storage for p in placed)
        kept = sum(p.requested.state for p in placed)
        if storage is not None and slot.partition_key("storages") == slot.partition_key("states"):
            assert storage.used == stored + kept
        else:
            assert (storage.used if storage is not None else 0) == stored
            assert (state.used if state is not None else 0) == kept
        for name, pool in slot.resources.items():
            assert pool.slots.used == sum(name in p.resources for p in placed)
        for resource, pool in slot.pools.items():
            held = sorted(i for p in placed for r, ids in p.devices if r == resource for i in ids)
            assert sorted(i for i, n in pool.holders for _ in range(n)) == held
