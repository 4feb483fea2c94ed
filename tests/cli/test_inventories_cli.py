"""A node's ``inventories`` through the command line: ``validate`` and the schema check them,
``plan``/``explain`` honour them, ``status`` shows overcommitted capacity as such."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from reconciler.cli.commands import main
from reconciler.io.yamlsafe import parse_yaml
from reconciler.model.values import instance_id
from tests.support.state_files import write

NODE = """apiVersion: reconciler/v1
kind: Node
id: n1
type: edge
maxDMIPS: 1000
totalRAM: 1Gi
partitions:
  - {{name: data, types: [storages], totalSize: 2Gi}}
inventories:
{inventories}
runtimes:
  - {{id: runc, type: runc, platform: {{architecture: x86_64}}}}
"""

SERVICE = """apiVersion: reconciler/v1
kind: Service
id: {id}
version: 1.0.0
instances: {instances}
requestedResources: {{cpu: {cpu}}}
image: {{rootfs: /r, cmd: [/bin/true]}}
"""

OVERCOMMIT = """  cpu: {reserved: 200, allocationRatio: 2, stepSize: 100}
  storage: {minUnit: 64Mi}"""


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def unit(root: Path, inventories: str, *services: tuple[str, int, int]) -> Path:
    write(root, "nodes/n1.yaml", NODE.format(inventories=inventories))
    for item, instances, cpu in services:
        write(root, f"desired/{item}.yaml", SERVICE.format(id=item, instances=instances, cpu=cpu))
    return root


def test_validate_reports_a_reserved_part_beyond_the_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = unit(tmp_path, "  cpu: {reserved: 1200}\n  ram: {minUnit: 2Mi, maxUnit: 1Mi}")
    code, out, _ = run(capsys, "validate", "--state", str(state))
    assert code == 1
    node = state / "nodes" / "n1.yaml"
    assert f"{node}:11:8: error: inventories.ram: maxUnit 1048576 is below minUnit 2097152" in out
    write(state, "nodes/n1.yaml", NODE.format(inventories="  cpu: {reserved: 1200}"))
    code, out, _ = run(capsys, "validate", "--state", str(state))
    assert f"{node}:10:3: error: inventories: cpu.reserved 1200 exceeds maxDMIPS (1000)" in out
    huge = NODE.format(inventories="  cpu: {allocationRatio: 2}")
    write(state, "nodes/n1.yaml", huge.replace("maxDMIPS: 1000", f"maxDMIPS: {2**63 - 1}"))
    code, out, _ = run(capsys, "validate", "--state", str(state))
    assert (
        f"{node}:10:3: error: inventories: cpu: (maxDMIPS - reserved) x allocationRatio 2.0 "
        "exceeds 2^63-1: no output could hold that capacity"
    ) in out
    write(state, "nodes/n1.yaml", NODE.format(inventories="  storage: {stepSize: 0}"))
    code, out, _ = run(capsys, "validate", "--state", str(state))
    assert f"{node}:10:23: error: inventories.storage.stepSize: must be at least 1 byte" in out
    write(state, "nodes/n1.yaml", NODE.format(inventories=OVERCOMMIT))
    code, out, _ = run(capsys, "validate", "--state", str(state))
    assert code == 0, out


def _node_schema(capsys: pytest.CaptureFixture[str]) -> Draft202012Validator:
    code, out, _ = run(capsys, "schema", "--kind", "Node")
    assert code == 0
    return Draft202012Validator(json.loads(out))


def test_the_schema_describes_inventories(capsys: pytest.CaptureFixture[str]) -> None:
    validator = _node_schema(capsys)
    good: dict[str, Any] = parse_yaml(NODE.format(inventories=OVERCOMMIT).encode()).data
    assert list(validator.iter_errors(good)) == []
    bads: tuple[dict[str, dict[str, Any]], ...] = (
        {"cpu": {"allocationRatio": 0}},
        {"cpu": {"minUnit": 0}},
        {"ram": {"stepSize": 0}},
        {"ram": {"reserved": "lots"}},
        {"gpu": {}},
        {"cpu": {"overcommit": 2}},
    )
    for bad in bads:
        assert list(validator.iter_errors({**good, "inventories": bad})), bad


def test_plan_and_explain_honour_the_inventories(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """(1000 - 200) * 2 = 1600 DMIPS: 16 instances of 100; 150 DMIPS breaks stepSize 100."""
    state = unit(tmp_path, OVERCOMMIT, ("many", 20, 100), ("odd", 1, 150))
    code, out, _ = run(capsys, "plan", "--state", str(state), "--json")
    assert code == 3  # some instance unplaceable
    plan = json.loads(out)
    placed = [a for a in plan["actions"] if a["action"] == "start" and a["itemId"] == "many"]
    assert len(placed) == 16
    code, out, _ = run(capsys, "explain", "odd:0", "--state", str(state), "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["instanceId"] == instance_id("odd", "default", 0)
    assert doc["failure"]["reason"] == "Cpu"
    (node,) = doc["nodes"]
    assert node["droppedBy"] == "Cpu"
    assert node["filters"]["Cpu"] == {
        "pass": False,
        "reason": "needs 150 DMIPS: step-size (inventories.cpu.stepSize 100)",
    }


def test_status_shows_overcommitted_capacity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = unit(tmp_path, OVERCOMMIT, ("many", 12, 100))
    code, _, err = run(capsys, "reconcile", "--state", str(state))
    assert code == 0, err
    code, out, _ = run(capsys, "status", "--state", str(state), "--json")
    assert code == 0
    n1 = json.loads(out)["nodes"]["n1"]
    assert n1["cpu"] == {
        "capacity": 1600,
        "reserved": 1200,
        "free": 400,
        "inventory": {
            "total": 1000,
            "reserved": 200,
            "allocationRatio": 2.0,
            "minUnit": 1,
            "maxUnit": None,
            "stepSize": 100,
        },
        "overcommitted": 800,
    }
    storage = n1["partitions"]["storage"]
    assert storage["capacity"] == 2 * 1024**3 and "overcommitted" not in storage
    assert storage["inventory"]["minUnit"] == 64 * 1024**2
    assert n1["ram"] == {"capacity": 1024**3, "reserved": 0, "free": 1024**3}
    code, out, _ = run(capsys, "status", "--state", str(state))
    assert code == 0
    assert "1200/1600 (overcommitted x2: 800 beyond the node's)" in " ".join(out.split())
