"""The program's own process (reconciler.cli.program): a command that runs once keeps the
cyclic collector off from its start to the process's end, so a run that allocated millions of
objects with the collector paused is not followed by a collection that walks them all."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.cli import commands, program
from reconciler.controller import reconcile as reconcile_module


@pytest.fixture
def as_the_program(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bool]]:
    """The CLI as ``python -m reconciler`` runs it, recording whether the collector was on
    whenever a reconcile run starts and after it returns."""
    seen: list[bool] = []
    real = reconcile_module.reconcile

    def recording(*args: object, **kwargs: object) -> object:
        seen.append(gc.isenabled())
        report = real(*args, **kwargs)  # type: ignore[arg-type]
        seen.append(gc.isenabled())
        return report

    monkeypatch.setattr(reconcile_module, "reconcile", recording)
    monkeypatch.setattr(program, "_running", True)
    was = gc.isenabled()
    try:
        yield seen
    finally:
        gc.unfreeze()
        if was:
            gc.enable()


@pytest.mark.parametrize("command", [["reconcile"], ["rebalance"]])
def test_the_commands_that_write_run_with_the_collector_off_to_the_end(
    demo_copy: Path, as_the_program: list[bool], command: list[str]
) -> None:
    assert gc.isenabled()
    code = commands.main([*command, "--state", str(demo_copy)])
    assert code == 0
    assert as_the_program == [False, False]  # off before the run and after it
    assert not gc.isenabled()  # (the process would end here)


def test_outside_the_program_the_collector_is_left_as_it_was(demo_copy: Path) -> None:
    assert gc.isenabled()
    assert commands.main(["reconcile", "--state", str(demo_copy)]) == 0
    assert gc.isenabled()
