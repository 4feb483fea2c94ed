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
from collections.abc import Iterable, Mapping
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
    "explain_network",
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


@dataclass
class _Net:
    """One network during a run."""

    id: str
    members: list[tuple[Placement, Service]] = field(default_factory=list)
    subnet: ipaddress.IPv4Network | None = None
    vlan: int | None = None
    hosts: dict[str, int] = field(default_factory=dict)  # node -> address (as an int)
    used: set[int] = field(default_factory=set)
    cursor: int = 0  # no free address below it (new addresses are taken in increasing order)

    def take(self, start: int) -> int | None:
        assert self.subnet is not None
        last = int(self.subnet.broadcast_address) - 1
        at = max(self.cursor, start)
        while at <= last and at in self.used:
            at += 1
        if at > last:
            return None
        self.used.add(at)
        self.cursor = at + 1
        return at


def _ip(value: object) -> int | None:
    try:
        return int(ipaddress.IPv4Address(str(value)))
    except ValueError:
        return None


def _pools(cfg: NetworkConfig) -> list[ipaddress.IPv4Network]:
    excluded = [ipaddress.IPv4Network(s) for s in cfg.excludeSubnets]
    pools = [ipaddress.IPv4Network(s) for s in cfg.subnets]
    return [p for p in pools if not any(p.overlaps(x) for x in excluded)]


def assign_networks(
    unit: UnitConfig | None,
    services: Mapping[_ServiceKey, Service] | Iterable[Service],
    result: BalanceResult,
    previous: Mapping[str, Any],
) -> NetworkResult:
    """The network phase over ``result``'s placements; see the module docstring."""
    listed = list(services.values()) if isinstance(services, Mapping) else list(services)
    if (unit is None or unit.network is None) and not any(s.networked for s in listed):
        return NetworkResult({}, {})  # no network anywhere: no pass over the placements
    by_key: dict[_ServiceKey, Service] = {s.key: s for s in listed}
    cfg = unit.network if unit is not None and unit.network is not None else NetworkConfig()
    prev_nets: Mapping[str, Any] = previous.get("networks", {}) or {}
    prev_addr: Mapping[str, Any] = previous.get("addresses", {}) or {}

    # 1. who has a network now (placed, a service with one); the others release theirs
    nets: dict[str, _Net] = {}
    order: dict[str, int] = {}
    for k, p in enumerate(result.placements):
        service = by_key.get((p.item_id, p.subject_id))
        if service is None or not has_network(unit, service):
            continue
        order[p.instance_id] = k
        net = nets.get(service.network_id)
        if net is None:
            net = nets[service.network_id] = _Net(service.network_id)
        net.members.append((p, service))
    if not nets:
        return NetworkResult({}, {})
    failures: dict[str, str] = {}

    # 2. subnets (kept, then the first free in order), VLAN ids, host addresses per node
    pools = _pools(cfg)
    allowed = {str(p): p for p in pools}
    taken: set[str] = set()
    for net in sorted(nets.values(), key=lambda n: n.id):
        got = prev_nets.get(net.id)
        subnet = str(got.get("subnet")) if isinstance(got, Mapping) else None
        if subnet in allowed and subnet not in taken:
            net.subnet = allowed[subnet]
            taken.add(subnet)
    for net in sorted(nets.values(), key=lambda n: n.id):
        if net.subnet is not None:
            continue
        # a network without a subnet of its own takes the one its members' addresses lie in
        # (the recovery from actual/), else the first free one
        hinted = _hinted(net, prev_addr, pools, taken)
        free = hinted or next((p for p in pools if str(p) not in taken), None)
        if free is None:
            for p, _service in net.members:
                failures[p.instance_id] = (
                    f"network {net.id}: no free subnet (all of {len(pools)} allowed "
                    "subnets are held by other networks)"
                )
            continue
        net.subnet = free
        taken.add(str(free))
    if cfg.vlan:
        used_vlans: set[int] = set()
        for net in sorted(nets.values(), key=lambda n: n.id):
            got = prev_nets.get(net.id)
            vlan = got.get("vlanId") if isinstance(got, Mapping) else None
            if isinstance(vlan, int) and vlan in VLAN_IDS and vlan not in used_vlans:
                net.vlan = vlan
                used_vlans.add(vlan)
        for net in sorted(nets.values(), key=lambda n: n.id):
            if net.vlan is None and net.subnet is not None:
                vlan = next((v for v in VLAN_IDS if v not in used_vlans), None)
                if vlan is None:
                    for p, _service in net.members:
                        failures[p.instance_id] = f"network {net.id}: no free VLAN id"
                    continue
                net.vlan = vlan
                used_vlans.add(vlan)

    # 3. sticky addresses first (hosts, then instances), so that nothing new takes them; then
    # new host addresses from .1, then new instance addresses from .2, exposed ports first
    ips: dict[str, int] = {}
    for net in sorted(nets.values(), key=lambda n: n.id):
        if net.subnet is None or net.members[0][0].instance_id in failures:
            continue
        base = int(net.subnet.network_address)
        lo, hi = base + 1, int(net.subnet.broadcast_address) - 1
        got = prev_nets.get(net.id)
        prev_hosts = got.get("hosts", {}) if isinstance(got, Mapping) else {}
        nodes = sorted({p.node_id for p, _s in net.members})
        for node in nodes:
            ip = _ip(prev_hosts.get(node)) if isinstance(prev_hosts, Mapping) else None
            if ip is not None and lo <= ip <= hi and ip not in net.used:
                net.hosts[node] = ip
                net.used.add(ip)
        for p, _service in net.members:
            a = prev_addr.get(p.instance_id)
            if not isinstance(a, Mapping) or a.get("network") != net.id:
                continue
            ip = _ip(a.get("ip"))
            if ip is not None and lo + 1 <= ip <= hi and ip not in net.used:
                net.used.add(ip)
                ips[p.instance_id] = ip
        for node in nodes:
            if node not in net.hosts:
                host = net.take(base + 1)
                if host is None:
                    for p, _s in net.members:
                        if p.node_id == node:
                            failures[p.instance_id] = (
                                f"network {net.id}: no free address in {net.subnet} for "
                                f"node {node}'s bridge"
                            )
                else:
                    net.hosts[node] = host
        net.cursor = 0
        exposed = [m for m in net.members if m[1].exposedPorts]
        others = [m for m in net.members if not m[1].exposedPorts]
        for p, _service in exposed + others:
            iid = p.instance_id
            if iid in ips or iid in failures:
                continue
            ip = net.take(base + 2)
            if ip is None:
                failures[iid] = f"network {net.id}: no free address in {net.subnet}"
            else:
                ips[iid] = ip

    # 4. DNS names, in instance order: a name already held fails the later instance
    members = sorted(
        (m for net in nets.values() for m in net.members if m[0].instance_id in ips),
        key=lambda m: order[m[0].instance_id],
    )
    dns: dict[str, str] = {}
    for p, service in members:
        names = dns_names(service, p.index)
        held = [n for n in names if n in dns]
        if held:
            failures[p.instance_id] = (
                f"DNS name {held[0]} is already held by another instance ({dns[held[0]]})"
            )
            del ips[p.instance_id]
            continue
        address = str(ipaddress.IPv4Address(ips[p.instance_id]))
        for n in names:
            dns[n] = address

    # 5. firewall: a consumer whose connection no instance serves fails (until none more
    # fails: a failed instance serves nothing), then one rule per (consumer, target, port)
    serving: dict[tuple[str, int, str], list[tuple[Placement, Service]]] = {}
    for p, service in members:
        for spec in service.ports:
            serving.setdefault((service.id, spec.port, spec.proto), []).append((p, service))
    consumers = [m for m in members if m[1].allowedConnections]
    changed = True
    while changed:
        changed = False
        for p, service in consumers:
            if p.instance_id not in ips:
                continue
            for conn in service.connections:
                targets = serving.get((conn.item_id, conn.port, conn.proto), [])
                if not any(t.instance_id in ips for t, _s in targets):
                    failures[p.instance_id] = (
                        f"no instance of {conn.item_id} exposes {conn.port}/{conn.proto}"
                    )
                    del ips[p.instance_id]
                    changed = True
                    break
    live_ips = {str(ipaddress.IPv4Address(i)) for i in ips.values()}
    dns = {n: a for n, a in dns.items() if a in live_ips}
    rules: dict[str, set[FirewallRule]] = {}
    for p, service in consumers:
        if p.instance_id not in ips:
            continue
        src = str(ipaddress.IPv4Address(ips[p.instance_id]))
        for conn in service.connections:
            for t, _s in serving.get((conn.item_id, conn.port, conn.proto), []):
                if t.instance_id not in ips:
                    continue
                dst = str(ipaddress.IPv4Address(ips[t.instance_id]))
                rule = FirewallRule(src, dst, conn.port, conn.proto)
                rules.setdefault(p.instance_id, set()).add(rule)
                rules.setdefault(t.instance_id, set()).add(rule)

    # the result: the state, and each instance's parameters in instance order
    state_nets: dict[str, Any] = {}
    for net in sorted(nets.values(), key=lambda n: n.id):
        if net.subnet is None or not any(p.instance_id in ips for p, _s in net.members):
            continue
        live = {p.node_id for p, _s in net.members if p.instance_id in ips}
        entry: dict[str, Any] = {
            "subnet": str(net.subnet),
            "hosts": {
                node: str(ipaddress.IPv4Address(ip))
                for node, ip in sorted(net.hosts.items())
                if node in live
            },
        }
        if net.vlan is not None:
            entry["vlanId"] = net.vlan
        state_nets[net.id] = entry
    out: dict[str, InstanceNetwork] = {}
    addresses: dict[str, Any] = {}
    for p, service in members:
        iid = p.instance_id
        if iid not in ips:
            continue
        net = nets[service.network_id]
        assert net.subnet is not None
        addr = str(ipaddress.IPv4Address(ips[iid]))
        addresses[iid] = {"network": net.id, "ip": addr}
        out[iid] = InstanceNetwork(
            iid,
            p.node_id,
            net.id,
            addr,
            net.subnet.prefixlen,
            str(ipaddress.IPv4Address(net.hosts[p.node_id])),
            tuple(sorted(rules.get(iid, ()))),
            service.hostname,
            service.quotas.downloadSpeed or 0,
            service.quotas.uploadSpeed or 0,
            net.vlan,
        )
    state: dict[str, Any] = {}
    if state_nets or addresses:
        state = {"addresses": dict(sorted(addresses.items())), "networks": state_nets}
    ordered_failures = dict(sorted(failures.items(), key=lambda kv: order[kv[0]]))
    return NetworkResult(state, out, ordered_failures, dict(sorted(dns.items())))


def _hinted(
    net: _Net,
    prev_addr: Mapping[str, Any],
    pools: list[ipaddress.IPv4Network],
    taken: set[str],
) -> ipaddress.IPv4Network | None:
    for p, _service in net.members:
        a = prev_addr.get(p.instance_id)
        if not isinstance(a, Mapping) or a.get("network") != net.id:
            continue
        ip = _ip(a.get("ip"))
        if ip is None:
            continue
        for pool in pools:
            if str(pool) not in taken and ipaddress.IPv4Address(ip) in pool:
                return pool
    return None


def explain_network(
    unit: UnitConfig | None,
    services: Mapping[_ServiceKey, Service] | Iterable[Service],
    result: BalanceResult,
    previous: Mapping[str, Any],
    instance: str,
) -> tuple[str | None, InstanceNetwork | None]:
    """For ``reconciler explain``: why the network phase fails ``instance`` (None: it does
    not), and its network parameters when it has a network."""
    net = assign_networks(unit, services, result, previous)
    return net.failures.get(instance), net.instances.get(instance)
