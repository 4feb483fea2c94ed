"""Log lines carry a timestamp; ``--log-format json`` gives one JSON object a line (issue 30)."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from reconciler.cli.commands import main

STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"


def _broken(demo_copy: Path) -> Path:
    """The demo with one invalid desired file (plan --allow-invalid logs it as a warning)."""
    nav = demo_copy / "desired" / "navigation.yaml"
    nav.write_text(nav.read_text().replace("instances: 1", "instances: many"))
    return nav


def test_text_log_lines_start_with_a_utc_timestamp(
    demo_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nav = _broken(demo_copy)
    main(["plan", "--allow-invalid", "--state", str(demo_copy)])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if str(nav) in line]
    assert lines, err
    for line in lines:
        assert re.match(rf"^{STAMP} WARNING reconciler: {re.escape(str(nav))}:6:12: ", line), line


def test_json_log_lines_are_objects(demo_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nav = _broken(demo_copy)
    main(["--log-format", "json", "plan", "--allow-invalid", "--state", str(demo_copy)])
    err = capsys.readouterr().err
    docs = [json.loads(line) for line in err.splitlines() if line.strip()]
    assert docs
    mine = [d for d in docs if str(nav) in d["message"]]
    assert mine, docs
    for d in mine:
        assert set(d) == {"time", "level", "logger", "message"}
        assert re.fullmatch(STAMP, d["time"])
        assert (d["level"], d["logger"]) == ("warning", "reconciler")


def test_json_carries_the_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--log-format", "json", "schema", "--kind", "Node"]) == 0
    capsys.readouterr()
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("reconciler.test").exception("it failed: %s", "x")
    doc = json.loads(capsys.readouterr().err.strip())
    assert doc["message"] == "it failed: x" and doc["level"] == "error"
    assert "ValueError: boom" in doc["exception"]


def test_unknown_log_format_names_the_accepted_values(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--log-format", "xml", "validate"]) == 64
    assert "'text', 'json'" in capsys.readouterr().err
