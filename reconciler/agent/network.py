"""The node agent's network side (SPEC §17): bridges, DNS, namespaces, CNI and the firewall.

The controller decides every address (``out/network.json``, ``out/instances/<id>/network.json``);
the agent wires them with the tools a Linux node has:

- per instance with a network, a named network namespace ``/run/netns/<nodeId>.<instanceId>``
  (its container's id; the container's config joins it), then Debian's standard CNI plugins
  (``containernetworking-plugins``) run directly with the CNI environment (``CNI_COMMAND``,
  ``CNI_CONTAINERID``, ``CNI_NETNS``, ``CNI_IFNAME``, ``CNI_PATH``) and chained with
  ``prevResult``: ``bridge`` (the network's bridge on the node, holding the node's host address
  as the instances' gateway, outgoing traffic masqueraded) with ``static`` IPAM, ``firewall``
  (iptables backend, with this agent's admin chain), and ``bandwidth`` when a speed is set. The
  plugins' configurations and the final result are kept in the agent's directory
  (``DIR/.agent-<node>-network/<id>.json``) for the DEL at stop, which runs the chain in
  reverse with that result, then deletes the namespace;
- the admin chain ``RECONCILER-ADMIN`` (which the firewall plugin evaluates before its own
  rules), rebuilt whole on each apply: replies accepted, each allowed connection accepted, then
  any traffic into one of the node's networks from outside it dropped (instances of one network
  share a bridge and reach each other freely);
- one DNS server, Debian's ``dnsmasq``, listening on the node's bridge addresses and serving
  the DNS table as a hosts file, reloaded with SIGHUP when the table changes and restarted when
  the addresses change;
- bridges of networks that no longer have an instance on the node are deleted;
- with an uplink (``agent --uplink IFACE``), each network of the node that has a VLAN id gets
  a VLAN sub-interface ``rv-<the 10 hex digits of its bridge>`` on the uplink, enslaved to
  its bridge (:func:`vlan_name`, :func:`vlan_commands`), so the network's instances on
  several nodes share one layer-2 segment; it goes when the network leaves the node or its
  VLAN id changes. Without an uplink, VLAN ids are ignored (said once in the log).

``host_netns`` runs every host-side command (bridges, iptables, dnsmasq, the plugins) inside
that named namespace instead of the host's own (``ip netns exec``): tests use it to keep every
packet inside namespaces they made.

Every run looks at what it recorded: an instance recorded and no longer desired here (or with
another address now) is torn down first, so a crashed agent's leftovers go at its next start.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reconciler.io.fsio import FileReadError, atomic_write, ensure_dir, read_bytes_at
from reconciler.model.jsonbytes import pretty_json

__all__ = [
    "ADMIN_CHAIN",
    "CNI_PATH",
    "CNI_VERSION",
    "NetworkError",
    "NodeNetwork",
    "admin_rules",
    "bridge_name",
    "cni_chain",
    "dns_hosts",
    "interface_name_problem",
    "vlan_commands",
    "vlan_name",
]

log = logging.getLogger("reconciler.agent.network")

ADMIN_CHAIN = "RECONCILER-ADMIN"
CNI_PATH = "/usr/lib/cni"
CNI_VERSION = "1.0.0"
IFNAME = "eth0"
_TIMEOUT = 60.0
_MAX = 4 << 20


class NetworkError(RuntimeError):
    pass


# ---------------------------------------------------------------------------- pure parts


def bridge_name(network_id: str) -> str:
    """The bridge of a network on a node: ``rc-`` and 10 hex digits of its id's sha256 (an
    interface name holds at most 15 characters)."""
    return "rc-" + hashlib.sha256(network_id.encode()).hexdigest()[:10]


def vlan_name(network_id: str) -> str:
    """The VLAN sub-interface of a network on the uplink: ``rv-`` and the 10 hex digits of its
    bridge (:func:`bridge_name`), so ``rc-1a2b…`` and ``rv-1a2b…`` belong together. The VLAN
    id is not in the name (``ip -d link show`` says it): a changed id makes the same name
    again."""
    return "rv-" + bridge_name(network_id)[3:]


def interface_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a Linux network interface's name (None: it can): 1 to 15
    characters, not ``.`` or ``..``, no ``/``, ``:`` or white space; and, since it becomes an
    argument of ``ip``, not starting with ``-``."""
    if not name or len(name.encode()) > 15:
        return "an interface name has 1 to 15 characters"
    if name in (".", "..") or name.startswith("-"):
        return f"{name!r} is not an interface name"
    if any(c in "/:" or c.isspace() or not c.isprintable() for c in name):
        return "an interface name has no '/', ':', space or control character"
    return None


def vlan_commands(
    current: Mapping[str, Any] | None, uplink: str, vlan_id: int, bridge: str, name: str
) -> list[list[str]]:
    """The ``ip`` commands that make ``name`` a VLAN sub-interface of ``uplink`` with
    ``vlan_id``, enslaved to ``bridge`` and up, given what ``ip -d -j link show dev NAME``
    says of it now (``current``; None when it does not exist). One of another kind, id or
    parent is deleted and made again; the right one with another master gets the bridge; the
    right one, up, on the bridge needs nothing."""
    info = current.get("linkinfo", {}) if current is not None else {}
    data = info.get("info_data", {}) if isinstance(info, Mapping) else {}
    right = (
        current is not None
        and isinstance(data, Mapping)
        and info.get("info_kind") == "vlan"
        and data.get("id") == vlan_id
        and current.get("link") == uplink
    )
    up = ["ip", "link", "set", name, "up"]
    if right:
        assert current is not None
        cmds: list[list[str]] = []
        if current.get("master") != bridge:
            cmds.append(["ip", "link", "set", name, "master", bridge])
        if "UP" not in current.get("flags", []):
            cmds.append(up)
        return cmds
    cmds = [["ip", "link", "del", name]] if current is not None else []
    return [
        *cmds,
        ["ip", "link", "add", "link", uplink, "name", name, "type", "vlan", "id", str(vlan_id)],
        ["ip", "link", "set", name, "master", bridge],
        up,
    ]


def cni_chain(net: Mapping[str, Any], cni_version: str = CNI_VERSION) -> list[dict[str, Any]]:
    """The plugin configurations of one instance, in ADD order (without ``prevResult``)."""
    name = str(net["networkId"])
    base = {"cniVersion": cni_version, "name": name}
    address = f"{net['ip']}/{net['prefix']}"
    chain: list[dict[str, Any]] = [
        base
        | {
            "type": "bridge",
            "bridge": bridge_name(name),
            "isGateway": True,
            "ipMasq": True,
            "ipam": {
                "type": "static",
                "addresses": [{"address": address, "gateway": net["gateway"]}],
                "routes": [{"dst": "0.0.0.0/0"}],
            },
        },
        base | {"type": "firewall", "backend": "iptables", "iptablesAdminChainName": ADMIN_CHAIN},
    ]
    ingress, egress = int(net.get("ingressKbit", 0)), int(net.get("egressKbit", 0))
    if ingress or egress:
        limits: dict[str, Any] = {"type": "bandwidth"}
        if ingress:  # bits per second; a burst of a tenth of a second (at least one packet)
            limits |= {"ingressRate": ingress * 1000, "ingressBurst": max(ingress * 100, 12000)}
        if egress:
            limits |= {"egressRate": egress * 1000, "egressBurst": max(egress * 100, 12000)}
        chain.append(base | limits)
    return chain


def admin_rules(nets: Iterable[Mapping[str, Any]], subnets: Iterable[str]) -> list[list[str]]:
    """The admin chain's rules (``iptables -A`` arguments after the chain name): replies, each
    allowed connection of the instances given, then traffic into each of ``subnets`` from
    outside it dropped."""
    rules: list[list[str]] = [
        ["-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"]
    ]
    allowed: set[tuple[str, str, int, str]] = set()
    for net in nets:
        for r in net.get("firewallRules", ()):
            allowed.add((str(r["srcIp"]), str(r["dstIp"]), int(r["dstPort"]), str(r["proto"])))
    for src, dst, port, proto in sorted(allowed):
        rules.append(
            [
                "-s",
                f"{src}/32",
                "-d",
                f"{dst}/32",
                "-p",
                proto,
                "--dport",
                str(port),
                "-j",
                "ACCEPT",
            ]
        )
    for subnet in sorted(set(subnets)):
        rules.append(["-d", subnet, "!", "-s", subnet, "-j", "DROP"])
    return rules


def dns_hosts(dns: Mapping[str, str]) -> str:
    """The DNS table as a hosts file for dnsmasq: one line per address, names sorted."""
    by_ip: dict[str, list[str]] = {}
    for name, ip in sorted(dns.items()):
        by_ip.setdefault(ip, []).append(name)
    return "".join(f"{ip} {' '.join(names)}\n" for ip, names in sorted(by_ip.items()))


def _vlan_id(network: Any) -> int | None:
    """A network's VLAN id in ``out/network.json`` (None: it has none, or not a valid one)."""
    vid = network.get("vlanId") if isinstance(network, Mapping) else None
    return vid if type(vid) is int and 1 <= vid <= 4094 else None


# ---------------------------------------------------------------------------- the shell

# (node, network, VLAN id) already said to be ignored without an uplink: said once a process
_IGNORED: set[tuple[str, str, int]] = set()


@dataclass
class NodeNetwork:
    """Wires one node's instances (see the module docstring)."""

    state_dir: Path
    node_id: str
    host_netns: str | None = None
    cni_path: str = CNI_PATH
    uplink: str | None = None  # the interface that carries the networks' VLANs off the node
    problems: dict[str, str] = field(default_factory=dict)  # instance id -> why it failed

    @property
    def directory(self) -> Path:
        return self.state_dir / f".agent-{self.node_id}-network"

    # -- commands

    def _host(self, argv: Sequence[str]) -> list[str]:
        if self.host_netns is None:
            return list(argv)
        return ["ip", "netns", "exec", self.host_netns, *argv]

    def _run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        check: bool = True,
    ) -> subprocess.CompletedProcess[bytes]:
        full = {**os.environ, **env} if env is not None else None
        try:
            done = subprocess.run(
                list(argv),
                input=stdin,
                env=full,
                capture_output=True,
                timeout=_TIMEOUT,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise NetworkError(f"{' '.join(argv[:4])}: {e}") from None
        if check and done.returncode != 0:
            out = (done.stderr or done.stdout).decode(errors="replace").strip()
            raise NetworkError(f"{' '.join(argv)}: exit {done.returncode}: {out}")
        return done

    def _cni(self, command: str, conf: Mapping[str, Any], cid: str, netns: str) -> dict[str, Any]:
        env = {
            "CNI_COMMAND": command,
            "CNI_CONTAINERID": cid,
            "CNI_NETNS": f"/run/netns/{netns}",
            "CNI_IFNAME": IFNAME,
            "CNI_PATH": self.cni_path,
        }
        plugin = f"{self.cni_path}/{conf['type']}"
        done = self._run(
            self._host([plugin]), stdin=json.dumps(conf).encode(), env=env, check=False
        )
        if done.returncode != 0:
            raise NetworkError(
                f"CNI {conf['type']} {command}: {done.stdout.decode(errors='replace').strip()} "
                f"{done.stderr.decode(errors='replace').strip()}".strip()
            )
        text = done.stdout.decode(errors="replace").strip()
        return json.loads(text) if text else {}

    # -- records

    def _record_path(self, iid: str) -> Path:
        return self.directory / f"{iid}.json"

    def _records(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        if not self.directory.is_dir():
            return out
        for p in sorted(self.directory.glob("*.json")):
            if p.name == "node.json":
                continue
            try:
                raw, _ = read_bytes_at(p, _MAX)
                out[p.stem] = json.loads(raw)
            except (FileReadError, ValueError) as e:
                log.warning("%s: ignoring the network record %s: %s", self.node_id, p, e)
        return out

    def _node_record(self) -> dict[str, Any]:
        try:
            raw, _ = read_bytes_at(self.directory / "node.json", _MAX)
            data = json.loads(raw)
            return data if isinstance(data, dict) else {}
        except (FileReadError, ValueError):
            return {}

    def _save_node_record(self, data: Mapping[str, Any]) -> None:
        ensure_dir(self.directory)
        atomic_write(self.directory / "node.json", pretty_json(dict(data)))

    # -- inputs

    def _read_json(self, path: Path) -> dict[str, Any] | None:
        if not path.exists() or path.is_symlink():
            return None
        try:
            raw, _ = read_bytes_at(path, _MAX)
            data = json.loads(raw)
        except (FileReadError, ValueError) as e:
            log.warning("%s: cannot read %s: %s", self.node_id, path, e)
            return None
        return data if isinstance(data, dict) else None

    def instance_network(self, iid: str) -> dict[str, Any] | None:
        """The instance's ``network.json`` when it has a network on this node."""
        net = self._read_json(self.state_dir / "out" / "instances" / iid / "network.json")
        if net is None or net.get("nodeId") != self.node_id:
            return None
        return net

    # -- per instance

    def _netns_exists(self, name: str) -> bool:
        return os.path.exists(f"/run/netns/{name}")

    def setup(self, iid: str, net: Mapping[str, Any]) -> dict[str, Any]:
        """The instance's namespace and CNI chain; its record (kept for DEL)."""
        netns = str(net["netns"])
        if self._netns_exists(netns):  # a leftover nobody recorded: start clean
            self._run(["ip", "netns", "del", netns], check=False)
        self._run(["ip", "netns", "add", netns])
        self._run(["ip", "-n", netns, "link", "set", "lo", "up"])
        confs = cni_chain(net)
        record: dict[str, Any] = {
            "netns": netns,
            "networkId": net["networkId"],
            "ip": net["ip"],
            "plugins": confs,
            "result": None,
        }
        result: dict[str, Any] | None = None
        done: list[dict[str, Any]] = []
        try:
            for conf in confs:
                full = dict(conf)
                if result is not None:
                    full["prevResult"] = result
                result = self._cni("ADD", full, netns, netns)
                done.append(conf)
        except NetworkError:
            record["plugins"] = done
            record["result"] = result
            self._teardown(record, netns)
            raise
        record["result"] = result
        ensure_dir(self.directory)
        atomic_write(self._record_path(iid), pretty_json(record))
        return record

    def _teardown(self, record: Mapping[str, Any], cid: str) -> list[str]:
        errors: list[str] = []
        netns = str(record.get("netns", cid))
        result = record.get("result")
        for conf in reversed(list(record.get("plugins", []))):
            full = dict(conf)
            if result:
                full["prevResult"] = result
            try:
                self._cni("DEL", full, netns, netns)
            except NetworkError as e:
                errors.append(str(e))
        if self._netns_exists(netns):
            try:
                self._run(["ip", "netns", "del", netns])
            except NetworkError as e:
                errors.append(str(e))
        return errors

    def teardown(self, iid: str, record: Mapping[str, Any] | None = None) -> None:
        record = record if record is not None else self._records().get(iid)
        if record is None:
            return
        for e in self._teardown(record, str(record.get("netns", iid))):
            log.warning("%s: tearing down %s: %s", self.node_id, iid, e)
        self._record_path(iid).unlink(missing_ok=True)

    # -- the node

    def sync(self, desired: Iterable[str]) -> dict[str, dict[str, Any]]:
        """Make the node's networking match the desired instances: tear down what is recorded
        and not desired (or desired with another address), set up what is desired and not
        recorded, then the bridges, the admin chain and the DNS server. Returns each desired
        instance's network (its ``network.json``); an instance whose setup failed is in
        :attr:`problems` instead."""
        self.problems = {}
        top = self._read_json(self.state_dir / "out" / "network.json") or {}
        records = self._records()
        wanted: dict[str, dict[str, Any]] = {}
        for iid in sorted(set(desired)):
            net = self.instance_network(iid)
            if net is not None:
                wanted[iid] = net
        if not wanted and not records and not self._node_record():
            return {}
        for iid, record in sorted(records.items()):
            net = wanted.get(iid)
            if (
                net is None
                or net["ip"] != record.get("ip")
                or net["networkId"] != record.get("networkId")
            ):
                self.teardown(iid, record)
                records.pop(iid)
        for iid, net in wanted.items():
            if iid in records:
                continue
            try:
                records[iid] = self.setup(iid, net)
            except NetworkError as e:
                self.problems[iid] = f"network setup failed: {e}"
                log.error("%s: %s: %s", self.node_id, iid, self.problems[iid])
        live = {iid: wanted[iid] for iid in records if iid in wanted}
        networks = top.get("networks", {}) if isinstance(top.get("networks"), dict) else {}
        on_node = sorted({str(n["networkId"]) for n in live.values()})
        self._vlans({n: v for n in on_node if (v := _vlan_id(networks.get(n))) is not None})
        self._bridges(on_node)
        subnets = [str(networks[n]["subnet"]) for n in on_node if n in networks]
        self._admin_chain(live.values(), subnets)
        hosts = [str(networks[n]["hosts"][self.node_id]) for n in on_node if n in networks]
        self._dns(top.get("dns", {}) if live else {}, hosts)
        return live

    def _bridges(self, on_node: list[str]) -> None:
        node = self._node_record()
        old = set(node.get("networks", []))
        for net_id in sorted(old - set(on_node)):
            self._run(self._host(["ip", "link", "del", bridge_name(net_id)]), check=False)
        self._save_node_record(dict(node, networks=on_node))

    # -- VLANs

    def _link(self, name: str) -> dict[str, Any] | None:
        """What ``ip -d -j link show dev NAME`` says of an interface (None: there is none)."""
        done = self._run(self._host(["ip", "-d", "-j", "link", "show", "dev", name]), check=False)
        if done.returncode != 0:
            return None
        try:
            links = json.loads(done.stdout)
        except ValueError:
            return None
        first = links[0] if isinstance(links, list) and links else None
        return first if isinstance(first, dict) else None

    def _vlans(self, want: Mapping[str, int]) -> None:
        """The VLAN sub-interfaces on the uplink of the networks in ``want`` (network id ->
        VLAN id), each on its network's bridge; the ones recorded and not wanted (the network
        left the node, or has no VLAN id or no uplink now) are deleted. A failure is logged:
        the network still works on this node."""
        node = self._node_record()
        recorded = node.get("vlans")
        old: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
        if want and self.uplink is None:
            self._say_ignored(want)
            want = {}
        if want and self.uplink is not None and self._link(self.uplink) is None:
            log.error(
                "%s: the uplink %s does not exist: no VLAN sub-interface for %s",
                self.node_id,
                self.uplink,
                ", ".join(f"network {n} (VLAN {v})" for n, v in sorted(want.items())),
            )
            want = {}
        for net_id in sorted(set(old) - set(want)):  # the name from the id: only ever ours
            self._run(self._host(["ip", "link", "del", vlan_name(str(net_id))]), check=False)
        made: dict[str, dict[str, Any]] = {}
        for net_id, vid in sorted(want.items()):
            assert self.uplink is not None
            name = vlan_name(net_id)
            made[net_id] = {"name": name, "uplink": self.uplink, "vlanId": vid}
            try:
                for argv in vlan_commands(
                    self._link(name), self.uplink, vid, bridge_name(net_id), name
                ):
                    self._run(self._host(argv))
            except NetworkError as e:  # recorded all the same: the next run fixes or removes it
                log.error(
                    "%s: network %s: VLAN sub-interface %s (VLAN %d on %s): %s",
                    self.node_id,
                    net_id,
                    name,
                    vid,
                    self.uplink,
                    e,
                )
        if made != old:
            self._save_node_record(dict(self._node_record(), vlans=made))

    def _say_ignored(self, want: Mapping[str, int]) -> None:
        new = sorted((n, v) for n, v in want.items() if (self.node_id, n, v) not in _IGNORED)
        if new:
            _IGNORED.update((self.node_id, n, v) for n, v in new)
            log.warning(
                "%s: VLAN ids are ignored without --uplink, so these networks reach no other "
                "node: %s (give the agent --uplink IFACE to carry their VLANs)",
                self.node_id,
                ", ".join(f"network {n} (VLAN {v})" for n, v in new),
            )

    def _admin_chain(self, nets: Iterable[Mapping[str, Any]], subnets: list[str]) -> None:
        rules = admin_rules(nets, subnets)
        if len(rules) == 1 and not self._chain_exists():
            return
        self._run(self._host(["iptables", "-w", "-N", ADMIN_CHAIN]), check=False)
        self._run(self._host(["iptables", "-w", "-F", ADMIN_CHAIN]))
        if len(rules) == 1:
            return  # nothing on the node: the empty chain stays (the plugin's jump names it)
        for rule in rules:
            self._run(self._host(["iptables", "-w", "-A", ADMIN_CHAIN, *rule]))

    def _chain_exists(self) -> bool:
        done = self._run(self._host(["iptables", "-w", "-S", ADMIN_CHAIN]), check=False)
        return done.returncode == 0

    def admin_chain(self) -> list[str]:
        """``iptables -S RECONCILER-ADMIN`` (empty when the chain does not exist)."""
        done = self._run(self._host(["iptables", "-w", "-S", ADMIN_CHAIN]), check=False)
        return done.stdout.decode().splitlines() if done.returncode == 0 else []

    # -- DNS

    @property
    def _dns_pid(self) -> Path:
        return self.directory / "dnsmasq.pid"

    def _dnsmasq_pid(self) -> int | None:
        try:
            pid = int(self._dns_pid.read_text().strip())
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except OSError:
            return None
        try:  # the pid is dnsmasq's (not a recycled one)
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            return None
        return pid if comm == "dnsmasq" else None

    def _dns(self, dns: Mapping[str, str], listen: list[str]) -> None:
        node = self._node_record()
        pid = self._dnsmasq_pid()
        if not listen:
            if pid is not None:
                self._stop_dnsmasq(pid)
            self._save_node_record(dict(node, dnsListen=[]))
            return
        ensure_dir(self.directory)
        hosts = self.directory / "dns.hosts"
        text = dns_hosts(dns).encode()
        try:
            current, _ = read_bytes_at(hosts, _MAX)
        except FileReadError:
            current = None
        if current != text:
            atomic_write(hosts, text, mode=0o644)
        if pid is not None and node.get("dnsListen") == listen:
            if current != text:
                os.kill(pid, signal.SIGHUP)  # reloads the hosts file
            return
        if pid is not None:
            self._stop_dnsmasq(pid)
        self._run(
            self._host(
                [
                    "dnsmasq",
                    "--conf-file=/dev/null",
                    "--no-resolv",
                    "--no-hosts",
                    f"--addn-hosts={hosts}",
                    f"--listen-address={','.join(listen)}",
                    "--bind-dynamic",
                    f"--pid-file={self._dns_pid}",
                    "--user=root",
                    "--group=root",
                ]
            )
        )
        self._save_node_record(dict(self._node_record(), dnsListen=listen))

    def _stop_dnsmasq(self, pid: int) -> None:
        os.kill(pid, signal.SIGTERM)
        for _ in range(100):  # until it is gone (its addresses are free again), at most 5 s
            if self._dnsmasq_pid() is None:
                return
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)

    def shutdown(self) -> None:
        """Tear down everything recorded: instances, bridges, the admin chain, the DNS
        server."""
        for iid, record in sorted(self._records().items()):
            self.teardown(iid, record)
        self._vlans({})
        self._bridges([])
        if self._chain_exists():
            self._run(self._host(["iptables", "-w", "-F", ADMIN_CHAIN]), check=False)
        self._dns({}, [])
