"""Running the command line on a pseudo-terminal, as a person would (colors, a terminal's width)."""

from __future__ import annotations

import subprocess
import sys


def run_in_pty(args: list[str], env: dict[str, str]) -> bytes:
    """Run the CLI on a pseudo-terminal, as a person would, and return what it printed."""
    import os
    import pty

    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "reconciler", *args],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env=env,
        close_fds=True,
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    proc.wait(timeout=60)
    os.close(leader)
    return b"".join(chunks)
