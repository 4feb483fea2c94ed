"""Exporting Prometheus metrics (SPEC §20): an HTTP endpoint for the long-running processes
(``--metrics-addr``) and a node-exporter textfile for the oneshot (``--metrics-file``).

Both expose a ``prometheus_client`` registry in the text exposition format. The textfile is
written as every other output: a temp file in the same directory, fsync, rename, fsync of the
directory, so node-exporter's textfile collector never reads half a file. It is world-readable
(0644: node-exporter runs as its own user) whatever the process's umask.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from reconciler.io.fsio import FileReadError, atomic_write, read_bytes_at

__all__ = [
    "MetricsServer",
    "parse_metrics_addr",
    "read_metrics_file",
    "serve_metrics",
    "write_metrics_file",
]

log = logging.getLogger("reconciler.metrics")

MAX_METRICS_FILE_BYTES = 64 << 20
"""A metrics file larger than this is not read back (the controller's is a few MB at most)."""


def parse_metrics_addr(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for an IPv6 address; PORT 0 picks a free port). Raises
    ValueError with what is wrong."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{text!r}: expected HOST:PORT (e.g. 127.0.0.1:9464 or [::1]:0)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"{text!r}: the port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"{text!r}: the port must be in 0..65535")
    return host, port


class _Server(Protocol):
    server_port: int

    def shutdown(self) -> None: ...

    def server_close(self) -> None: ...


@dataclass
class MetricsServer:
    """A running endpoint: ``/metrics`` (any path answers) on ``host:port``."""

    host: str
    port: int
    _server: _Server
    _thread: threading.Thread

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve_metrics(registry: CollectorRegistry, addr: str) -> MetricsServer:
    """Serve ``registry`` on ``addr`` (:func:`parse_metrics_addr`) from a daemon thread and log
    the address, with the port the system chose for port 0. Raises ValueError for a bad
    address, OSError when it cannot listen."""
    host, port = parse_metrics_addr(addr)
    server, thread = start_http_server(port, addr=host, registry=registry)
    chosen = MetricsServer(host, int(server.server_port), server, thread)
    log.info("serving metrics on %s", chosen.url)
    return chosen


def write_metrics_file(path: Path, registry: CollectorRegistry) -> None:
    """``registry`` in the text format at ``path``, atomically, mode 0644."""
    atomic_write(path, generate_latest(registry), mode=0o644)


def read_metrics_file(path: Path) -> list[Metric]:
    """The metric families of a metrics file written before (empty when there is none, or it
    cannot be read or parsed: the file only carries values over from one run to the next)."""
    try:
        raw, _ = read_bytes_at(path, MAX_METRICS_FILE_BYTES)
    except FileReadError:
        return []
    if len(raw) > MAX_METRICS_FILE_BYTES:
        return []
    try:
        return list(text_string_to_metric_families(raw.decode()))
    except (ValueError, UnicodeDecodeError, TypeError) as e:
        log.warning("%s: not a metrics file (%s); counting from zero", path, e)
        return []
