"""The agent's network pieces that need no root (SPEC §17): the CNI chain of an instance, the
admin chain's rules, the DNS hosts file, bridge names; and a node without networks runs no
network command at all."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from reconciler.agent.network import (
    ADMIN_CHAIN,
    NodeNetwork,
    admin_rules,
    bridge_name,
    cni_chain,
    dns_hosts,
)

RULE = {"srcIp": "172.17.0.2", "dstIp": "172.18.0.3", "dstPort": 80, "proto": "tcp"}
NET: dict[str, Any] = {
    "networkId": "shop",
    "ip": "172.18.0.3",
    "prefix": 16,
    "gateway": "172.18.0.1",
    "ingressKbit": 0,
    "egressKbit": 0,
    "firewallRules": [RULE],
}


def test_bridge_names_fit_an_interface_name_and_differ_per_network() -> None:
    assert len(bridge_name("a" * 63)) <= 15
    assert bridge_name("shop") != bridge_name("office")
    assert bridge_name("shop") == bridge_name("shop")


def test_the_cni_chain_is_bridge_with_static_ipam_then_firewall() -> None:
    chain = cni_chain(NET)
    assert [c["type"] for c in chain] == ["bridge", "firewall"]
    bridge = chain[0]
    assert bridge["bridge"] == bridge_name("shop")
    assert bridge["isGateway"] is True and bridge["ipMasq"] is True
    assert bridge["ipam"] == {
        "type": "static",
        "addresses": [{"address": "172.18.0.3/16", "gateway": "172.18.0.1"}],
        "routes": [{"dst": "0.0.0.0/0"}],
    }
    assert chain[1]["iptablesAdminChainName"] == ADMIN_CHAIN
    assert all(c["name"] == "shop" and c["cniVersion"] == "1.0.0" for c in chain)
    assert all("prevResult" not in c for c in chain)  # added when run, from the previous one


def test_bandwidth_joins_the_chain_when_a_speed_is_set() -> None:
    chain = cni_chain(NET | {"ingressKbit": 1000, "egressKbit": 0})
    assert [c["type"] for c in chain] == ["bridge", "firewall", "bandwidth"]
    assert chain[2]["ingressRate"] == 1_000_000
    assert "egressRate" not in chain[2]


def test_admin_rules() -> None:
    other = {"firewallRules": [dict(RULE)]}  # the consumer's copy: one rule
    rules = admin_rules([NET, other], ["172.18.0.0/16", "172.17.0.0/16"])
    assert rules == [
        ["-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"],
        [
            "-s",
            "172.17.0.2/32",
            "-d",
            "172.18.0.3/32",
            "-p",
            "tcp",
            "--dport",
            "80",
            "-j",
            "ACCEPT",
        ],
        ["-d", "172.17.0.0/16", "!", "-s", "172.17.0.0/16", "-j", "DROP"],
        ["-d", "172.18.0.0/16", "!", "-s", "172.18.0.0/16", "-j", "DROP"],
    ]


def test_dns_hosts_file() -> None:
    dns = {"www": "10.0.0.2", "default.web": "10.0.0.2", "0.default.db": "10.0.0.10"}
    assert dns_hosts(dns) == "10.0.0.10 0.default.db\n10.0.0.2 default.web www\n"


def test_a_node_without_networks_runs_nothing(tmp_path: Path) -> None:
    ran: list[list[str]] = []

    class Recording(NodeNetwork):
        def _run(
            self,
            argv: Sequence[str],
            *,
            stdin: bytes | None = None,
            env: Mapping[str, str] | None = None,
            check: bool = True,
        ) -> subprocess.CompletedProcess[bytes]:
            ran.append(list(argv))
            raise AssertionError("no command expected")

    (tmp_path / "out" / "instances" / "x").mkdir(parents=True)
    assert Recording(tmp_path, "n1").sync(["x"]) == {}
    assert ran == []
    assert not (tmp_path / ".agent-n1-network").exists()
