"""``plan`` is a gate: an invalid input file fails it, unless ``--allow-invalid``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from reconciler.cli.commands import EXIT_ERROR, main
from tests.support.paths import DEMO, EXAMPLES

BROKEN = "apiVersion: reconciler/v1\nkind: Service\nid: [broken\n"  # "[" never closed


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def unit(tmp_path: Path) -> Path:
    copy = tmp_path / "unit"
    shutil.copytree(DEMO, copy)
    return copy


@pytest.mark.parametrize("state", [DEMO, *EXAMPLES], ids=lambda p: p.name)
def test_every_bundled_unit_validates_and_plans(
    state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "validate", "--state", str(state))
    assert code == 0, out
    assert ": error: " not in out
    code, out, err = run(capsys, "plan", "--state", str(state))
    assert code in (0, 2), out + err  # never 3: every instance of a bundled unit is placed


def test_an_invalid_file_fails_the_plan_and_is_named(
    unit: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, _ = run(capsys, "plan", "--state", str(unit))
    assert code == 2  # the demo, valid: changes, every instance placed
    broken = unit / "desired" / "telemetry.yaml"
    broken.write_text(BROKEN)
    other = unit / "nodes" / "edge-2.yaml"
    other.write_text(other.read_text() + "colour: red\n")
    code, out, err = run(capsys, "plan", "--state", str(unit))
    assert code == EXIT_ERROR
    # line 3 is "id: [broken" (11 characters): the "]" is missing at column 12
    assert f"{broken}:3:12: error: invalid YAML: '[' opened at 3:5 is not closed" in err
    assert f"{other}:" in err and "unknown field 'colour'" in err
    assert f"2 invalid input file(s): {broken}, {other}" in err  # sorted by path
    assert "--allow-invalid" in err
    assert "Plan:" not in out  # no plan is shown for inputs that are not all valid


def test_allow_invalid_plans_with_the_last_good_versions(
    unit: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["reconcile", "--state", str(unit)]) == 0  # records the last good versions
    capsys.readouterr()
    code, before, _ = run(capsys, "plan", "--state", str(unit), "--json")
    assert code == 2
    (unit / "desired" / "telemetry.yaml").write_text(BROKEN)
    code, after, err = run(capsys, "plan", "--state", str(unit), "--json", "--allow-invalid")
    assert code == 2  # as before the file broke: the telemetry service keeps its instances
    old, new = json.loads(before), json.loads(after)
    assert new["actions"] == old["actions"]
    assert "telemetry.yaml" in err  # still reported, as a warning on stderr


def test_json_lists_invalid_files_and_the_plan_is_not_complete(
    unit: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "plan", "--state", str(unit), "--json")
    doc = json.loads(out)
    assert code == 2 and doc["complete"] is True
    assert "invalidFiles" not in doc  # valid inputs: the very document out/plan.json holds
    broken = unit / "desired" / "telemetry.yaml"
    broken.write_text(BROKEN)
    for extra, want in (((), EXIT_ERROR), (("--allow-invalid",), 2)):
        code, out, _ = run(capsys, "plan", "--state", str(unit), "--json", *extra)
        doc = json.loads(out)
        assert code == want
        assert doc["complete"] is False
        assert doc["invalidFiles"] == [str(broken)]
        assert [(d["path"], d["line"], d["col"]) for d in doc["invalidInputs"]] == [
            (str(broken), 3, 12)
        ]


def test_a_warning_alone_does_not_fail_the_plan(
    unit: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a node whose resourcesFile is missing is a warning (it has no resources), not an error
    node = unit / "nodes" / "edge-1.yaml"
    text = node.read_text()
    assert "resourcesFile: resources/edge-1.json" in text
    node.write_text(text.replace("resources/edge-1.json", "resources/missing.json"))
    code, out, err = run(capsys, "plan", "--state", str(unit), "--json")
    doc = json.loads(out)
    assert code in (2, 3), err
    assert doc["invalidFiles"] == []
    assert [d["severity"] for d in doc["invalidInputs"]] == ["warning"]
