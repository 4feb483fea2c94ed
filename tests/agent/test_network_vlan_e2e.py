"""A network's VLAN on the agent's uplink, for real (root, ``ip``, the CNI plugins, iptables,
dnsmasq and a kernel with 802.1Q VLANs).

Everything lives in namespaces the test makes: the node's host side is the network namespace
``host`` (``NodeNetwork.host_netns``), whose veth ``upl0`` is the uplink; its other end
``upl0p`` is in the namespace ``peer``, which stands for the rest of the VLAN. The controller
gives network ``shop`` a VLAN id (unit.yaml ``network.vlan: true``); the agent's network apply
with uplink ``upl0`` makes the sub-interface on the bridge; from ``peer``, a VLAN interface
with that id on ``upl0p`` reaches the bridge's host address; a second apply leaves the
sub-interface alone; when the network leaves the node it is gone. The namespaces (and with
them every veth, bridge and rule in them) are removed at the end, also on failure.

Skips, saying why, without root, a tool, or VLAN support in the kernel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from reconciler.agent.network import NodeNetwork, bridge_name, vlan_name
from reconciler.controller.configs import default_config_builder
from reconciler.controller.reconcile import ReconcileOptions, reconcile
from reconciler.model.values import instance_id
from tests.support.e2e import runc_node

NODE = "vlan-n1"
IID = instance_id("web", "default", 0)
PEER_IP = "10.232.1.200/24"


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=check)


def _ping() -> list[str]:
    if shutil.which("ping"):
        return ["ping"]
    if shutil.which("busybox"):
        return ["busybox", "ping"]
    pytest.skip("no ping here (iputils-ping or busybox)")


def _require_tools() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces, bridges, VLANs, iptables)")
    for tool in ("ip", "iptables", "dnsmasq"):
        if shutil.which(tool) is None:
            pytest.skip(f"no {tool} here (scripts/bootstrap installs it)")
    for plugin in ("bridge", "static", "firewall"):
        if not os.access(f"/usr/lib/cni/{plugin}", os.X_OK):
            pytest.skip(f"no CNI plugin /usr/lib/cni/{plugin} (containernetworking-plugins)")


@dataclass
class Env:
    state: Path
    host: str  # the node's host side
    peer: str  # the other end of the uplink

    def link(self, name: str) -> dict[str, Any] | None:
        done = sh("ip", "-n", self.host, "-d", "-j", "link", "show", "dev", name, check=False)
        if done.returncode != 0:
            return None
        got: dict[str, Any] = json.loads(done.stdout)[0]
        return got

    def network(self, uplink: str | None = "upl0") -> NodeNetwork:
        return NodeNetwork(self.state, NODE, self.host, uplink=uplink)


def _state(root: Path) -> Path:
    state = root / "state"
    (state / "desired").mkdir(parents=True)
    (state / "nodes").mkdir()
    (state / "rootfs").mkdir()
    (state / "unit.yaml").write_text(
        "apiVersion: reconciler/v1\nkind: UnitConfig\nversion: 1.0.0\n"
        "network: {subnets: [10.232.1.0/24], vlan: true}\n"
    )
    node = runc_node(NODE)
    (state / "nodes" / f"{NODE}.yaml").write_text(json.dumps(node))
    (state / "desired" / "web.yaml").write_text(
        "apiVersion: reconciler/v1\nkind: Service\nid: web\nversion: 1.0.0\n"
        "runtimes: [runc]\nowner: shop\nimage:\n  rootfs: rootfs\n  cmd: [/bin/true]\n"
    )
    return state


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    _require_tools()
    tag = uuid.uuid4().hex[:8]
    e = Env(_state(tmp_path), f"rcvlan-host-{tag}", f"rcvlan-peer-{tag}")
    try:
        for ns in (e.host, e.peer):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", e.host, "link", "add", "upl0", "type", "veth", "peer", "upl0p")
        sh("ip", "-n", e.host, "link", "set", "upl0p", "netns", e.peer)
        sh("ip", "-n", e.host, "link", "set", "upl0", "up")
        sh("ip", "-n", e.peer, "link", "set", "upl0p", "up")
        probe = sh(
            "ip", "-n", e.host, "link", "add", "link", "upl0", "name", "probe", "type", "vlan",
            "id", "4094", check=False,
        )  # fmt: skip
        if probe.returncode != 0:
            pytest.skip(f"this kernel makes no VLAN interface (802.1Q): {probe.stderr.strip()}")
        sh("ip", "-n", e.host, "link", "del", "probe")
        yield e
    finally:
        try:
            if (e.state / f".agent-{NODE}-network").exists():
                e.network().shutdown()  # the instance's namespace and the DNS server too
        finally:
            sh("ip", "netns", "del", f"{NODE}.{IID}", check=False)
            for ns in (e.host, e.peer):  # with them, every link and rule made in them
                sh("ip", "netns", "del", ns, check=False)
            left = os.listdir("/run/netns") if os.path.isdir("/run/netns") else []
            assert not [n for n in left if tag in n or n == f"{NODE}.{IID}"], left


def test_a_vlan_network_reaches_the_peer_through_the_uplink(env: Env) -> None:
    report = reconcile(env.state, ReconcileOptions(configs=default_config_builder()))
    assert report.plan.complete, [f.summary for f in report.plan.failures]
    shop = json.loads((env.state / "out" / "network.json").read_text())["networks"]["shop"]
    vid, host_ip = shop["vlanId"], shop["hosts"][NODE]
    name, bridge = vlan_name("shop"), bridge_name("shop")

    assert IID in env.network().sync([IID])
    link = env.link(name)
    assert link is not None, f"no {name} on the uplink"
    assert link["linkinfo"]["info_kind"] == "vlan"
    assert link["linkinfo"]["info_data"]["id"] == vid
    assert link["link"] == "upl0"
    assert link["master"] == bridge
    assert "UP" in link["flags"]

    # the other side of the uplink, on the same VLAN, reaches the node's bridge
    sub = f"upl0p.{vid}"
    sh("ip", "-n", env.peer, "link", "add", "link", "upl0p", "name", sub, "type", "vlan",
       "id", str(vid))  # fmt: skip
    sh("ip", "-n", env.peer, "addr", "add", PEER_IP, "dev", sub)
    sh("ip", "-n", env.peer, "link", "set", sub, "up")
    ping = sh("ip", "netns", "exec", env.peer, *_ping(), "-c", "3", "-W", "2", host_ip, check=False)
    assert ping.returncode == 0, ping.stdout + ping.stderr

    # applied again: the same sub-interface, left alone
    env.network().sync([IID])
    again = env.link(name)
    assert again is not None and again["ifindex"] == link["ifindex"]
    assert again["master"] == bridge

    # the network leaves the node: its sub-interface goes, and the bridge with it
    env.network().sync([])
    assert env.link(name) is None
    assert env.link(bridge) is None
    assert env.link("upl0") is not None  # the uplink itself is not the agent's
