"""``validate`` checks the input files against one another.

Each check is shown with its message, its severity (a warning leaves the exit code 0, an error
makes it 1) and the ``file:line:col`` of the offending field; the line numbers are counted by
hand in the texts below.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reconciler.cli.commands import main

UNIT = """apiVersion: reconciler/v1
kind: UnitConfig
version: 1.0.0
nodes:
  - {nodeType: server, labels: [ssd]}
"""

NODE = """apiVersion: reconciler/v1
kind: Node
id: {id}
type: {type}
maxDMIPS: 10000
totalRAM: 8Gi
runtimes:
  - {{id: rt, type: {runtime}, platform: {{architecture: x86_64}}}}
"""

# lines 1-7; each test appends its own lines from line 8 on
SERVICE = """apiVersion: reconciler/v1
kind: Service
id: web
version: 1.0.0
image:
  rootfs: /srv/web
  cmd: [/bin/web]
"""


def unit_dir(tmp_path: Path, service: str, *, nodes: tuple[tuple[str, str, str], ...] = ()) -> Path:
    """A state directory with unit.yaml, the nodes (id, type, runtime type) and one service."""
    (tmp_path / "desired").mkdir(parents=True)
    (tmp_path / "nodes").mkdir()
    (tmp_path / "unit.yaml").write_text(UNIT)
    for node_id, node_type, runtime in nodes:
        text = NODE.format(id=node_id, type=node_type, runtime=runtime)
        (tmp_path / "nodes" / f"{node_id}.yaml").write_text(text)
    (tmp_path / "desired" / "web.yaml").write_text(service)
    return tmp_path


SERVER = (("n1", "server", "runc"),)


def validate(capsys: pytest.CaptureFixture[str], state: Path) -> tuple[int, list[str]]:
    code = main(["validate", "--state", str(state)])
    out = capsys.readouterr().out
    return code, [line for line in out.splitlines() if ": error: " in line or ": warning: " in line]


def test_a_consistent_unit_has_no_findings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = unit_dir(tmp_path, SERVICE + "labels: [ssd]\nruntimes: [runc]\n", nodes=SERVER)
    assert validate(capsys, state) == (0, [])


def test_a_label_no_node_has_is_a_warning_at_the_label(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # line 8 is "labels: [ssd, gpu]": "gpu" starts at column 15; the node's entry has only ssd
    state = unit_dir(tmp_path, SERVICE + "labels: [ssd, gpu]\n", nodes=SERVER)
    code, lines = validate(capsys, state)
    assert code == 0
    assert lines == [
        f"{state / 'desired' / 'web.yaml'}:8:15: warning: labels: no node has the label 'gpu' "
        "(a node's labels come from its unit.yaml entry): no instance can be placed until one has"
    ]


def test_a_runtime_type_no_node_offers_is_an_error_at_the_entry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # lines 8-10: "runtimes:", "  - runc", "  - kata": "kata" is at 10:5
    state = unit_dir(tmp_path, SERVICE + "runtimes:\n  - runc\n  - kata\n", nodes=SERVER)
    code, lines = validate(capsys, state)
    assert code == 1
    assert lines == [
        f"{state / 'desired' / 'web.yaml'}:10:5: error: runtimes: no node offers a runtime of "
        "type 'kata' (offered: runc)"
    ]


def test_default_runtimes_no_node_offers_are_an_error_at_the_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # no runtimes field: the defaults crun and runc; the only node offers youki. "id" is on
    # line 3, the service's identity: the line to read (there is no runtimes line)
    state = unit_dir(tmp_path, SERVICE, nodes=(("n1", "server", "youki"),))
    code, lines = validate(capsys, state)
    assert code == 1
    assert len(lines) == 1
    assert lines[0].startswith(f"{state / 'desired' / 'web.yaml'}:3:1: error: runtimes: ")
    assert "crun or runc" in lines[0] and "(offered: youki)" in lines[0]


def test_a_node_type_without_a_unit_entry_is_a_warning_at_its_type(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # NODE's line 4 is "type: edge": the value starts at column 7
    state = unit_dir(tmp_path, SERVICE, nodes=(*SERVER, ("n2", "edge", "runc")))
    code, lines = validate(capsys, state)
    assert code == 0
    assert len(lines) == 1
    assert lines[0].startswith(
        f"{state / 'nodes' / 'n2.yaml'}:4:7: warning: type: unit.yaml has no entry for "
        "nodeType 'edge' (nor for nodeId 'n2'): the node gets priority 0, no labels"
    )


def test_a_node_with_an_entry_by_its_id_has_no_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = unit_dir(tmp_path, SERVICE, nodes=(*SERVER, ("n2", "edge", "runc")))
    (state / "unit.yaml").write_text(UNIT + "  - {nodeType: other, nodeId: n2}\n")
    assert validate(capsys, state) == (0, [])


def test_an_image_with_neither_entrypoint_nor_cmd_is_an_error_at_the_image_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # line 5 is "image:"; without line 7 ("  cmd: ...") there is nothing to run
    service = SERVICE.replace("  cmd: [/bin/web]\n", "")
    state = unit_dir(tmp_path, service, nodes=SERVER)
    code, lines = validate(capsys, state)
    assert code == 1
    assert lines == [
        f"{state / 'desired' / 'web.yaml'}:5:1: error: image: neither entrypoint nor cmd is "
        "set: an instance would have nothing to run"
    ]


def test_an_entrypoint_alone_is_enough(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    service = SERVICE.replace("  cmd: [/bin/web]\n", "  entrypoint: [/bin/web]\n")
    assert validate(capsys, unit_dir(tmp_path, service, nodes=SERVER)) == (0, [])


def test_a_request_above_its_quota_is_a_warning_at_the_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # line 8 "quotas:", 9 "  ramLimit: 1Gi", 10 "requestedResources:", 11 "  ram: 2Gi" (the
    # value at column 8), 12 "  cpu: 100" (no cpu quota: no finding)
    extra = "quotas:\n  ramLimit: 1Gi\nrequestedResources:\n  ram: 2Gi\n  cpu: 100\n"
    state = unit_dir(tmp_path, SERVICE + extra, nodes=SERVER)
    code, lines = validate(capsys, state)
    assert code == 0
    assert lines == [
        f"{state / 'desired' / 'web.yaml'}:11:8: warning: requestedResources.ram: 2 GiB is "
        "above quotas.ramLimit (1 GiB): the quota is requested instead"
    ]


def test_a_request_within_its_quota_or_skipped_has_no_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    within = "quotas: {ramLimit: 2Gi}\nrequestedResources: {ram: 2Gi}\n"
    assert validate(capsys, unit_dir(tmp_path / "a", SERVICE + within, nodes=SERVER)) == (0, [])
    skipped = "quotas: {ramLimit: 1Gi}\nrequestedResources: {ram: 2Gi}\nskipResourceLimits: true\n"
    assert validate(capsys, unit_dir(tmp_path / "b", SERVICE + skipped, nodes=SERVER)) == (0, [])


def test_without_node_files_labels_and_runtimes_are_not_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = unit_dir(tmp_path, SERVICE + "labels: [gpu]\nruntimes: [kata]\n")
    assert validate(capsys, state) == (0, [])


def test_json_output_lists_findings_by_severity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    service = SERVICE.replace("  cmd: [/bin/web]\n", "") + "labels: [gpu]\n"
    state = unit_dir(tmp_path, service, nodes=SERVER)
    code = main(["validate", "--state", str(state), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["valid"] is False
    path = str(state / "desired" / "web.yaml")
    assert [(e["path"], e["line"], e["col"], e["severity"]) for e in doc["errors"]] == [
        (path, 5, 1, "error")
    ]
    # line 7 is "labels: [gpu]" (the cmd line removed): "gpu" at column 10
    assert [(w["path"], w["line"], w["col"], w["severity"]) for w in doc["warnings"]] == [
        (path, 7, 10, "warning")
    ]


def test_an_invalid_file_is_not_checked_across_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the service is invalid on its own (an unknown field): one error, no cross-file finding
    service = SERVICE.replace("  cmd: [/bin/web]\n", "") + "colour: red\n"
    state = unit_dir(tmp_path, service, nodes=SERVER)
    code, lines = validate(capsys, state)
    assert code == 1
    assert len(lines) == 1 and "unknown field 'colour'" in lines[0]
