"""The command line: validate, plan, explain, exit codes, help (schema: model/test_schema.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import pytest

from reconciler.cli.commands import EXIT_USAGE, main
from reconciler.io.loader import load_state
from reconciler.model.values import instance_id
from tests.support.paths import DEMO, EXAMPLES
from tests.support.terminal import run_in_pty


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


class TestValidate:
    @pytest.mark.parametrize("state", [DEMO, *EXAMPLES], ids=lambda p: p.name)
    def test_bundled_units_are_valid(self, state: Path, capsys: pytest.CaptureFixture[str]) -> None:
        code, out, _ = run(capsys, "validate", "--state", str(state))
        assert code == 0, out
        assert "valid" in out

    def test_broken_copy_reports_each_file_with_position(
        self, demo_copy: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        nav = demo_copy / "desired" / "navigation.yaml"
        nav.write_text(nav.read_text().replace("instances: 1", "instances: many"))
        node = demo_copy / "nodes" / "edge-2.yaml"
        node.write_text(node.read_text().replace("maxDMIPS: 2000", "maxDMIPS: 2000\ncolour: red"))
        res = demo_copy / "resources" / "edge-1.json"
        res.write_text(res.read_text().replace('"sharedCount": 2,', '"sharedCount": 2,,'))
        code, out, _ = run(capsys, "validate", "--state", str(demo_copy))
        assert code == 1
        errors = sorted(line for line in out.splitlines() if ": error: " in line)
        assert errors == sorted(
            [
                f"{nav}:6:12: error: instances: Input should be a valid integer (got 'many')",
                f"{node}:6:1: error: unknown field 'colour'",
                # line 4 is '    "sharedCount": 2,,': the second comma is column 22
                f"{res}:4:22: error: invalid JSON: Expecting property name enclosed in double "
                "quotes (resources of node edge-1)",
            ]
        )
        assert "invalid: 3 error(s)" in out

    def test_the_console_script_validates_the_demo(self) -> None:
        """The `reconciler` entry point of pyproject.toml, as a newcomer runs it."""
        script = Path(sys.executable).parent / "reconciler"
        assert script.exists(), "pip install -e . creates the reconciler console script"
        proc = subprocess.run(
            [str(script), "validate", "--state", str(DEMO)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.startswith("valid: 7 services, 3 nodes")

    def test_json_output(self, demo_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
        (demo_copy / "desired" / "x.yaml").write_text("kind: Service\n")
        code, out, _ = run(capsys, "validate", "--state", str(demo_copy), "--json")
        report = json.loads(out)
        assert code == 1 and report["formatVersion"] == 1 and report["valid"] is False
        assert report["counts"]["services"] == 7
        assert {e["path"] for e in report["errors"]} == {str(demo_copy / "desired" / "x.yaml")}


class TestBundledUnits:
    def test_the_demo_has_what_a_newcomer_needs_to_see(self) -> None:
        view, diags = load_state(DEMO)
        assert [d for d in diags if d.severity == "error"] == []
        assert len(view.services) >= 4
        assert len(view.nodes) >= 3
        assert all(node.runtimes for node in view.nodes.values())
        assert any(node.host_resources for node in view.nodes.values())
        assert any(node.devicePools for node in view.nodes.values())

    def test_at_least_two_more_units_under_examples_all_valid(self) -> None:
        assert len(EXAMPLES) >= 2
        for unit in EXAMPLES:
            view, diags = load_state(unit)
            assert diags == [], unit
            assert view.unit is not None and view.services and view.nodes, unit


class TestUsage:
    @pytest.mark.parametrize(
        "args", [["no-such-command"], ["validate", "--bogus"], ["schema", "--kind", "Nope"]]
    )
    def test_usage_errors_exit_64(
        self, args: list[str], capsys: pytest.CaptureFixture[str]
    ) -> None:
        code, _, err = run(capsys, *args)
        assert code == EXIT_USAGE
        assert "Usage:" in err

    def test_help_explains_every_command(self, capsys: pytest.CaptureFixture[str]) -> None:
        from reconciler.cli.commands import cli

        code, out, _ = run(capsys, "--help")
        assert code == 0
        listed = out.split("Commands:", 1)[1]
        assert {"validate", "schema", "plan", "explain"} <= set(cli.commands)
        for command in cli.commands:
            assert f"\n  {command} " in listed, command
            c, sub, _ = run(capsys, command, "--help")
            assert c == 0 and "--state" in sub, command
            summary = sub.split("Options:", 1)[0]
            assert len(summary.split()) >= 12, (command, summary)  # explains, not just names

    def test_missing_state_dir_is_an_error(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        code, _, err = run(capsys, "validate", "--state", str(tmp_path / "nope"))
        assert code == 1 and "does not exist" in err


def _four_node_unit(root: Path) -> Path:
    """Nodes A-D (runc on A-C, runx on D); A has label1 (priority 100), B label2 (50).
    Service needs2 wants label2 (2 instances), needs3 wants label3 (none has it)."""
    (root / "nodes").mkdir(parents=True)
    (root / "desired").mkdir()
    (root / "unit.yaml").write_text(
        "apiVersion: reconciler/v1\nkind: UnitConfig\nversion: 1.0.0\nnodes:\n"
        "  - {nodeType: edge, nodeId: A, priority: 100, labels: [label1]}\n"
        "  - {nodeType: edge, nodeId: B, priority: 50, labels: [label2]}\n"
    )
    for nid in "ABCD":
        rt = "runx" if nid == "D" else "runc"
        (root / "nodes" / f"{nid}.yaml").write_text(
            f"apiVersion: reconciler/v1\nkind: Node\nid: {nid}\ntype: edge\nmaxDMIPS: 1000\n"
            f"totalRAM: 1Gi\nruntimes:\n"
            f"  - {{id: {rt}, type: {rt}, platform: {{architecture: x86_64, os: linux}}}}\n"
        )
    for item, label, count in (("needs2", "label2", 2), ("needs3", "label3", 1)):
        (root / "desired" / f"{item}.yaml").write_text(
            f"apiVersion: reconciler/v1\nkind: Service\nid: {item}\nversion: 1.0.0\n"
            f"instances: {count}\nlabels: [{label}]\nimage: {{rootfs: /r, cmd: [/bin/true]}}\n"
        )
    return root


class TestPlanAndExplain:
    """`plan` prints placements and failures; `explain` prints the node x filter matrix."""

    FILTERS: ClassVar[list[str]] = [
        "NodeState",
        "NodeId",
        "Labels",
        "Resources",
        "Devices",
        "RuntimeType",
        "Platform",
        "Cpu",
        "Ram",
        "Storage",
        "State",
        "MaxInstances",
    ]

    def test_plan_prints_placements_and_failures(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        state = _four_node_unit(tmp_path / "s")
        code, out, _ = run(capsys, "plan", "--state", str(state))
        assert code == 3  # some instance unplaceable
        rows = [
            [cell.strip() for cell in line.split("│")][:4]
            for line in out.splitlines()
            if line.lstrip().startswith("needs2:") and "│" in line  # the placements table
        ]
        assert rows == [
            ["needs2:default:0", "1.0.0", "B", "runc"],
            ["needs2:default:1", "1.0.0", "B", "runc"],
        ]
        assert "needs3:default:0: 0/4 nodes feasible: 4 Labels" in out
        assert not (state / "out").exists() and not (state / "checkpoint").exists()

    def test_explain_a_failure_shows_every_node_and_filter(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        state = _four_node_unit(tmp_path / "s")
        code, out, _ = run(capsys, "explain", "needs3:0", "--state", str(state), "--json")
        assert code == 0
        doc = json.loads(out)
        assert doc["instanceId"] == instance_id("needs3", "default", 0)
        assert doc["filters"] == self.FILTERS
        assert doc["placement"] is None
        assert doc["failure"]["reason"] == "Labels"
        assert doc["failure"]["summary"] == "needs3:default:0: 0/4 nodes feasible: 4 Labels"
        assert doc["feasibility"] == {"feasible": 0, "nodes": 4, "droppedBy": {"Labels": 4}}
        assert [n["nodeId"] for n in doc["nodes"]] == ["A", "B", "C", "D"]
        for node in doc["nodes"]:
            assert node["droppedBy"] == "Labels"
            assert set(node["filters"]) == set(self.FILTERS)
            failing = {code for code, cell in node["filters"].items() if not cell["pass"]}
            # D also fails RuntimeType (runx only); the node is charged to Labels, its first
            assert failing == ({"Labels", "RuntimeType"} if node["nodeId"] == "D" else {"Labels"})
            assert node["filters"]["Labels"]["reason"] == "missing labels label3"

    def test_explain_a_placement(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        state = _four_node_unit(tmp_path / "s")
        code, out, _ = run(capsys, "explain", "needs2:default:1", "--state", str(state), "--json")
        assert code == 0
        doc = json.loads(out)
        assert doc["placement"] == {
            "nodeId": "B",
            "runtimeId": "runc",
            "version": "1.0.0",
            "held": False,
        }
        assert doc["failure"] is None
        dropped = {n["nodeId"]: n["droppedBy"] for n in doc["nodes"]}
        assert dropped == {"A": "Labels", "B": None, "C": "Labels", "D": "Labels"}
        # the Kubernetes-style count above the matrix: B passes, three nodes lack a label
        assert doc["feasibility"] == {"feasible": 1, "nodes": 4, "droppedBy": {"Labels": 3}}
        code, out, _ = run(capsys, "explain", "needs2:default:1", "--state", str(state))
        assert code == 0
        assert out.splitlines()[1:3] == ["placed on B runtime runc", "1/4 nodes feasible: 3 Labels"]

    def test_explain_prints_the_matrix(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        state = _four_node_unit(tmp_path / "s")
        code, out, _ = run(capsys, "explain", "needs3:0", "--state", str(state))
        assert code == 0
        assert "needs3:default:0: 0/4 nodes feasible: 4 Labels" in out
        header = next(line for line in out.splitlines() if "NodeState" in line)
        positions = [header.index(f" {code} ") for code in self.FILTERS]
        assert positions == sorted(positions)  # every filter, in pipeline order
        for nid in "ABCD":
            assert any(line.split()[:1] == [nid] for line in out.splitlines()), nid

    def test_explain_an_unknown_instance_exits_1(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        state = _four_node_unit(tmp_path / "s")
        code, _, err = run(capsys, "explain", "nope:0", "--state", str(state))
        assert code == 1
        assert "no desired instance 'nope:0'" in err


def test_example_copy_keeps_demo_untouched(demo_copy: Path) -> None:
    shutil.rmtree(demo_copy / "desired")
    assert (DEMO / "desired" / "navigation.yaml").exists()


class TestColor:
    def test_colors_on_a_terminal_and_never_with_no_color(self) -> None:
        import os

        env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
        env["TERM"] = "xterm-256color"
        colored = run_in_pty(["validate", "--state", str(DEMO)], env)
        assert b"\x1b[" in colored and b"valid" in colored
        plain = run_in_pty(["validate", "--state", str(DEMO)], {**env, "NO_COLOR": "1"})
        assert b"valid" in plain and b"\x1b[3" not in plain  # no color codes

    def test_no_color_when_piped(self, capsys: pytest.CaptureFixture[str]) -> None:
        code, out, _ = run(capsys, "validate", "--state", str(DEMO))
        assert code == 0 and "\x1b[" not in out


class TestWriteErrors:
    def test_a_failed_fsync_is_a_clear_error_not_a_traceback(
        self, demo_copy: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A write that fails (here every fsync, as on a dying disk) ends the run with exit 1
        and one line on stderr; the files already there stay as they were."""
        import errno
        import os

        def failing_fsync(_fd: int) -> None:
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(os, "fsync", failing_fsync)
        monkeypatch.setattr("reconciler.io.fsio._SYNCFS", None)  # one fsync per file
        code, _out, err = run(capsys, "reconcile", "--state", str(demo_copy))
        assert code == 1
        assert "Traceback" not in err
        assert err.startswith("error: writing ") and "Input/output error" in err
        assert not (demo_copy / "out" / "plan.json").exists()
        assert not (demo_copy / "checkpoint" / "allocations.json").exists()
