"""``reconciler agent --node-config FILE``: the agent writes its node's document (SPEC §19)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reconciler.cli.commands import EXIT_USAGE, main

CONFIG = """apiVersion: reconciler/v1
kind: NodeAgentConfig
id: {node}
type: edge
maxDMIPS: 1000
"""


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_once_writes_the_node_document_then_applies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    config = tmp_path / "n1.yaml"
    config.write_text(CONFIG.format(node="n1"))
    code, out, err = run(
        capsys, "agent", "--node", "n1", "--state", str(state), "--node-config", str(config)
    )
    assert code == 0, err
    node = json.loads((state / "nodes" / "n1.yaml").read_text())
    assert node["id"] == "n1" and node["type"] == "edge" and node["totalRAM"] > 0
    assert "reportedAt" in node
    code, out, _ = run(capsys, "validate", "--state", str(state))
    assert code == 0, out


def test_a_config_of_another_node_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    config = tmp_path / "n2.yaml"
    config.write_text(CONFIG.format(node="n2"))
    code, _, err = run(
        capsys, "agent", "--node", "n1", "--state", str(state), "--node-config", str(config)
    )
    assert code == EXIT_USAGE
    assert "n2" in err
    assert not (state / "nodes").exists()


def test_explain_says_a_node_has_no_fresh_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    (state / "desired").mkdir(parents=True)
    (state / "desired" / "s.yaml").write_text(
        "apiVersion: reconciler/v1\nkind: Service\nid: s\nversion: 1.0.0\n"
        "runtimes: [runc]\nimage: {rootfs: /r}\n"
    )
    config = tmp_path / "n1.yaml"
    config.write_text(CONFIG.format(node="n1"))
    code, _, err = run(
        capsys, "agent", "--node", "n1", "--state", str(state), "--node-config", str(config)
    )
    assert code == 0, err
    path = state / "nodes" / "n1.yaml"
    node = json.loads(path.read_text())
    node["reportedAt"] = "2001-01-01T00:00:00Z"  # an agent that stopped long ago
    path.write_text(json.dumps(node))
    code, out, _ = run(capsys, "explain", "s:0", "--state", str(state), "--json")
    got = json.loads(out)
    (row,) = got["nodes"]
    assert row["droppedBy"] == "NodeState"
    assert row["filters"]["NodeState"]["reason"].startswith("no report for ")
