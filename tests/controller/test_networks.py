"""reconcile's network phase end to end through files (SPEC §17): the outputs, addresses kept
across a restart and a corrupt checkpoint, reason ``Network`` in status and explain."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from reconciler.cli.commands import main
from reconciler.controller.configs import default_config_builder
from reconciler.controller.network_files import write_network_files
from reconciler.controller.reconcile import ReconcileOptions, reconcile
from reconciler.io.checkpoint_files import CURRENT, PREVIOUS, load_checkpoint, save_checkpoint
from reconciler.model.values import instance_id
from tests.support.oci import assert_valid
from tests.support.outputs import copied, warm_options, written, written_afresh
from tests.support.state_files import RUNC_NODE

NODE = RUNC_NODE.replace("{dmips}", "100000")

WEB = """apiVersion: reconciler/v1
kind: Service
id: web
version: 1.0.0
owner: shop
hostname: www
exposedPorts: ['80/tcp']
image: {rootfs: /srv/rootfs, cmd: [httpd]}
"""

CLIENT = """apiVersion: reconciler/v1
kind: Service
id: {id}
version: 1.0.0
owner: office
{extra}image: {{rootfs: /srv/rootfs, cmd: [wget]}}
"""


def iid(item: str, index: int = 0) -> str:
    return instance_id(item, "default", index)


def unit(tmp_path: Path, nodes: tuple[str, ...] = ("n1",)) -> Path:
    state = tmp_path / "state"
    (state / "desired").mkdir(parents=True)
    (state / "nodes").mkdir()
    for n in nodes:
        (state / "nodes" / f"{n}.yaml").write_text(NODE.format(id=n))
    (state / "desired" / "web.yaml").write_text(WEB)
    allowed = "allowedConnections: [web/80/tcp]\n"
    (state / "desired" / "client.yaml").write_text(CLIENT.format(id="client", extra=allowed))
    return state


def run(state: Path) -> Any:
    return reconcile(state, ReconcileOptions(configs=default_config_builder()))


def out(state: Path, *parts: str) -> Any:
    path = state.joinpath("out", *parts)
    return json.loads(path.read_text()) if path.suffix == ".json" else path.read_text()


def addresses(state: Path) -> dict[str, str]:
    """The checkpoint's addresses, as any reader takes them (a watcher writes a delta)."""
    network = load_checkpoint(state / "checkpoint", {}, quarantine=False).checkpoint.network
    return {i: a["ip"] for i, a in network["addresses"].items()}


def test_outputs(tmp_path: Path) -> None:
    state = unit(tmp_path)
    report = run(state)
    assert not report.computed.result.failures
    net = out(state, "network.json")
    assert net["networks"] == {
        "office": {"subnet": "172.17.0.0/16", "hosts": {"n1": "172.17.0.1"}},
        "shop": {"subnet": "172.18.0.0/16", "hosts": {"n1": "172.18.0.1"}},
    }
    assert net["dns"]["www"] == "172.18.0.2"
    assert net["dns"]["default.web.shop"] == "172.18.0.2"
    assert net["dns"]["0.default.client"] == "172.17.0.2"
    web = out(state, "instances", iid("web"), "network.json")
    assert web == {
        "instanceId": iid("web"),
        "nodeId": "n1",
        "networkId": "shop",
        "ip": "172.18.0.2",
        "prefix": 16,
        "gateway": "172.18.0.1",
        "dnsServers": ["172.18.0.1"],
        "firewallRules": [
            {"srcIp": "172.17.0.2", "dstIp": "172.18.0.2", "dstPort": 80, "proto": "tcp"}
        ],
        "hostname": "www",
        "ingressKbit": 0,
        "egressKbit": 0,
        "netns": f"n1.{iid('web')}",
    }
    assert out(state, "instances", iid("web"), "resolv.conf") == "nameserver 172.18.0.1\n"
    assert out(state, "instances", iid("web"), "hosts") == (
        "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n172.18.0.2\tshop www\n"
    )
    config = out(state, "instances", iid("web"), "config.json")
    assert_valid(config)
    namespaces = {n["type"]: n.get("path") for n in config["linux"]["namespaces"]}
    assert namespaces["network"] == f"/run/netns/n1.{iid('web')}"
    mounts = {m["destination"]: m for m in config["mounts"]}
    assert mounts["/etc/resolv.conf"]["source"] == str(
        (state / "out" / "instances" / iid("web") / "resolv.conf").resolve()
    )
    assert mounts["/etc/resolv.conf"]["options"] == ["rbind", "ro"]
    # a second run with the same inputs rewrites nothing
    again = run(state)
    assert again.written == ()


def test_without_networks_no_network_files_and_host_network(tmp_path: Path) -> None:
    state = unit(tmp_path)
    (state / "desired" / "web.yaml").write_text(
        WEB.replace("owner: shop\n", "").replace("exposedPorts: ['80/tcp']\n", "")
    )
    (state / "desired" / "client.yaml").unlink()
    run(state)
    assert not (state / "out" / "network.json").exists()
    config = out(state, "instances", iid("web"), "config.json")
    assert {"type": "network"} in config["linux"]["namespaces"]
    assert not (state / "out" / "instances" / iid("web") / "network.json").exists()
    cp = json.loads((state / "checkpoint" / "allocations.json").read_text())
    assert "network" not in cp["data"]
    # networks declared in unit.yaml, then taken away again: the files come and go
    (state / "unit.yaml").write_text(
        "apiVersion: reconciler/v1\nkind: UnitConfig\nversion: 1.0.0\nnetwork: {}\n"
    )
    run(state)
    assert out(state, "instances", iid("web"), "network.json")["networkId"] == "default"
    (state / "unit.yaml").unlink()
    run(state)
    assert not (state / "out" / "network.json").exists()
    assert not (state / "out" / "instances" / iid("web") / "network.json").exists()
    assert not (state / "out" / "instances" / iid("web") / "resolv.conf").exists()


def test_addresses_survive_a_restart_and_a_corrupt_checkpoint(tmp_path: Path) -> None:
    state = unit(tmp_path)
    (state / "desired" / "client.yaml").write_text(
        CLIENT.format(id="client", extra="instances: 3\nallowedConnections: [web/80/tcp]\n")
    )
    run(state)
    first = addresses(state)
    # an unrelated edit that would take a low address if addresses were not sticky: a new
    # service exposing a port in the client's network (a second checkpoint generation)
    (state / "desired" / "db.yaml").write_text(
        CLIENT.format(id="db", extra="exposedPorts: ['5432']\n")
    )
    run(state)
    second = addresses(state)
    assert {k: second[k] for k in first} == first
    assert second[iid("db")] == "172.17.0.5"
    # a restart: a new process (no cache) with the same inputs
    run(state)
    assert addresses(state) == second
    # a corrupt checkpoint: the previous generation is used, then the same addresses again
    (state / "checkpoint" / "allocations.json").write_text('{"garbage": true}')
    report = run(state)
    assert report.computed.loaded.source == "previous"
    assert addresses(state) == second


def test_addresses_rebuilt_from_actual_when_no_checkpoint_is_trusted(tmp_path: Path) -> None:
    state = unit(tmp_path)
    run(state)
    before = addresses(state)
    # the agent's actual/ records each instance's address and network
    actual = {
        "apiVersion": "reconciler/v1",
        "kind": "ActualState",
        "nodeId": "n1",
        "revision": 1,
        "instances": {
            iid("client"): {
                "itemId": "client",
                "subjectId": "default",
                "index": 0,
                "version": "1.0.0",
                "runtimeId": "runc",
                "state": "active",
                "ip": "172.17.0.9",
                "network": "office",
            },
        },
    }
    (state / "actual").mkdir()
    (state / "actual" / "n1.yaml").write_text(json.dumps(actual))
    for name in (CURRENT, PREVIOUS):  # neither generation can be trusted
        (state / "checkpoint" / name).write_text("{}")
    report = run(state)
    assert report.computed.loaded.source == "actual"
    after = addresses(state)
    assert after[iid("client")] == "172.17.0.9"
    assert after[iid("web")] == before[iid("web")]


def test_network_failures_in_status_plan_and_explain(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = unit(tmp_path)
    # a second service with the same hostname fails (the later instance); a consumer of a
    # port nobody exposes fails too
    (state / "desired" / "web2.yaml").write_text(WEB.replace("id: web", "id: web2"))
    (state / "desired" / "client.yaml").write_text(
        CLIENT.format(id="client", extra="allowedConnections: [web/81/tcp]\n")
    )
    run(state)
    status = out(state, "status.json")
    text = json.dumps(status)
    assert "web2:default:0: DNS name www is already held by another instance" in text
    assert "client:default:0: no instance of web exposes 81/tcp" in text
    plan = out(state, "plan.json")
    reasons = {f["itemId"]: f["reason"] for f in plan["failures"]}
    assert reasons == {"client": "Network", "web2": "Network"}
    assert main(["explain", "web2:0", "--state", str(state), "--json"]) == 0
    exp = json.loads(capsys.readouterr().out)
    assert exp["failure"]["reason"] == "Network"
    assert exp["placement"] is None
    assert main(["explain", "web:0", "--state", str(state), "--json"]) == 0
    exp = json.loads(capsys.readouterr().out)
    assert exp["failure"] is None
    assert exp["network"]["ip"] == "172.18.0.2"
    assert main(["explain", "client:0", "--state", str(state)]) == 0
    assert "no instance of web exposes 81/tcp" in capsys.readouterr().out
    assert main(["plan", "--state", str(state)]) == 3


def test_explain_on_a_networked_unit_balances_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The network phase after placement reads the balance the explanation was made after,
    not a second one of its own."""
    from reconciler.placement import balancer

    state = unit(tmp_path)
    run(state)
    calls: list[int] = []
    real = balancer.balance

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(balancer, "balance", counted)
    assert main(["explain", "web:0", "--state", str(state), "--json"]) == 0
    exp = json.loads(capsys.readouterr().out)
    assert exp["network"]["ip"] == "172.18.0.2"
    assert len(calls) == 1


def test_the_node_patch_records_each_instance_address(tmp_path: Path) -> None:
    """A start adds the instance's record with its ``ip`` (the one its network.json holds), so
    the actual document the patch makes names it; an instance without a network has none."""
    state = unit(tmp_path)
    (state / "desired" / "plain.yaml").write_text(
        "apiVersion: reconciler/v1\nkind: Service\nid: plain\nversion: 1.0.0\n"
        "image: {rootfs: /srv/rootfs, cmd: [sleep]}\n"
    )
    run(state)
    added = {
        op["path"].rsplit("/", 1)[1]: op["value"]
        for op in out(state, "nodes", "n1.json")
        if op["op"] == "add"
    }
    for item in ("web", "client"):
        assert added[iid(item)]["ip"] == out(state, "instances", iid(item), "network.json")["ip"]
    assert "ip" not in added[iid("plain")]
    plan = out(state, "plan.json")
    patched = {op["path"].rsplit("/", 1)[1]: op for op in plan["nodes"]["n1"]["patch"]}
    assert patched[iid("web")]["value"]["ip"] == "172.18.0.2"


def test_a_network_failure_keeps_the_watch_memo_warm(tmp_path: Path) -> None:
    """An instance the network phase refuses is placed by the balance and taken out after it,
    so the checkpoint never holds it. The watcher's next runs (nothing changed; then an edit
    of another service) still balance from the memo, and write what a process of its own
    writes for the same files."""
    state = unit(tmp_path / "warm")
    (state / "desired" / "web2.yaml").write_text(WEB.replace("id: web", "id: web2"))

    warm, cache = warm_options()
    view = reconcile(state, warm).computed.view
    assert not cache.balance.incremental

    def again(edit: str | None = None) -> None:
        nonlocal view
        if edit is not None:
            (state / "desired" / "client.yaml").write_text(
                CLIENT.format(id="client", extra=f"{edit}\nallowedConnections: [web/80/tcp]\n")
            )
        fresh = copied(state, tmp_path / "fresh")
        report = reconcile(state, warm, view)
        view = report.computed.view
        assert cache.balance.incremental
        assert [f.item_id for f in report.computed.result.failures] == ["web2"]
        assert written(state) == written_afresh(fresh, state)

    again()
    again("priority: 0")
    again("quotas: {pidsLimit: 64}")


def test_a_trusting_run_skips_network_files_it_knows(tmp_path: Path) -> None:
    """An event's run (``verify`` off) skips each instance whose network parameters equal
    what the last run left, and rewrites those that changed; the files then equal what a
    process of its own writes. A run that fails before its commit is flushed leaves the memo
    empty: the next run compares every file again."""
    state = unit(tmp_path / "warm")

    verifying, cache = warm_options()
    trusting = dataclasses.replace(verifying, verify=False)
    report = reconcile(state, verifying)
    report = reconcile(state, trusting, report.computed.view)
    assert cache.network_files.trusted == 2  # web and client, nothing compared
    assert not [w for w in report.written if w.endswith(("network.json", "resolv.conf"))]
    # another port allowed: the client's firewall rules change, its file is rewritten
    web = WEB.replace("exposedPorts: ['80/tcp']", "exposedPorts: ['80/tcp', '81/tcp']")
    (state / "desired" / "web.yaml").write_text(web)
    (state / "desired" / "client.yaml").write_text(
        CLIENT.format(id="client", extra="allowedConnections: [web/80/tcp, web/81/tcp]\n")
    )
    fresh = copied(state, tmp_path / "fresh")
    report = reconcile(state, trusting, report.computed.view)
    assert f"out/instances/{iid('client')}/network.json" in report.written
    assert written(state) == written_afresh(fresh, state)
    # a run whose commit never flushed: what it put in the memo is not kept
    c = report.computed
    assert c.built is not None
    path = state / "out" / "instances" / iid("client") / "network.json"
    path.write_text("{}")  # (by hand: a trusting run does not look)
    memo = cache.network_files
    assert write_network_files(state, c.network, c.built, memo=memo, verify=False) == []
    memo.written()
    write_network_files(state, c.network, c.built, memo=memo, verify=True)  # never flushed
    path.write_text("{}")
    got = write_network_files(state, c.network, c.built, memo=memo, verify=False)
    assert got == [f"out/instances/{iid('client')}/network.json"]
    assert json.loads(path.read_text())["ip"] == addresses(state)[iid("client")]


def test_the_network_phase_runs_again_when_a_networked_instance_moves(tmp_path: Path) -> None:
    """A service without a network, of a higher priority, evicts a networked instance, which
    moves to another node: nothing networked was edited and the network state is the last
    run's, but the phase runs again (the instance's parameters name its new node)."""
    state = unit(tmp_path / "warm", nodes=("n1", "n2", "n3"))
    (state / "desired" / "client.yaml").unlink()
    heavy = WEB.replace("hostname: www\n", "instances: 2\nrequestedResources: {cpu: 60000}\n")
    (state / "desired" / "web.yaml").write_text(heavy)

    opts, cache = warm_options()
    view = reconcile(state, opts).computed.view
    view = reconcile(state, opts, view).computed.view
    nodes_before = {p.node_id for p in reconcile(state, opts, view).computed.result.placements}
    assert cache.network.reused and nodes_before == {"n1", "n2"}
    (state / "desired" / "big.yaml").write_text(
        "apiVersion: reconciler/v1\nkind: Service\nid: big\nversion: 1.0.0\npriority: 9\n"
        "nodeId: n1\nrequestedResources: {cpu: 60000}\n"
        "image: {rootfs: /srv/rootfs, cmd: [sleep]}\n"
    )
    fresh = copied(state, tmp_path / "fresh")
    report = reconcile(state, opts, view)
    moved = {p.instance_id: p.node_id for p in report.computed.result.placements}
    assert moved[iid("big")] == "n1" and moved[iid("web", 0)] == "n3"  # evicted, placed again
    assert cache.balance.incremental and not cache.network.reused
    assert out(state, "instances", iid("web", 0), "network.json")["nodeId"] == "n3"
    assert written(state) == written_afresh(fresh, state)


def test_a_dropped_instance_the_balance_no_longer_places_is_not_in_the_answer(
    tmp_path: Path,
) -> None:
    """``web2`` fails in the network phase each run (its DNS name is web's). A service without
    a network then takes the room it was placed in: the balance fails it for CPU, and the
    network phase, which no longer sees it, runs again (its last answer failed it)."""
    state = unit(tmp_path / "warm")
    (state / "desired" / "client.yaml").unlink()
    room = "requestedResources: {cpu: 60000}\nimage:"
    (state / "desired" / "web2.yaml").write_text(
        WEB.replace("id: web", "id: web2").replace("image:", room)
    )

    opts, cache = warm_options()
    view = reconcile(state, opts).computed.view
    report = reconcile(state, opts, view)
    assert [f.reason for f in report.computed.result.failures] == ["Network"]
    (state / "desired" / "big.yaml").write_text(
        "apiVersion: reconciler/v1\nkind: Service\nid: big\nversion: 1.0.0\npriority: 9\n"
        "requestedResources: {cpu: 60000}\nimage: {rootfs: /srv/rootfs, cmd: [sleep]}\n"
    )
    fresh = copied(state, tmp_path / "fresh")
    report = reconcile(state, opts, report.computed.view)
    assert cache.balance.incremental and not cache.network.reused
    assert [(f.item_id, f.reason) for f in report.computed.result.failures] == [("web2", "Cpu")]
    assert written(state) == written_afresh(fresh, state)


def test_a_network_state_another_writer_changed_is_not_taken_for_the_last(
    tmp_path: Path,
) -> None:
    """The same placements, but the checkpoint's network state is not the one the last run
    started from (another writer emptied it): the addresses are assigned from it again, as a
    process of its own does, not taken from the last answer."""
    state = unit(tmp_path / "warm")
    (state / "desired" / "client.yaml").unlink()
    (state / "desired" / "web2.yaml").write_text(
        WEB.replace("id: web", "id: web2").replace("hostname: www\n", "")
    )

    opts, cache = warm_options()
    view = reconcile(state, opts).computed.view
    (state / "desired" / "web.yaml").unlink()  # web2 keeps its address (.3), sticky
    view = reconcile(state, opts, view).computed.view
    view = reconcile(state, opts, view).computed.view
    assert addresses(state)[iid("web2")] == "172.17.0.3"
    loaded = load_checkpoint(state / "checkpoint", {}, quarantine=False)
    save_checkpoint(state / "checkpoint", dataclasses.replace(loaded.checkpoint, network={}))
    fresh = copied(state, tmp_path / "fresh")
    reconcile(state, opts, view)
    assert cache.balance.incremental and not cache.network.reused
    assert addresses(state)[iid("web2")] == "172.17.0.2"  # (from nothing: the first free)
    assert written(state) == written_afresh(fresh, state)
