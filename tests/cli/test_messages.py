"""Messages for users: "did you mean" for unknown fields and commands, the accepted values
named, human units and plain lists in validate and explain (issue 30)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from reconciler.cli.commands import EXIT_USAGE, main
from reconciler.model.documents import Node, Service
from reconciler.model.suggest import close_names, fields_at


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))


class TestUnknownFields:
    def test_top_level_nested_and_list_item_fields_get_did_you_mean(
        self, demo_copy: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        node = demo_copy / "nodes" / "edge-2.yaml"
        _replace(node, "maxDMIPS: 2000", "maxDMIPS: 2000\nmaxDMIP: 3")
        _replace(node, "os: linux}", "oss: linux}")  # runtimes[0].platform
        kiosk = demo_copy / "desired" / "kiosk.yaml"
        _replace(kiosk, "  cpu: 20", "  cpus: 20")  # requestedResources
        code, out, _ = run(capsys, "validate", "--state", str(demo_copy))
        assert code == 1
        errors = sorted(line for line in out.splitlines() if ": error: " in line)
        assert f"{node}:6:1: error: unknown field 'maxDMIP' (did you mean 'maxDMIPS'?)" in errors
        assert any(
            line.startswith(f"{node}:")
            and "runtimes.0.platform: unknown field 'oss' (did you mean 'os'?)" in line
            for line in errors
        ), errors
        assert any(
            line.startswith(f"{kiosk}:14:3:")
            and "requestedResources: unknown field 'cpus' (did you mean 'cpu'?)" in line
            for line in errors
        ), errors

    def test_fields_at_walks_the_models(self) -> None:
        assert "maxDMIPS" in fields_at(Node, ())
        assert {"architecture", "os", "osFeatures"} <= set(
            fields_at(Node, ("runtimes", 0, "platform"))
        )
        assert "cpu" in fields_at(Service, ("requestedResources",))
        assert close_names("maxdmips", fields_at(Node, ())) == ["maxDMIPS"]  # case alone


class TestCommands:
    def test_misspelled_command_gets_did_you_mean(self, capsys: pytest.CaptureFixture[str]) -> None:
        code, _, err = run(capsys, "valdate")
        assert code == EXIT_USAGE
        assert "No such command 'valdate'. Did you mean 'validate'?" in err

    def test_unknown_command_lists_every_command(self, capsys: pytest.CaptureFixture[str]) -> None:
        code, _, err = run(capsys, "frobnicate")
        assert code == EXIT_USAGE
        assert "No such command 'frobnicate'. Commands: agent, apply, explain," in err
        assert "validate, watch." in err


class TestAcceptedValues:
    def test_literal_error_names_the_accepted_values(
        self, demo_copy: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        kiosk = demo_copy / "desired" / "kiosk.yaml"
        kiosk.write_text(kiosk.read_text() + "restartPolicy: sometimes\n")
        _, out, _ = run(capsys, "validate", "--state", str(demo_copy))
        assert "restartPolicy: Input should be 'always', 'on-failure' or 'never'" in out

    def test_unknown_sharing_policy_lists_the_known_ones(self) -> None:
        from reconciler.placement.sharing import policy

        with pytest.raises(KeyError, match=r"known: exclusive, fractional, shared-count\)"):
            policy("exclusiv")


def test_node_agent_config_unknown_field_gets_did_you_mean(tmp_path: Path) -> None:
    from reconciler.agent.report import NodeReportError, load_node_config

    path = tmp_path / "node.yaml"
    path.write_text(
        "apiVersion: reconciler/v1\nkind: NodeAgentConfig\nid: n1\ntype: t\nmaxDMIPS: 9\n"
        "maxDMIP: 3\n"
    )
    with pytest.raises(NodeReportError) as err:
        load_node_config(path)
    assert f"{path}:6:1: unknown field 'maxDMIP' (did you mean 'maxDMIPS'?)" in str(err.value)


def test_an_unreachable_etcd_is_said_in_words(capsys: pytest.CaptureFixture[str]) -> None:
    """Not the HTTP library's text ("HTTPConnectionPool(...): Max retries exceeded ...")."""
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, _out, err = run(capsys, "status", "--store", f"etcd://127.0.0.1:{port}/unit")
    assert code == 1
    assert f"cannot reach etcd at 127.0.0.1:{port} (connection refused)" in err
    assert "HTTPConnectionPool" not in err and "Max retries" not in err
