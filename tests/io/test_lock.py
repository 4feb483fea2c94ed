"""The state directory's lock names its holder (pid, command, since) to whoever waits for it:
in the timeout's message and in the wait callback (reconcile's spinner) (issue 30)."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.controller.reconcile import ReconcileOptions, reconcile
from reconciler.io.lock import LockHolder, LockTimeout, StateLock

HOLD = """
import sys
import threading
from pathlib import Path
from reconciler.io.lock import StateLock
sys.argv = ["reconciler", "watch", "--state", sys.argv[1]]
with StateLock(Path(sys.argv[3])):
    print("held", flush=True)
    sys.stdin.read()
"""


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process (as `reconciler watch --state DIR`) holding tmp_path's lock."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)],
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


def test_timeout_names_the_holder(tmp_path: Path, holder: subprocess.Popen[str]) -> None:
    with pytest.raises(LockTimeout) as err, StateLock(tmp_path, timeout=0.2):
        pass
    text = str(err.value)
    assert f"pid {holder.pid} (reconciler watch --state {tmp_path}) since " in text
    assert " UTC, " in text and " s ago" in text
    assert "waited 0.2 s" in text


def test_wait_callback_gets_the_holder_before_waiting(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    told: list[str] = []
    with pytest.raises(LockTimeout), StateLock(tmp_path, timeout=0.1, on_wait=told.append):
        pass
    assert len(told) == 1 and told[0].startswith(f"pid {holder.pid} (reconciler watch")


def test_reconcile_spinner_says_whom_it_waits_for(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    stages: list[str] = []
    opts = ReconcileOptions(lock_timeout=0.2, on_stage=stages.append)
    with pytest.raises(LockTimeout):
        reconcile(tmp_path, opts)
    assert stages and stages[0].startswith(f"waiting for the lock held by pid {holder.pid} ")


def test_free_lock_calls_no_wait_and_leaves_no_record(tmp_path: Path) -> None:
    told: list[str] = []
    with StateLock(tmp_path, on_wait=told.append):
        assert b'"pid"' in (tmp_path / ".lock").read_bytes()
    assert told == []
    assert (tmp_path / ".lock").read_bytes() == b""  # no record of a holder that is gone


def test_unknown_or_torn_record_reads_as_another_writer(tmp_path: Path) -> None:
    with StateLock(tmp_path):
        (tmp_path / ".lock").write_text('{"pid": 12')  # torn
        with (
            pytest.raises(LockTimeout, match="held by another writer"),
            StateLock(tmp_path, timeout=0.1),
        ):
            pass


def test_describe_ages() -> None:
    h = LockHolder(7, "reconciler reconcile", since=0.0)
    assert h.describe(now=5.0) == "pid 7 (reconciler reconcile) since 00:00:00 UTC, 5 s ago"
    assert h.describe(now=600.0).endswith(", 10 min ago")


def test_cli_commands_that_wait_say_for_whom(
    tmp_path: Path, holder: subprocess.Popen[str], caplog: pytest.LogCaptureFixture
) -> None:
    """apply, export and import wait as long as it takes, and log whom they wait for."""
    from reconciler.cli.commands import _state_lock

    got = threading.Event()

    def take() -> None:
        with _state_lock(tmp_path):
            got.set()

    with caplog.at_level(logging.WARNING, logger="reconciler"):
        waiter = threading.Thread(target=take)
        waiter.start()
        assert not got.wait(0.5)  # still waiting
        assert holder.stdin is not None
        holder.stdin.close()  # the holder lets go
        assert got.wait(30)
        waiter.join(30)
    assert f"held by pid {holder.pid} (reconciler watch --state {tmp_path})" in caplog.text
