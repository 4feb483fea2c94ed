"""Readable output at any size: `status`, `plan` and `explain` in text at 80 columns (every node
id whole), status's summary, filters and report ages, plan grouped by node then service,
explain's per-runtime breakdown, `explain ITEM` and suggestions for misspelled ids."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from freezegun import freeze_time
from rich.console import Console

from benchmarks.statedir import write_state_dir
from reconciler.cli.commands import EXIT_USAGE, main
from reconciler.cli.statusview import StatusFilter, render_status
from reconciler.cli.textout import Column, Painter, TextTable
from tests.support.paths import DEMO

WIDTH = 80


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def narrow(monkeypatch: pytest.MonkeyPatch) -> None:
    """An 80-column terminal (as COLUMNS says; stdout is captured, not a terminal)."""
    monkeypatch.setenv("COLUMNS", str(WIDTH))


@pytest.fixture
def demo(demo_copy: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    assert run(capsys, "reconcile", "--state", str(demo_copy))[0] == 0
    return demo_copy


@pytest.fixture
def big(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """200 nodes, 600 instances (more than a view lists by default), reconciled."""
    root = tmp_path / "big"
    write_state_dir(root, 200, 600, seed=3)
    assert run(capsys, "reconcile", "--state", str(root))[0] == 0
    return root


def _node_ids(state: Path) -> list[str]:
    doc = json.loads((state / "out" / "status.json").read_text())
    return sorted(doc["nodes"])


def _fits(out: str) -> None:
    long = [line for line in out.splitlines() if len(line) > WIDTH]
    assert not long, long[:3]
    assert "…" not in out


def _whole_at_line_start(out: str, node_id: str) -> bool:
    """A line starts with the node id as a whole word (a table row, a plan's node header)."""
    return any(line.split()[:1] == [node_id] for line in out.splitlines())


@pytest.mark.usefixtures("narrow")
@pytest.mark.parametrize("unit", ["demo", "big"])
def test_status_plan_and_explain_print_every_node_id_whole_at_80_columns(
    unit: str, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    state: Path = request.getfixturevalue(unit)
    nodes = _node_ids(state)
    assert len(nodes) == (3 if unit == "demo" else 200)

    code, out, _ = run(capsys, "status", "--state", str(state))
    assert code == 0
    _fits(out)
    missing = [n for n in nodes if not _whole_at_line_start(out, n)]
    assert not missing, missing[:5]

    (state / "actual").mkdir(exist_ok=True)
    code, out, _ = run(capsys, "plan", "--state", str(state), "--placements")
    assert code in (0, 2, 3)
    _fits(out)
    code, doc, _ = run(capsys, "plan", "--state", str(state), "--json")
    acting = sorted({a["nodeId"] for a in json.loads(doc)["actions"]})
    placed_on = {
        i["nodeId"]
        for i in json.loads((state / "out" / "status.json").read_text())["instances"].values()
    }
    assert acting  # nothing is running: every placement is a start
    assert not [n for n in acting if not _whole_at_line_start(out, n)]  # the node headers
    assert all(re.search(rf"(^|\s){re.escape(n)}(\s|;|$)", out, re.M) for n in placed_on)

    status = json.loads((state / "out" / "status.json").read_text())
    record = next(iter(status["instances"].values()))
    label = f"{record['itemId']}:{record['subjectId']}:{record['index']}"
    code, out, _ = run(capsys, "explain", label, "--state", str(state), "--all-nodes")
    assert code == 0
    _fits(out)
    missing = [n for n in nodes if not _whole_at_line_start(out, n)]
    assert not missing, missing[:5]


def _matrix_nodes(out: str, nodes: list[str]) -> list[str]:
    """The node ids that start a line of ``explain``'s text (its matrix rows), in order."""
    known = set(nodes)
    rows = (line.split()[:1] for line in out.splitlines() if not line.startswith(" "))
    return [w[0] for w in rows if w and w[0] in known]


def test_explain_on_a_large_unit_shows_the_closest_nodes_and_counts_the_others(
    big: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = big
    nodes = _node_ids(state)
    status = json.loads((state / "out" / "status.json").read_text())
    record = next(iter(status["instances"].values()))
    label = f"{record['itemId']}:{record['subjectId']}:{record['index']}"
    code, out, _ = run(capsys, "explain", label, "--state", str(state))
    assert code == 0
    shown = _matrix_nodes(out, nodes)
    assert len(shown) == 20 and shown == sorted(shown)  # at most 20, in node order
    assert record["nodeId"] in shown  # the node it is placed on is always there
    # the others are counted as the summary counts them, from the complete --json
    code, raw, _ = run(capsys, "explain", label, "--state", str(state), "--json")
    doc = json.loads(raw)
    assert len(doc["nodes"]) == len(nodes) == 200
    by_id = {n["nodeId"]: n for n in doc["nodes"]}
    failing = {k: sum(not f["pass"] for f in n["filters"].values()) for k, n in by_id.items()}
    # the nodes shown fail no more filters than any left out (the placed node aside)
    worst_shown = max(failing[k] for k in shown if k != record["nodeId"])
    assert worst_shown <= min(failing[k] for k in by_id if k not in shown)
    hidden = [by_id[k]["droppedBy"] or "feasible" for k in by_id if k not in shown]
    counts: dict[str, int] = {}
    for why in hidden:
        counts[why] = counts.get(why, 0) + 1
    line = next(x for x in out.splitlines() if "more nodes not shown" in x)
    assert line.startswith(f"{len(hidden)} more nodes not shown: ")
    for why, n in counts.items():
        assert f"{n} {why}" in line
    assert "--all-nodes" in line
    # --all-nodes: every node, and no such line
    code, out, _ = run(capsys, "explain", label, "--state", str(state), "--all-nodes")
    assert _matrix_nodes(out, nodes) == nodes
    assert "not shown" not in out


def test_a_table_keeps_its_first_column_whole_however_narrow() -> None:
    console = Console(file=io.StringIO(), width=30, color_system=None)
    table = TextTable([Column("node"), Column("cpu"), Column("devices", "dev")])
    table.add_row("a-rather-long-node-id-17", "1200/1600", "example.com/gpu: 1/2/2")
    lines = table.render(30, Painter(console))
    assert any(line.split()[:1] == ["a-rather-long-node-id-17"] for line in lines)
    assert all(len(line) <= 30 for line in lines)
    assert "1200/1600" in " ".join(lines) and "example.com/gpu: 1/2/2" in " ".join(lines)


class TestStatus:
    def test_the_summary_comes_first(self, demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
        nav = demo / "desired" / "navigation.yaml"
        nav.write_text(nav.read_text().replace("labels: [display, gpu]", "labels: [nowhere]"))
        run(capsys, "reconcile", "--state", str(demo))
        code, out, _ = run(capsys, "status", "--state", str(demo))
        assert code == 0
        lines = out.splitlines()
        assert re.fullmatch(
            r"Status made \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(\d+s ago, by the last reconcile\)",
            lines[0],
        )
        assert lines[1:5] == [
            "Nodes: 3: provisioned 3",
            "Instances: 10: pending 10",  # nav is held where it was placed
            "Unplaceable: 1: Labels 1",
            "Alerts: 0",
        ]

    def test_a_large_unit_lists_nodes_not_instances_unless_asked(
        self, big: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        code, out, _ = run(capsys, "status", "--state", str(big))
        assert code == 0
        assert "600 instances: list them with --instances" in out
        assert not re.search(r"^svc-\d+:default:\d+ ", out, re.M)
        assert len(out.splitlines()) < 250
        code, out, _ = run(capsys, "status", "--state", str(big), "--instances")
        assert len(re.findall(r"^svc-\d+:default:\d+ ", out, re.M)) == 600

    def test_filter_by_node(self, demo: Path, capsys: pytest.CaptureFixture[str]) -> None:
        code, out, _ = run(capsys, "status", "--state", str(demo), "--node", "edge-2")
        assert code == 0
        assert _instances(out) == [
            "com.example.telemetry:default:0",
            "com.example.telemetry:default:1",
            "com.example.vision:default:0",
        ]
        assert "Nodes (1, reserved/capacity)" in out
        assert _whole_at_line_start(out, "edge-2") and not _whole_at_line_start(out, "edge-1")

    def test_filter_by_service_with_or_without_subject(
        self, demo: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        want = [f"com.example.logger:default:{i}" for i in range(3)]
        for svc in ("com.example.logger", "com.example.logger:default"):
            code, out, _ = run(capsys, "status", "--state", str(demo), "--service", svc)
            assert code == 0 and _instances(out) == want
        code, out, _ = run(
            capsys,
            "status",
            "--state",
            str(demo),
            "--service",
            "com.example.logger",
            "--service",
            "com.example.nav",
        )
        assert _instances(out) == [*want, "com.example.nav:default:0"]

    def test_filter_by_instance_state_and_failed(
        self, demo: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        path = demo / "out" / "status.json"
        doc = json.loads(path.read_text())
        iid, record = next(
            (i, r) for i, r in doc["instances"].items() if r["itemId"] == "com.example.kiosk"
        )
        doc["instances"][iid] = {**record, "state": "failed", "reason": "exit code 3"}
        path.write_text(json.dumps(doc))
        code, out, _ = run(capsys, "status", "--state", str(demo), "--in-state", "failed")
        assert code == 0 and _instances(out) == ["com.example.kiosk:default:0"]
        assert "com.example.kiosk:default:0 on edge-1: exit code 3" in out
        code, out, _ = run(capsys, "status", "--state", str(demo), "--failed")
        assert _instances(out) == ["com.example.kiosk:default:0"]
        code, out, _ = run(capsys, "status", "--state", str(demo), "--in-state", "pending")
        assert len(_instances(out)) == 9
        code, out, _ = run(capsys, "status", "--state", str(demo), "--in-state", "active")
        assert _instances(out) == [] and "Instances (0)" in out

    def test_unknown_filter_values_are_usage_errors_with_suggestions(
        self, demo: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        code, _, err = run(capsys, "status", "--state", str(demo), "--node", "edge2")
        assert code == EXIT_USAGE and "did you mean 'edge-2'" in err
        code, _, err = run(capsys, "status", "--state", str(demo), "--service", "com.example.lgger")
        assert code == EXIT_USAGE and "did you mean 'com.example.logger'" in err
        code, _, err = run(capsys, "status", "--state", str(demo), "--in-state", "activ")
        assert code == EXIT_USAGE and "did you mean 'active'" in err

    def test_report_ages_from_reported_at_or_the_actual_file(
        self, demo_copy: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        now = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
        node = demo_copy / "nodes" / "edge-1.yaml"
        node.write_text(node.read_text() + "reportedAt: 2026-03-01T11:57:00Z\n")
        (demo_copy / "actual").mkdir(exist_ok=True)
        actual = demo_copy / "actual" / "edge-2.yaml"
        actual.write_text(
            "apiVersion: reconciler/v1\nkind: ActualState\nnodeId: edge-2\nrevision: 1\n"
            "instances: {}\n"
        )
        two_hours_before = now.timestamp() - 2 * 3600
        with freeze_time(now):
            assert run(capsys, "reconcile", "--state", str(demo_copy))[0] == 0
            os.utime(actual, (two_hours_before, two_hours_before))
            doc = json.loads((demo_copy / "out" / "status.json").read_text())
            assert doc["nodes"]["edge-1"]["reportedAt"] == "2026-03-01T11:57:00Z"
            assert "reportedAt" not in doc["nodes"]["edge-2"]
            code, out, _ = run(capsys, "status", "--state", str(demo_copy))
        assert code == 0
        ages = {line.split()[0]: line.split()[-1] for line in out.splitlines() if "│" in line}
        assert ages["edge-1"] == "3m"  # its agent's reportedAt
        assert ages["edge-2"] == "2h*"  # the time of actual/edge-2.yaml
        assert ages["edge-3"] == "-"  # neither
        assert "* the age of the node's actual/ file" in " ".join(out.split())

    def test_when_the_report_was_made(self) -> None:
        doc: dict[str, Any] = {
            "nodes": {},
            "instances": {},
            "failures": [],
            "alerts": [],
            "invalidInputs": {},
        }
        console = Console(file=io.StringIO(), width=WIDTH, color_system=None)
        made = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC).timestamp()
        render_status(console, doc, made_at=made, now=made + 5 * 60 + 7, select=StatusFilter())
        first = console.file.getvalue().splitlines()[0]  # type: ignore[attr-defined]
        assert first == "Status made 2026-03-01 12:00:00 UTC (5m ago, by the last reconcile)"


def _instances(out: str) -> list[str]:
    """The instance column of the instance table (the rows under its header)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Instances ("))
    rows = []
    for line in lines[start + 3 :]:
        if not line.strip() or not re.match(r"^\S+:\S+:\d+\s", line):
            if not line.startswith(" "):
                break
            continue
        rows.append(line.split()[0])
    return rows


def test_plan_groups_lines_by_node_then_service(
    demo_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "plan", "--state", str(demo_copy))
    assert code == 2
    shown = out.split("\n\n", 1)[1].splitlines()  # after the placements table
    assert shown == [
        "edge-1",
        "  com.example.guest:default",
        "    + start 0 1.0.0 on runc-1 (new)",
        "  com.example.kiosk:default",
        "    + start 0 1.0.0 on runc-1 (new)",
        "  com.example.logger:default",
        "    + start 0 1.0.0 on runc-1 (new)",
        "    + start 1 1.0.0 on runc-1 (new)",
        "    + start 2 1.0.0 on runc-1 (new)",
        "  com.example.nav:default",
        "    + start 0 1.2.0 on runc-1 (new)",
        "  com.example.shop.web:default",
        "    + start 0 1.0.0 on runc-1 (new)",
        "edge-2",
        "  com.example.telemetry:default",
        "    + start 0 0.9.1 on runc-2 (new)",
        "    + start 1 0.9.1 on runc-2 (new)",
        "  com.example.vision:default",
        "    + start 0 2.0.0 on runc-2 (new)",
        "Plan: 10 to start, 0 to stop; 0 unplaceable.",
    ]


def test_a_large_plan_leaves_out_the_placements_table_unless_asked(
    big: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "plan", "--state", str(big))
    assert code == 2
    assert "Placements" not in out and out.startswith("node-")
    code, out, _ = run(capsys, "plan", "--state", str(big), "--placements")
    assert code == 2 and out.startswith("Placements")


def _two_runtime_unit(root: Path) -> Path:
    """Node M has runtimes runc (arm64) and runx (x86_64); node S only runc (x86_64).
    Service app accepts runc only and wants x86_64: on M each runtime filter passes on some
    runtime (RuntimeType on runc, Platform on runx) and none passes both."""
    (root / "nodes").mkdir(parents=True)
    (root / "desired").mkdir()
    (root / "unit.yaml").write_text("apiVersion: reconciler/v1\nkind: UnitConfig\nversion: 1.0.0\n")
    runtimes = {
        "M": "  - {id: runc, type: runc, platform: {architecture: arm64, os: linux}}\n"
        "  - {id: runx, type: runx, platform: {architecture: x86_64, os: linux}}\n",
        "S": "  - {id: runc, type: runc, platform: {architecture: x86_64, os: linux}}\n",
    }
    for nid, rts in runtimes.items():
        (root / "nodes" / f"{nid}.yaml").write_text(
            f"apiVersion: reconciler/v1\nkind: Node\nid: {nid}\ntype: edge\nmaxDMIPS: 1000\n"
            f"totalRAM: 1Gi\nruntimes:\n{rts}"
        )
    (root / "desired" / "app.yaml").write_text(
        "apiVersion: reconciler/v1\nkind: Service\nid: app\nversion: 1.0.0\ninstances: 3\n"
        "runtimes: [runc]\nimage: {rootfs: /r, cmd: [/bin/true], "
        "platform: {architecture: x86_64, os: linux}}\n"
        "requestedResources: {cpu: 400}\n"
    )
    return root


class TestExplain:
    def test_per_runtime_breakdown_where_every_filter_column_is_ok(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        state = _two_runtime_unit(tmp_path / "s")
        code, out, _ = run(capsys, "explain", "app:0", "--state", str(state), "--json")
        assert code == 0
        doc = json.loads(out)
        m = next(n for n in doc["nodes"] if n["nodeId"] == "M")
        assert all(cell["pass"] for cell in m["filters"].values())  # every column ok ...
        assert m["droppedBy"] is not None  # ... and yet dropped
        assert m["runtimes"]["runc"]["Platform"] == {
            "pass": False,
            "reason": "architecture arm64 is not x86_64",
        }
        assert m["runtimes"]["runc"]["RuntimeType"]["pass"]
        assert m["runtimes"]["runx"]["RuntimeType"] == {
            "pass": False,
            "reason": "type runx not accepted (the service accepts runc)",
        }
        assert m["runtimes"]["runx"]["Platform"]["pass"]

        code, out, _ = run(capsys, "explain", "app:0", "--state", str(state))
        lines = out.splitlines()
        start = lines.index("Per runtime (nodes with several runtimes)")
        assert lines[start + 1 : start + 4] == [
            "  M",
            "    runc: fails Platform (architecture arm64 is not x86_64)",
            "    runx: fails RuntimeType (type runx not accepted (the service accepts runc))",
        ]
        assert "  S" not in lines[start:]  # one runtime: the matrix says it all

    def test_explain_an_item_lists_its_instances(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        state = _two_runtime_unit(tmp_path / "s")  # S fits two instances of app (1000/400)
        code, out, _ = run(capsys, "explain", "app", "--state", str(state))
        assert code == 0
        assert out.splitlines()[0] == "app: 3 instance(s): 2 placed, 1 unplaceable"
        rows = {
            line.split("│")[0].strip(): [c.strip() for c in line.split("│")[1:]]
            for line in out.splitlines()
            if line.startswith("app:default:")
        }
        assert rows["app:default:0"] == ["placed", "on S runtime runc"]
        assert rows["app:default:1"] == ["placed", "on S runtime runc"]
        assert rows["app:default:2"][0] == "unplaceable"
        assert rows["app:default:2"][1].startswith("0/2 nodes feasible")

        code, out, _ = run(capsys, "explain", "app:default", "--state", str(state), "--json")
        doc = json.loads(out)
        assert [i["label"] for i in doc["instances"]] == [f"app:default:{i}" for i in range(3)]
        assert [i["state"] for i in doc["instances"]] == ["placed", "placed", "unplaceable"]
        assert doc["instances"][0]["placement"]["nodeId"] == "S"
        assert doc["instances"][2]["failure"]["summary"].startswith("app:default:2: 0/2")

    @pytest.mark.parametrize(
        ("typed", "meant"),
        [("ap:0", "'app:0'"), ("app:defalt:1", "'app:default:1'"), ("apq", "'app'")],
    )
    def test_misspelled_ids_get_suggestions(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], typed: str, meant: str
    ) -> None:
        state = _two_runtime_unit(tmp_path / "s")
        code, _, err = run(capsys, "explain", typed, "--state", str(state))
        assert code == 1
        assert f"no desired instance {typed!r}; did you mean {meant}" in err

    @pytest.mark.parametrize(
        ("typed", "meant"),
        [
            ("telemetri", "'com.example.telemetry'"),  # the last part misspelt
            ("logr", "'com.example.logger'"),
            ("telemetr", "'com.example.telemetry'"),  # a part of the id
            ("nav:defualt", "'com.example.nav:default'"),
        ],
    )
    def test_a_misspelt_last_part_of_a_dotted_id_gets_the_whole_id(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], typed: str, meant: str
    ) -> None:
        state = tmp_path / "s"
        shutil.copytree(DEMO, state, ignore=shutil.ignore_patterns("out", "checkpoint", ".lock"))
        code, _, err = run(capsys, "explain", typed, "--state", str(state))
        assert code == 1
        assert f"no desired instance {typed!r}; did you mean {meant}?" in err


def _explanation(failing: dict[str, int], placed_on: str | None) -> Any:
    """An explanation whose node ``n`` fails the first ``failing[n]`` of three filters (the
    matrix selection reads only the rows and the placement)."""
    from reconciler.placement.balancer import Explanation

    rows = tuple(
        (n, tuple("why" if k < bad else None for k in range(3)), "A" if bad else None)
        for n, bad in sorted(failing.items())
    )
    placement = cast(Any, SimpleNamespace(node_id=placed_on)) if placed_on else None
    return Explanation(cast(Any, None), ("A", "B", "C"), rows, placement, None)


def test_the_matrix_keeps_the_placed_node_then_the_nodes_failing_fewest_filters() -> None:
    from reconciler.cli.render import matrix_rows

    failing = {f"n{k:02d}": 2 + k % 2 for k in range(30)}
    failing.update(n05=1, n17=1, n20=0)
    shown, hidden = matrix_rows(_explanation(failing, None), 3)
    assert [r[0] for r in shown] == ["n05", "n17", "n20"]  # node order among the closest
    assert len(hidden) == 27 and {r[0] for r in hidden}.isdisjoint({"n05", "n17", "n20"})
    # the node it is placed on comes first, whatever it fails (a held instance's node)
    failing["n29"] = 3
    shown, _ = matrix_rows(_explanation(failing, "n29"), 2)
    assert [r[0] for r in shown] == ["n20", "n29"]
    # within the limit, or without one: every row, in node order
    shown, hidden = matrix_rows(_explanation(failing, None), None)
    assert [r[0] for r in shown] == sorted(failing) and hidden == []
    assert matrix_rows(_explanation(failing, None), 30)[1] == []


def test_explain_takes_a_desired_file_for_the_item_it_holds(
    demo: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A newcomer types the file they edited: its name, its path under the state directory,
    relative to the working directory or absolute, all name the item the file holds."""
    header = "com.example.nav:default: 1 instance(s): 1 placed"
    monkeypatch.chdir(demo.parent)
    for typed in (
        "navigation",
        "navigation.yaml",
        "desired/navigation.yaml",
        f"{demo.name}/desired/navigation.yaml",
        str(demo / "desired" / "navigation.yaml"),
    ):
        code, out, err = run(capsys, "explain", typed, "--state", str(demo))
        assert (code, out.splitlines()[0]) == (0, header), (typed, err)
    # a node's file, or a name no desired file has, names no item
    for typed in ("nodes/edge-1.yaml", "edge-1", "navigatio"):
        code, _, err = run(capsys, "explain", typed, "--state", str(demo))
        assert code == 1 and "no desired instance" in err, typed
