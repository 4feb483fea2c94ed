"""The state directory's lock names its holder (pid, command, since when) to whoever waits
for it: in the timeout's message, in the wait callback (reconcile's spinner) and in the log of
the commands that wait (issue 30); without writing anything."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.controller.reconcile import ReconcileOptions, reconcile
from reconciler.io.lock import LockHolder, LockTimeout, StateLock, command_text

HOLD = """\
import sys
from pathlib import Path
from reconciler.io.lock import StateLock
with StateLock(Path(sys.argv[-1])):
    print("held", flush=True)
    sys.stdin.read()
"""


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process, a script named ``reconciler`` run as ``reconciler watch --state DIR``,
    holding DIR's lock (DIR: tmp_path/state) until its stdin closes."""
    script = tmp_path / "bin" / "reconciler"
    script.parent.mkdir()
    script.write_text(HOLD)
    state = tmp_path / "state"
    state.mkdir()
    proc = subprocess.Popen(
        [sys.executable, str(script), "watch", "--state", str(state)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "held"
    try:
        yield proc
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


def _needs_proc_locks() -> None:
    if not Path("/proc/locks").is_file():
        pytest.skip("no /proc/locks: the holder cannot be named here")


def test_timeout_names_the_holder(tmp_path: Path, holder: subprocess.Popen[str]) -> None:
    _needs_proc_locks()
    state = tmp_path / "state"
    with pytest.raises(LockTimeout) as err, StateLock(state, timeout=0.2):
        pass
    text = str(err.value)
    assert f"is held by pid {holder.pid} (reconciler watch --state {state}), running since " in text
    assert " UTC (" in text and "waited 0.2 s" in text


def test_wait_callback_gets_the_holder_before_waiting(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    _needs_proc_locks()
    told: list[str] = []
    with pytest.raises(LockTimeout), StateLock(tmp_path / "state", 0.1, told.append):
        pass
    assert len(told) == 1 and told[0].startswith(f"pid {holder.pid} (reconciler watch")


def test_reconcile_spinner_says_whom_it_waits_for(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    _needs_proc_locks()
    stages: list[str] = []
    opts = ReconcileOptions(lock_timeout=0.2, on_stage=stages.append)
    with pytest.raises(LockTimeout):
        reconcile(tmp_path / "state", opts)
    assert stages and stages[0].startswith(f"waiting for the lock held by pid {holder.pid} ")


def test_cli_commands_that_wait_say_for_whom(
    tmp_path: Path, holder: subprocess.Popen[str], caplog: pytest.LogCaptureFixture
) -> None:
    """apply, export and import wait as long as it takes, and log whom they wait for."""
    _needs_proc_locks()
    from reconciler.cli.commands import _state_lock

    got = threading.Event()

    def take() -> None:
        with _state_lock(tmp_path / "state"):
            got.set()

    with caplog.at_level(logging.WARNING, logger="reconciler"):
        waiter = threading.Thread(target=take)
        waiter.start()
        assert not got.wait(0.5)  # still waiting
        assert holder.stdin is not None
        holder.stdin.close()  # the holder lets go
        assert got.wait(30)
        waiter.join(30)
    assert f"held by pid {holder.pid} (reconciler watch --state {tmp_path / 'state'})" in (
        caplog.text
    )


def test_a_free_lock_calls_no_wait_and_writes_nothing(tmp_path: Path) -> None:
    told: list[str] = []
    with StateLock(tmp_path):
        pass
    lock = tmp_path / ".lock"
    before = lock.stat().st_mtime_ns
    time.sleep(0.01)
    with StateLock(tmp_path, on_wait=told.append):
        pass
    assert told == []
    assert lock.read_bytes() == b"" and lock.stat().st_mtime_ns == before


def test_the_holder_in_this_process_is_named_too(tmp_path: Path) -> None:
    _needs_proc_locks()
    named = pytest.raises(LockTimeout, match=rf"pid {os.getpid()} \(")
    with StateLock(tmp_path), named, StateLock(tmp_path, timeout=0.05):
        pass


def test_command_text() -> None:
    py = "/usr/bin/python3.11"
    assert command_text([py, "/usr/local/bin/reconciler", "watch"]) == "reconciler watch"
    assert command_text([py, "-m", "reconciler", "plan"]) == "reconciler plan"
    assert command_text(["/usr/bin/reconciler", "reconcile"]) == "reconciler reconcile"
    assert command_text([py, "-c", "import x\nx.run()"]) == "python3.11 -c import x x.run()"
    assert len(command_text(["reconciler", "x" * 500])) == 200


def test_describe_ages() -> None:
    h = LockHolder(7, "reconciler reconcile", started=0.0)
    assert h.describe(now=5.0) == "pid 7 (reconciler reconcile), running since 00:00:00 UTC (5 s)"
    assert h.describe(now=600.0).endswith("(10 min)")
    assert LockHolder(7, "", None).describe() == "pid 7"
