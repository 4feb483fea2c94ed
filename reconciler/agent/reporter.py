"""The agent's reporting loop: measure, merge with the node config, write ``nodes/<id>.yaml``
every ``--usage-interval`` and at once when a device plugin's devices change."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from reconciler.agent.deviceplugin.manager import DevicePluginManager
from reconciler.agent.node import container_id
from reconciler.agent.report import (
    NodeAgentConfig,
    NodeReportError,
    Sampler,
    measure_static,
    node_bytes,
    node_document,
    write_node_report,
)
from reconciler.agent.runc import ContainerRuntime, RuncError
from reconciler.io.lock import LockTimeout
from reconciler.model.documents import DevicePool, Node

__all__ = ["NodeReporter"]

log = logging.getLogger("reconciler.agent.report")


class NodeReporter:
    """Writes one node's document from its config, its measurements and its plugins."""

    def __init__(
        self,
        state_dir: Path,
        config: NodeAgentConfig,
        runtime: ContainerRuntime,
        *,
        plugins: DevicePluginManager | None = None,
        clock: Callable[[], float] = time.time,
        sampler: Sampler | None = None,
        lock_timeout: float | None = 30.0,
    ) -> None:
        self.state_dir = state_dir
        self.config = config
        self.runtime = runtime
        self.plugins = plugins
        self.clock = clock
        self.sampler = sampler or Sampler(config.maxDMIPS)
        self.lock_timeout = lock_timeout
        self.wake = threading.Event()
        self._last: bytes | None = None
        self.last_node: Node | None = None

    def _containers(self) -> dict[str, int]:
        """The running containers of this node: instance id -> pid of their init."""
        prefix = container_id(self.config.id, "")
        try:
            states = self.runtime.list()
        except RuncError as e:
            log.warning("%s: runc list: %s", self.config.id, e)
            return {}
        return {
            st.id[len(prefix) :]: st.pid
            for st in states
            if st.id.startswith(prefix) and st.status == "running" and st.pid > 0
        }

    def report(self, *, sample: bool = True) -> Node:
        """Measure and write the node document (only when its bytes changed)."""
        facts = measure_static(self.config)
        usage = self.sampler.sample(self._containers()) if sample else None
        if usage is None and self.last_node is not None and self.last_node.usage is not None:
            kept = self.last_node.usage  # (the first sample only starts a window)
            node = node_document(self.config, facts, self._pools(), None, self._now())
            node = node.model_copy(update={"usage": kept})
        else:
            node = node_document(self.config, facts, self._pools(), usage, self._now())
        data = node_bytes(node)
        if data != self._last:
            write_node_report(self.state_dir, node, self.lock_timeout)
            self._last = data
        self.last_node = node
        return node

    def _pools(self) -> tuple[DevicePool, ...]:
        return self.plugins.pools() if self.plugins is not None else ()

    def _now(self) -> datetime:
        return datetime.fromtimestamp(int(self.clock()), UTC)

    def run(self, stop: threading.Event, interval: float) -> None:
        """Report every ``interval`` seconds and whenever :attr:`wake` is set, until ``stop``."""
        while not stop.is_set():
            try:
                self.report()
            except (NodeReportError, LockTimeout, OSError, ValueError) as e:
                log.error("%s: node report failed: %s", self.config.id, e)
            self.wake.clear()
            deadline = time.monotonic() + interval
            while not stop.is_set() and not self.wake.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.wake.wait(min(left, 0.5))
                if stop.is_set():
                    return
