"""Networks: the balancer's phase after placement (SPEC §17; AosEdge's network manager).

A pure function of (unit config, services, the balance result, the previous network state)
→ (the new state, each placed instance's network parameters, the instances that fail with
reason ``Network``, the DNS table). The state is plain JSON kept in the checkpoint (``data``'s
``network``), so addresses are sticky across runs, restarts and the recovery of a corrupt
checkpoint:

    {"networks": {netId: {"subnet": "172.17.0.0/16", "vlanId": 1, "hosts": {nodeId: ip}}},
     "addresses": {instanceId: {"network": netId, "ip": ip}}}

Which instances have a network: the placed *service* instances (never a component) of a unit
whose unit.yaml declares ``network``, and without it those of the services that name an
``owner``, expose a port or connect to one. Every other instance keeps the host's network, as
before networks existed.

The decisions, in this order each run:

1. instances no longer placed (or placed in another network) release their addresses;
2. each network with placed instances holds one subnet (its previous one while it stays
   allowed, else the first free of ``subnets`` that overlaps no ``excludeSubnets``), a VLAN id
   when ``vlan`` (its previous one, else the smallest free in 1..4094) and per node that hosts
   it a host address (the node's bridge and its instances' gateway: its previous one, else the
   smallest free from ``.1``); a network with no placed instance releases them;
3. addresses: every instance keeps its previous address in its network (also after a move to
   another node), then the instances whose service exposes ports, then the others (each group
   in instance order) take the smallest free address from ``.2``;
4. DNS names (the service ``hostname``; ``<index>.<subject>.<item>`` and with
   ``.<network>``; for index 0 also ``<subject>.<item>`` and with ``.<network>``): a name
   already held fails the later instance (instance order);
5. firewall: for each ``allowedConnections`` entry of a consumer, one rule per instance of the
   target item whose service exposes that port; a connection no instance serves fails the
   consumer.

Subnet, host-address and address exhaustion fail only the instances concerned. An instance
that fails releases its address. Everything is in sorted or instance order: the same inputs
give the same addresses.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

from reconciler.model.documents import NetworkConfig, Service, UnitConfig
from reconciler.model.network import Protocol
from reconciler.placement.instances import BalanceResult, Placement

__all__ = [
    "NETWORK_FAILURE",
    "VLAN_IDS",
    "FirewallRule",
    "InstanceNetwork",
    "NetworkResult",
    "assign_networks",
    "dns_names",
    "has_network",
    "instance_addresses",
    "netns_name",
    "state_from_actual",
]

NETWORK_FAILURE = "Network"
"""The failure code of an instance the network phase cannot serve (SPEC §17)."""

VLAN_IDS = range(1, 4095)

_ServiceKey = tuple[str, str]


@dataclass(frozen=True, slots=True, order=True)
class FirewallRule:
    """Traffic allowed from ``src_ip`` to ``dst_ip:dst_port/proto`` (replies allowed)."""

    src_ip: str
    dst_ip: str
    dst_port: int
    proto: Protocol

    def to_json(self) -> dict[str, Any]:
        return {
            "srcIp": self.src_ip,
            "dstIp": self.dst_ip,
            "dstPort": self.dst_port,
            "proto": self.proto,
        }


@dataclass(frozen=True, slots=True)
class InstanceNetwork:
    """One instance's network parameters: ``out/instances/<id>/network.json``."""

    instance_id: str
    node_id: str
    network_id: str
    ip: str
    prefix: int
    gateway: str
    firewall_rules: tuple[FirewallRule, ...]
    hostname: str | None
    ingress_kbit: int  # quotas.downloadSpeed, 0 = unlimited
    egress_kbit: int  # quotas.uploadSpeed, 0 = unlimited
    vlan_id: int | None = None

    @property
    def dns_servers(self) -> tuple[str, ...]:
        return (self.gateway,)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "instanceId": self.instance_id,
            "nodeId": self.node_id,
            "networkId": self.network_id,
            "ip": self.ip,
            "prefix": self.prefix,
            "gateway": self.gateway,
            "dnsServers": list(self.dns_servers),
            "firewallRules": [r.to_json() for r in self.firewall_rules],
            "hostname": self.hostname,
            "ingressKbit": self.ingress_kbit,
            "egressKbit": self.egress_kbit,
            "netns": netns_name(self.node_id, self.instance_id),
        }
        if self.vlan_id is not None:
            out["vlanId"] = self.vlan_id
        return out


@dataclass(frozen=True)
class NetworkResult:
    state: Mapping[str, Any]
    """What the checkpoint keeps (empty when no instance has a network)."""
    instances: Mapping[str, InstanceNetwork]
    """Per placed instance with a network, in instance order."""
    failures: Mapping[str, str] = field(default_factory=dict)
    """Instance id → why the network phase fails it (reason ``Network``)."""
    dns: Mapping[str, str] = field(default_factory=dict)
    """The DNS table: name → address, sorted by name."""

    def network_json(self) -> dict[str, Any]:
        """``out/network.json``: the networks (subnet, VLAN id, host address per node) and the
        DNS table."""
        return {
            "formatVersion": 1,
            "networks": dict(self.state.get("networks", {})),
            "dns": dict(self.dns),
        }


def netns_name(node_id: str, instance_id: str) -> str:
    """The network namespace of an instance: its container's id (``/run/netns/<name>``)."""
    return f"{node_id}.{instance_id}"


def has_network(unit: UnitConfig | None, service: Service) -> bool:
    """Whether the instances of ``service`` get a network (see the module docstring)."""
    if service.type != "service":
        return False
    return (unit is not None and unit.network is not None) or service.networked


def dns_names(service: Service, index: int) -> list[str]:
    """The DNS names of instance ``index`` of ``service`` (SPEC §17), lower-cased."""
    net = service.network_id
    base = f"{service.subject}.{service.id}"
    names = [f"{index}.{base}", f"{index}.{base}.{net}"]
    if index == 0:
        names += [base, f"{base}.{net}"]
    if service.hostname:
        names.insert(0, service.hostname)
    seen: list[str] = []
    for n in names:
        n = n.lower()
        if n not in seen:
            seen.append(n)
    return seen


def instance_addresses(state: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """Instance id → (network id, address), from a state :func:`assign_networks` made."""
    return {
        iid: (str(a["network"]), str(a["ip"]))
        for iid, a in state.get("addresses", {}).items()
        if isinstance(a, Mapping)
    }


def state_from_actual(instances: Iterable[tuple[str, str | None, str | None]]) -> dict[str, Any]:
    """A state holding only the addresses node agents report, ``(instance id, network, ip)``
    (the recovery when no checkpoint can be trusted: each network takes the subnet its
    instances' addresses lie in again when it is free)."""
    addresses = {
        iid: {"network": net, "ip": ip}
        for iid, net, ip in sorted(instances)
        if net is not None and ip is not None
    }
    return {"addresses": addresses} if addresses else {}


# ---------------------------------------------------------------------------- the phase

_Member = tuple[Placement, Service]
_Networks = Mapping[str, Sequence[_Member]]
"""Network id → its members (placement, service), in instance order; networks sorted by id."""
_Serving = Mapping[tuple[str, int, str], Sequence[_Member]]
"""(item id, port, protocol) → the members whose service exposes that port."""


def assign_networks(
    unit: UnitConfig | None,
    services: Mapping[_ServiceKey, Service] | Iterable[Service],
    result: BalanceResult,
    previous: Mapping[str, Any],
    *,
    networked: bool | None = None,
) -> NetworkResult:
    """The network phase over ``result``'s placements; see the module docstring.
    ``networked``: whether any service is ``networked``, when the caller has counted it."""
    listed = list(services.values()) if isinstance(services, Mapping) else list(services)
    cfg = _network_config(unit, listed, networked)
    if cfg is None:
        return NetworkResult({}, {})  # no network anywhere: no pass over the placements
    prev_nets: Mapping[str, Any] = previous.get("networks", {}) or {}
    prev_addr: Mapping[str, Any] = previous.get("addresses", {}) or {}

    # 1. who has a network now; the others release theirs
    nets, order = _networked_members(unit, listed, result.placements)
    if not nets:
        return NetworkResult({}, {})
    # 2. subnets, then VLAN ids
    subnets, failures = _assign_subnets(nets, _pools(cfg), prev_nets, prev_addr)
    vlans: dict[str, int] = {}
    if cfg.vlan:
        vlans, vlan_failures = _assign_vlans(nets, subnets, prev_nets)
        failures.update(vlan_failures)
    # 3. host and instance addresses, sticky ones first
    hosts, ips, address_failures = _assign_addresses(
        nets, subnets, set(failures), prev_nets, prev_addr
    )
    failures.update(address_failures)
    members = _in_instance_order(nets, ips, order)
    # 4. DNS names
    dns, dns_failures = _assign_dns(members, ips)
    failures.update(dns_failures)
    ips = _without(ips, dns_failures)
    # 5. firewall
    rules, firewall_failures = _firewall(members, ips)
    failures.update(firewall_failures)
    ips = _without(ips, firewall_failures)

    # the result: the state, and each instance's parameters in instance order
    out, addresses = _instance_networks(members, subnets, vlans, hosts, ips, rules)
    return NetworkResult(
        _state(_state_networks(nets, subnets, vlans, hosts, ips), addresses),
        out,
        dict(sorted(failures.items(), key=lambda kv: order[kv[0]])),
        _live_dns(dns, ips),
    )


def _network_config(
    unit: UnitConfig | None, services: Iterable[Service], networked: bool | None = None
) -> NetworkConfig | None:
    """Which rules apply: unit.yaml's ``network``, the defaults when only services ask for a
    network, None when nothing has one (``networked``: whether a service asks, if known)."""
    if unit is not None and unit.network is not None:
        return unit.network
    if networked is None:
        networked = any(s.networked for s in services)
    return NetworkConfig() if networked else None


def _ip(value: object) -> int | None:
    """An address of the previous state as an int (None when it is not one)."""
    try:
        return int(ipaddress.IPv4Address(str(value)))
    except ValueError:
        return None


def _dotted(ip: int) -> str:
    """An address as the state and the outputs write it."""
    return str(ipaddress.IPv4Address(ip))


def _pools(cfg: NetworkConfig) -> list[ipaddress.IPv4Network]:
    """Rule 2 (allowed subnets): ``subnets`` in order, without those overlapping any of
    ``excludeSubnets``."""
    excluded = [ipaddress.IPv4Network(s) for s in cfg.excludeSubnets]
    pools = [ipaddress.IPv4Network(s) for s in cfg.subnets]
    return [p for p in pools if not any(p.overlaps(x) for x in excluded)]


def _previous(prev_nets: Mapping[str, Any], net_id: str, key: str) -> object:
    """``key`` of network ``net_id``'s entry in the previous state (None without one)."""
    got = prev_nets.get(net_id)
    return got.get(key) if isinstance(got, Mapping) else None


def _previous_address(prev_addr: Mapping[str, Any], net_id: str, instance: str) -> int | None:
    """The address ``instance`` held in network ``net_id`` before (None: none, or another)."""
    a = prev_addr.get(instance)
    if not isinstance(a, Mapping) or a.get("network") != net_id:
        return None
    return _ip(a.get("ip"))


def _fail_all(members: Iterable[_Member], reason: str) -> dict[str, str]:
    """The same failure for each of ``members``."""
    return {p.instance_id: reason for p, _service in members}


# 1. who has a network


def _networked_members(
    unit: UnitConfig | None, services: Iterable[Service], placements: Iterable[Placement]
) -> tuple[dict[str, list[_Member]], dict[str, int]]:
    """Rule 1: the placed service instances that have a network, per network (sorted by id),
    and each one's position in instance order."""
    by_key: dict[_ServiceKey, Service] = {s.key: s for s in services}
    nets: dict[str, list[_Member]] = {}
    order: dict[str, int] = {}
    for k, p in enumerate(placements):
        service = by_key.get((p.item_id, p.subject_id))
        if service is None or not has_network(unit, service):
            continue
        order[p.instance_id] = k
        nets.setdefault(service.network_id, []).append((p, service))
    return dict(sorted(nets.items())), order


# 2. subnets and VLAN ids


def _assign_subnets(
    nets: _Networks,
    pools: Sequence[ipaddress.IPv4Network],
    prev_nets: Mapping[str, Any],
    prev_addr: Mapping[str, Any],
) -> tuple[dict[str, ipaddress.IPv4Network], dict[str, str]]:
    """Rule 2 (subnets): each network keeps its allowed previous subnet, else takes the one its
    members' addresses lie in, else the first free one; with none free its instances fail."""
    allowed = {str(p): p for p in pools}
    subnets: dict[str, ipaddress.IPv4Network] = {}
    taken: set[str] = set()
    for net_id in nets:
        kept = str(_previous(prev_nets, net_id, "subnet"))
        if kept in allowed and kept not in taken:
            subnets[net_id] = allowed[kept]
            taken.add(kept)
    failures: dict[str, str] = {}
    for net_id, members in nets.items():
        if net_id in subnets:
            continue
        # the recovery from actual/: the subnet its members' addresses lie in, else the first
        hinted = _hinted(net_id, members, prev_addr, pools, taken)
        free = hinted or next((p for p in pools if str(p) not in taken), None)
        if free is None:
            failures.update(
                _fail_all(
                    members,
                    f"network {net_id}: no free subnet (all of {len(pools)} allowed "
                    "subnets are held by other networks)",
                )
            )
            continue
        subnets[net_id] = free
        taken.add(str(free))
    return subnets, failures


def _hinted(
    net_id: str,
    members: Iterable[_Member],
    prev_addr: Mapping[str, Any],
    pools: Sequence[ipaddress.IPv4Network],
    taken: set[str],
) -> ipaddress.IPv4Network | None:
    """Rule 2 (recovery): the first free allowed subnet a member's previous address lies in."""
    for p, _service in members:
        ip = _previous_address(prev_addr, net_id, p.instance_id)
        if ip is None:
            continue
        for pool in pools:
            if str(pool) not in taken and ipaddress.IPv4Address(ip) in pool:
                return pool
    return None


def _assign_vlans(
    nets: _Networks,
    subnets: Mapping[str, ipaddress.IPv4Network],
    prev_nets: Mapping[str, Any],
) -> tuple[dict[str, int], dict[str, str]]:
    """Rule 2 (VLAN ids): each network keeps its previous VLAN id, else a network with a subnet
    takes the smallest free one; with none free its instances fail."""
    vlans: dict[str, int] = {}
    for net_id in nets:
        vlan = _previous(prev_nets, net_id, "vlanId")
        if isinstance(vlan, int) and vlan in VLAN_IDS and vlan not in vlans.values():
            vlans[net_id] = vlan
    failures: dict[str, str] = {}
    for net_id, members in nets.items():
        if net_id in vlans or net_id not in subnets:
            continue
        used = set(vlans.values())
        free = next((v for v in VLAN_IDS if v not in used), None)
        if free is None:
            failures.update(_fail_all(members, f"network {net_id}: no free VLAN id"))
            continue
        vlans[net_id] = free
    return vlans, failures


# 3. host and instance addresses


def _assign_addresses(
    nets: _Networks,
    subnets: Mapping[str, ipaddress.IPv4Network],
    failed: Set[str],
    prev_nets: Mapping[str, Any],
    prev_addr: Mapping[str, Any],
) -> tuple[dict[str, dict[str, int]], dict[str, int], dict[str, str]]:
    """Rule 3 over every network with a subnet whose instances have not failed: the host
    address per network and node, the address per instance, and who fails for want of one."""
    hosts: dict[str, dict[str, int]] = {}
    ips: dict[str, int] = {}
    failures: dict[str, str] = {}
    for net_id, members in nets.items():
        subnet = subnets.get(net_id)
        if subnet is None or members[0][0].instance_id in failed:
            continue
        prev_hosts = _previous(prev_nets, net_id, "hosts")
        net_hosts, net_ips, net_failures = _address_network(
            net_id,
            members,
            subnet,
            prev_hosts if isinstance(prev_hosts, Mapping) else {},
            prev_addr,
        )
        hosts[net_id] = net_hosts
        ips.update(net_ips)
        failures.update(net_failures)
    return hosts, ips, failures


def _address_network(
    net_id: str,
    members: Sequence[_Member],
    subnet: ipaddress.IPv4Network,
    prev_hosts: Mapping[str, Any],
    prev_addr: Mapping[str, Any],
) -> tuple[dict[str, int], dict[str, int], dict[str, str]]:
    """Rule 3 for one network: sticky host then instance addresses, then new host addresses
    from ``.1``, then new instance addresses from ``.2`` (exposed ports first)."""
    base = int(subnet.network_address)
    hi = int(subnet.broadcast_address) - 1
    nodes = sorted({p.node_id for p, _s in members})
    hosts = _kept_hosts(nodes, prev_hosts, base + 1, hi)
    ips = _kept_addresses(net_id, members, prev_addr, base + 2, hi, set(hosts.values()))
    used = set(hosts.values()) | set(ips.values())
    hosts, failures = _new_hosts(net_id, members, nodes, subnet, hosts, used)
    # an instance failed for want of its node's bridge address gives its kept address up
    ips = {i: a for i, a in ips.items() if i not in failures}
    free = _free_addresses(subnet, used | set(hosts.values()), base + 2)
    exposed = [m for m in members if m[1].exposedPorts]
    others = [m for m in members if not m[1].exposedPorts]
    for p, _service in exposed + others:
        iid = p.instance_id
        if iid in ips or iid in failures:
            continue
        ip = next(free, None)
        if ip is None:
            failures[iid] = f"network {net_id}: no free address in {subnet}"
        else:
            ips[iid] = ip
    return hosts, ips, failures


def _new_hosts(
    net_id: str,
    members: Sequence[_Member],
    nodes: Iterable[str],
    subnet: ipaddress.IPv4Network,
    kept: Mapping[str, int],
    used: Set[int],
) -> tuple[dict[str, int], dict[str, str]]:
    """Rule 3 (new hosts): each node without a kept host address takes the smallest free one
    from ``.1``; with none free the node's instances fail."""
    hosts = dict(kept)
    free = _free_addresses(subnet, used, int(subnet.network_address) + 1)
    failures: dict[str, str] = {}
    for node in nodes:
        if node in hosts:
            continue
        host = next(free, None)
        if host is None:
            failures.update(
                _fail_all(
                    (m for m in members if m[0].node_id == node),
                    f"network {net_id}: no free address in {subnet} for node {node}'s bridge",
                )
            )
        else:
            hosts[node] = host
    return hosts, failures


def _kept_hosts(
    nodes: Iterable[str], prev_hosts: Mapping[str, Any], lo: int, hi: int
) -> dict[str, int]:
    """Rule 3 (sticky hosts): each node keeps its previous host address while in the subnet
    and not held by another node."""
    hosts: dict[str, int] = {}
    for node in nodes:
        ip = _ip(prev_hosts.get(node))
        if ip is not None and lo <= ip <= hi and ip not in hosts.values():
            hosts[node] = ip
    return hosts


def _kept_addresses(
    net_id: str,
    members: Iterable[_Member],
    prev_addr: Mapping[str, Any],
    lo: int,
    hi: int,
    used: Set[int],
) -> dict[str, int]:
    """Rule 3 (sticky instances): each instance keeps its previous address in its network
    while in the subnet and not held by a host or an earlier instance."""
    ips: dict[str, int] = {}
    for p, _service in members:
        ip = _previous_address(prev_addr, net_id, p.instance_id)
        if ip is not None and lo <= ip <= hi and ip not in used and ip not in ips.values():
            ips[p.instance_id] = ip
    return ips


def _free_addresses(subnet: ipaddress.IPv4Network, used: Set[int], start: int) -> Iterator[int]:
    """Rule 3 (new addresses): the free addresses of ``subnet`` from ``start`` up, smallest
    first, below the broadcast address."""
    last = int(subnet.broadcast_address) - 1
    return (a for a in range(start, last + 1) if a not in used)


def _in_instance_order(
    nets: _Networks, ips: Mapping[str, int], order: Mapping[str, int]
) -> list[_Member]:
    """The members that have an address after rule 3, in instance order."""
    return sorted(
        (m for ms in nets.values() for m in ms if m[0].instance_id in ips),
        key=lambda m: order[m[0].instance_id],
    )


def _without(ips: Mapping[str, int], failed: Mapping[str, str]) -> dict[str, int]:
    """An instance that fails releases its address."""
    return {iid: ip for iid, ip in ips.items() if iid not in failed}


# 4. DNS names


def _assign_dns(
    members: Iterable[_Member], ips: Mapping[str, int]
) -> tuple[dict[str, str], dict[str, str]]:
    """Rule 4: each instance's DNS names in instance order; a name already held fails the
    later instance."""
    dns: dict[str, str] = {}
    failures: dict[str, str] = {}
    for p, service in members:
        names = dns_names(service, p.index)
        held = [n for n in names if n in dns]
        if held:
            failures[p.instance_id] = (
                f"DNS name {held[0]} is already held by another instance ({dns[held[0]]})"
            )
            continue
        address = _dotted(ips[p.instance_id])
        for n in names:
            dns[n] = address
    return dns, failures


# 5. firewall


def _firewall(
    members: Sequence[_Member], ips: Mapping[str, int]
) -> tuple[dict[str, set[FirewallRule]], dict[str, str]]:
    """Rule 5: the consumers whose connections no instance serves fail, then one rule per
    (consumer, target instance, port) for the others."""
    serving = _serving(members)
    consumers = [m for m in members if m[1].allowedConnections]
    failures = _unserved_consumers(consumers, serving, ips)
    return _firewall_rules(consumers, serving, _without(ips, failures)), failures


def _serving(members: Iterable[_Member]) -> dict[tuple[str, int, str], list[_Member]]:
    """Rule 5 (targets): the instances exposing each (item, port, protocol)."""
    serving: dict[tuple[str, int, str], list[_Member]] = {}
    for p, service in members:
        for spec in service.ports:
            serving.setdefault((service.id, spec.port, spec.proto), []).append((p, service))
    return serving


def _unserved_consumers(
    consumers: Sequence[_Member], serving: _Serving, ips: Mapping[str, int]
) -> dict[str, str]:
    """Rule 5 (failures): a consumer a connection of which no live instance serves fails,
    until none more fails (a failed instance serves nothing)."""
    live = set(ips)
    failures: dict[str, str] = {}
    changed = True
    while changed:
        changed = False
        for p, service in consumers:
            if p.instance_id not in live:
                continue
            for conn in service.connections:
                targets = serving.get((conn.item_id, conn.port, conn.proto), [])
                if not any(t.instance_id in live for t, _s in targets):
                    failures[p.instance_id] = (
                        f"no instance of {conn.item_id} exposes {conn.port}/{conn.proto}"
                    )
                    live.discard(p.instance_id)
                    changed = True
                    break
    return failures


def _firewall_rules(
    consumers: Iterable[_Member], serving: _Serving, ips: Mapping[str, int]
) -> dict[str, set[FirewallRule]]:
    """Rule 5 (rules): one rule per (live consumer, live target instance, port), carried by
    both instances."""
    rules: dict[str, set[FirewallRule]] = {}
    for p, service in consumers:
        if p.instance_id not in ips:
            continue
        src = _dotted(ips[p.instance_id])
        for conn in service.connections:
            for t, _s in serving.get((conn.item_id, conn.port, conn.proto), []):
                if t.instance_id not in ips:
                    continue
                rule = FirewallRule(src, _dotted(ips[t.instance_id]), conn.port, conn.proto)
                rules.setdefault(p.instance_id, set()).add(rule)
                rules.setdefault(t.instance_id, set()).add(rule)
    return rules


# the result


def _state(state_nets: Mapping[str, Any], addresses: Mapping[str, Any]) -> dict[str, Any]:
    """What the checkpoint keeps: empty when no instance has a network."""
    if not state_nets and not addresses:
        return {}
    return {"addresses": dict(sorted(addresses.items())), "networks": dict(state_nets)}


def _live_dns(dns: Mapping[str, str], ips: Mapping[str, int]) -> dict[str, str]:
    """The DNS table, sorted by name, without the names of the instances that failed."""
    live_ips = {_dotted(i) for i in ips.values()}
    return dict(sorted((n, a) for n, a in dns.items() if a in live_ips))


def _state_networks(
    nets: _Networks,
    subnets: Mapping[str, ipaddress.IPv4Network],
    vlans: Mapping[str, int],
    hosts: Mapping[str, Mapping[str, int]],
    ips: Mapping[str, int],
) -> dict[str, Any]:
    """The state's ``networks``: each network with a live instance, with the host addresses
    of the nodes that run one."""
    state_nets: dict[str, Any] = {}
    for net_id, members in nets.items():
        subnet = subnets.get(net_id)
        live = {p.node_id for p, _s in members if p.instance_id in ips}
        if subnet is None or not live:
            continue
        entry: dict[str, Any] = {
            "subnet": str(subnet),
            "hosts": {
                node: _dotted(ip) for node, ip in sorted(hosts[net_id].items()) if node in live
            },
        }
        if net_id in vlans:
            entry["vlanId"] = vlans[net_id]
        state_nets[net_id] = entry
    return state_nets


def _instance_networks(
    members: Iterable[_Member],
    subnets: Mapping[str, ipaddress.IPv4Network],
    vlans: Mapping[str, int],
    hosts: Mapping[str, Mapping[str, int]],
    ips: Mapping[str, int],
    rules: Mapping[str, set[FirewallRule]],
) -> tuple[dict[str, InstanceNetwork], dict[str, Any]]:
    """Each live instance's network parameters, and the state's ``addresses``, in instance
    order."""
    out: dict[str, InstanceNetwork] = {}
    addresses: dict[str, Any] = {}
    for p, service in members:
        iid = p.instance_id
        if iid not in ips:
            continue
        net_id = service.network_id
        addr = _dotted(ips[iid])
        addresses[iid] = {"network": net_id, "ip": addr}
        out[iid] = InstanceNetwork(
            iid,
            p.node_id,
            net_id,
            addr,
            subnets[net_id].prefixlen,
            _dotted(hosts[net_id][p.node_id]),
            tuple(sorted(rules.get(iid, ()))),
            service.hostname,
            service.quotas.downloadSpeed or 0,
            service.quotas.uploadSpeed or 0,
            vlans.get(net_id),
        )
    return out, addresses
