"""The filters of ``reconciler status`` as click options (see :mod:`reconciler.cli.statusview`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:  # (statusview loads rich: imported where used, not by `--help`)
    from reconciler.cli.statusview import StatusFilter

__all__ = ["INSTANCE_STATES", "status_filter", "status_filter_options"]

INSTANCE_STATES = ("activating", "active", "failed", "inactive", "pending")
"""The states status.json gives an instance: its agent's, or pending while none reports it."""

F = TypeVar("F", bound=Callable[..., Any])


def status_filter_options(f: F) -> F:
    options = (
        click.option(
            "--node",
            "nodes",
            multiple=True,
            metavar="ID",
            help="Only this node and its instances (repeatable).",
        ),
        click.option(
            "--service",
            "services",
            multiple=True,
            metavar="ITEM[:SUBJECT]",
            help="Only the instances of this service (repeatable), and their nodes.",
        ),
        click.option(
            "--in-state",
            "states",
            multiple=True,
            metavar="STATE",
            help=f"Only the instances in this state (repeatable): {', '.join(INSTANCE_STATES)}. "
            "(--state is the state directory.)",
        ),
        click.option(
            "--failed",
            is_flag=True,
            help="Only the failed instances and the unplaceable ones.",
        ),
        click.option(
            "--instances",
            "list_instances",
            is_flag=True,
            help="List every instance even on a large unit (above 100 instances, the default "
            "is the summary and the nodes).",
        ),
    )
    for option in reversed(options):
        f = option(f)
    return f


def status_filter(
    nodes: tuple[str, ...],
    services: tuple[str, ...],
    states: tuple[str, ...],
    failed: bool,
    list_instances: bool,
) -> StatusFilter:
    from reconciler.cli.statusview import StatusFilter

    return StatusFilter(
        nodes=tuple(sorted(set(nodes))),
        services=tuple(sorted(set(services))),
        states=tuple(sorted(set(states))),
        failed=failed,
        instances=list_instances,
    )
