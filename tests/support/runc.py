"""Running real runc containers from the OCI tests: the busybox applets their rootfs holds, the
runtime's architecture name, and ``runc`` with a private ``--root``. The ``runc_env`` fixture
that probes whether runc can run here is in tests/oci/conftest.py."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.busybox import find_static_busybox, make_busybox_rootfs

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


def require_runc_and_busybox() -> str:
    """The static busybox to build container roots from; skips the test, saying why, when
    containers cannot run here (not root, no runc, no static busybox)."""
    if os.geteuid() != 0:
        pytest.skip("runc containers need root here (euid is not 0)")
    if shutil.which("runc") is None:
        pytest.skip("runc is not on PATH (scripts/bootstrap or .ci/run installs it)")
    busybox = find_static_busybox()
    if busybox is None:
        pytest.skip("no static busybox (/bin/busybox from busybox-static) for the rootfs")
    return busybox
