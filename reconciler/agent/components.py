"""The node agent's component instances (SPEC §18): installed and removed by a handler.

A component's start runs its runtime's handler ``handler install ITEM VERSION ARTIFACT``; its
stop ``handler remove ITEM VERSION`` (the handler and artifact come from the controller's
``out/components/<id>.json``). What is installed is kept in ``DIR/.agent-<node>-components.json``
(item, version, handler, the handler's last words), so a stop (whose file the controller has
removed by then) knows what to remove, and a version change removes the old version first.
``actual/`` records the installed version and the handler's result; a component is ``active``
when its install succeeded, ``failed`` (with the handler's output) when it did not. A failed
install is tried again on the next run.
"""

from __future__ import annotations

import json
import logging
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reconciler.io.fsio import FileReadError, atomic_write, read_bytes_at
from reconciler.model.jsonbytes import pretty_json

__all__ = ["ComponentOutcome", "Components"]

log = logging.getLogger("reconciler.agent.components")

_MAX = 1 << 20
HANDLER_TIMEOUT = 300.0


@dataclass(frozen=True)
class ComponentOutcome:
    state: str  # active | failed
    result: str  # the handler's result, one line
    installed: bool = False  # installed by this run


@dataclass
class Components:
    state_dir: Path
    node_id: str
    timeout: float = HANDLER_TIMEOUT
    outcomes: dict[str, ComponentOutcome] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return self.state_dir / f".agent-{self.node_id}-components.json"

    def spec(self, iid: str) -> dict[str, Any] | None:
        """The controller's ``out/components/<id>.json`` for this node, if any."""
        path = self.state_dir / "out" / "components" / f"{iid}.json"
        if not path.is_file() or path.is_symlink():
            return None
        try:
            raw, _ = read_bytes_at(path, _MAX)
            doc = json.loads(raw)
        except (FileReadError, ValueError) as e:
            log.warning("%s: cannot read %s: %s", self.node_id, path, e)
            return None
        if not isinstance(doc, dict) or doc.get("nodeId") != self.node_id:
            return None
        return doc

    def _installed(self) -> dict[str, dict[str, Any]]:
        if not self.path.exists() and not self.path.is_symlink():
            return {}
        try:
            raw, _ = read_bytes_at(self.path, _MAX)
            data = json.loads(raw)
        except (FileReadError, ValueError) as e:
            log.warning("%s: ignoring %s: %s", self.node_id, self.path, e)
            return {}
        return data if isinstance(data, dict) else {}

    def _run(self, argv: Sequence[str]) -> tuple[bool, str]:
        if not argv:
            return False, "the runtime has no handler"
        try:
            done = subprocess.run(
                list(argv),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=self.timeout,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            return False, f"{argv[0]}: {e}"
        words = " ".join((done.stdout + " " + done.stderr).split())[:500]
        if done.returncode != 0:
            return False, f"exit {done.returncode}: {words}".rstrip(": ")
        return True, words or "ok"

    def sync(self, desired: Mapping[str, Mapping[str, Any]]) -> dict[str, ComponentOutcome]:
        """Remove what is installed and no longer desired here (or at another version), then
        install the desired components not installed. ``desired``: the patched actual
        document's records. Returns the outcome of every desired component."""
        installed = self._installed()
        specs = {iid: s for iid in sorted(desired) if (s := self.spec(iid)) is not None}
        self.outcomes, self.removed = {}, []
        for iid, was in sorted(installed.items()):
            record = desired.get(iid)
            if record is not None and iid in specs and record.get("version") == was.get("version"):
                continue
            argv = [*was.get("handler", []), "remove", str(was["itemId"]), str(was["version"])]
            ok, words = self._run(argv)
            if not ok:
                log.error("%s: removing %s failed: %s", self.node_id, iid, words)
            log.info("%s: removed component %s %s", self.node_id, was["itemId"], was["version"])
            del installed[iid]
            self.removed.append(iid)
        for iid, spec in specs.items():
            have = installed.get(iid)
            if have is not None and have.get("ok"):
                self.outcomes[iid] = ComponentOutcome("active", str(have.get("result", "ok")))
                continue
            argv = [
                *spec.get("handler", []),
                "install",
                str(spec["itemId"]),
                str(spec["version"]),
                str(spec["artifact"]),
            ]
            ok, words = self._run(argv)
            installed[iid] = {
                "itemId": spec["itemId"],
                "version": spec["version"],
                "handler": spec.get("handler", []),
                "ok": ok,
                "result": words,
            }
            if ok:
                log.info("%s: installed %s %s", self.node_id, spec["itemId"], spec["version"])
                self.outcomes[iid] = ComponentOutcome("active", words, installed=True)
            else:
                log.error("%s: installing %s failed: %s", self.node_id, iid, words)
                self.outcomes[iid] = ComponentOutcome("failed", f"install failed: {words}")
                del installed[iid]  # nothing installed: tried again next run
        if installed or self.path.exists():
            atomic_write(self.path, pretty_json(dict(sorted(installed.items()))))
        return self.outcomes
