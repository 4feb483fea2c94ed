"""Networks end to end with runc, the CNI plugins, iptables and dnsmasq (SPEC §17).

One node whose host side is a network namespace the test makes (``host_netns``): its bridges,
iptables rules and DNS server live there, so every packet stays inside namespaces the test
made. A web server (busybox ``httpd``) of network ``shop`` is reached by its DNS name from a
consumer of network ``office`` that is allowed the port; a second consumer without the
connection is refused; two instances of ``shop`` reach each other; after a stop no namespace,
veth or rule of the stopped instance is left; at the end everything the test made is removed.

Skips, saying why, when a tool is missing or the test does not run as root.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from reconciler.agent.network import ADMIN_CHAIN, NodeNetwork
from reconciler.agent.node import AgentReport, container_id, run_agent_once
from reconciler.agent.runc import Runc, RuncError
from reconciler.controller.configs import default_config_builder
from reconciler.controller.reconcile import ReconcileOptions, ReconcileReport, reconcile
from reconciler.model.values import instance_id
from tests.support.busybox import make_busybox_rootfs
from tests.support.e2e import runc_node, skip_unless_runc_works
from tests.support.runc import require_runc_and_busybox

pytestmark = pytest.mark.slow

NODE = "n1"
APPLETS = ("sh", "sleep", "httpd", "wget", "nslookup", "cat", "true", "timeout")


def service(item: str, extra: str, cmd: str, instances: int = 1) -> str:
    return (
        f"apiVersion: reconciler/v1\nkind: Service\nid: {item}\nversion: 1.0.0\n"
        f"instances: {instances}\nruntimes: [runc]\n{extra}"
        f"image:\n  rootfs: rootfs\n  cmd: [/bin/sh, -c, {json.dumps(cmd)}]\n"
    )


WEB = service(
    "web", "owner: shop\nexposedPorts: ['8080/tcp']\n", "httpd -f -p 8080 -h /www", instances=2
)
GOOD = service("good", "owner: office\nallowedConnections: [web/8080/tcp]\n", "sleep 3600")
BAD = service("bad", "owner: office\n", "sleep 3600")


@dataclass
class Net:
    state: Path
    runc: Runc
    host_netns: str
    logs: Path

    def reconcile(self) -> ReconcileReport:
        report = reconcile(self.state, ReconcileOptions(configs=default_config_builder()))
        assert report.plan.complete, [f.summary for f in report.plan.failures]
        return report

    def agent(self) -> AgentReport:
        report = run_agent_once(
            self.state,
            NODE,
            self.runc,
            stop_timeout=1.0,
            log_dir=self.logs,
            host_netns=self.host_netns,
        )
        assert not report.failed, report.failed
        return report

    def exec(self, item: str, *argv: str, index: int = 0) -> subprocess.CompletedProcess[str]:
        cid = container_id(NODE, instance_id(item, "default", index))
        return subprocess.run(
            ["runc", "--root", str(self.runc.root), "exec", cid, *argv],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    def host(self, *argv: str) -> str:
        done = subprocess.run(
            ["ip", "netns", "exec", self.host_netns, *argv],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return done.stdout

    def veths(self) -> list[str]:
        return [
            line.split(":")[1].strip().split("@")[0]
            for line in self.host("ip", "-o", "link", "show", "type", "veth").splitlines()
        ]


def _require_tools() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces, bridges, iptables)")
    for tool in ("ip", "iptables", "dnsmasq"):
        if shutil.which(tool) is None:
            pytest.skip(f"no {tool} here (scripts/bootstrap installs it)")
    for plugin in ("bridge", "static", "firewall", "bandwidth"):
        if not os.access(f"/usr/lib/cni/{plugin}", os.X_OK):
            pytest.skip(f"no CNI plugin /usr/lib/cni/{plugin} (containernetworking-plugins)")


def _our_netns(prefix: str) -> list[str]:
    return (
        sorted(n for n in os.listdir("/run/netns") if n.startswith(prefix))
        if os.path.isdir("/run/netns")
        else []
    )


@pytest.fixture
def net(tmp_path: Path) -> Iterator[Net]:
    _require_tools()
    busybox = require_runc_and_busybox()
    skip_unless_runc_works(tmp_path, busybox)
    state = tmp_path / "state"
    (state / "desired").mkdir(parents=True)
    (state / "nodes").mkdir()
    rootfs = state / "rootfs"
    make_busybox_rootfs(rootfs, busybox, APPLETS, ("proc", "dev", "sys", "tmp", "etc", "www"))
    (rootfs / "www" / "index.html").write_text("hello from shop\n")
    (state / "unit.yaml").write_text(
        "apiVersion: reconciler/v1\nkind: UnitConfig\nversion: 1.0.0\n"
        "network: {subnets: [10.231.1.0/24, 10.231.2.0/24, 10.231.3.0/24]}\n"
    )
    node = runc_node(NODE)
    (state / "nodes" / f"{NODE}.yaml").write_text(json.dumps(node))
    host_netns = f"rctest-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", host_netns], check=True, timeout=30)
    subprocess.run(
        ["ip", "netns", "exec", host_netns, "ip", "link", "set", "lo", "up"], check=True, timeout=30
    )
    runc = Runc(root=tmp_path / "runc", timeout=30)
    env = Net(state, runc, host_netns, tmp_path / "logs")
    try:
        yield env
    finally:
        with contextlib.suppress(RuncError):
            for st in runc.list():
                with contextlib.suppress(RuncError):
                    runc.kill(st.id, "KILL")
                with contextlib.suppress(RuncError):
                    runc.delete(st.id, force=True)
        NodeNetwork(state, NODE, host_netns).shutdown()
        for name in _our_netns(f"{NODE}."):
            recorded = state / f".agent-{NODE}-network" / f"{name[len(NODE) + 1 :]}.json"
            if recorded.exists() or name.startswith(f"{NODE}."):
                subprocess.run(["ip", "netns", "del", name], check=False, timeout=30)
        subprocess.run(["ip", "netns", "del", host_netns], check=False, timeout=30)
        assert host_netns not in _our_netns("rctest-")


def test_networks_with_runc_cni_and_dnsmasq(net: Net) -> None:
    (net.state / "desired" / "web.yaml").write_text(WEB)
    (net.state / "desired" / "good.yaml").write_text(GOOD)
    (net.state / "desired" / "bad.yaml").write_text(BAD)
    net.reconcile()
    report = net.agent()
    assert len(report.started) == 4, report
    top = json.loads((net.state / "out" / "network.json").read_text())
    shop = top["networks"]["shop"]["subnet"]
    web0 = top["dns"]["default.web"]

    # the web server answers (retried: httpd may take a moment to listen); busybox 1.35's
    # `wget -T` crashes (SIGSEGV), so `timeout` bounds a connection that is dropped
    def fetch(item: str, url: str, index: int = 0) -> subprocess.CompletedProcess[str]:
        return net.exec(item, "timeout", "3", "wget", "-q", "-O", "-", url, index=index)

    for _ in range(20):
        got = fetch("web", "http://127.0.0.1:8080/index.html")
        if got.returncode == 0:
            break
    assert got.stdout == "hello from shop\n", got

    # by its DNS name from the allowed consumer of another network
    lookup = net.exec("good", "nslookup", "default.web")
    assert web0 in lookup.stdout, lookup
    got = fetch("good", "http://default.web:8080/index.html")
    assert got.returncode == 0 and got.stdout == "hello from shop\n", got
    # the consumer without the connection is refused (dropped: wget times out)
    got = fetch("bad", "http://default.web:8080/index.html")
    assert got.returncode != 0 and "hello" not in got.stdout, got
    # two instances of one network reach each other
    got = fetch("web", "http://0.default.web:8080/index.html", index=1)
    assert got.returncode == 0 and got.stdout == "hello from shop\n", got

    # the admin chain holds the allowed connection and the drop into each network
    chain = net.host("iptables", "-S", ADMIN_CHAIN)
    good_ip = json.loads(
        (
            net.state / "out" / "instances" / instance_id("good", "default", 0) / "network.json"
        ).read_text()
    )["ip"]
    assert f"-s {good_ip}/32 -d {web0}/32 -p tcp -m tcp --dport 8080 -j ACCEPT" in chain
    assert f"! -s {shop} -d {shop} -j DROP" in chain
    # actual/ records each instance's address
    actual = json.loads((net.state / "actual" / f"{NODE}.yaml").read_text())
    assert actual["instances"][instance_id("good", "default", 0)]["ip"] == good_ip

    # a stop leaves no namespace, veth or rule of the stopped instance
    bad_iid = instance_id("bad", "default", 0)
    bad_ip = json.loads((net.state / "out" / "instances" / bad_iid / "network.json").read_text())[
        "ip"
    ]
    assert len(net.veths()) == 4
    (net.state / "desired" / "bad.yaml").unlink()
    net.reconcile()
    report = net.agent()
    assert report.stopped == (bad_iid,)
    assert f"{NODE}.{bad_iid}" not in _our_netns(f"{NODE}.")
    assert len(net.veths()) == 3
    rules = net.host("iptables-save")
    assert bad_ip not in rules
    assert f"{NODE}.{bad_iid}" not in rules
    # the others still work
    got = fetch("good", "http://default.web:8080/index.html")
    assert got.returncode == 0, got

    # everything goes: no namespace, veth, bridge or DNS server of the unit is left
    for name in ("web.yaml", "good.yaml"):
        (net.state / "desired" / name).unlink()
    reconcile(net.state, ReconcileOptions(configs=default_config_builder(), allow_empty=True))
    net.agent()
    assert _our_netns(f"{NODE}.") == []
    assert net.veths() == []
    assert net.host("ip", "-o", "link", "show", "type", "bridge") == ""
    assert (
        "RECONCILER" not in net.host("iptables", "-S", "FORWARD")
        or net.host("iptables", "-S", ADMIN_CHAIN).strip() == f"-N {ADMIN_CHAIN}"
    )
