"""Start-up: the command line loads what a command needs, not everything (issue 30).

Not timed (benchmarks/cli.py measures): these check *what* is imported, in a fresh interpreter,
so that an eager import of etcd, HTTP, grpc, metrics, JSON Schema or rich at the top of a CLI
module cannot come back unnoticed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler.cli import agent_report, commands
from reconciler.controller.ha import INPUT_SCOPES
from reconciler.model.documents import KINDS
from reconciler.model.schema import RESOURCES_FILE
from tests.support.paths import DEMO

HEAVY = ("etcd3gw", "requests", "jsonschema", "rich", "prometheus_client", "grpc", "watchfiles")
"""Never loaded by ``import reconciler.cli`` (nor by ``--help``)."""


def _modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code`` (stdout and stderr are
    pipes, and no variable makes rich take them for terminals)."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        env=env,
    )
    return set(json.loads(proc.stdout.splitlines()[-1]))


def _loaded(modules: set[str], roots: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in roots)


def test_import_cli_loads_no_heavy_library() -> None:
    mods = _modules_after("import reconciler.cli")
    assert _loaded(mods, HEAVY) == []
    assert "pydantic" not in mods  # not even the documents
    assert "reconciler.model.documents" not in mods


def test_help_loads_no_heavy_library() -> None:
    mods = _modules_after(
        "import contextlib, io\n"
        "from reconciler.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert main(['--help']) == 0"
    )
    assert _loaded(mods, (*HEAVY, "pydantic", "yaml", "ruamel")) == []


@pytest.mark.parametrize("command", ["validate", "plan"])
def test_validate_and_plan_load_no_store_or_agent(command: str) -> None:
    """validate and plan read files: no etcd client, HTTP, grpc, metrics or watcher."""
    mods = _modules_after(
        "import contextlib, io\n"
        "from reconciler.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    main([{command!r}, '--state', {str(DEMO)!r}])"
    )
    assert "reconciler.io.loader" in mods  # it did run
    assert _loaded(mods, tuple(h for h in HEAVY if h != "rich")) == []
    assert not any(m.startswith(("reconciler.stores.etcd", "reconciler.agent.")) for m in mods)


def test_validate_does_not_load_rich() -> None:
    mods = _modules_after(
        "import contextlib, io\n"
        "from reconciler.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    main(['validate', '--state', {str(DEMO)!r}])"
    )
    assert _loaded(mods, ("rich",)) == []


def test_device_pool_policies_known_without_importing_placement() -> None:
    """The sharing policies are registered before the documents first validate a pool, though
    the package no longer imports them eagerly."""
    mods = _modules_after(
        "from reconciler.model.policies import policy_names\n"
        "assert {'exclusive', 'fractional'} <= set(policy_names()), policy_names()"
    )
    assert "reconciler.placement.sharing" in mods
    assert "reconciler.placement.sharing" not in _modules_after("import reconciler")


def test_constants_copied_to_avoid_imports_stay_equal() -> None:
    from reconciler.agent.deviceplugin.manager import DEFAULT_PLUGIN_DIR

    assert sorted([*KINDS, RESOURCES_FILE]) == commands.SCHEMA_KINDS
    assert tuple(INPUT_SCOPES) == commands._INPUT_SCOPES
    assert Path(DEFAULT_PLUGIN_DIR) == agent_report.DEFAULT_PLUGIN_DIR


@pytest.mark.parametrize("command", ["validate", "plan"])
def test_validate_and_plan_of_clean_files_load_no_rich_nor_ruamel(command: str) -> None:
    """On the demo (valid files, output to a pipe): no rich (plan's text is laid out by
    .textout and written through .plainconsole; rich only paints a terminal's colors), no
    ruamel.yaml (libyaml reads clean YAML; the pure-Python parser only locates problems),
    and no second parse of a node file for its resourcesFile's position."""
    mods = _modules_after(
        "import contextlib, io\n"
        "from reconciler.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        f"    main([{command!r}, '--state', {str(DEMO)!r}])\n"
        "assert out.getvalue(), 'no output'"
    )
    assert "reconciler.io.loader" in mods  # it did run
    assert _loaded(mods, ("rich",)) == []
    assert _loaded(mods, ("ruamel",)) == []


def _program_then(argv: list[str], in_process: list[str]) -> tuple[int, bool, int, bool]:
    """In a fresh interpreter: ``main(in_process)`` as a test calls it, then ``main()`` on
    ``argv`` as the program runs; the freeze count and whether the collector runs after each."""
    script = (
        "import contextlib, gc, io, sys\n"
        "from reconciler.cli import main\n"
        f"sys.argv = ['reconciler', *{argv!r}]\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    main({in_process!r})\n"
        "first = (gc.get_freeze_count(), gc.isenabled())\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main()\n"
        "print(*first, gc.get_freeze_count(), gc.isenabled())"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    frozen, enabled, frozen_after, enabled_after = proc.stdout.split()
    return int(frozen), enabled == "True", int(frozen_after), enabled_after == "True"


@pytest.mark.parametrize("command", ["validate", "plan"])
def test_a_one_shot_command_as_the_program_runs_without_the_collector(command: str) -> None:
    """As the program (main() without argv), plan and validate run with the cyclic collector
    off (their imports and reads make no garbage cycles), and main() ends by freezing what it
    holds, so the interpreter's last collection does not walk and free the whole heap; called
    with argv in a process that goes on (as the tests do), neither happens."""
    argv = [command, "--state", str(DEMO)]
    frozen, enabled, frozen_after, enabled_after = _program_then(argv, argv)
    assert (frozen, enabled) == (0, True)
    assert frozen_after > 10_000  # the loaded modules, classes and schemas
    assert not enabled_after


def test_other_commands_keep_the_collector() -> None:
    """Any other command (here --version; watch and agent run long) keeps the collector on as
    the program; only the exit's freeze applies."""
    frozen, enabled, frozen_after, enabled_after = _program_then(["--version"], ["--version"])
    assert (frozen, enabled) == (0, True)
    assert frozen_after > 0
    assert enabled_after
