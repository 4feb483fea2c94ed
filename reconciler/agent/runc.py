"""A small typed wrapper around the ``runc`` binary (SPEC §15).

Every call is a plain ``subprocess.run`` of an argument list (never a shell) with a timeout.
Each :class:`Runc` may have its own ``--root`` (the directory where runc keeps its container
state), so that agents of different nodes on one machine never see each other's containers.

``run_detached`` is the one call that leaves a process behind: a detached container inherits
runc's stdin, stdout and stderr, so they are ``/dev/null`` or a log file, never a pipe that we
would wait on (the wait would last as long as the container). runc's own diagnostics go to a
private ``--log`` file in JSON, read back for the error message and then removed.

A failed command raises :class:`RuncError` with the command and runc's message.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal as signals
import stat
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "ContainerRuntime",
    "ContainerState",
    "Runc",
    "RuncError",
    "delete_quietly",
    "validate_container_id",
]

_log = logging.getLogger("reconciler.runc")

# runc accepts ``^[\w+-\.]+$``; a leading '-' would be read as a flag, so it is refused here
_CONTAINER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,1023}$")
_SIGNAL = re.compile(r"^(SIG)?[A-Z][A-Z0-9+-]{0,15}$")
_TEXT_MSG = re.compile(r'level=(\w+) msg="((?:[^"\\]|\\.)*)"')
_MAX_ERROR = 4000
DEFAULT_ROOT = Path("/run/runc")  # runc's --root default when run as root


def validate_container_id(value: str) -> str:
    """Raise ValueError unless runc would take ``value`` as a container id (never a flag)."""
    if not _CONTAINER_ID.match(value) or value in (".", ".."):
        raise ValueError(f"invalid container id {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class ContainerState:
    """What ``runc state`` says of one container."""

    id: str
    status: str  # created | running | paused | stopped (runc also has creating, pausing)
    pid: int = 0
    bundle: str = ""
    created: str = ""

    @classmethod
    def from_json(cls, data: Any) -> ContainerState:
        if not isinstance(data, dict) or not isinstance(data.get("id"), str):
            raise ValueError(f"not a runc container state: {data!r:.200}")
        status = data.get("status")
        pid = data.get("pid")
        return cls(
            id=data["id"],
            status=status if isinstance(status, str) else "unknown",
            pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else 0,
            bundle=str(data.get("bundle") or ""),
            created=str(data.get("created") or ""),
        )


class RuncError(RuntimeError):
    """A runc command failed; ``message`` is runc's own error (or why the call failed)."""

    def __init__(
        self, command: Sequence[str], message: str, *, returncode: int | None = None
    ) -> None:
        self.command = tuple(command)
        self.message = message
        self.returncode = returncode
        shown = " ".join(self.command)
        super().__init__(f"`{shown}` failed: {message}" if message else f"`{shown}` failed")


class ContainerRuntime(Protocol):
    """The operations the agent needs; :class:`Runc` implements them (tests use a fake)."""

    def state(self, container_id: str) -> ContainerState | None: ...

    def list(self) -> list[ContainerState]: ...

    def run_detached(self, container_id: str, bundle: Path, log: Path | None = None) -> None: ...

    def kill(self, container_id: str, signal: int | str = signals.SIGTERM) -> None: ...

    def delete(self, container_id: str, force: bool = False) -> None: ...


def _messages(stderr: str) -> str:
    """runc's error lines as plain text: the ``msg`` of each text-format log line."""
    out: list[str] = []
    for line in stderr.splitlines():
        line = line.strip()
        if not line:
            continue
        m = _TEXT_MSG.search(line)
        if m is None:
            out.append(line)
        elif m.group(1) in ("error", "fatal", "panic"):
            out.append(m.group(2).replace('\\"', '"').replace("\\\\", "\\"))
    text = "; ".join(out) or stderr.strip()
    return text[:_MAX_ERROR]


def _json_log_messages(raw: str) -> tuple[list[str], list[str]]:
    """(errors, warnings) from a runc ``--log-format json`` file."""
    errors: list[str] = []
    warnings: list[str] = []
    for line in raw.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            if line.strip():
                errors.append(line.strip())
            continue
        if not isinstance(entry, dict):
            continue
        msg = str(entry.get("msg", ""))
        level = entry.get("level")
        if level in ("error", "fatal", "panic"):
            errors.append(msg)
        elif level == "warning":
            warnings.append(msg)
    return errors, warnings


class Runc:
    """``runc [--root ROOT] …``; each method is one runc command with a timeout."""

    def __init__(
        self, binary: str = "runc", root: Path | None = None, *, timeout: float = 30.0
    ) -> None:
        self.binary = binary
        self.root = root
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"Runc(binary={self.binary!r}, root={self.root!r})"

    def _base(self) -> list[str]:
        cmd = [self.binary]
        if self.root is not None:
            cmd += ["--root", str(self.root)]
        return cmd

    def _spawn(self, cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` with stdin closed and the timeout; failures to run become RuncError."""
        try:
            done: subprocess.CompletedProcess[str] = subprocess.run(
                cmd, stdin=subprocess.DEVNULL, timeout=self.timeout, check=False, **kwargs
            )
        except subprocess.TimeoutExpired:
            raise RuncError(cmd, f"no answer within {self.timeout:g}s") from None
        except OSError as e:
            raise RuncError(cmd, f"cannot run {self.binary}: {e.strerror or e}") from None
        return done

    def _run(self, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return self._spawn([*self._base(), *args], capture_output=True, text=True)

    def _check(self, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        done = self._run(args)
        if done.returncode != 0:
            raise RuncError(done.args, _messages(done.stderr), returncode=done.returncode)
        return done

    @property
    def state_root(self) -> Path:
        """Where runc keeps its containers' state: ``--root``, else runc's default for root."""
        return self.root if self.root is not None else DEFAULT_ROOT

    def leftover(self, container_id: str) -> Path | None:
        """The container's directory under the runc root when it holds no readable
        ``state.json``: what a ``runc run`` killed before it wrote its state leaves behind.
        runc calls such a container absent but refuses to create it again ("container with id
        exists"). None when there is no such directory, or it holds a state."""
        validate_container_id(container_id)
        path = self.state_root / container_id
        try:
            if not stat.S_ISDIR(path.lstat().st_mode):
                return None
            raw = (path / "state.json").read_bytes()
        except FileNotFoundError:
            return path if path.is_dir() and not path.is_symlink() else None
        except OSError:
            return None
        try:
            if isinstance(json.loads(raw), dict):
                return None
        except ValueError:
            pass
        return path

    def state(self, container_id: str) -> ContainerState | None:
        """The container's state, or None when it does not exist (or is only a leftover
        directory without a state: see :meth:`leftover`)."""
        validate_container_id(container_id)
        done = self._run(["state", container_id])
        if done.returncode != 0:
            if "does not exist" in done.stderr or self.leftover(container_id) is not None:
                return None
            raise RuncError(done.args, _messages(done.stderr), returncode=done.returncode)
        try:
            return ContainerState.from_json(json.loads(done.stdout))
        except ValueError as e:
            raise RuncError(done.args, f"unreadable output: {e}") from None

    def list(self) -> list[ContainerState]:
        """Every container under this root (``runc list --format json``), sorted by id."""
        done = self._check(["list", "--format", "json"])
        try:
            data = json.loads(done.stdout or "null")
            if data is None:  # runc prints null for no containers
                return []
            if not isinstance(data, list):
                raise ValueError("expected a list")
            states = [ContainerState.from_json(item) for item in data]
        except ValueError as e:
            raise RuncError(done.args, f"unreadable output: {e}") from None
        return sorted(states, key=lambda s: s.id)

    def run_detached(self, container_id: str, bundle: Path, log: Path | None = None) -> None:
        """``runc run --detach --bundle BUNDLE ID``: create and start; returns once it runs.
        A :meth:`leftover` directory of the id is removed first.

        The container's stdio is ``/dev/null`` (stdin) and ``log`` (stdout and stderr, appended)
        or ``/dev/null``.
        """
        stale = self.leftover(container_id)
        if stale is not None:
            _log.warning("runc %s: removing %s, left without a state", container_id, stale)
            try:
                shutil.rmtree(stale)
            except OSError as e:
                raise RuncError([str(stale)], f"cannot remove the leftover: {e}") from None
        with tempfile.TemporaryDirectory(prefix="reconciler-runc-") as tmp:
            runc_log = Path(tmp) / "runc.log"
            cmd = [
                *self._base(),
                "--log",
                str(runc_log),
                "--log-format",
                "json",
                "run",
                "--detach",
                "--bundle",
                str(bundle),
                container_id,
            ]
            out_path = log if log is not None else Path(os.devnull)
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
            if log is not None:
                flags |= os.O_NOFOLLOW
            try:
                out_fd = os.open(out_path, flags, 0o600)
            except OSError as e:
                raise RuncError(cmd, f"cannot open the log {out_path}: {e.strerror}") from None
            try:
                done = self._spawn(cmd, stdout=out_fd, stderr=out_fd)
            finally:
                os.close(out_fd)
            try:
                raw = runc_log.read_text(errors="replace")
            except OSError:
                raw = ""
        errors, warnings = _json_log_messages(raw)
        for w in warnings:
            _log.warning("runc %s: %s", container_id, w)
        if done.returncode != 0:
            message = "; ".join(errors) or f"exit status {done.returncode}"
            raise RuncError(cmd, message[:_MAX_ERROR], returncode=done.returncode)

    def kill(self, container_id: str, signal: int | str = signals.SIGTERM) -> None:
        """``runc kill ID SIGNAL`` (a number, a ``signal.Signals`` or a name like ``TERM``)."""
        validate_container_id(container_id)
        if isinstance(signal, str):
            if not _SIGNAL.match(signal):
                raise ValueError(f"invalid signal name {signal!r}")
            sig = signal
        else:
            sig = str(int(signal))
        self._check(["kill", container_id, sig])

    def delete(self, container_id: str, force: bool = False) -> None:
        """``runc delete [--force] ID``; with ``force`` a missing container is no error."""
        validate_container_id(container_id)
        self._check(["delete", *(["--force"] if force else []), container_id])


def delete_quietly(runtime: ContainerRuntime, container_id: str) -> None:
    """``delete --force``, ignoring errors (clean-up after a failure)."""
    with contextlib.suppress(RuncError):
        runtime.delete(container_id, force=True)
