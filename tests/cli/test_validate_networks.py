"""``validate`` on the network and component fields (SPEC §17, §18): malformed port strings,
unknown protocols and connections to items no service has are errors at their ``file:line:col``
(line numbers counted by hand in the texts below)."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.cli.commands import main

# lines 1-7; each test appends its own lines from line 8 on
WEB = """apiVersion: reconciler/v1
kind: Service
id: web
version: 1.0.0
image:
  rootfs: /srv/web
  cmd: [/bin/web]
"""


def run(capsys: pytest.CaptureFixture[str], state: Path) -> tuple[int, list[str]]:
    code = main(["validate", "--state", str(state)])
    out = capsys.readouterr().out
    return code, [line for line in out.splitlines() if ": error: " in line or ": warning: " in line]


def unit(tmp_path: Path, web: str, *others: str, unit_yaml: str = "") -> Path:
    (tmp_path / "desired").mkdir(parents=True)
    (tmp_path / "desired" / "web.yaml").write_text(web)
    for n, text in enumerate(others):
        (tmp_path / "desired" / f"other{n}.yaml").write_text(text)
    if unit_yaml:
        (tmp_path / "unit.yaml").write_text(unit_yaml)
    return tmp_path


def db(exposed: str = "[5432/tcp]") -> str:
    return WEB.replace("id: web", "id: db") + f"exposedPorts: {exposed}\n"


def test_network_fields_are_valid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    web = WEB + "owner: shop\nexposedPorts: ['8080', 53/udp]\nallowedConnections: [db/5432]\n"
    web += "quotas: {downloadSpeed: 1000, uploadSpeed: 0}\n"
    state = unit(tmp_path, web, db())
    assert run(capsys, state) == (0, [])


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            "exposedPorts: [80/tcp, 80/sctp]",
            "8:24: error: exposedPorts.1: '80/sctp': unknown protocol 'sctp' (tcp or udp)",
        ),
        (
            "exposedPorts: [http]",
            "8:16: error: exposedPorts.0: 'http': 'http' is not a port number (1-65535)",
        ),
        (
            "exposedPorts: ['99999']",
            "8:16: error: exposedPorts.0: '99999': port 99999 is out of range (1-65535)",
        ),
        (
            "exposedPorts: [1/tcp/x]",
            "8:16: error: exposedPorts.0: '1/tcp/x' is not a port: expected port[/proto]",
        ),
        (
            "allowedConnections: [db]",
            "8:22: error: allowedConnections.0: 'db' is not a connection: expected itemId/port",
        ),
        (
            "allowedConnections: [db/5432/icmp]",
            "8:22: error: allowedConnections.0: 'db/5432/icmp': unknown protocol 'icmp'",
        ),
        (
            "allowedConnections: [../x/5432]",
            "8:22: error: allowedConnections.0: '../x/5432': '..' is not a valid item id",
        ),
    ],
)
def test_malformed_ports_and_connections_are_errors_at_their_entry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, message: str
) -> None:
    state = unit(tmp_path, WEB + line + "\n", db())
    code, lines = run(capsys, state)
    assert code == 1
    assert len(lines) == 1, lines
    assert lines[0].startswith(str(state / "desired" / "web.yaml") + ":"), lines
    assert message in lines[0], lines


def test_a_connection_to_an_item_no_service_has_is_an_error_at_the_entry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # line 8 "allowedConnections:", line 9 "  - db/5432", line 10 "  - cache/6379"
    web = WEB + "allowedConnections:\n  - db/5432\n  - cache/6379\n"
    state = unit(tmp_path, web, db())
    code, lines = run(capsys, state)
    assert code == 1
    assert lines == [
        f"{state / 'desired' / 'web.yaml'}:10:5: error: allowedConnections: no service has "
        "the item 'cache'"
    ]


def test_a_connection_to_a_port_nobody_exposes_is_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = unit(tmp_path, WEB + "allowedConnections: [db/5433/tcp]\n", db())
    code, lines = run(capsys, state)
    assert code == 0
    assert lines == [
        f"{state / 'desired' / 'web.yaml'}:8:22: warning: allowedConnections: no service of "
        "'db' exposes 5433/tcp (exposed: 5432/tcp): the instances fail Network"
    ]


def test_unit_network_subnets_are_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (
        "apiVersion: reconciler/v1\nkind: UnitConfig\nversion: 1.0.0\n"
        "network:\n  subnets: [10.1.0.0/24, 10.2.0.1/24]\n  vlan: true\n"
    )
    state = unit(tmp_path, WEB, unit_yaml=text)
    code, lines = run(capsys, state)
    assert code == 1
    assert len(lines) == 1
    assert (
        f"{state / 'unit.yaml'}:5:26: error: network.subnets.1: '10.2.0.1/24' is not an IPv4"
        in lines[0]
    )


def test_component_and_handler_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fw = WEB.replace("id: web", "id: fw") + "type: component\nruntimes: [rootfs]\n"
    node = (
        "apiVersion: reconciler/v1\nkind: Node\nid: n1\ntype: t\nmaxDMIPS: 1000\ntotalRAM: 1Gi\n"
        "runtimes:\n"
        "  - {id: rt, type: runc, platform: {architecture: x86_64}}\n"
        "  - {id: fs, type: rootfs, platform: {architecture: x86_64}, handler: [/bin/inst]}\n"
    )
    state = unit(tmp_path, WEB + "runtimes: [runc]\n", fw)
    (state / "nodes").mkdir()
    (state / "nodes" / "n1.yaml").write_text(node)
    assert run(capsys, state) == (0, [])
    bad = fw + "exposedPorts: ['80']\n"
    (state / "desired" / "other0.yaml").write_text(bad)
    code, lines = run(capsys, state)
    assert code == 1
    assert "exposedPorts: a component gets no network" in lines[0]
