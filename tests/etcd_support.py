"""A real etcd server for the tests (Debian's etcd-server; scripts/bootstrap installs it).

One server per test session on free loopback ports, its data directory in a temp dir, with the
request limits docs/etcd.md recommends (a unit's commit is one transaction). Each test gets its
own key prefix, so tests never see each other's keys. Without the ``etcd`` binary the tests
that need it skip, saying why.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

__all__ = ["EtcdServer", "etcd_server", "etcd_url", "start_etcd"]


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


def start_etcd(data_dir: Path) -> EtcdServer:
    binary = shutil.which("etcd")
    if binary is None:
        pytest.skip("no etcd binary (Debian: apt-get install etcd-server; scripts/bootstrap)")
    client, peer = _free_port(), _free_port()
    log = open(data_dir / "etcd.log", "wb")  # noqa: SIM115 - the server's lifetime
    process = subprocess.Popen(
        [
            binary,
            "--name=test",
            f"--data-dir={data_dir / 'data'}",
            f"--listen-client-urls=http://127.0.0.1:{client}",
            f"--advertise-client-urls=http://127.0.0.1:{client}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=test=http://127.0.0.1:{peer}",
            "--max-txn-ops=100000",
            "--max-request-bytes=67108864",
            "--log-level=error",
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


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    with tempfile.TemporaryDirectory(prefix="reconciler-etcd-") as tmp:
        server = start_etcd(Path(tmp))
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture
def etcd_url(etcd_server: EtcdServer) -> str:
    """A store URL with a prefix of this test's own."""
    return etcd_server.url(f"test/{uuid.uuid4().hex}")
