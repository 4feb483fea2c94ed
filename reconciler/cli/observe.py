"""The command line's side of observability (SPEC §20): ``--metrics-addr``, ``--metrics-file``
and ``status --html``."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:  # imported where used: the command line's start-up loads none of it
    from reconciler.agent.metrics import AgentMetrics
    from reconciler.controller.reconcile import ReconcileReport

__all__ = [
    "agent_metrics",
    "controller_metrics",
    "metrics_addr_option",
    "write_reconcile_metrics",
    "write_status_page",
]

log = logging.getLogger("reconciler.metrics")

F = TypeVar("F", bound=Callable[..., Any])


def _addr(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None:
        from reconciler.io.metrics_export import parse_metrics_addr

        try:
            parse_metrics_addr(value)
        except ValueError as e:
            raise click.BadParameter(str(e)) from None
    return value


def metrics_addr_option(what: str) -> Callable[[F], F]:
    return click.option(
        "--metrics-addr",
        default=None,
        metavar="HOST:PORT",
        callback=_addr,
        help=f"Serve {what} Prometheus metrics on http://HOST:PORT/metrics (off by default; "
        "port 0 picks a free port, logged at start).",
    )


@contextlib.contextmanager
def controller_metrics(
    addr: str | None,
) -> Iterator[Callable[[ReconcileReport | None], None] | None]:
    """With an address: the controller's metrics served there, and the hook that counts each
    run (``on_run``); without: None."""
    if addr is None:
        yield None
        return
    from reconciler.controller.metrics import ControllerMetrics

    metrics = ControllerMetrics()
    server = _serve(metrics.registry, addr)
    try:
        yield metrics.observe
    finally:
        server.close()


@contextlib.contextmanager
def agent_metrics(addr: str | None) -> Iterator[AgentMetrics | None]:
    if addr is None:
        yield None
        return
    from reconciler.agent.metrics import AgentMetrics

    metrics = AgentMetrics()
    server = _serve(metrics.registry, addr)
    try:
        yield metrics
    finally:
        server.close()


def _serve(registry: Any, addr: str) -> Any:
    from reconciler.io.metrics_export import serve_metrics

    try:
        return serve_metrics(registry, addr)
    except OSError as e:
        raise click.ClickException(f"--metrics-addr {addr}: {e.strerror or e}") from None


def write_reconcile_metrics(path: Path, report: ReconcileReport | None) -> None:
    """``reconcile --metrics-file``: this run's metrics, continuing the counters of the file
    written before. A file that cannot be written is a warning: the run's outputs are out."""
    from reconciler.controller.metrics import ControllerMetrics
    from reconciler.io.metrics_export import read_metrics_file, write_metrics_file

    metrics = ControllerMetrics(before=read_metrics_file(path))
    metrics.observe(report)
    try:
        write_metrics_file(path, metrics.registry)
    except OSError as e:
        log.warning("--metrics-file %s: not written: %s", path, e.strerror or e)


def write_status_page(doc: dict[str, Any], made_at: float, target: Path) -> int:
    """``status --html FILE``: the page of ``doc`` at ``target`` (atomically); its size."""
    from reconciler.controller.statuspage import render_status_page
    from reconciler.io.fsio import atomic_write

    page = render_status_page(doc, made_at=made_at)
    atomic_write(target, page, mode=0o644)
    return len(page)
