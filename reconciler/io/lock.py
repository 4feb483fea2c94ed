"""One writer at a time: an exclusive ``flock`` on ``DIR/.lock`` (SPEC §14).

flock, not POSIX ``lockf``: a POSIX lock vanishes when *any* descriptor of the file closes, and
the lock file is a dedicated file that is never replaced by rename. A flock dies with its
process, so there are no stale locks after a crash.

The holder writes who it is into the lock file (one JSON line: pid, command, since), in place
(the file is never renamed over: that would be a new inode, with no lock on it), and empties it
before it lets go; a writer that waits reads it to say whom it waits for. The record is only a
message: a torn or stale one (a holder killed before emptying it; the flock itself is gone with
the process) reads as an unknown holder or names a dead process, never blocks anyone.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

__all__ = ["LockHolder", "LockTimeout", "StateLock", "read_holder"]

_MAX_RECORD = 4096


class LockTimeout(TimeoutError):
    pass


@dataclass(frozen=True)
class LockHolder:
    """Who holds a state directory's lock, as it wrote it."""

    pid: int
    command: str
    since: float  # seconds since the epoch

    def describe(self, now: float | None = None) -> str:
        """``pid 4242 (reconciler watch --state s) since 02:51:07 UTC, 12 s ago``."""
        now = time.time() if now is None else now
        at = time.strftime("%H:%M:%S UTC", time.gmtime(self.since))
        ago = max(0, round(now - self.since))
        return f"pid {self.pid} ({self.command}) since {at}, {_age(ago)} ago"


def _age(seconds: int) -> str:
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def _this_command() -> str:
    argv = list(sys.argv) or ["python"]
    name = os.path.basename(argv[0])
    if name == "__main__.py":  # python -m reconciler
        name = "reconciler"
    text = " ".join([name, *argv[1:]])
    return text if len(text) <= 200 else text[:197] + "..."


def _parse(raw: bytes) -> LockHolder | None:
    try:
        doc = json.loads(raw)
        pid, command, since = doc["pid"], doc["command"], doc["since"]
    except (ValueError, TypeError, KeyError):
        return None
    if not (isinstance(pid, int) and isinstance(command, str)):
        return None
    if not isinstance(since, int | float):
        return None
    return LockHolder(pid, command, float(since))


def read_holder(fd: int) -> LockHolder | None:
    """The record in an open lock file, or None (none, torn, or not ours)."""
    try:
        return _parse(os.pread(fd, _MAX_RECORD, 0))
    except OSError:
        return None


def _holder_text(fd: int) -> str:
    holder = read_holder(fd)
    return "another writer" if holder is None else holder.describe()


class StateLock:
    """``with StateLock(dir):`` holds the state directory's writer lock.

    ``on_wait`` is called (with the holder's description) when the lock is taken by someone
    else, before waiting for it."""

    def __init__(
        self,
        state_dir: Path,
        timeout: float | None = None,
        on_wait: Callable[[str], None] | None = None,
    ) -> None:
        self.path = state_dir / ".lock"
        self.timeout = timeout
        self.on_wait = on_wait
        self._fd: int | None = None

    def __enter__(self) -> StateLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            self._acquire(fd)
            self._write_record(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def _acquire(self, fd: int) -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        if self.on_wait is not None:
            self.on_wait(_holder_text(fd))
        if self.timeout is None:
            fcntl.flock(fd, fcntl.LOCK_EX)
            return
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockTimeout(
                        f"{self.path} is held by {_holder_text(fd)} (waited {self.timeout:g} s)"
                    ) from None
                time.sleep(0.05)

    @staticmethod
    def _write_record(fd: int) -> None:
        record = {"pid": os.getpid(), "command": _this_command(), "since": round(time.time(), 3)}
        data = json.dumps(record, sort_keys=True).encode() + b"\n"
        with contextlib.suppress(OSError):  # only a message for waiters: never fails the holder
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)  # no record of a holder that is gone
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
