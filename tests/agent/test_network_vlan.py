"""VLAN sub-interfaces on the agent's uplink, without root: the name, the ``ip`` commands for
what a link looks like now, and what a node's sync runs (a recording runner that keeps a
small model of the node's links)."""

from __future__ import annotations

import json
import logging
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from reconciler.agent import node as agent_node
from reconciler.agent.network import (
    NodeNetwork,
    bridge_name,
    interface_name_problem,
    vlan_commands,
    vlan_name,
)
from reconciler.agent.node import run_agent_once
from tests.support.fake_runc import FakeRunc

NODE = "n1"
IID = "inst-1"
NAME = vlan_name("shop")
BRIDGE = bridge_name("shop")


def vlan_link(vid: int, parent: str = "upl0", master: str | None = BRIDGE) -> dict[str, Any]:
    link: dict[str, Any] = {
        "ifname": NAME,
        "link": parent,
        "flags": ["BROADCAST", "MULTICAST", "UP"],
        "linkinfo": {"info_kind": "vlan", "info_data": {"protocol": "802.1Q", "id": vid}},
    }
    if master is not None:
        link["master"] = master
    return link


# ---------------------------------------------------------------- pure parts


def test_the_sub_interface_name_fits_and_pairs_with_the_bridge() -> None:
    assert vlan_name("shop") == "rv-" + BRIDGE[3:]
    assert len(vlan_name("x" * 200)) <= 15
    assert vlan_name("shop") == NAME
    assert vlan_name("office") != NAME
    assert vlan_name("shop") != bridge_name("shop")


@pytest.mark.parametrize("name", ["eth0", "enp3s0", "bond0.7", "wlan_1", "a" * 15])
def test_interface_names_accepted(name: str) -> None:
    assert interface_name_problem(name) is None


@pytest.mark.parametrize("name", ["", "a" * 16, ".", "..", "-eth0", "a/b", "a:b", "a b", "a\tb"])
def test_interface_names_refused(name: str) -> None:
    assert interface_name_problem(name) is not None


ADD = [
    ["ip", "link", "add", "link", "upl0", "name", NAME, "type", "vlan", "id", "42"],
    ["ip", "link", "set", NAME, "master", BRIDGE],
    ["ip", "link", "set", NAME, "up"],
]


def test_a_missing_sub_interface_is_made_enslaved_and_up() -> None:
    assert vlan_commands(None, "upl0", 42, BRIDGE, NAME) == ADD


def test_the_right_sub_interface_is_left_alone() -> None:
    assert vlan_commands(vlan_link(42), "upl0", 42, BRIDGE, NAME) == []


def test_the_right_sub_interface_on_another_master_or_down_is_fixed_in_place() -> None:
    assert vlan_commands(vlan_link(42, master="br9"), "upl0", 42, BRIDGE, NAME) == [
        ["ip", "link", "set", NAME, "master", BRIDGE]
    ]
    down = vlan_link(42, master=None) | {"flags": ["BROADCAST"]}
    assert vlan_commands(down, "upl0", 42, BRIDGE, NAME) == [
        ["ip", "link", "set", NAME, "master", BRIDGE],
        ["ip", "link", "set", NAME, "up"],
    ]


@pytest.mark.parametrize(
    "current",
    [
        vlan_link(7),  # another VLAN id
        vlan_link(42, parent="eth1"),  # another uplink
        {"ifname": NAME, "link": "upl0", "linkinfo": {"info_kind": "veth"}},  # not a VLAN
        {"ifname": NAME},
    ],
)
def test_a_wrong_link_of_that_name_is_deleted_and_made_again(current: dict[str, Any]) -> None:
    assert vlan_commands(current, "upl0", 42, BRIDGE, NAME) == [
        ["ip", "link", "del", NAME],
        *ADD,
    ]


# ---------------------------------------------------------------- what a sync runs


class Links:
    """The node's links as ``ip`` would show them, changed by the commands run."""

    def __init__(self, names: Sequence[str] = ("lo", "upl0")) -> None:
        self.links: dict[str, dict[str, Any]] = {n: {"ifname": n, "flags": ["UP"]} for n in names}

    def run(self, argv: list[str]) -> subprocess.CompletedProcess[bytes]:
        def done(out: bytes = b"", rc: int = 0) -> subprocess.CompletedProcess[bytes]:
            return subprocess.CompletedProcess(argv, rc, out, b"")

        match argv:
            case ["ip", "-d", "-j", "link", "show", "dev", name]:
                link = self.links.get(name)
                return done(json.dumps([link]).encode()) if link else done(rc=1)
            case ["ip", "link", "add", "link", parent, "name", name, "type", "vlan", "id", vid]:
                if parent not in self.links or name in self.links:
                    return done(rc=2)
                self.links[name] = {
                    "ifname": name,
                    "link": parent,
                    "flags": [],
                    "linkinfo": {"info_kind": "vlan", "info_data": {"id": int(vid)}},
                }
            case ["ip", "link", "set", name, "master", bridge]:
                self.links[name]["master"] = bridge
            case ["ip", "link", "set", name, "up"]:
                self.links[name]["flags"] = ["UP"]
            case ["ip", "link", "del", name]:
                return done() if self.links.pop(name, None) else done(rc=1)
            case [plugin] if plugin.startswith("/"):  # a CNI plugin: an empty result
                return done(b"{}")
        return done()


def recording(links: Links, ran: list[list[str]]) -> type[NodeNetwork]:
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
            done = links.run(list(argv))
            assert not check or done.returncode == 0, argv
            return done

    return Recording


def write_networks(state: Path, vlan_id: int | None, node: str = NODE) -> None:
    shop: dict[str, Any] = {"subnet": "10.231.1.0/24", "hosts": {node: "10.231.1.1"}}
    if vlan_id is not None:
        shop["vlanId"] = vlan_id
    out = state / "out"
    (out / "instances" / IID).mkdir(parents=True, exist_ok=True)
    (out / "network.json").write_text(
        json.dumps({"formatVersion": 1, "networks": {"shop": shop}, "dns": {}})
    )
    net = {
        "instanceId": IID,
        "nodeId": node,
        "networkId": "shop",
        "ip": "10.231.1.2",
        "prefix": 24,
        "gateway": "10.231.1.1",
        "dnsServers": ["10.231.1.1"],
        "firewallRules": [],
        "ingressKbit": 0,
        "egressKbit": 0,
        "netns": f"{node}.{IID}",
    }
    if vlan_id is not None:
        net["vlanId"] = vlan_id
    (out / "instances" / IID / "network.json").write_text(json.dumps(net))


def link_commands(ran: list[list[str]]) -> list[list[str]]:
    """The commands that change links, ``ip netns`` and the CNI plugins aside."""
    return [a for a in ran if a[:2] == ["ip", "link"]]


@pytest.fixture
def state(tmp_path: Path) -> Path:
    write_networks(tmp_path, 42)
    return tmp_path


def node_record(state: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((state / f".agent-{NODE}-network" / "node.json").read_text())
    return data


def test_a_vlan_network_gets_its_sub_interface_once(state: Path) -> None:
    links = Links()
    ran: list[list[str]] = []
    agent = recording(links, ran)
    assert IID in agent(state, NODE, uplink="upl0").sync([IID])
    assert link_commands(ran) == ADD
    assert links.links[NAME]["master"] == BRIDGE
    assert node_record(state)["vlans"] == {"shop": {"name": NAME, "uplink": "upl0", "vlanId": 42}}
    ran.clear()
    agent(state, NODE, uplink="upl0").sync([IID])  # again: nothing to do
    assert link_commands(ran) == []
    assert ["ip", "-d", "-j", "link", "show", "dev", NAME] in ran


def test_a_wrong_sub_interface_is_fixed(state: Path) -> None:
    links = Links()
    ran: list[list[str]] = []
    links.links[NAME] = vlan_link(7)
    recording(links, ran)(state, NODE, uplink="upl0").sync([IID])
    assert link_commands(ran) == [["ip", "link", "del", NAME], *ADD]
    ran.clear()
    links.links[NAME]["master"] = "br-else"
    recording(links, ran)(state, NODE, uplink="upl0").sync([IID])
    assert link_commands(ran) == [["ip", "link", "set", NAME, "master", BRIDGE]]


def test_a_changed_vlan_id_makes_the_sub_interface_again(state: Path) -> None:
    links = Links()
    ran: list[list[str]] = []
    recording(links, ran)(state, NODE, uplink="upl0").sync([IID])
    write_networks(state, 43)
    ran.clear()
    recording(links, ran)(state, NODE, uplink="upl0").sync([IID])
    assert link_commands(ran) == [
        ["ip", "link", "del", NAME],
        ["ip", "link", "add", "link", "upl0", "name", NAME, "type", "vlan", "id", "43"],
        ["ip", "link", "set", NAME, "master", BRIDGE],
        ["ip", "link", "set", NAME, "up"],
    ]
    assert node_record(state)["vlans"]["shop"]["vlanId"] == 43


def test_the_sub_interface_goes_with_the_network(state: Path) -> None:
    links = Links()
    ran: list[list[str]] = []
    recording(links, ran)(state, NODE, uplink="upl0").sync([IID])
    ran.clear()
    recording(links, ran)(state, NODE, uplink="upl0").sync([])  # nothing desired here
    assert ["ip", "link", "del", NAME] in ran
    assert NAME not in links.links
    assert node_record(state)["vlans"] == {}


def test_at_start_a_recorded_sub_interface_no_longer_wanted_goes(state: Path) -> None:
    links = Links()
    ran: list[list[str]] = []
    recording(links, ran)(state, NODE, uplink="upl0").sync([IID])
    write_networks(state, None)  # the unit turned vlan off; a new agent process starts
    ran.clear()
    recording(links, ran)(state, NODE, uplink="upl0").sync([IID])
    assert link_commands(ran) == [["ip", "link", "del", NAME]]
    assert NAME not in links.links
    assert node_record(state)["vlans"] == {}


def test_the_agent_started_without_the_uplink_removes_what_it_made(state: Path) -> None:
    links = Links()
    ran: list[list[str]] = []
    recording(links, ran)(state, NODE, uplink="upl0").sync([IID])
    ran.clear()
    recording(links, ran)(state, NODE).sync([IID])
    assert link_commands(ran) == [["ip", "link", "del", NAME]]


def test_shutdown_removes_the_sub_interface(state: Path) -> None:
    links = Links()
    ran: list[list[str]] = []
    recording(links, ran)(state, NODE, uplink="upl0").sync([IID])
    recording(links, ran)(state, NODE, uplink="upl0").shutdown()
    assert NAME not in links.links


def test_without_an_uplink_vlan_ids_are_ignored_and_said_once(
    state: Path, caplog: pytest.LogCaptureFixture
) -> None:
    links = Links()
    ran: list[list[str]] = []
    node = "n-without-uplink"  # said once per process and node: a node no other test uses
    write_networks(state, 42, node=node)
    with caplog.at_level(logging.WARNING, logger="reconciler.agent.network"):
        assert IID in recording(links, ran)(state, node).sync([IID])
        recording(links, ran)(state, node).sync([IID])
    said = [r.getMessage() for r in caplog.records if "VLAN" in r.getMessage()]
    assert len(said) == 1, said
    assert "ignored without --uplink" in said[0] and "network shop (VLAN 42)" in said[0]
    assert link_commands(ran) == []
    assert all("vlan" not in a for a in ran)


def test_an_uplink_that_does_not_exist_is_said_and_nothing_made_on_it(
    state: Path, caplog: pytest.LogCaptureFixture
) -> None:
    links = Links(names=("lo",))
    ran: list[list[str]] = []
    with caplog.at_level(logging.ERROR, logger="reconciler.agent.network"):
        live = recording(links, ran)(state, NODE, uplink="upl0").sync([IID])
    assert IID in live  # the instance is wired all the same, on its bridge
    assert link_commands(ran) == []
    assert ["ip", "-d", "-j", "link", "show", "dev", NAME] not in ran
    said = [r.getMessage() for r in caplog.records]
    assert any("the uplink upl0 does not exist" in m and "VLAN 42" in m for m in said), said
    assert all(r.exc_info is None for r in caplog.records)


def test_the_agent_run_hands_its_uplink_to_the_network(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str | None] = []

    class Spy:
        def __init__(self, _state: Path, _node: str, _netns: str | None, **kw: Any) -> None:
            seen.append(kw.get("uplink"))
            self.problems: dict[str, str] = {}

        def sync(self, _desired: Any) -> dict[str, dict[str, Any]]:
            return {}

    monkeypatch.setattr(agent_node, "NodeNetwork", Spy)
    (tmp_path / "nodes").mkdir()
    (tmp_path / "nodes" / f"{NODE}.yaml").write_text("{}\n")
    run_agent_once(tmp_path, NODE, FakeRunc(), networks=True, uplink="upl0")
    run_agent_once(tmp_path, NODE, FakeRunc(), networks=True)
    assert seen == ["upl0", None]
