"""``reconciler agent --uplink IFACE``: the interface that carries the networks' VLANs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

__all__ = ["SYS_NET", "uplink_option"]

F = TypeVar("F", bound=Callable[..., Any])

SYS_NET = Path("/sys/class/net")
"""Where the kernel lists this node's network interfaces, one entry per name."""


def _uplink(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    from reconciler.agent.network import interface_name_problem

    problem = interface_name_problem(value)
    if problem is None and not (SYS_NET / value).exists():
        problem = f"no network interface {value!r} on this node (ip link show lists them)"
    if problem is not None:
        raise click.BadParameter(problem)
    return value


def uplink_option(f: F) -> F:
    """The agent's ``--uplink``: checked at start, so a wrong name changes nothing."""
    return click.option(
        "--uplink",
        default=None,
        metavar="IFACE",
        callback=_uplink,
        help="The interface that carries the networks' VLANs to the other nodes: each network "
        "with a VLAN id gets a sub-interface rv-<10 hex digits> on IFACE, on its bridge. "
        "Without it, VLAN ids are ignored (networks stay on the node). An interface that does "
        "not exist is a usage error (exit 64): the agent does not start.",
    )(f)
