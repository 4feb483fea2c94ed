"""One writer at a time: an exclusive ``flock`` on ``DIR/.lock`` (SPEC §14).

flock, not POSIX ``lockf``: a POSIX lock vanishes when *any* descriptor of the file closes, and
the lock file is a dedicated file that is never replaced by rename. A flock dies with its
process, so there are no stale locks after a crash.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from types import TracebackType

__all__ = ["LockTimeout", "StateLock"]


class LockTimeout(TimeoutError):
    pass


class StateLock:
    """``with StateLock(dir):`` holds the state directory's writer lock."""

    def __init__(self, state_dir: Path, timeout: float | None = None) -> None:
        self.path = state_dir / ".lock"
        self.timeout = timeout
        self._fd: int | None = None

    def __enter__(self) -> StateLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            if self.timeout is None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            else:
                deadline = time.monotonic() + self.timeout
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() >= deadline:
                            raise LockTimeout(
                                f"{self.path} is held by another writer (waited {self.timeout:g}s)"
                            ) from None
                        time.sleep(0.05)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

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
