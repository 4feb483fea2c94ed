"""Fixtures of the controller's tests."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest


@pytest.fixture
def replicas() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Controller processes a test starts (it appends them): each still running at the end is
    killed (SIGKILL) and reaped."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
