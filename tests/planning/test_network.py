"""The network phase (SPEC §17): subnets, sticky addresses, VLAN ids, exhaustion, firewall
rules and DNS names, as a pure function over a balance result and the previous state."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.accel import balance
from reconciler.model.documents import Node, Service, UnitConfig
from reconciler.model.values import instance_id
from reconciler.placement.instances import BalanceResult
from reconciler.planning.network import NetworkResult, assign_networks, dns_names
from tests.support.builders import make_node, make_service

Doc = dict[str, Any]


def service(item: str, instances: int = 1, **fields: Any) -> Service:
    doc = make_service(item, instances=instances).model_dump(mode="json", exclude_unset=True)
    doc.update(fields)
    return Service.model_validate(doc)


def unit(**network: Any) -> UnitConfig:
    return UnitConfig.model_validate(
        {
            "apiVersion": "reconciler/v1",
            "kind": "UnitConfig",
            "version": "1.0.0",
            "network": network,
        }
    )


def run(
    services: Sequence[Service],
    previous: Mapping[str, Any] | None = None,
    *,
    the_unit: UnitConfig | None = None,
    nodes: Sequence[Node] | None = None,
) -> tuple[BalanceResult, NetworkResult]:
    nodes = nodes if nodes is not None else [make_node("n1", dmips=100000, ram="64Gi")]
    the_unit = the_unit if the_unit is not None else unit()
    result = balance(the_unit, nodes, list(services), {}, "stable")
    return result, assign_networks(the_unit, services, result, previous or {})


def ip(net: NetworkResult, item: str, index: int = 0, subject: str = "default") -> str:
    return net.instances[instance_id(item, subject, index)].ip


def iid(item: str, index: int = 0) -> str:
    return instance_id(item, "default", index)


def test_addresses_are_unique_and_in_the_subnet_of_their_network() -> None:
    services = [
        service("a", 3, owner="p1"),
        service("b", 2, owner="p2"),
        service("c", 2),
    ]
    _, net = run(services)
    nets = net.state["networks"]
    assert sorted(nets) == ["default", "p1", "p2"]
    # subnets taken in order by network id
    assert [nets[n]["subnet"] for n in ("default", "p1", "p2")] == [
        "172.17.0.0/16",
        "172.18.0.0/16",
        "172.19.0.0/16",
    ]
    ips = [n.ip for n in net.instances.values()]
    assert len(ips) == len(set(ips)) == 7
    for n in net.instances.values():
        subnet = ipaddress.IPv4Network(nets[n.network_id]["subnet"])
        assert ipaddress.IPv4Address(n.ip) in subnet
        assert n.gateway == nets[n.network_id]["hosts"]["n1"] == str(subnet.network_address + 1)
        assert n.prefix == 16
    assert ip(net, "a", 0) == "172.18.0.2"
    assert ip(net, "a", 2) == "172.18.0.4"


def test_same_inputs_same_addresses() -> None:
    services = [service("a", 3, owner="p1"), service("b", 2, owner="p2")]
    assert run(services)[1] == run(services)[1]


def test_exposed_port_instances_are_addressed_first() -> None:
    # "a" comes first in instance order but "z" exposes a port
    services = [service("a", 2), service("z", 1, exposedPorts=["80"])]
    _, net = run(services)
    assert ip(net, "z") == "172.17.0.2"
    assert [ip(net, "a", 0), ip(net, "a", 1)] == ["172.17.0.3", "172.17.0.4"]


def test_an_address_is_kept_across_an_unrelated_edit() -> None:
    _, first = run([service("a", 2), service("b", 1)])
    # a new service that exposes a port would come first, but held addresses stay
    _, second = run(
        [service("a", 2), service("b", 1), service("c", 1, exposedPorts=["80"])], first.state
    )
    for item, index in (("a", 0), ("a", 1), ("b", 0)):
        assert ip(second, item, index) == ip(first, item, index)
    assert ip(second, "c") == "172.17.0.5"


def test_an_address_moves_with_its_instance_to_another_node_of_the_network() -> None:
    nodes = [make_node("n1", dmips=100000, ram="64Gi"), make_node("n2", dmips=100000, ram="64Gi")]
    services = [service("a", 1, nodeId="n1"), service("b", 1, nodeId="n2")]
    _, first = run(services, nodes=nodes)
    moved = [service("a", 1, nodeId="n2"), service("b", 1, nodeId="n2")]
    result, second = run(moved, first.state, nodes=nodes)
    assert result.by_id[iid("a")].node_id == "n2"
    assert ip(second, "a") == ip(first, "a")
    assert second.instances[iid("a")].gateway == first.state["networks"]["default"]["hosts"]["n2"]
    # n1 hosts nothing of the network any more: its host address is released
    assert sorted(second.state["networks"]["default"]["hosts"]) == ["n2"]


def test_released_addresses_are_reused_lowest_first() -> None:
    _, first = run([service("a", 4)])
    assert [ip(first, "a", i) for i in range(4)] == [f"172.17.0.{k}" for k in (2, 3, 4, 5)]
    # a:1 and a:2 go away (a:3 stays by a new service of its own: another item takes its place)
    state = {
        "networks": first.state["networks"],
        "addresses": {
            k: v for k, v in first.state["addresses"].items() if k not in (iid("a", 1), iid("a", 2))
        },
    }
    _, second = run([service("a", 4), service("b", 1)], state)
    assert ip(second, "a", 0) == "172.17.0.2"
    assert ip(second, "a", 3) == "172.17.0.5"
    # the freed .3 and .4 are taken again in instance order, lowest first
    assert [ip(second, "a", 1), ip(second, "a", 2), ip(second, "b")] == [
        "172.17.0.3",
        "172.17.0.4",
        "172.17.0.6",
    ]
    # and a removed instance's address leaves the state
    _, third = run([service("a", 1)], second.state)
    assert sorted(third.state["addresses"]) == [iid("a")]


def test_vlan_ids_are_unique_and_sticky() -> None:
    vlan = unit(vlan=True)
    _, first = run([service("a", owner="p1"), service("b", owner="p2")], the_unit=vlan)
    nets = first.state["networks"]
    assert [nets["p1"]["vlanId"], nets["p2"]["vlanId"]] == [1, 2]
    _, second = run(
        [service("a", owner="p1"), service("b", owner="p2"), service("c", owner="p0")],
        first.state,
        the_unit=vlan,
    )
    nets = second.state["networks"]
    assert [nets["p0"]["vlanId"], nets["p1"]["vlanId"], nets["p2"]["vlanId"]] == [3, 1, 2]
    assert second.instances[iid("c")].vlan_id == 3
    # without vlan: none
    _, plain = run([service("a", owner="p1")])
    assert "vlanId" not in plain.state["networks"]["p1"]


def test_subnet_exhaustion_fails_only_the_instances_of_that_network() -> None:
    the_unit = unit(subnets=["10.0.0.0/24", "10.0.1.0/24"])
    services = [service("a", owner="p1"), service("b", owner="p2"), service("c", 2, owner="p3")]
    _, net = run(services, the_unit=the_unit)
    assert sorted(net.failures) == sorted([iid("c", 0), iid("c", 1)])
    assert "no free subnet" in net.failures[iid("c", 0)]
    assert sorted(net.instances) == sorted([iid("a"), iid("b")])


def test_excluded_subnets_are_skipped() -> None:
    the_unit = unit(subnets=["10.0.0.0/24", "10.0.1.0/24"], excludeSubnets=["10.0.0.128/25"])
    _, net = run([service("a")], the_unit=the_unit)
    assert net.state["networks"]["default"]["subnet"] == "10.0.1.0/24"


def test_address_exhaustion_fails_only_the_instances_beyond_it() -> None:
    # a /29 has .1 (the bridge) and .2-.6 for instances: five
    the_unit = unit(subnets=["10.0.0.0/29", "10.0.1.0/29"])
    services = [service("a", 7, owner="p1"), service("b", 1, owner="p2")]
    _, net = run(services, the_unit=the_unit)
    assert sorted(net.failures) == sorted([iid("a", 5), iid("a", 6)])
    assert "no free address in 10.0.0.0/29" in net.failures[iid("a", 5)]
    assert ip(net, "a", 4) == "10.0.0.6"
    assert ip(net, "b") == "10.0.1.2"


def test_firewall_rules_for_every_target_instance_exposing_the_port() -> None:
    services = [
        service("db", 2, owner="back", exposedPorts=["5432/tcp"]),
        service("db", 1, subject="other", owner="back", exposedPorts=["5432"]),
        service("cache", 1, owner="back", exposedPorts=["6379"]),
        service("web", 1, owner="front", allowedConnections=["db/5432/tcp"]),
    ]
    _, net = run(services)
    web = net.instances[iid("web")]
    dbs = sorted(
        [ip(net, "db", 0), ip(net, "db", 1), ip(net, "db", 0, subject="other")],
        key=ipaddress.IPv4Address,
    )
    assert [(r.src_ip, r.dst_ip, r.dst_port, r.proto) for r in web.firewall_rules] == [
        (web.ip, d, 5432, "tcp") for d in dbs
    ]
    # the target instances carry the rule too (both nodes apply it), the cache none
    db0 = net.instances[iid("db")]
    assert [(r.src_ip, r.dst_ip) for r in db0.firewall_rules] == [(web.ip, db0.ip)]
    assert net.instances[iid("cache")].firewall_rules == ()


def test_a_connection_no_instance_serves_fails_the_consumer() -> None:
    services = [
        service("db", 1, exposedPorts=["5432/udp"]),
        service("web", 1, allowedConnections=["db/5432/tcp"]),
        service("ok", 1, allowedConnections=["db/5432/udp"]),
    ]
    _, net = run(services)
    assert net.failures == {iid("web"): "no instance of db exposes 5432/tcp"}
    assert iid("ok") in net.instances


def test_dns_names() -> None:
    services = [service("com.example.db", 2, subject="s1", owner="back", hostname="database")]
    s = services[0]
    assert dns_names(s, 0) == [
        "database",
        "0.s1.com.example.db",
        "0.s1.com.example.db.back",
        "s1.com.example.db",
        "s1.com.example.db.back",
    ]
    assert dns_names(s, 1) == ["database", "1.s1.com.example.db", "1.s1.com.example.db.back"]
    _, net = run([service("com.example.db", 2, subject="s1", owner="back")])
    a0, a1 = ip(net, "com.example.db", 0, "s1"), ip(net, "com.example.db", 1, "s1")
    assert net.dns == {
        "0.s1.com.example.db": a0,
        "0.s1.com.example.db.back": a0,
        "1.s1.com.example.db": a1,
        "1.s1.com.example.db.back": a1,
        "s1.com.example.db": a0,
        "s1.com.example.db.back": a0,
    }
    assert list(net.dns) == sorted(net.dns)


def test_a_duplicate_hostname_fails_the_later_instance() -> None:
    services = [service("a", 1, hostname="shared"), service("b", 1, hostname="shared")]
    _, net = run(services)
    assert list(net.failures) == [iid("b")]
    assert "DNS name shared is already held" in net.failures[iid("b")]
    assert net.dns["shared"] == ip(net, "a")
    assert iid("b") not in net.state["addresses"]


def test_without_networks_nothing_is_assigned() -> None:
    nodes = [make_node("n1")]
    services = [make_service("a"), make_service("b", instances=2)]
    result = balance(None, nodes, services, {}, "stable")
    net = assign_networks(None, services, result, {})
    assert net.state == {} and dict(net.instances) == {} and dict(net.failures) == {}


def test_components_get_no_network() -> None:
    nodes = [
        make_node(
            "n1",
            runtimes=[
                {"id": "runc", "type": "runc", "platform": {"architecture": "x86_64"}},
                {
                    "id": "fs",
                    "type": "rootfs",
                    "platform": {"architecture": "x86_64"},
                    "handler": ["/bin/true"],
                },
            ],
        )
    ]
    services = [service("fw", type="component", runtimes=["rootfs"]), service("a")]
    result = balance(unit(), nodes, services, {}, "stable")
    assert iid("fw") in result.by_id
    net = assign_networks(unit(), services, result, {})
    assert list(net.instances) == [iid("a")]


@st.composite
def networked_units(draw: st.DrawFn) -> tuple[UnitConfig, list[Node], list[Service]]:
    """Small units with networks: a few services in up to three networks (some exposing a
    port, some connecting to one, some sharing a hostname), on one or two nodes, with subnets
    small enough to run out."""
    subnets = draw(
        st.lists(
            st.sampled_from(["10.0.0.0/29", "10.0.1.0/30", "10.0.2.0/28", "172.17.0.0/16"]),
            min_size=1,
            max_size=3,
            unique=True,
        )
    )
    the_unit = unit(subnets=subnets, vlan=draw(st.booleans()))
    nodes = [make_node(f"n{i}", dmips=100000, ram="64Gi") for i in range(draw(st.integers(1, 2)))]
    items = draw(st.lists(st.sampled_from("abcde"), min_size=1, max_size=4, unique=True))
    services = []
    for item in items:
        fields: dict[str, Any] = {}
        owner = draw(st.sampled_from([None, "p1", "p2"]))
        if owner is not None:
            fields["owner"] = owner
        if draw(st.booleans()):
            fields["exposedPorts"] = ["80"]
        if draw(st.integers(0, 3)) == 0:
            fields["allowedConnections"] = [f"{draw(st.sampled_from(items))}/80/tcp"]
        if draw(st.integers(0, 3)) == 0:
            fields["hostname"] = "shared"
        services.append(service(item, draw(st.integers(1, 4)), **fields))
    return the_unit, nodes, services


def assert_addresses_unique_in_their_subnets(net: NetworkResult) -> None:
    nets = net.state.get("networks", {})
    held: dict[str, set[str]] = {n: set(e["hosts"].values()) for n, e in nets.items()}
    for n in net.instances.values():
        subnet = ipaddress.IPv4Network(nets[n.network_id]["subnet"])
        address = ipaddress.IPv4Address(n.ip)
        assert address in subnet
        assert address not in (subnet.network_address, subnet.broadcast_address)
        assert n.gateway == nets[n.network_id]["hosts"][n.node_id]
        assert n.ip not in held[n.network_id], f"{n.ip} held twice in {n.network_id}"
        held[n.network_id].add(n.ip)
    # each placed instance with a network either has one or fails, never both
    assert not set(net.instances) & set(net.failures)
    assert net.state.get("addresses", {}) == {
        i: {"network": n.network_id, "ip": n.ip} for i, n in net.instances.items()
    }


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=networked_units())
def test_addresses_are_unique_inside_their_subnet_and_deterministic(
    case: tuple[UnitConfig, list[Node], list[Service]],
) -> None:
    the_unit, nodes, services = case
    result = balance(the_unit, nodes, services, {}, "stable")
    net = assign_networks(the_unit, services, result, {})
    assert_addresses_unique_in_their_subnets(net)
    # new addresses around sticky ones: a state where every other instance held one
    half = replace(result, placements=result.placements[::2])
    sticky = assign_networks(the_unit, services, half, {}).state
    again = assign_networks(the_unit, services, result, sticky)
    assert_addresses_unique_in_their_subnets(again)
    # the same inputs give the same result, also over the state it made
    assert assign_networks(the_unit, services, result, {}) == net
    assert assign_networks(the_unit, list(reversed(services)), result, {}) == net
    assert assign_networks(the_unit, services, result, net.state) == net
    assert assign_networks(the_unit, services, result, sticky) == again


def test_an_instance_moved_to_a_node_with_no_bridge_address_left_fails_and_frees_its_own() -> None:
    """Its node gets no host address (the subnet is full), so it fails ``Network`` and gives
    its kept address up: it is not addressed with no gateway (this raised a KeyError)."""
    nodes = [make_node("n1", dmips=100000, ram="64Gi"), make_node("n2", dmips=100000, ram="64Gi")]
    the_unit = unit(subnets=["10.0.0.0/29"])  # .1 for n1's bridge, .2-.6 for instances
    first_services = [service("a", 5, nodeId="n1")]
    _, first = run(first_services, the_unit=the_unit, nodes=nodes)
    assert not first.failures and len(first.instances) == 5
    moved = [service("a", 4, nodeId="n1"), service("a", 1, subject="x", nodeId="n2")]
    # (the moved instance: a's index 4 as a new subject keeps no address; move one instead)
    previous = dict(first.state)
    addresses = dict(previous["addresses"])
    addresses[instance_id("a", "x", 0)] = addresses.pop(iid("a", 4))
    previous["addresses"] = addresses
    _, second = run(moved, previous, the_unit=the_unit, nodes=nodes)
    failed = instance_id("a", "x", 0)
    assert "for node n2's bridge" in second.failures[failed]
    assert failed not in second.instances and failed not in second.state["addresses"]
    assert sorted(second.state["networks"]["default"]["hosts"]) == ["n1"]
