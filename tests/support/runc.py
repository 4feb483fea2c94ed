"""Running real runc containers from the OCI tests: the busybox applets their rootfs holds, the
runtime's architecture name, and ``runc`` with a private ``--root``. The ``runc_env`` fixture
that probes whether runc can run here is in tests/oci/conftest.py."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

from tests.support.busybox import make_busybox_rootfs

APPLETS = ("sh", "cat", "echo", "grep", "head", "hostname", "id", "ls", "stat", "true", "sleep")

ARCH = {"aarch64": "arm64"}.get(platform.machine(), platform.machine())


def run_runc(runc_root: Path, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["runc", "--root", str(runc_root), *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def make_runc_rootfs(rootfs: Path, busybox: str) -> None:
    # no /tmp: runc gives a tmpfs mounted over an existing directory that directory's mode,
    # ignoring mode=1777 (images ship /tmp as 1777); here the mount option must do it
    make_busybox_rootfs(rootfs, busybox, APPLETS, ("etc", "proc", "sys", "dev", "data"))
