"""The command line: validate, schema, exit codes, help."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from reconciler.cli import EXIT_USAGE, main
from reconciler.yamlsafe import parse_yaml

from .conftest import DEMO, EXAMPLES


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
        code, out, _ = run(capsys, "validate", "--state", str(demo_copy))
        assert code == 1
        assert f"{nav}:6:12: error: instances: Input should be a valid integer" in out
        assert f"{node}:6:1: error: unknown field 'colour'" in out

    def test_json_output(self, demo_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
        (demo_copy / "desired" / "x.yaml").write_text("kind: Service\n")
        code, out, _ = run(capsys, "validate", "--state", str(demo_copy), "--json")
        report = json.loads(out)
        assert code == 1 and report["formatVersion"] == 1 and report["valid"] is False
        assert report["counts"]["services"] == 4
        assert {e["path"] for e in report["errors"]} == {str(demo_copy / "desired" / "x.yaml")}


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
        code, out, _ = run(capsys, "--help")
        assert code == 0
        for command in ("validate", "schema"):
            assert command in out
            c, sub, _ = run(capsys, command, "--help")
            assert c == 0 and "--state" in sub and len(sub.splitlines()) > 5

    def test_missing_state_dir_is_an_error(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        code, _, err = run(capsys, "validate", "--state", str(tmp_path / "nope"))
        assert code == 1 and "does not exist" in err


def _all_input_files(state: Path) -> list[tuple[str, Path]]:
    files = [("UnitConfig", state / "unit.yaml")] if (state / "unit.yaml").exists() else []
    files += [("Service", p) for p in sorted((state / "desired").rglob("*.yaml"))]
    files += [("Node", p) for p in sorted((state / "nodes").glob("*.yaml"))]
    files += [("ActualState", p) for p in sorted((state / "actual").glob("*.yaml"))]
    return files


class TestSchema:
    def test_schemas_validate_every_bundled_file(self, capsys: pytest.CaptureFixture[str]) -> None:
        code, out, _ = run(capsys, "schema")
        assert code == 0
        schemas = json.loads(out)["schemas"]
        assert set(schemas) == {"UnitConfig", "Service", "Node", "ActualState"}
        checked = 0
        for state in (DEMO, *EXAMPLES):
            for kind, path in _all_input_files(state):
                Draft202012Validator.check_schema(schemas[kind])
                errors = list(
                    Draft202012Validator(schemas[kind]).iter_errors(
                        parse_yaml(path.read_bytes()).data
                    )
                )
                assert errors == [], (path, errors[0].message)
                checked += 1
        assert checked >= 15

    def test_schema_rejects_what_the_loader_rejects(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        _, out, _ = run(capsys, "schema", "--kind", "Service")
        schema = json.loads(out)
        validator = Draft202012Validator(schema)
        base = parse_yaml((DEMO / "desired" / "navigation.yaml").read_bytes()).data
        assert validator.is_valid(base)
        for bad in ({"colour": "red"}, {"instances": -1}, {"id": "../x"}, {"version": "1.0"}):
            assert not validator.is_valid({**base, **bad}), bad


def test_example_copy_keeps_demo_untouched(demo_copy: Path) -> None:
    shutil.rmtree(demo_copy / "desired")
    assert (DEMO / "desired" / "navigation.yaml").exists()


def _run_in_pty(args: list[str], env: dict[str, str]) -> bytes:
    """Run the CLI on a pseudo-terminal, as a person would, and return what it printed."""
    import os
    import pty
    import subprocess
    import sys

    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "reconciler", *args],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env=env,
        close_fds=True,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    proc.wait(timeout=60)
    os.close(leader)
    return b"".join(chunks)


class TestColor:
    def test_colors_on_a_terminal_and_never_with_no_color(self) -> None:
        import os

        env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
        env["TERM"] = "xterm-256color"
        colored = _run_in_pty(["validate", "--state", str(DEMO)], env)
        assert b"\x1b[" in colored and b"valid" in colored
        plain = _run_in_pty(["validate", "--state", str(DEMO)], {**env, "NO_COLOR": "1"})
        assert b"valid" in plain and b"\x1b[3" not in plain  # no color codes

    def test_no_color_when_piped(self, capsys: pytest.CaptureFixture[str]) -> None:
        code, out, _ = run(capsys, "validate", "--state", str(DEMO))
        assert code == 0 and "\x1b[" not in out
