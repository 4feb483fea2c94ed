"""``reconciler agent --node-config FILE``: the agent that also reports its node (SPEC §19)."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:  # imported where used: the command line's start-up loads none of it
    from reconciler.agent.node import AgentReport
    from reconciler.agent.runc import ContainerRuntime

__all__ = ["ReportingOptions", "node_report_options", "run_reporting_agent"]

F = TypeVar("F", bound=Callable[..., Any])
log = logging.getLogger("reconciler.agent")

DEFAULT_PLUGIN_DIR = Path("/var/lib/reconciler/device-plugins")
"""reconciler.agent.deviceplugin.manager.DEFAULT_PLUGIN_DIR (a test keeps them equal), without
loading grpc."""


def _duration(_ctx: click.Context, _param: click.Parameter, value: str) -> float:
    from reconciler.model.values import parse_duration

    try:
        got = parse_duration(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None
    if got <= 0:
        raise click.BadParameter("must be more than 0")
    return got


def node_report_options(f: F) -> F:
    """The agent's options for reporting its node."""
    f = click.option(
        "--device-plugin-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=str(DEFAULT_PLUGIN_DIR),
        show_default=True,
        help="With --node-config and --watch: serve the device plugin API (v1beta1) on "
        "DIR/kubelet.sock; plugins put their sockets here.",
    )(f)
    f = click.option(
        "--usage-interval",
        default="10s",
        show_default=True,
        callback=_duration,
        help="With --node-config and --watch: how often usage is sampled and the node written.",
    )(f)
    f = click.option(
        "--node-config",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="The node's declared facts (kind: NodeAgentConfig); the agent writes "
        "nodes/NODE.yaml from them and what it measures.",
    )(f)
    return f


@dataclass(frozen=True)
class ReportingOptions:
    node_config: Path
    usage_interval: float
    device_plugin_dir: Path
    once: bool
    stop_timeout: float
    log_dir: Path | None
    uplink: str | None = None


def run_reporting_agent(
    state_dir: Path,
    node_id: str,
    runc: ContainerRuntime,
    opts: ReportingOptions,
    *,
    as_json: bool = False,
    on_run: Callable[[AgentReport | None], None] | None = None,
) -> int:
    """Report the node, then apply its plan (once), or keep doing both until SIGTERM
    (``on_run``: called with each watching run's report, as ``agent_watch`` does)."""
    from reconciler.agent.deviceplugin.manager import DevicePluginManager
    from reconciler.agent.deviceplugin.prestart import PluginBundles, agent_bundles_dir
    from reconciler.agent.node import AgentError, agent_watch, run_agent_once
    from reconciler.agent.report import NodeReportError, load_node_config
    from reconciler.agent.reporter import NodeReporter
    from reconciler.agent.runc import RuncError
    from reconciler.io.lock import LockTimeout

    try:
        config = load_node_config(opts.node_config)
    except NodeReportError as e:
        click.echo(f"error: {e}", err=True)
        return 1
    if config.id != node_id:
        raise click.UsageError(f"{opts.node_config} is node {config.id!r}, not --node {node_id!r}")
    if opts.once:
        try:
            NodeReporter(state_dir, config, runc).report(sample=False)
            report = run_agent_once(
                state_dir,
                node_id,
                runc,
                stop_timeout=opts.stop_timeout,
                log_dir=opts.log_dir,
                uplink=opts.uplink,
            )
        except (NodeReportError, AgentError, RuncError, LockTimeout, OSError) as e:
            click.echo(f"error: {e}", err=True)
            return 1
        if as_json:
            click.echo(json.dumps(report.to_json(), indent=2, sort_keys=True))
        else:
            click.echo(report.summary())
        if report.stale:
            return 4
        return 1 if report.start_failed else 0

    logging.getLogger("reconciler").setLevel(min(logging.INFO, logging.getLogger().level))
    stop = threading.Event()
    plugins = DevicePluginManager(opts.device_plugin_dir)
    reporter = NodeReporter(state_dir, config, runc, plugins=plugins)
    plugins.on_change = reporter.wake.set
    try:
        plugins.start()
    except (OSError, RuntimeError) as e:
        click.echo(f"error: device plugin directory {opts.device_plugin_dir}: {e}", err=True)
        return 1
    try:
        reporter.report(sample=True)  # the node document exists before the first apply
    except (NodeReportError, LockTimeout, OSError) as e:
        plugins.stop()
        click.echo(f"error: {e}", err=True)
        return 1
    thread = threading.Thread(
        target=reporter.run, args=(stop, opts.usage_interval), name="node report", daemon=True
    )
    thread.start()
    bundles = PluginBundles(plugins, agent_bundles_dir(state_dir.resolve(), node_id))
    try:
        agent_watch(
            state_dir,
            node_id,
            runc,
            stop,
            stop_timeout=opts.stop_timeout,
            log_dir=opts.log_dir,
            prepare=bundles.prepare,
            on_run=on_run,
            uplink=opts.uplink,
        )
    finally:
        stop.set()
        thread.join(timeout=10)
        plugins.stop()
    return 0
