"""The plain console (reconciler.cli.plainconsole): ``plan`` prints through it instead of rich
when stdout is no terminal, and must print the very bytes rich's console would."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import pytest
from rich.console import Console

from reconciler.cli import commands
from reconciler.cli.plainconsole import PlainConsole, no_terminal, plain_console
from reconciler.cli.render import render_placements, render_plan
from reconciler.controller.configs import default_config_builder
from reconciler.controller.reconcile import ReconcileOptions, compute_once
from tests.support.paths import DEMO

_RICH_ENV = ("COLUMNS", "FORCE_COLOR", "TTY_COMPATIBLE", "NO_COLOR", "TERM")


class _Pipe(io.StringIO):
    """Standard output that is no terminal."""


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for name in _RICH_ENV:
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"COLUMNS": "100"},
        {"COLUMNS": "7"},
        {"COLUMNS": "wide"},
        {"FORCE_COLOR": ""},
        {"TTY_COMPATIBLE": "0"},
        {"TTY_COMPATIBLE": "0", "FORCE_COLOR": "1"},
        {"NO_COLOR": "1"},
        {"TERM": "dumb"},
    ],
)
def test_plain_console_is_the_console_rich_gives_a_pipe(
    clean_env: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    for name, value in env.items():
        clean_env.setenv(name, value)
    clean_env.setattr("sys.stdout", _Pipe())
    plain = plain_console(commands._PIPED_WIDTH)
    rich = commands._console()
    assert plain is not None
    assert not rich.is_terminal
    assert (plain.width, plain.color_system, plain.no_color) == (
        rich.width,
        rich.color_system,
        rich.no_color,
    )
    assert isinstance(commands._text_console(), PlainConsole)


@pytest.mark.parametrize(
    ("env", "stream"),
    [
        ({}, _Tty()),  # a terminal
        ({"FORCE_COLOR": "1"}, _Pipe()),  # rich colors a pipe
        ({"TTY_COMPATIBLE": "1"}, _Pipe()),
        ({"COLUMNS": "0"}, _Pipe()),  # rich prints an empty line as nothing at width 0
    ],
)
def test_rich_keeps_what_may_not_be_plain(
    clean_env: pytest.MonkeyPatch, env: dict[str, str], stream: io.StringIO
) -> None:
    for name, value in env.items():
        clean_env.setenv(name, value)
    clean_env.setattr("sys.stdout", stream)
    assert plain_console(commands._PIPED_WIDTH) is None
    assert isinstance(commands._text_console(), Console)


@pytest.mark.parametrize(
    ("env", "stream", "expected"),
    [
        ({}, _Pipe(), True),
        ({}, _Tty(), False),
        ({"FORCE_COLOR": "1"}, _Pipe(), False),
        ({"FORCE_COLOR": ""}, _Tty(), True),
        ({"TTY_COMPATIBLE": "0"}, _Tty(), True),
        ({"TTY_COMPATIBLE": "1"}, _Pipe(), False),
    ],
)
def test_no_terminal_agrees_with_rich(
    clean_env: pytest.MonkeyPatch, env: dict[str, str], stream: io.StringIO, expected: bool
) -> None:
    for name, value in env.items():
        clean_env.setenv(name, value)
    assert no_terminal(stream) is expected
    assert Console(file=stream).is_terminal is not expected


@pytest.mark.parametrize(
    "objects",
    [
        (),
        ("No instance is placed.",),
        ("a", "b"),
        ("[bold]markup[/bold] gone",),
        ("an emoji :smile: code",),
        ("a\ttab",),
        (42,),
    ],
)
def test_print_writes_what_rich_writes(clean_env: pytest.MonkeyPatch, objects: Any) -> None:
    plain, rich = _Pipe(), _Pipe()
    clean_env.setattr("sys.stdout", plain)
    PlainConsole(80).print(*objects)
    clean_env.setattr("sys.stdout", rich)
    Console(width=80, highlight=False, soft_wrap=True).print(*objects)
    assert plain.getvalue() == rich.getvalue()


@pytest.mark.parametrize("width", [240, 60, 20])
def test_plan_views_print_the_same_bytes_as_with_rich(
    clean_env: pytest.MonkeyPatch, width: int
) -> None:
    comp = compute_once(DEMO, ReconcileOptions(configs=default_config_builder()), read_only=True)
    assert comp.plan.actions  # the demo has something to show

    def show(console: Any, out: io.StringIO) -> str:
        clean_env.setattr("sys.stdout", out)
        render_placements(console, comp.result)
        console.print()
        render_plan(console, comp.plan)
        return out.getvalue()

    rich = show(Console(highlight=False, soft_wrap=True, width=width), _Pipe())
    assert show(PlainConsole(width), _Pipe()) == rich
