"""The ``reconciler`` command line (SPEC §13).

Exit codes: 0 success, 1 error, 64 usage error (EX_USAGE); commands document their own extra
codes. Human output goes to stdout (colored only on a terminal, never with ``NO_COLOR``); logs go
to stderr; ``--json`` gives machine output with a ``formatVersion``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import errno
import functools
import json
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypeVar, cast

import click

from reconciler import __version__
from reconciler.cli.agent_report import node_report_options
from reconciler.cli.agentopts import uplink_option
from reconciler.cli.logformat import LOG_FORMATS, LogFormat, configure_logging
from reconciler.cli.observe import metrics_addr_option
from reconciler.cli.program import one_shot
from reconciler.cli.statusopts import status_filter, status_filter_options

if TYPE_CHECKING:  # the rest is imported where used: `reconciler --help` loads none of it
    from rich.console import Console

    from reconciler.cli.plainconsole import TextConsole
    from reconciler.controller.planbasis import Reused
    from reconciler.controller.reconcile import ReconcileOptions, ReconcileReport
    from reconciler.io.loader import Diagnostic
    from reconciler.io.lock import StateLock
    from reconciler.placement.instances import Mode
    from reconciler.planning.plans import Plan
    from reconciler.stores.base import StateStore
    from reconciler.stores.etcd import EtcdStore

__all__ = ["EXIT_ERROR", "EXIT_OK", "EXIT_USAGE", "cli", "main"]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 64
FORMAT_VERSION = 1

log = logging.getLogger("reconciler")

F = TypeVar("F", bound=Callable[..., Any])


_PIPED_WIDTH = 240


def _console() -> Console:
    """stdout: colors only on a terminal (rich honors NO_COLOR); wide when piped (unless
    COLUMNS says how wide)."""
    from rich.console import Console

    console = Console(highlight=False, soft_wrap=True)
    if not console.is_terminal and not os.environ.get("COLUMNS", "").isdigit():
        console = Console(highlight=False, soft_wrap=True, width=max(console.width, _PIPED_WIDTH))
    return console


def _text_console() -> TextConsole:
    """:func:`_console` for the text views (.textout), without loading rich when stdout is
    no terminal (the same width, no colors: the same bytes)."""
    from reconciler.cli.plainconsole import plain_console

    return plain_console(_PIPED_WIDTH) or _console()


def _err_console() -> Console:
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


def state_option(f: F) -> F:
    return click.option(
        "--state",
        "state_dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=Path("state"),
        show_default=True,
        help="The state directory (unit.yaml, desired/, nodes/, actual/, out/, checkpoint/).",
    )(f)


def _store_flag(help_text: str, *, required: bool = False) -> Callable[[F], F]:
    """``--store URL`` (env RECONCILER_STORE), as each kind of command explains it."""
    return click.option(
        "--store",
        "store_url",
        metavar="URL",
        envvar="RECONCILER_STORE",
        default=None,
        required=required,
        help=help_text,
    )


store_option = _store_flag(
    "Keep the unit in etcd (etcd://HOST:PORT/PREFIX; env RECONCILER_STORE) instead of "
    "in --state; --state is then the local working copy (docs/etcd.md)."
)

required_store_option = _store_flag(
    "The unit in etcd: etcd://HOST:PORT/PREFIX (env RECONCILER_STORE).", required=True
)


def snapshot_store_option(scope: Sequence[str]) -> Callable[[F], F]:
    """``--store`` for a read-only command: it runs on one snapshot of the documents it reads
    (``scope``: documents, or directories ending in ``/``) of the unit in etcd, copied into a
    private temporary directory (removed afterwards) made the working directory, so the paths
    in its messages are the documents' keys under the prefix. Nothing is written to etcd, and
    --state is not read."""

    def decorate(f: F) -> F:
        @functools.wraps(f)
        def run(*args: Any, store_url: str | None, state_dir: Path, **kwargs: Any) -> Any:
            if store_url is None:
                return f(*args, state_dir=state_dir, **kwargs)
            from reconciler.io import readcache
            from reconciler.io.fsio import FileReadError, ensure_dir
            from reconciler.stores.base import FileStore, StoreError

            store = _etcd(store_url)
            back = Path.cwd()
            with tempfile.TemporaryDirectory(prefix="reconciler-snapshot-") as scratch:
                copy = Path(scratch) / "unit"
                try:
                    ensure_dir(copy)
                    snap = store.snapshot(scope)
                    FileStore(copy).commit({rel: e.data for rel, e in snap.entries.items()})
                except (StoreError, FileReadError, OSError) as e:
                    _err_console().print(f"error: {e}", markup=False)
                    return EXIT_ERROR
                os.chdir(copy)
                try:
                    with readcache.disabled():  # (a new directory each time: never read again)
                        return f(*args, state_dir=Path("."), **kwargs)
                finally:
                    os.chdir(back)

        flag = _store_flag(
            "Read the unit from etcd (etcd://HOST:PORT/PREFIX; env RECONCILER_STORE) instead "
            "of --state: one snapshot of what the command reads, copied into a temporary "
            "directory; nothing is written to etcd, and file names in messages are the "
            "documents' keys under PREFIX."
        )
        return cast(F, flag(run))

    return decorate


_INPUT_SCOPES = ("actual/", "desired/", "nodes/", "resources/", "unit.yaml")
"""The inputs (reconciler.controller.ha.INPUT_SCOPES, which a test keeps equal)."""

_READS_INPUTS = (*_INPUT_SCOPES, "checkpoint/")
"""What plan and explain read: the inputs and the checkpoint (with the last good versions)."""


def _etcd(url: str) -> EtcdStore:
    from reconciler.stores.base import StoreError
    from reconciler.stores.etcd import EtcdStore

    try:
        return EtcdStore(url)
    except StoreError as e:
        raise click.BadParameter(str(e), param_hint="--store") from None


def json_option(f: F) -> F:
    return click.option(
        "--json", "as_json", is_flag=True, help="Print machine-readable JSON instead of text."
    )(f)


def _print_json(payload: dict[str, Any], *, large: bool = False) -> None:
    """The document, pretty: two-space indent, sorted keys. ``large``: with orjson, which
    writes non-ASCII characters as they are rather than as ``\\u`` escapes (the same JSON
    value), ten times as fast as CPython's encoder, which falls back to pure Python when it
    indents (``explain --json`` of a 5,000-node unit: 65,000 cells)."""
    out = {"formatVersion": FORMAT_VERSION, **payload}
    if large:
        from reconciler.model.jsonbytes import pretty_json

        sys.stdout.write(pretty_json(out).decode())
        return
    sys.stdout.write(json.dumps(out, indent=2, sort_keys=True) + "\n")


def _colored(err: bool = False) -> bool:
    """Whether stdout (stderr) gets colors: only a terminal, never with NO_COLOR (as rich)."""
    stream = sys.stderr if err else sys.stdout
    return "NO_COLOR" not in os.environ and stream.isatty()


def _print_diagnostics(diags: Sequence[Diagnostic], *, err: bool = False) -> None:
    """FILE:LINE:COL: error|warning: MESSAGE, one a line (click, not rich: validate is quick)."""
    color = _colored(err)
    for d in diags:
        where = click.style(f"{d.path}:{d.line}:{d.col}:", bold=True)
        label = click.style(f"{d.severity}:", fg="yellow" if d.severity == "warning" else "red")
        click.echo(f"{where} {label} {d.message}", err=err, color=color)


class _Commands(click.Group):
    """The command group; an unknown command is told the close ones, or every command."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            known = self.list_commands(ctx)
            close = difflib.get_close_matches(name, known, n=3)
            if close:
                hint = "Did you mean " + " or ".join(f"'{c}'" for c in close) + "?"
            else:
                hint = "Commands: " + ", ".join(known) + "."
            raise click.UsageError(f"No such command '{name}'. {hint}", ctx)
        return super().resolve_command(ctx, args)


@click.group(
    cls=_Commands,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="reconciler")
@click.option("-v", "--verbose", count=True, help="More log detail on stderr (-v info, -vv debug).")
@click.option(
    "--log-format",
    type=click.Choice(LOG_FORMATS),
    default="text",
    show_default=True,
    envvar="RECONCILER_LOG_FORMAT",
    help="Log lines on stderr: text (UTC time, level, logger, message) or json (one object "
    "a line: time, level, logger, message); env RECONCILER_LOG_FORMAT.",
)
def cli(verbose: int, log_format: LogFormat) -> None:
    """Declarative reconciliation controller with file-backed state.

    People and GitOps tools edit desired-state YAML (desired/**/*.yaml); node agents write
    node status (nodes/<id>.yaml) and actual state (actual/<id>.yaml). The controller places
    every service instance on a node and runtime, plans start/stop changes as RFC 6902 JSON
    Patch, writes an OCI runtime config.json per instance and checkpoints its allocations.

    Every command takes --state DIR (default ./state). Exit codes: 0 success, 1 error,
    64 usage error; see each command's help for the others.
    """
    configure_logging(logging.WARNING - 10 * min(verbose, 2), log_format)


@cli.command()
@state_option
@snapshot_store_option(_INPUT_SCOPES)
@json_option
@one_shot
def validate(state_dir: Path, as_json: bool) -> int:
    """Check every input file of the state directory.

    Reads unit.yaml, desired/**/*.yaml, nodes/*.yaml (with their resources files) and
    actual/*.yaml (or .yml) with the same safe loader the controller uses, then checks the
    files against one another: a service label no node has (warning), a runtime type no node
    offers (error), a node type with no entry in unit.yaml (warning), an image with neither
    entrypoint nor cmd (error), a request above its quota (warning). Prints every problem as
    FILE:LINE:COL: error|warning: MESSAGE. Nothing is written in the state directory (valid
    inputs are kept in the read cache, as explain keeps them).

    Exit codes: 0 all files valid (warnings allowed), 1 at least one error.
    """
    from reconciler.io import readcache
    from reconciler.io.crosscheck import cross_checks, file_locator
    from reconciler.io.loader import instance_limit_guard

    _require_state(state_dir)
    view, loaded = readcache.load_state_cached(state_dir, readcache.open_cache(state_dir))
    found = cross_checks(view, file_locator(state_dir))
    over_limit = instance_limit_guard(view)
    if over_limit is not None:
        found = [*found, over_limit]
    diags = sorted([*loaded, *found], key=lambda d: (d.path, d.line, d.col))
    errors = [d for d in diags if d.severity == "error"]
    warnings = [d for d in diags if d.severity == "warning"]
    counts = {
        "services": len(view.services),
        "nodes": len(view.nodes),
        "actual": len(view.actual),
        "unitConfig": view.unit is not None,
    }
    if as_json:
        _print_json(
            {
                "valid": not errors,
                "counts": counts,
                "errors": [d.to_json() for d in errors],
                "warnings": [d.to_json() for d in warnings],
            }
        )
    else:
        _print_diagnostics(diags)
        summary = (
            f"{counts['services']} services, {counts['nodes']} nodes, "
            f"{counts['actual']} actual-state files"
        )
        if errors:
            head = click.style("invalid:", fg="red")
            click.echo(f"{head} {len(errors)} error(s); valid: {summary}", color=_colored())
        else:
            click.echo(f"{click.style('valid:', fg='green')} {summary}", color=_colored())
    return EXIT_ERROR if errors else EXIT_OK


SCHEMA_KINDS = ["ActualState", "Node", "ResourcesFile", "Service", "UnitConfig"]
"""sorted([*KINDS, RESOURCES_FILE]) (a test keeps them equal), without loading the documents."""


@cli.command()
@click.option(
    "--kind",
    type=click.Choice(SCHEMA_KINDS),
    help="Print only this kind's schema (for an editor's yaml-language-server).",
)
@state_option
def schema(kind: str | None, state_dir: Path) -> int:
    """Print the JSON Schema (draft 2020-12) of every document kind.

    KIND is UnitConfig, Service, Node, ActualState, or ResourcesFile (a node's resourcesFile,
    a JSON array of resource entries).

    Without --kind the output is {"formatVersion": 1, "schemas": {KIND: SCHEMA}}; with
    --kind it is that kind's schema alone, ready to save as a file and point an editor at
    (# yaml-language-server: $schema=service.schema.json). --state is accepted for
    uniformity and ignored.
    """
    from reconciler.model.schema import all_schemas

    del state_dir
    schemas = all_schemas()
    if kind is not None:
        sys.stdout.write(json.dumps(schemas[kind], indent=2, sort_keys=True) + "\n")
    else:
        _print_json({"schemas": schemas})
    return EXIT_OK


EXIT_PLAN_CHANGES = 2
EXIT_PLAN_UNPLACEABLE = 3
EXIT_STALE = 4


def _state_lock(state_dir: Path) -> StateLock:
    """DIR/.lock, waited for as long as it takes, saying whom it waits for."""
    from reconciler.io.lock import StateLock

    def waiting(holder: str) -> None:
        log.warning("waiting for %s: held by %s", state_dir / ".lock", holder)

    return StateLock(state_dir, on_wait=waiting)


def _require_state(state_dir: Path) -> None:
    if not state_dir.is_dir():
        raise click.ClickException(f"state directory {state_dir} does not exist")


def _mode_option(f: F) -> F:
    return click.option(
        "--mode",
        type=click.Choice(["stable", "fresh"]),
        default=None,
        help="Placement mode; default: unit.yaml's placement (stable when unset).",
    )(f)


def _allow_empty_option(f: F) -> F:
    return click.option(
        "--allow-empty",
        is_flag=True,
        help="Allow stopping every instance when no valid desired service, or no valid node "
        "(dropping their allocations), is left.",
    )(f)


def _report_diagnostics(diags: Sequence[Diagnostic]) -> None:
    for d in diags:
        log.warning("%s", d)


@cli.command()
@state_option
@snapshot_store_option(_READS_INPUTS)
@json_option
@_mode_option
@_allow_empty_option
@click.option(
    "--allow-invalid",
    is_flag=True,
    help="Plan even when input files are invalid, with their objects' last good versions.",
)
@click.option(
    "--placements",
    "show_placements",
    is_flag=True,
    help="Print the table of every placement even on a large unit (by default only when the "
    "unit has at most 100 instances).",
)
@click.option(
    "--recompute",
    is_flag=True,
    help="Compute the plan even when out/plan.json already holds the plan of these very inputs.",
)
@one_shot
def plan(
    state_dir: Path,
    as_json: bool,
    mode: str | None,
    allow_empty: bool,
    allow_invalid: bool,
    show_placements: bool,
    recompute: bool,
) -> int:
    """Compute and print the plan, read-only.

    Loads the state directory, places every desired instance (keeping previous placements in
    stable mode), and diffs the placements against actual/ into start and stop actions per
    node. Nothing is written in the state directory: not out/, not the checkpoint. (The
    loaded inputs are kept in the read cache of the user's own, as explain keeps them:
    $RECONCILER_CACHE_DIR, else $XDG_CACHE_HOME/reconciler, else ~/.cache/reconciler; empty:
    none. The next plan of these inputs only stats the files; the output is the same.)

    A plan is a gate: when any input file is invalid, each is named on stderr with
    FILE:LINE:COL and the exit code is 1, so a pull-request check fails on a broken file. With
    --allow-invalid the plan is computed anyway, each invalid file's object keeping its last
    good version (a first-ever invalid file's object does not exist yet).

    In text, the placements table comes first (on a unit of at most 100 instances, or with
    --placements), then the actions grouped by node, then by service (ITEM:SUBJECT), one
    line per instance; then the unplaceable instances grouped by service; then the totals.

    With --json the output is the plan document of out/plan.json (formatVersion, inputs,
    changesPresent, complete, actions, failures, nodes with their JSON Patch). When the
    inputs have problems it also holds invalidFiles (the input files with errors) and
    invalidInputs (every problem, warnings included), and complete is false while any input
    file is invalid.

    The controller's own plan is shown as it is when nothing it depends on has changed: after
    each run the controller records in out/plan.basis.json what its plan was computed from
    (the input files' contents, the checkpoint, the mode, until when every node's report
    stays young enough). When the input files still hash the same, the checkpoint and
    out/plan.json are the files it left, the same --mode is asked for and that time has not
    come, out/plan.json is printed (or rendered) without computing it again (a second
    instead of several at 20,000 instances): a computation would give the same bytes. A unit
    whose nodes declare host groups or devices, with a running alert timer, with an input
    problem or a node whose report is too old is always computed. --recompute always
    computes; say it after changing what is not an input file (an image, /dev, the group
    database).

    Exit codes: 0 no changes, 2 changes and every instance placed, 3 some instance
    unplaceable, 1 error (an invalid input file without --allow-invalid, the mass-deletion
    guard's refusal).
    """
    from reconciler.cli.render import SMALL_UNIT, render_placements, render_plan
    from reconciler.controller.configs import default_config_builder
    from reconciler.controller.reconcile import ReconcileError, ReconcileOptions, compute_once
    from reconciler.io import readcache

    _require_state(state_dir)
    if not recompute:
        from reconciler.controller.planbasis import reusable_plan

        reused = reusable_plan(state_dir, mode, time.time())
        # (the placements table needs the placements, which the plan document does not hold)
        if reused is not None and (
            as_json or not (show_placements or reused.instances <= SMALL_UNIT)
        ):
            return _show_reused(reused, as_json)
    opts = ReconcileOptions(
        mode=_mode(mode), allow_empty=allow_empty, configs=default_config_builder()
    )
    cache = readcache.open_cache(state_dir)
    started = readcache.cached_view(state_dir, cache)  # (the read cache: see explain)
    try:
        with _progress() as on_stage:
            staged = dataclasses.replace(opts, on_stage=on_stage)
            comp = compute_once(state_dir, staged, started, read_only=True)
            if started is not None and not readcache.exact(comp.view):
                started = None  # an input problem: what a load from nothing gives
                comp = compute_once(state_dir, staged, read_only=True)
    except ReconcileError as e:
        _err_console().print(f"error: {e}", markup=False)
        return EXIT_ERROR
    readcache.keep_view(state_dir, cache, comp.view, started)
    invalid = sorted({d.path for d in comp.diagnostics if d.severity == "error"})
    gated = bool(invalid) and not allow_invalid
    if gated:
        _print_diagnostics(comp.diagnostics, err=True)
    else:
        _report_diagnostics(comp.diagnostics)
    for problem in comp.loaded.problems:
        log.error("checkpoint: %s", problem)
    if as_json and not comp.diagnostics:  # exactly the bytes out/plan.json would hold
        from reconciler.planning.plans import plan_bytes

        sys.stdout.write(plan_bytes(comp.plan, comp.plan_inputs()).decode())
    elif as_json:
        doc = comp.plan_document()
        doc["invalidFiles"] = invalid
        doc["invalidInputs"] = [d.to_json() for d in comp.diagnostics]
        doc["complete"] = doc["complete"] and not invalid
        sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    elif not gated:
        console = _text_console()
        if show_placements or len(comp.result.placements) <= SMALL_UNIT:
            render_placements(console, comp.result)
            console.print()
        render_plan(console, comp.plan)
    if gated:
        _err_console().print(
            f"error: {len(invalid)} invalid input file(s): {', '.join(invalid)}; fix them, or "
            "pass --allow-invalid to plan with their last good versions",
            markup=False,
        )
        return EXIT_ERROR
    return _plan_exit(comp.plan)


def _show_reused(reused: Reused, as_json: bool) -> int:
    """``plan``'s output from the controller's plan document, as it is."""
    doc = reused.document
    if as_json:
        sys.stdout.write(reused.data.decode())
    else:
        from reconciler.cli.render import render_plan_document

        render_plan_document(_text_console(), doc)
        log.info("shown from out/plan.json: the controller's plan of these very inputs")
    if doc.get("failures"):
        return EXIT_PLAN_UNPLACEABLE
    return EXIT_PLAN_CHANGES if doc.get("changesPresent") else EXIT_OK


def _plan_exit(p: Plan) -> int:
    if p.failures:
        return EXIT_PLAN_UNPLACEABLE
    return EXIT_PLAN_CHANGES if p.changes_present else EXIT_OK


@contextlib.contextmanager
def _progress() -> Iterator[Callable[[str], None] | None]:
    """A spinner with the current stage and the time spent in it on stderr, only when stderr
    is a terminal: a long stage (placing a large unit) shows it is moving."""
    from reconciler.cli.plainconsole import no_terminal

    if no_terminal(sys.stderr):  # (known without loading rich)
        yield None
        return
    console = _err_console()
    if not console.is_terminal:
        yield None
        return
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = (SpinnerColumn("dots"), TextColumn("{task.description}..."), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("starting", total=None)

        def on_stage(text: str) -> None:
            progress.reset(task, description=text)  # the clock restarts with each stage

        yield on_stage


def _run_reconcile(
    state_dir: Path,
    opts: ReconcileOptions,
    as_json: bool,
    store_url: str | None = None,
    metrics_file: Path | None = None,
) -> int:
    done: list[ReconcileReport] = []  # the run's report, once it succeeded
    try:
        return _reconcile_and_show(state_dir, opts, as_json, store_url, done)
    finally:
        if metrics_file is not None:  # a failed run is counted too
            from reconciler.cli.observe import write_reconcile_metrics

            write_reconcile_metrics(metrics_file, done[0] if done else None)


def _reconcile_and_show(
    state_dir: Path,
    opts: ReconcileOptions,
    as_json: bool,
    store_url: str | None,
    done: list[ReconcileReport],
) -> int:
    from reconciler.cli.render import render_plan
    from reconciler.controller.ha import reconcile_via_store
    from reconciler.controller.reconcile import ReconcileError, reconcile
    from reconciler.io.fsio import FileReadError
    from reconciler.io.lock import LockTimeout
    from reconciler.planning.plans import failure_json
    from reconciler.stores.base import StoreError

    try:
        with _progress() as on_stage:
            staged = dataclasses.replace(opts, on_stage=on_stage)
            if store_url is None:
                report = reconcile(state_dir, staged)
            else:
                report = reconcile_via_store(
                    _etcd(store_url), state_dir, staged, wait=opts.lock_timeout
                )
    except (ReconcileError, LockTimeout, StoreError, FileReadError) as e:
        _err_console().print(f"error: {e}", markup=False)
        return EXIT_ERROR
    except OSError as e:  # a failed write or fsync ends the run; the old files stay
        _err_console().print(f"error: writing {state_dir}: {e}", markup=False)
        return EXIT_ERROR
    done.append(report)
    comp = report.computed
    _report_diagnostics(comp.diagnostics)
    p = report.plan
    if as_json:
        _print_json(
            {
                "passes": report.passes,
                "changesPresent": p.changes_present,
                "complete": p.complete,
                "written": list(report.written),
                "checkpointWritten": report.checkpoint_written,
                "checkpointGeneration": comp.checkpoint.generation,
                "actions": [a.to_json() for a in p.actions],
                "failures": [failure_json(f) for f in p.failures],
                "invalidInputs": [d.to_json() for d in comp.diagnostics],
            }
        )
    else:
        console = _console()
        render_plan(console, p)
        console.print(
            f"Wrote {len(report.written)} file(s)"
            + (
                f", checkpoint generation {comp.checkpoint.generation}"
                if report.checkpoint_written
                else ""
            )
            + f" in {report.passes} pass(es)."
        )
    if store_url is None:  # (a command with --store uses no read cache)
        # what the first explain after this run would load and balance (its read cache)
        from reconciler.controller.explaincache import keep_for_explain

        keep_for_explain(state_dir, comp, opts.mode)
    return EXIT_OK


@cli.command(name="reconcile")
@state_option
@store_option
@json_option
@_mode_option
@_allow_empty_option
@click.option(
    "--lock-timeout",
    type=float,
    default=None,
    help="Give up after waiting this many seconds for another writer (default: wait).",
)
@click.option(
    "--metrics-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="After the run (failed or not), write Prometheus metrics to this file in the "
    "node-exporter textfile format, atomically (e.g. in node-exporter's textfile directory).",
)
@one_shot
def reconcile_cmd(
    state_dir: Path,
    store_url: str | None,
    as_json: bool,
    mode: str | None,
    allow_empty: bool,
    lock_timeout: float | None,
    metrics_file: Path | None,
) -> int:
    """Compute the plan and write out/ and the checkpoint.

    Under the exclusive lock on DIR/.lock: loads every input, recovers the allocation
    checkpoint (quarantining a corrupt one), places every instance, writes out/plan.json,
    out/nodes/<node>.json (the node's JSON Patch), out/instances/<id>/ (OCI config and hosts),
    out/status.json and out/status.html (a page to open in a browser) and a new checkpoint
    generation when allocations changed. Files are written
    atomically and only when their content changed. If the inputs changed during the run, it
    runs again (at most 5 passes).

    With --store etcd://…: takes the unit's leader key (waiting up to --lock-timeout for a
    running leader; by default it fails at once), copies the unit into DIR, runs as above in
    DIR and commits out/ and checkpoint/ to etcd: the OCI configs and last good inputs first
    (as many transactions as etcd's limits need), then the checkpoint with the node patches,
    status and plan in one transaction. Every commit is guarded by the leader key.

    Exit codes: 0 done (unplaceable instances are reported in status), 1 error.
    """
    from reconciler.controller.configs import default_config_builder
    from reconciler.controller.reconcile import ReconcileOptions

    opts = ReconcileOptions(
        mode=_mode(mode),
        allow_empty=allow_empty,
        lock_timeout=lock_timeout,
        configs=default_config_builder(),
    )
    return _run_reconcile(state_dir, opts, as_json, store_url, metrics_file)


@cli.command()
@click.argument("planfile", type=click.Path(dir_okay=False, exists=True, path_type=Path))
@state_option
@json_option
@_allow_empty_option
@one_shot
def apply(planfile: Path, state_dir: Path, as_json: bool, allow_empty: bool) -> int:
    """Apply a saved plan if its inputs have not changed since.

    PLANFILE is the output of `reconciler plan --json` (or a copy of out/plan.json). Its
    inputs.fingerprint covers every input file and the checkpoint generation; when it still
    matches, this runs `reconcile` with the plan's mode, which writes exactly that plan.

    Exit codes: 0 applied, 4 stale plan (the inputs or the checkpoint changed), 1 error.
    """
    from reconciler.controller.configs import default_config_builder
    from reconciler.controller.reconcile import ReconcileError, ReconcileOptions, compute_once

    _require_state(state_dir)
    try:
        saved = json.loads(planfile.read_text())
        want = saved["inputs"]["fingerprint"]
        saved_mode = saved["inputs"].get("mode")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise click.ClickException(f"{planfile}: not a plan file ({e})") from None
    opts = ReconcileOptions(
        mode=_mode(saved_mode),
        allow_empty=allow_empty,
        configs=default_config_builder(),
    )
    with _state_lock(state_dir):
        try:
            comp = compute_once(state_dir, opts, read_only=True)
        except ReconcileError as e:
            _err_console().print(f"error: {e}", markup=False)
            return EXIT_ERROR
        if comp.plan.fingerprint != want:
            _err_console().print(
                f"error: stale plan: {planfile} was computed from other inputs "
                f"({want} != {comp.plan.fingerprint}); run plan again",
                markup=False,
            )
            return EXIT_STALE
    return _run_reconcile(state_dir, opts, as_json)


@cli.command()
@state_option
@json_option
@_allow_empty_option
@one_shot
def rebalance(state_dir: Path, as_json: bool, allow_empty: bool) -> int:
    """Rebalance now: place everything afresh, pinning balancingPolicy: disabled instances.

    A fresh placement in instance order in which instances whose service has
    balancingPolicy: disabled keep their node and runtime first. Moves carry the reason
    "rebalanced". Writes like `reconcile`.

    Exit codes: 0 done, 1 error.
    """
    from reconciler.controller.configs import default_config_builder
    from reconciler.controller.reconcile import ReconcileOptions

    opts = ReconcileOptions(
        mode="rebalance", allow_empty=allow_empty, configs=default_config_builder()
    )
    return _run_reconcile(state_dir, opts, as_json)


def _duration(ctx: click.Context, param: click.Parameter, value: str) -> float:
    from reconciler.model.values import parse_duration

    try:
        return parse_duration(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


TAKEOVER_SLACK = 2
"""Seconds beyond ``--lease`` within which a standby takes over from a dead leader: etcd
deletes the key of an expired lease at its next expiry check (every 0.5 s), the standby sees
it gone at its next look (every 0.25 s), then takes it (two requests)."""


@cli.command()
@state_option
@store_option
@_mode_option
@_allow_empty_option
@click.option(
    "--lease",
    "lease_ttl",
    type=click.IntRange(1, 3600),
    default=10,
    show_default=True,
    help="With --store: seconds the leader's lease lasts without a refresh; a standby "
    f"replica takes over at most LEASE + {TAKEOVER_SLACK} s after the leader dies (etcd "
    "expires the lease up to LEASE s after the last refresh, then deletes the leader key at "
    "its next check; the standby sees it gone within 0.25 s).",
)
@click.option(
    "--debounce",
    default="200ms",
    show_default=True,
    callback=_duration,
    help="Quiet time after the last change before a run (e.g. 200ms, 1s).",
)
@click.option(
    "--resync",
    default="60s",
    show_default=True,
    callback=_duration,
    help="Full reconcile at least this often, even without events (e.g. 60s, 5m).",
)
@metrics_addr_option("the controller's")
def watch(
    state_dir: Path,
    store_url: str | None,
    mode: str | None,
    allow_empty: bool,
    lease_ttl: int,
    debounce: float,
    resync: float,
    metrics_addr: str | None,
) -> int:
    """Reconcile on every change of the inputs, until SIGTERM.

    Watches the state directory (unit.yaml, desired/, nodes/, actual/; never out/ or
    checkpoint/) with inotify, waits for DEBOUNCE of quiet, then runs one reconcile, which
    re-reads every input. A full reconcile also runs every RESYNC, so an event lost by the
    kernel queue or a file outside the state directory is never missed for long. Logs one
    line per run on stderr (readable in journalctl). SIGTERM or SIGINT stops it cleanly.

    With --store etcd://…: any number of replicas may run; they elect one leader through a
    lease on PREFIX/.leader. The leader copies the unit into DIR, reconciles, commits out/ and
    checkpoint/ guarded by its leadership (the checkpoint and the plans in one transaction),
    then follows etcd's watch events
    (resyncing from a snapshot after a compaction or a lost watch). The others stand by and
    take over at most --lease + 2 seconds after the leader's death (at once after a SIGTERM,
    which releases the lease).

    Exit codes: 0 stopped by a signal, 1 error.
    """
    from reconciler.cli.observe import controller_metrics
    from reconciler.controller.configs import default_config_builder
    from reconciler.controller.ha import store_watch_loop
    from reconciler.controller.reconcile import ReconcileOptions
    from reconciler.controller.watch import WatchOptions, watch_loop

    logging.getLogger("reconciler").setLevel(min(logging.INFO, logging.getLogger().level))
    opts = ReconcileOptions(
        mode=_mode(mode), allow_empty=allow_empty, configs=default_config_builder()
    )
    wopts = WatchOptions(debounce=debounce, resync=resync)
    with controller_metrics(metrics_addr) as on_run:
        if store_url is not None:
            return store_watch_loop(
                _etcd(store_url), state_dir, opts, wopts, ttl=lease_ttl, on_run=on_run
            )
        return watch_loop(state_dir, opts, wopts, on_run=on_run)


@cli.command()
@click.option("--node", "node_id", required=True, help="The node this agent runs on (its id).")
@state_option
@store_option
@json_option
@click.option(
    "--runtime",
    type=click.Choice(["runc"]),
    default="runc",
    show_default=True,
    help="The OCI runtime binary that runs the containers.",
)
@click.option(
    "--runc-root",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="runc's state directory (--root); give each local agent its own.",
)
@click.option(
    "--once/--watch",
    default=True,
    show_default=True,
    help="Apply the current plan once, or keep applying every new plan until SIGTERM.",
)
@click.option(
    "--stop-timeout",
    default="10s",
    show_default=True,
    callback=_duration,
    help="How long a container gets between SIGTERM and SIGKILL.",
)
@click.option(
    "--log-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Append each container's stdout and stderr to LOG_DIR/<container>.log.",
)
@node_report_options
@metrics_addr_option("the agent's (with --watch)")
@uplink_option
def agent(
    node_id: str,
    state_dir: Path,
    store_url: str | None,
    as_json: bool,
    runtime: str,
    runc_root: Path | None,
    once: bool,
    stop_timeout: float,
    log_dir: Path | None,
    node_config: Path | None,
    usage_interval: float,
    device_plugin_dir: Path,
    metrics_addr: str | None,
    uplink: str | None,
) -> int:
    """The node agent: apply out/nodes/NODE.json to this node with runc.

    With --node-config FILE it also writes nodes/NODE.yaml: the declared facts of FILE with
    what it measures (RAM, CPUs, partition sizes, OS; with --watch the usage every
    --usage-interval, and the devices of the device plugins registered on
    --device-plugin-dir/kubelet.sock).

    Refuses a plan whose revision test fails against actual/NODE.yaml (a stale plan: nothing
    is started or stopped). For each stop: runc kill (SIGTERM, then SIGKILL after
    --stop-timeout) and runc delete; for each start: runc run --detach with the bundle
    out/instances/<id>/ (config.json, hosts). A running instance is never started twice. Then
    writes actual/NODE.yaml with revision + 1 and each instance's real state from runc state
    (running: active, created: activating, stopped or gone: failed), which closes the loop: the
    next plan is empty. Containers are named <node>.<instance id>.

    With --store etcd://…: the node's patch, its actual document and the bundles the patch
    starts are read from etcd into DIR (the same path on every machine, as the OCI configs
    name it), and actual/NODE.yaml is written back in a
    transaction that fails if anyone changed it since it was read (a stale write: exit 1,
    nothing written; the next run reads the new version).

    A container found stopped or missing while its instance is desired here is started again
    as the service's restartPolicy says (always, on-failure, never), the first time at once,
    then after a back-off of 10 s doubling to 5 min, kept in DIR/.agent-NODE.json; actual
    records each instance's restartCount, lastExit and why it is failed.

    Exit codes: 0 applied (or nothing to do, as when run twice in a row), 4 stale plan, 1
    error: a start failed, NODE is no node of the unit (no nodes/NODE.yaml, plan or actual),
    or the run could not be done. With --watch: runs until SIGTERM, then 0.
    """
    from reconciler.agent.node import AgentError, agent_watch, run_agent_once
    from reconciler.agent.runc import Runc, RuncError
    from reconciler.cli.agent_report import ReportingOptions, run_reporting_agent
    from reconciler.cli.observe import agent_metrics
    from reconciler.controller.ha import agent_watch_store, run_agent_via_store
    from reconciler.io.lock import LockTimeout
    from reconciler.stores.base import StoreError

    if store_url is None:
        _require_state(state_dir)
    del runtime  # only runc is supported (crun refuses this kind of cgroup setup)
    runc = Runc(binary="runc", root=runc_root)
    store = _etcd(store_url) if store_url is not None else None
    if once and metrics_addr is not None:
        raise click.UsageError("--metrics-addr needs --watch")
    if node_config is not None:
        if store is not None:
            raise click.UsageError("--node-config works with a state directory, not --store")
        with agent_metrics(metrics_addr) as metrics:
            return run_reporting_agent(
                state_dir,
                node_id,
                runc,
                ReportingOptions(
                    node_config,
                    usage_interval,
                    device_plugin_dir,
                    once,
                    stop_timeout,
                    log_dir,
                    uplink,
                ),
                as_json=as_json,
                on_run=metrics.observe if metrics is not None else None,
            )
    if not once:
        logging.getLogger("reconciler").setLevel(min(logging.INFO, logging.getLogger().level))
        with agent_metrics(metrics_addr) as metrics:
            on_run = metrics.observe if metrics is not None else None
            if store is not None:
                agent_watch_store(
                    store,
                    state_dir,
                    node_id,
                    runc,
                    threading.Event(),
                    stop_timeout=stop_timeout,
                    log_dir=log_dir,
                    on_run=on_run,
                    uplink=uplink,
                )
                return EXIT_OK
            agent_watch(
                state_dir,
                node_id,
                runc,
                threading.Event(),
                stop_timeout=stop_timeout,
                log_dir=log_dir,
                on_run=on_run,
                uplink=uplink,
            )
        return EXIT_OK
    try:
        if store is not None:
            report = run_agent_via_store(
                store,
                state_dir,
                node_id,
                runc,
                stop_timeout=stop_timeout,
                log_dir=log_dir,
                uplink=uplink,
            )
        else:
            report = run_agent_once(
                state_dir, node_id, runc, stop_timeout=stop_timeout, log_dir=log_dir, uplink=uplink
            )
    except (AgentError, RuncError, LockTimeout, StoreError, OSError) as e:
        _err_console().print(f"error: {e}", markup=False)
        return EXIT_ERROR
    if as_json:
        _print_json(report.to_json())
    else:
        _console().print(report.summary(), markup=False)
        for iid, why in sorted(report.failed.items()):
            _console().print(f"  failed {iid}: {why}", markup=False)
    if report.stale:
        return EXIT_STALE
    return EXIT_ERROR if report.start_failed else EXIT_OK


def _copy(source: StateStore, target: StateStore, verb: str, as_json: bool) -> int:
    from reconciler.stores.base import StoreError, copy_unit

    try:
        written, deleted = copy_unit(source, target)
    except (StoreError, OSError) as e:
        _err_console().print(f"error: {e}", markup=False)
        return EXIT_ERROR
    if as_json:
        _print_json({"from": source.url, "to": target.url, "written": written, "deleted": deleted})
    else:
        _console().print(
            f"{verb} {source.url} -> {target.url}: {written} document(s) written, "
            f"{deleted} deleted",
            markup=False,
        )
    return EXIT_OK


@cli.command(name="export")
@state_option
@required_store_option
@json_option
def export_cmd(state_dir: Path, store_url: str, as_json: bool) -> int:
    """Copy a unit from etcd into the state directory DIR.

    Afterwards DIR holds exactly the unit's documents (unit.yaml, desired/, nodes/, actual/,
    resources/, out/, checkpoint/): files the store does not have are deleted there, each file
    is written atomically. Run it under no other writer of DIR; any command (plan, status,
    explain, reconcile) then works on DIR offline.

    Exit codes: 0 done, 1 error.
    """
    from reconciler.io.fsio import FileReadError, ensure_dir
    from reconciler.stores.base import FileStore

    try:
        ensure_dir(state_dir)
    except (FileReadError, OSError) as e:
        _err_console().print(f"error: {e}", markup=False)
        return EXIT_ERROR
    with _state_lock(state_dir):
        return _copy(_etcd(store_url), FileStore(state_dir), "exported", as_json)


@cli.command(name="import")
@state_option
@required_store_option
@click.option(
    "--force", is_flag=True, help="Import even while a controller leads the unit in etcd."
)
@json_option
def import_cmd(state_dir: Path, store_url: str, force: bool, as_json: bool) -> int:
    """Copy the unit in the state directory DIR into etcd.

    Afterwards PREFIX holds exactly DIR's documents (its checkpoint included, so placements
    carry over): keys DIR does not have are deleted. A large unit takes several transactions
    (within the limits the URL gives), the deletions in the last; an import that fails part-way
    leaves part of it: run it again. Refused while a controller leads the unit (its next commit
    would undo part of the import) unless --force.

    Exit codes: 0 done, 1 error.
    """
    from reconciler.stores.base import FileStore, StoreError

    _require_state(state_dir)
    store = _etcd(store_url)
    try:
        holder = store.leader()
    except StoreError as e:
        _err_console().print(f"error: {e}", markup=False)
        return EXIT_ERROR
    if holder is not None and not force:
        _err_console().print(
            f"error: {holder} leads {store.url}; stop it first (or --force)", markup=False
        )
        return EXIT_ERROR
    with _state_lock(state_dir):
        return _copy(FileStore(state_dir), store, "imported", as_json)


_STATUS_MAX_BYTES = 1 << 32
"""status.json is about 750 bytes per instance (15 MB at 20,000); this only bounds a wrong file."""


@cli.command()
@state_option
@snapshot_store_option(("out/status.json",))
@json_option
@click.option(
    "--html",
    "html_file",
    type=click.Path(dir_okay=False, path_type=Path, resolve_path=True),  # (before --store's cd)
    default=None,
    help="Write the status as one self-contained HTML page to this file (as out/status.html).",
)
@status_filter_options
@one_shot
def status(state_dir: Path, as_json: bool, html_file: Path | None, **filters: Any) -> int:
    """Show a summary, the nodes, and (on request) the instances.

    Reads out/status.json as the last reconcile wrote it (run `reconciler reconcile` first).
    First a summary: when the report was made, nodes per state, instances per state,
    unplaceable instances per reason, alerts, invalid inputs. Then one line per node: its
    reserved/capacity of CPU, RAM, storage and state, its devices, and the age of its agent's
    last report (the node file's reportedAt; marked * when the node has none and the age is
    that of its actual/ file). Then the instances with their node, runtime, state, restarts
    and devices: by default only on a small unit (at most 100 instances); on a larger one
    with --instances, or with any filter (--node, --service, --in-state, --failed, each
    repeatable), which also narrows the node table to the nodes of the instances shown.
    Unplaceable instances and raised alerts come last; invalid input files with their
    errors.

    With --json the output is out/status.json itself (no filter applies).

    Exit codes: 0 shown, 1 no status yet or error, 64 a filter names nothing in the report.
    """
    from reconciler.cli.observe import write_status_page
    from reconciler.cli.statusview import StatusFilterError, actual_file_mtime, render_status
    from reconciler.io.fsio import FileReadError, read_bytes_at

    _require_state(state_dir)
    path = state_dir / "out" / "status.json"
    if path.parent.is_symlink():
        raise click.ClickException(f"{path.parent} is a symlink; refusing to read through it")
    try:
        raw, _ = read_bytes_at(path, _STATUS_MAX_BYTES)
        doc = json.loads(raw)
    except FileReadError as e:
        if not os.path.lexists(path):
            raise click.ClickException(
                f"{path} does not exist: run `reconciler reconcile` first"
            ) from None
        raise click.ClickException(f"{path}: {e}") from None
    except ValueError as e:
        raise click.ClickException(f"{path}: {e}") from None
    if not isinstance(doc, dict):
        raise click.ClickException(f"{path}: not a status report")
    if html_file is not None:
        try:  # made when the report was written
            size = write_status_page(doc, os.lstat(path).st_mtime, html_file)
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise click.ClickException(
                f"{path}: not a status report of this version ({type(e).__name__}: {e}); "
                "run `reconciler reconcile` again"
            ) from None
        except OSError as e:
            raise click.ClickException(f"{html_file}: {e.strerror or e}") from None
        if not as_json:
            _console().print(f"Wrote {html_file} ({size:,} bytes).", markup=False)
            return EXIT_OK
    if as_json:
        sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        return EXIT_OK
    select = status_filter(**filters)
    try:
        select.check(doc)
    except StatusFilterError as e:
        raise click.UsageError(str(e)) from None
    except (KeyError, TypeError, AttributeError) as e:
        raise click.ClickException(
            f"{path}: not a status report ({type(e).__name__}: {e})"
        ) from None
    try:
        render_status(
            _console(),
            doc,
            made_at=os.lstat(path).st_mtime,
            file_mtime=actual_file_mtime(state_dir),
            select=select,
        )
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise click.ClickException(
            f"{path}: not a status report of this version ({type(e).__name__}: {e}); "
            "run `reconciler reconcile` again"
        ) from None
    return EXIT_OK


def _mode(mode: str | None) -> Mode | None:
    if mode == "stable":
        return "stable"
    if mode == "fresh":
        return "fresh"
    if mode == "rebalance":
        return "rebalance"
    return None


@cli.command()
@click.argument("instance")
@state_option
@snapshot_store_option(_READS_INPUTS)
@json_option
@_mode_option
@click.option(
    "--all-nodes",
    "all_nodes",
    is_flag=True,
    help="Print every node in the matrix (by default at most 20: the nodes "
    "closest to taking the instance; --json always has every node).",
)
@one_shot
def explain(
    instance: str, state_dir: Path, as_json: bool, mode: str | None, all_nodes: bool
) -> int:
    """Explain why INSTANCE is where it is, or why it cannot be placed.

    INSTANCE is an instance id (uuid) or ITEM:SUBJECT:INDEX (ITEM:INDEX for the default
    subject). Every filter is evaluated on every node against the final placement of everyone
    else. The first lines say where the instance is placed, or why it has no place, and count
    the nodes: how many are feasible and how many each filter dropped. The node x filter
    matrix follows, with the reason of each failing cell under it. On a unit of more than 20
    nodes the matrix holds the 20 nodes closest to taking the instance (the node it is
    placed on, then the nodes failing the fewest filters: the feasible ones, then the near
    misses) and one line counts the others; --all-nodes prints every node. A runtime filter's
    cell is ok when the filter passes on some runtime of the node; for each node shown with
    several runtimes that a runtime filter drops (and the node it is placed on), the runtime
    filters that fail on each runtime are listed too (a node is feasible only when one
    runtime passes them all).

    INSTANCE may also be an item, ITEM or ITEM:SUBJECT, or a desired file (its path, or its
    name under desired/ with or without .yaml: navigation for desired/navigation.yaml): then
    each instance of that item is listed with where it is placed or why it has no place. An
    id that names nothing gets the closest desired ids as suggestions.

    The loaded inputs, the balance and what it leaves free on each node are kept in a read
    cache of the user's own ($RECONCILER_CACHE_DIR, else $XDG_CACHE_HOME/reconciler, else
    ~/.cache/reconciler; empty: none), so the next explain of unchanged inputs only stats the
    files, balances nothing and reserves again only on the instance's own node. Its output is
    the same either way.

    Exit codes: 0 explained, 1 unknown instance or error.
    """
    from reconciler.accel import balance
    from reconciler.accel import explain as explain_instance
    from reconciler.cli.explainview import (
        find_instance,
        find_item,
        item_json,
        item_of_file,
        item_view,
        render_item,
        runtime_json,
        suggestions,
    )
    from reconciler.cli.render import MATRIX_NODES, render_explanation
    from reconciler.controller.reports import StaleMarks
    from reconciler.io import readcache
    from reconciler.io.checkpoint_files import LoadReport, load_checkpoint
    from reconciler.placement.instances import BalanceResult, Failure
    from reconciler.planning.checkpoint import IDS_FAILURE, id_failure
    from reconciler.planning.network import NETWORK_FAILURE, assign_networks
    from reconciler.planning.plans import failure_json

    _require_state(state_dir)
    cache = readcache.open_cache(state_dir)
    view, diags = readcache.load_state_cached(state_dir, cache)
    _report_diagnostics(diags)
    services = view.services_sorted()
    checkpoint_dir = state_dir / "checkpoint"

    @functools.cache
    def loaded() -> LoadReport:
        return load_checkpoint(checkpoint_dir, view.actual, quarantine=False)

    nodes = StaleMarks().apply(view.unit, view.nodes.values(), time.time())  # as reconcile does
    # the balance of these very inputs, checkpoint, mode and stale nodes, when a command
    # computed it before (the read cache): the next instance is explained without a balance
    key = "" if cache is None or diags else readcache.balance_key(view, checkpoint_dir, mode, nodes)
    got = cache.get("balance", key) if cache is not None and key else None
    result = got if isinstance(got, BalanceResult) else None
    # an instance id the balance placed or failed (every desired instance is one or the
    # other) is found there, without a uuid5 of every instance
    known = result is not None and (
        instance in result.by_id or any(f.instance_id == instance for f in result.failures)
    )
    iid = instance if known else find_instance(services, instance, view.services)
    members = find_item(services, instance) if iid is None else []
    if iid is None and not members:  # a desired file's path or name: the item it holds
        named = item_of_file(view.files, instance, str(state_dir))
        if named is not None:
            instance = f"{named[1].id}:{named[1].subject}"
            members = find_item(services, instance)
    if iid is None and not members:
        close = suggestions(services, instance)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise click.ClickException(f"no desired instance {instance!r}{hint}")
    if result is None:
        result = balance(view.unit, nodes, services, loaded().checkpoint.previous(), _mode(mode))
        if cache is not None and key:
            cache.put("balance", key, result)
    networked = (view.unit is not None and view.unit.network is not None) or (
        view.summary().networked > 0  # (counted once per view, not a pass over the services)
    )
    if iid is None:
        network = loaded().checkpoint.network if networked else {}
        item = item_view(instance, members, view.unit, services, result, network)
        if as_json:
            _print_json(item_json(item))
        else:
            render_item(_console(), item)
        return EXIT_OK
    # what each node holds after that balance, from the explanation of another instance
    got = cache.get("occupancy", key) if cache is not None and key else None
    occupied = got if isinstance(got, dict) else None
    exp = explain_instance(
        view.unit, nodes, services, iid, None, _mode(mode), result=result, occupied=occupied
    )
    if cache is not None and key and occupied is None and exp.occupancy is not None:
        cache.put("occupancy", key, exp.occupancy)
    # the phases after placement, as reconcile runs them: the network phase (its failure, or
    # the instance's network), then the uids and gids of what it left placed
    why: tuple[str, str] | None = None
    net = None
    if exp.placement is not None and exp.failure is None:
        cp = loaded().checkpoint
        if networked:
            phase = assign_networks(view.unit, services, result, cp.network)
            net = phase.instances.get(iid)
            if iid in phase.failures:
                why = (NETWORK_FAILURE, f"{exp.instance.label}: {phase.failures[iid]}")
            elif phase.failures:
                result = result.failed(phase.failures, NETWORK_FAILURE)
        if why is None:
            lacking = id_failure(result, iid, cp.allocations, cp.gids)
            why = None if lacking is None else (IDS_FAILURE, lacking)
    if why is not None:
        i = exp.instance
        reason, summary = why
        exp = dataclasses.replace(
            exp,
            placement=None,
            failure=Failure(
                iid,
                i.item_id,
                i.subject_id,
                i.index,
                i.version,
                i.priority,
                reason,
                summary,
                ((reason, 1),),
            ),
        )
    if as_json:
        runtimes = runtime_json(exp)
        feasible, n_nodes, counts = exp.feasibility()
        _print_json(
            {
                "network": None if net is None else net.to_json(),
                "instanceId": iid,
                "label": exp.instance.label,
                "filters": list(exp.filters),
                "placement": None
                if exp.placement is None
                else {
                    "nodeId": exp.placement.node_id,
                    "runtimeId": exp.placement.runtime_id,
                    "version": exp.placement.version,
                    # kept where it runs while its current spec places nowhere
                    "held": exp.failure is not None,
                },
                "version": exp.instance.version,
                "failure": None if exp.failure is None else failure_json(exp.failure),
                "feasibility": {"feasible": feasible, "nodes": n_nodes, "droppedBy": dict(counts)},
                "nodes": [
                    {
                        "nodeId": node_id,
                        "droppedBy": dropped,
                        "filters": {
                            code: {"pass": why is None, "reason": why}
                            for code, why in zip(exp.filters, cells, strict=True)
                        },
                        "runtimes": runtimes.get(node_id, {}),
                    }
                    for node_id, cells, dropped in exp.rows
                ],
            },
            large=True,
        )
    else:
        render_explanation(_console(), exp, None if all_nodes else MATRIX_NODES)
        if net is not None:
            _console().print(
                f"network {net.network_id}: {net.ip}/{net.prefix} via {net.gateway}, "
                f"{len(net.firewall_rules)} firewall rule(s)"
            )
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: run the CLI and turn every outcome into an exit code, never a traceback.

    Standard output that cannot be written (``> /dev/full``: ENOSPC; any other error) is one
    line on stderr and exit 1; a reader that went away (EPIPE: ``| head``) ends the command
    quietly, as other tools do, with exit 1 (whatever it printed was cut short). A file error
    no command caught, or a bug, is one line on stderr and exit 1 (``-vv`` logs the traceback).
    """
    real_stdout = sys.stdout
    sys.stdout = cast(TextIO, _Stdout(real_stdout))
    try:
        rv = cli.main(args=list(argv) if argv is not None else None, standalone_mode=False)
        sys.stdout.flush()  # what is still buffered fails here, not at the interpreter's exit
    except StdoutError as e:
        _silence(real_stdout)
        if e.errno != errno.EPIPE:
            _stderr_line(f"error: writing to standard output: {e.strerror or e}")
        return EXIT_ERROR
    except click.UsageError as e:
        e.show()
        return EXIT_USAGE
    except click.ClickException as e:
        e.show()
        return EXIT_ERROR
    except click.exceptions.Abort:
        _err_console().print("aborted")
        return 130
    except click.exceptions.Exit as e:
        return int(e.exit_code)
    except OSError as e:
        return _fail(f"{e.strerror or e}" + (f": {e.filename}" if e.filename else ""), e)
    except Exception as e:  # a bug: one line, the traceback only at -vv
        fsio = sys.modules.get("reconciler.io.fsio")  # loaded if it raised FileReadError
        if fsio is not None and isinstance(e, fsio.FileReadError):
            return _fail(str(e), e)
        return _fail(f"internal error: {type(e).__name__}: {e}", e)
    finally:
        sys.stdout = real_stdout
    return int(rv) if isinstance(rv, int) else EXIT_OK


def _fail(message: str, e: BaseException) -> int:
    log.debug("traceback", exc_info=e)
    _stderr_line(f"error: {message}")
    return EXIT_ERROR


def _stderr_line(text: str) -> None:
    with contextlib.suppress(OSError):  # stderr itself may be gone
        sys.stderr.write(text + "\n")
        sys.stderr.flush()


class StdoutError(OSError):
    """Standard output could not be written (a full disk, a closed pipe)."""


class _Stdout:
    """Standard output, whose write errors are told apart from every other file's."""

    def __init__(self, inner: TextIO) -> None:
        self._inner = inner

    def write(self, text: str) -> int:
        try:
            return self._inner.write(text)
        except OSError as e:
            raise StdoutError(e.errno, e.strerror) from None

    def flush(self) -> None:
        try:
            self._inner.flush()
        except OSError as e:
            raise StdoutError(e.errno, e.strerror) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _silence(stdout: TextIO) -> None:
    """Point ``stdout`` at /dev/null, so that the interpreter's own flush at exit does not
    fail again on what is still buffered."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stdout.fileno())
        os.close(devnull)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
