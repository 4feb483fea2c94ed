"""A throwaway single-member etcd (Debian's etcd-server) on free loopback ports, for the
etcd benchmark and the tests (tests/support/etcd.py). Its data directory and log live in the
directory given; :meth:`EtcdServer.stop` ends it."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import requests

__all__ = ["EtcdServer", "EtcdUnavailable", "start_etcd"]


class EtcdUnavailable(RuntimeError):
    """No ``etcd`` binary on this machine."""


@dataclass
class EtcdServer:
    host: str
    port: int
    process: subprocess.Popen[bytes]
    data_dir: Path

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url(self, prefix: str) -> str:
        return f"etcd://{self.host}:{self.port}/{prefix.strip('/')}"

    def compact(self, revision: int) -> None:
        """Drop the history before ``revision`` (as etcd's auto-compaction does)."""
        r = requests.post(
            f"{self.endpoint}/v3/kv/compaction", json={"revision": revision, "physical": True}
        )
        r.raise_for_status()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_etcd(
    data_dir: Path,
    *,
    max_txn_ops: int,
    max_request_bytes: int,
    extra: Sequence[str] = (),
) -> EtcdServer:
    """Start etcd with its data in ``data_dir/data`` and its log in ``data_dir/etcd.log``;
    returns once it answers its health check. Raises :class:`EtcdUnavailable` without the
    binary, ``RuntimeError`` when it does not come up."""
    binary = shutil.which("etcd")
    if binary is None:
        raise EtcdUnavailable("no etcd binary (Debian: apt-get install etcd-server)")
    client, peer = _free_port(), _free_port()
    log = open(data_dir / "etcd.log", "wb")  # noqa: SIM115 - the server's lifetime
    process = subprocess.Popen(
        [
            binary,
            "--name=local",
            f"--data-dir={data_dir / 'data'}",
            f"--listen-client-urls=http://127.0.0.1:{client}",
            f"--advertise-client-urls=http://127.0.0.1:{client}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=local=http://127.0.0.1:{peer}",
            f"--max-txn-ops={max_txn_ops}",
            f"--max-request-bytes={max_request_bytes}",
            "--log-level=error",
            *extra,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    server = EtcdServer("127.0.0.1", client, process, data_dir)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"etcd exited: {(data_dir / 'etcd.log').read_text()[-2000:]}")
        try:
            if requests.get(f"{server.endpoint}/health", timeout=1).ok:
                return server
        except requests.RequestException:
            pass
        time.sleep(0.1)
    server.stop()
    raise RuntimeError("etcd did not become healthy within 30 s")
