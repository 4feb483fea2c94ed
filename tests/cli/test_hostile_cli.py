"""Faults around the command line, each in the form it was found: a command whose standard
output cannot be written, or whose out/ is a symlink, ends with one line on stderr and exit 1,
never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def run(state: Path, *args: str, stdout: int | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "reconciler", *args, "--state", str(state)],
        stdout=stdout if stdout is not None else subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def reconciled(demo_copy: Path) -> Path:
    assert run(demo_copy, "reconcile").returncode == 0
    return demo_copy


@pytest.mark.parametrize(
    "command", [["reconcile"], ["plan"], ["status"], ["plan", "--json"], ["status", "--json"]]
)
def test_a_full_stdout_is_one_line_and_exit_1(reconciled: Path, command: list[str]) -> None:
    with open("/dev/full", "w") as full:
        proc = run(reconciled, *command, stdout=full.fileno())
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "error: writing to standard output: No space left on device"
    ]
    assert proc.returncode == 1


@pytest.mark.parametrize("command", [["plan"], ["status", "--json"], ["validate"]])
def test_a_reader_that_went_away_ends_the_command_quietly(
    reconciled: Path, command: list[str]
) -> None:
    read, write = os.pipe()
    os.close(read)  # every write gets EPIPE
    try:
        proc = run(reconciled, *command, stdout=write)
    finally:
        os.close(write)
    assert proc.stderr == ""
    assert proc.returncode == 1


def test_out_as_a_symlink_is_refused_with_one_line(reconciled: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    (reconciled / "out").rename(elsewhere)
    (reconciled / "out").symlink_to(elsewhere)
    before = sorted(p.name for p in elsewhere.iterdir())

    proc = run(reconciled, "reconcile")
    assert "Traceback" not in proc.stderr
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"error: {reconciled / 'out'} is a symlink; refusing to use it"

    proc = run(reconciled, "status")
    assert "Traceback" not in proc.stderr
    assert proc.returncode == 1
    assert "is a symlink" in proc.stderr and proc.stdout == ""  # not read through it
    assert sorted(p.name for p in elsewhere.iterdir()) == before


def test_checkpoint_as_a_symlink_is_refused_and_nothing_written_through_it(
    reconciled: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    (reconciled / "checkpoint").rename(elsewhere)
    (reconciled / "checkpoint").symlink_to(elsewhere)
    before = {p: p.read_bytes() for p in elsewhere.rglob("*") if p.is_file()}
    (reconciled / "desired" / "navigation.yaml").unlink()  # a change to write

    proc = run(reconciled, "reconcile")
    assert "Traceback" not in proc.stderr
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        f"error: {reconciled / 'checkpoint'} is a symlink; refusing to use it"
    )
    assert {p: p.read_bytes() for p in elsewhere.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize(
    ("content", "fragment"),
    [(b"{}", "not a status report"), (b"[1]", "not a status report"), (b"{", "Expecting")],
)
def test_a_damaged_status_report_is_one_line(
    reconciled: Path, content: bytes, fragment: str
) -> None:
    (reconciled / "out" / "status.json").write_bytes(content)
    proc = run(reconciled, "status")
    assert "Traceback" not in proc.stderr
    assert proc.returncode == 1
    assert fragment in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_status_json_as_a_directory_is_one_line(reconciled: Path) -> None:
    (reconciled / "out" / "status.json").unlink()
    (reconciled / "out" / "status.json").mkdir()
    proc = run(reconciled, "status")
    assert "Traceback" not in proc.stderr
    assert proc.returncode == 1
    assert "is not a regular file" in proc.stderr
