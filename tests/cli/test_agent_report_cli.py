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
