"""A fake runc for the agent tests: containers kept in a dict, every call recorded, so a test can
say exactly what was started, signalled and deleted."""

from __future__ import annotations

import builtins
import signal as signals
from dataclasses import dataclass
from pathlib import Path

from reconciler.agent.runc import ContainerState, RuncError


@dataclass
class Container:
    id: str
    bundle: Path
    pid: int
    status: str = "running"


class FakeRunc:
    """The agent's view of runc, in memory. ``ignore_term``: SIGTERM does not stop anything
    (like a shell as pid 1); ``fail_start``: container ids whose start fails."""

    def __init__(self) -> None:
        self.containers: dict[str, Container] = {}
        self.calls: list[tuple[str, ...]] = []
        self.ignore_term = False
        self.fail_start: set[str] = set()
        self._pid = 1000

    def add(self, cid: str, status: str = "running") -> None:
        self._pid += 1
        self.containers[cid] = Container(cid, Path("/nowhere"), self._pid, status)

    def state(self, container_id: str) -> ContainerState | None:
        c = self.containers.get(container_id)
        if c is None:
            return None
        return ContainerState(c.id, c.status, c.pid if c.status != "stopped" else 0, str(c.bundle))

    def list(self) -> list[ContainerState]:
        states = [self.state(cid) for cid in sorted(self.containers)]
        return [s for s in states if s is not None]

    def run_detached(self, container_id: str, bundle: Path, log: Path | None = None) -> None:
        self.calls.append(("run", container_id))
        cmd = ["runc", "run", "--detach", container_id]
        if container_id in self.containers:
            raise RuncError(cmd, f"container with id exists: {container_id}")
        if container_id in self.fail_start:
            raise RuncError(cmd, "unable to start container process: exec: no such file")
        if not (bundle / "config.json").is_file():
            raise RuncError(cmd, "open config.json: no such file or directory")
        if log is not None:
            with log.open("a") as f:
                f.write("started\n")
        self._pid += 1
        self.containers[container_id] = Container(container_id, bundle, self._pid)

    def kill(self, container_id: str, signal: int | str = signals.SIGTERM) -> None:
        if isinstance(signal, int):
            sig = signals.Signals(signal)
        else:
            sig = signals.Signals["SIG" + signal.removeprefix("SIG")]
        self.calls.append(("kill", container_id, sig.name))
        c = self.containers.get(container_id)
        if c is None:
            raise RuncError(["runc", "kill"], "container does not exist")
        if c.status != "running":
            raise RuncError(["runc", "kill"], "container not running")
        if sig == signals.SIGKILL or not self.ignore_term:
            c.status = "stopped"

    def delete(self, container_id: str, force: bool = False) -> None:
        self.calls.append(("delete", container_id))
        c = self.containers.get(container_id)
        if c is None:
            if force:
                return
            raise RuncError(["runc", "delete"], "container does not exist")
        if c.status == "running" and not force:
            raise RuncError(["runc", "delete"], "cannot delete container that is not stopped")
        del self.containers[container_id]

    def actions(self) -> builtins.list[tuple[str, ...]]:
        return [c for c in self.calls if c[0] in ("run", "kill", "delete")]
