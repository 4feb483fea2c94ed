"""Headless Chromium (Debian's ``chromium``, installed by scripts/bootstrap) for the tests of
the status page: a screenshot, or the DOM after load."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest


def chromium() -> str:
    """The browser's path; skips the test (saying why) when it is not installed."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found is not None:
            return found
    pytest.skip("chromium is not installed (scripts/bootstrap installs Debian's chromium)")


def _run(
    page: Path, size: tuple[int, int], *args: str, timeout: float
) -> subprocess.CompletedProcess[bytes]:
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        return subprocess.run(
            [
                chromium(),
                "--headless",
                "--no-sandbox",  # tests run as root
                "--disable-gpu",
                "--hide-scrollbars",
                "--no-first-run",
                "--disable-extensions",
                f"--user-data-dir={profile}",
                f"--window-size={size[0]},{size[1]}",
                *args,
                page.resolve().as_uri(),
            ],
            capture_output=True,
            timeout=timeout,
            check=False,
        )


def screenshot(page: Path, target: Path, size: tuple[int, int], *, timeout: float = 120) -> bytes:
    """A PNG of ``page`` at ``size`` (CSS pixels)."""
    proc = _run(page, size, f"--screenshot={target}", timeout=timeout)
    assert target.exists(), proc.stderr.decode(errors="replace")[-2000:]
    return target.read_bytes()


def dump_dom(
    page: Path, size: tuple[int, int] = (1280, 800), *args: str, timeout: float = 120
) -> str:
    """The serialized DOM of ``page`` once loaded (``--dump-dom``); ``args``: more flags."""
    proc = _run(page, size, "--dump-dom", *args, timeout=timeout)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    return proc.stdout.decode()
