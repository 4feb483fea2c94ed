"""One writer at a time: an exclusive ``flock`` on ``DIR/.lock`` (SPEC §14).

flock, not POSIX ``lockf``: a POSIX lock vanishes when *any* descriptor of the file closes, and
the lock file is a dedicated file that is never replaced by rename. A flock dies with its
process, so there are no stale locks after a crash.

A writer that has to wait says for whom: the kernel's table of locks (``/proc/locks``) names the
process holding the flock on the file's inode, and ``/proc/PID`` its command line and start.
Nothing is written for it (a run that changes nothing leaves every file untouched, the lock
file included), and it cannot go stale: it is read when needed, from the kernel. Where the
table cannot be read (another pid namespace, no /proc), the holder is "another writer".
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

__all__ = ["LockHolder", "LockTimeout", "StateLock", "lock_holder"]

_PROC = Path("/proc")


class LockTimeout(TimeoutError):
    pass


@dataclass(frozen=True)
class LockHolder:
    """The process holding a state directory's lock."""

    pid: int
    command: str
    started: float | None  # seconds since the epoch; None when unknown

    def describe(self, now: float | None = None) -> str:
        """``pid 4242 (reconciler watch --state s), running since 02:51:07 UTC (12 s)``."""
        text = f"pid {self.pid} ({self.command})" if self.command else f"pid {self.pid}"
        if self.started is None:
            return text
        now = time.time() if now is None else now
        at = time.strftime("%H:%M:%S UTC", time.gmtime(self.started))
        return f"{text}, running since {at} ({_age(max(0, round(now - self.started)))})"


def _age(seconds: int) -> str:
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def command_text(argv: list[str]) -> str:
    """A command line as people typed it: ``reconciler watch --state s`` rather than
    ``/usr/bin/python3 /usr/local/bin/reconciler watch --state s``; at most 200 characters."""
    if argv and os.path.basename(argv[0]).startswith("python") and len(argv) > 1:
        if argv[1] == "-m" and len(argv) > 2:
            argv = argv[2:]
        elif not argv[1].startswith("-"):
            argv = argv[1:]
    if not argv:
        return ""
    text = " ".join([os.path.basename(argv[0]), *argv[1:]])
    text = " ".join(text.split())
    return text if len(text) <= 200 else text[:197] + "..."


def _holder_pid(fd: int) -> int | None:
    """The pid holding a flock on ``fd``'s file, from /proc/locks (waiters' lines, ``->``,
    are skipped)."""
    st = os.fstat(fd)
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        table = (_PROC / "locks").read_text()
    except OSError:
        return None
    for line in table.splitlines():
        fields = line.split()
        if len(fields) < 6 or fields[1] == "->" or fields[1] != "FLOCK":
            continue
        if fields[5] == where:
            try:
                pid = int(fields[4])
            except ValueError:
                return None
            return pid if pid > 0 else None
    return None


def _started(pid: int) -> float | None:
    """When process ``pid`` started (its starttime, in clock ticks after boot)."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        boot = next(
            int(line.split()[1])
            for line in (_PROC / "stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def lock_holder(fd: int) -> LockHolder | None:
    """Who holds the flock on the open lock file ``fd``, or None when it cannot be told."""
    pid = _holder_pid(fd)
    if pid is None:
        return None
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        raw = b""
    argv = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
    return LockHolder(pid, command_text(argv), _started(pid))


def _holder_text(fd: int) -> str:
    holder = lock_holder(fd)
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

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
