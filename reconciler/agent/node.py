"""The node agent: applies ``out/nodes/<node>.json`` with runc and closes the loop.

One run (:func:`run_agent_once`), under the state directory's flock (the controller's lock):

1. read the node's patch (RFC 6902, SPEC §10) and ``actual/<node>.yaml`` (a missing file is
   revision 0 with nothing running);
2. apply the patch to a copy; if its ``test`` of ``/revision`` (or any operation) fails, the
   plan is **stale**: it was computed from another actual document. Nothing is started or
   stopped and ``actual`` is left alone; the controller's next plan will match. (A plan the
   document already holds, as after the agent's own last run, is nothing to apply, not stale.)
3. stop each removed instance (``runc kill`` SIGTERM, up to ``stop_timeout`` for it to exit,
   SIGKILL, ``runc delete --force``), then start each added one from its bundle
   ``out/instances/<id>/`` (``runc run --detach``) unless it already runs;
4. look at every instance of the patched document: one whose container is stopped or missing
   is started again as its ``restartPolicy`` and back-off say (:mod:`reconciler.agent.restarts`;
   the back-off lives in the agent's own ``DIR/.agent-<node>.json``);
5. write ``actual/<node>.yaml`` atomically with revision + 1 and each instance's real state
   from ``runc state``, restart count, last exit and failure reason — but only when something
   changed, so an idle agent does not bump the revision (and wake the controller) forever.

A node the unit does not know (no ``nodes/<node>.yaml``, no plan, no actual document) is an
error.

A container is named ``<nodeId>.<instanceId>`` (:func:`container_id`): runc derives the cgroup
path from the container id, so two agents on one machine (separate ``--root``) must still use
different ids, or an instance moving between their nodes would share a cgroup for a moment.

:func:`agent_watch` runs :func:`run_agent_once` on every change of the node's patch (watching
the ``out/nodes`` directory, never the file: the controller replaces it by rename) and on a
periodic resync, which also notices containers that died.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import jsonpatch
import watchfiles
from pydantic import ValidationError

from reconciler.agent.components import Components
from reconciler.agent.network import NetworkError, NodeNetwork
from reconciler.agent.restarts import (
    AgentMemory,
    RestartRecord,
    decide,
    policy_of_config,
    seen_down,
    seen_running,
    tried_start,
)
from reconciler.agent.runc import (
    ContainerRuntime,
    ContainerState,
    Runc,
    RuncError,
    delete_quietly,
)
from reconciler.io.fsio import FileReadError, atomic_write, ensure_dir, read_bytes_at
from reconciler.io.loader import format_validation_error
from reconciler.io.lock import LockTimeout, StateLock
from reconciler.io.signals import stop_on_signals
from reconciler.io.yamlsafe import DEFAULT_MAX_BYTES, YamlRejected, parse_yaml
from reconciler.model.documents import ActualInstance, ActualState, LastExit, RestartPolicy
from reconciler.model.jsonbytes import pretty_json
from reconciler.model.values import INT64_MAX, validate_id
from reconciler.planning.plans import empty_actual_document, pointer

__all__ = [
    "AGENT_RUN_ERRORS",
    "AgentError",
    "AgentReport",
    "agent_state_path",
    "agent_watch",
    "container_id",
    "instances_added",
    "instances_listed",
    "next_revision",
    "observed_state",
    "run_agent_logged",
    "run_agent_once",
]

log = logging.getLogger("reconciler.agent")

Prepare = Callable[[str, Mapping[str, Sequence[str]], Path], "Path | str"]
"""Before a start: (instance id, its devices by resource, its bundle) -> the bundle to run it
from, or why it cannot start (the device plugins' Allocate, :mod:`.deviceplugin.prestart`)."""

InstanceState = Literal["activating", "active", "inactive", "failed"]

MAX_PATCH_BYTES = 64 * 1024 * 1024
POLL_INTERVAL = 0.05  # seconds between `runc state` polls while waiting for a stop
KILL_GRACE = 5.0  # seconds to wait for a container to exit after SIGKILL

_STATE_OF_STATUS: dict[str, InstanceState] = {
    "running": "active",
    "created": "activating",
    "creating": "activating",
    "paused": "inactive",
    "pausing": "inactive",
}
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


class AgentError(RuntimeError):
    """The agent cannot run: unreadable inputs, a malformed plan, a broken state directory."""


@dataclass(frozen=True)
class AgentReport:
    """What one agent run did. Instance ids, each tuple sorted."""

    node_id: str
    revision: int  # the actual document's revision after the run
    started: tuple[str, ...] = ()
    stopped: tuple[str, ...] = ()  # removed by the plan, and their container is gone now
    already_running: tuple[str, ...] = ()  # added by the plan, but their container runs already
    orphans_stopped: tuple[str, ...] = ()  # containers of this node that no record claims
    restarted: tuple[str, ...] = ()  # found stopped or missing, and started again
    start_failed: tuple[str, ...] = ()  # a start or restart of this run failed
    next_restart: float | None = None  # the earliest back-off end (seconds since the epoch)
    failed: Mapping[str, str] = field(default_factory=dict)  # id -> why it is failed
    states: Mapping[str, InstanceState] = field(default_factory=dict)  # as written to actual
    stale: bool = False  # the patch was refused: nothing started or stopped
    applied: bool = False  # a patch was applied (False: no patch, or stale)
    written: bool = False  # actual/<node>.yaml was rewritten
    elapsed: float | None = field(default=None, compare=False)  # seconds (a watching agent's)
    message: str = ""

    @property
    def changed(self) -> bool:
        return bool(
            self.started or self.stopped or self.orphans_stopped or self.restarted or self.written
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "nodeId": self.node_id,
            "revision": self.revision,
            "started": list(self.started),
            "stopped": list(self.stopped),
            "alreadyRunning": list(self.already_running),
            "orphansStopped": list(self.orphans_stopped),
            "restarted": list(self.restarted),
            "startFailed": list(self.start_failed),
            "nextRestart": self.next_restart,
            "failed": dict(sorted(self.failed.items())),
            "states": dict(sorted(self.states.items())),
            "stale": self.stale,
            "applied": self.applied,
            "written": self.written,
            "message": self.message,
        }

    def summary(self) -> str:
        if self.stale:
            return f"{self.node_id}: {self.message}"
        parts = [
            f"{len(self.started)} started",
            f"{len(self.stopped)} stopped",
            f"{len(self.already_running)} already running",
            f"{len(self.failed)} failed",
        ]
        if self.orphans_stopped:
            parts.append(f"{len(self.orphans_stopped)} orphan(s) stopped")
        if self.restarted:
            parts.insert(1, f"{len(self.restarted)} restarted")
        tail = f"actual revision {self.revision}" + (" written" if self.written else " unchanged")
        return f"{self.node_id}: {', '.join(parts)}; {tail}"


def container_id(node_id: str, instance_id: str) -> str:
    """The runc container id of an instance on a node: ``<nodeId>.<instanceId>``."""
    return f"{node_id}.{instance_id}"


def _instance_of_container(node_id: str, cid: str) -> str | None:
    prefix = f"{node_id}."
    if cid.startswith(prefix) and _UUID.match(cid[len(prefix) :]):
        return cid[len(prefix) :]
    return None


def observed_state(st: ContainerState | None) -> tuple[InstanceState, str]:
    """An instance's state from its container: running → active, created → activating,
    paused → inactive; stopped or missing → failed (with the reason)."""
    if st is None:
        return "failed", "no container on this node"
    state = _STATE_OF_STATUS.get(st.status)
    if state is None:
        return "failed", f"the container is {st.status}"
    return state, ""


# ---------------------------------------------------------------- reading the inputs


def _read_patch(path: Path) -> list[dict[str, Any]] | None:
    if not path.exists() and not path.is_symlink():
        return None
    try:
        raw, _ = read_bytes_at(path, MAX_PATCH_BYTES)
    except FileReadError as e:
        raise AgentError(f"{path}: {e}") from None
    return _parse_patch(raw, str(path))


def _parse_patch(raw: bytes, where: str) -> list[dict[str, Any]]:
    if len(raw) > MAX_PATCH_BYTES:
        raise AgentError(f"{where}: over {MAX_PATCH_BYTES} bytes")
    try:
        ops = json.loads(raw)
    except ValueError as e:
        raise AgentError(f"{where}: not JSON: {e}") from None
    if not isinstance(ops, list) or not all(isinstance(op, dict) for op in ops):
        raise AgentError(f"{where}: a patch is a JSON array of operations")
    return ops


def instances_added(raw: bytes, where: str) -> list[str]:
    """The ids a node patch's ``add`` operations start, as the agent reads them; raises
    :class:`AgentError` for a patch the agent refuses."""
    return _check_ops(_parse_patch(raw, where), where)[1]


def instances_listed(raw: bytes, where: str) -> list[str]:
    """The ids an actual document lists, sorted; raises :class:`AgentError` for a document the
    agent refuses."""
    return sorted(_parse_actual(raw, where).instances)


def _instance_of_path(path: object, where: str) -> str:
    prefix = "/instances/"
    if not isinstance(path, str) or not path.startswith(prefix):
        raise AgentError(f"{where}: unsupported path {path!r} (only /instances/<id>)")
    iid = path[len(prefix) :]
    try:
        validate_id(iid, "instance id")
    except ValueError as e:
        raise AgentError(f"{where}: {e}") from None
    assert pointer("instances", iid) == path  # a valid id needs no RFC 6901 escaping
    return iid


def _check_ops(ops: list[dict[str, Any]], where: str) -> tuple[list[str], list[str]]:
    """(removed ids, added ids) in patch order. Only the planner's operations are accepted:
    ``test`` first on ``/revision``, then ``remove`` and ``add`` of ``/instances/<id>``."""
    if not ops or ops[0].get("op") != "test" or ops[0].get("path") != "/revision":
        raise AgentError(f"{where}: a node patch starts with a test of /revision")
    removed: list[str] = []
    added: list[str] = []
    for n, op in enumerate(ops[1:], start=1):
        kind = op.get("op")
        if kind == "test":
            continue
        if kind == "remove":
            removed.append(_instance_of_path(op.get("path"), f"{where}: operation {n}"))
        elif kind == "add":
            added.append(_instance_of_path(op.get("path"), f"{where}: operation {n}"))
        else:
            raise AgentError(f"{where}: operation {n}: unsupported op {kind!r}")
    return removed, added


def _parse_actual(raw: bytes, where: str) -> ActualState:
    try:
        parsed = parse_yaml(raw)
    except YamlRejected as e:
        raise AgentError(f"{where}:{e.line}:{e.col}: {e.message}") from None
    try:
        return ActualState.model_validate(parsed.data)
    except ValidationError as e:
        diags = format_validation_error(where, parsed, e)
        raise AgentError("; ".join(str(d) for d in diags)) from None


def _read_actual(path: Path, node_id: str) -> dict[str, Any]:
    """The validated actual document as plain JSON data (missing: revision 0, empty)."""
    if not path.exists() and not path.is_symlink():
        state = ActualState.model_validate(empty_actual_document(node_id))
    else:
        try:
            raw, _ = read_bytes_at(path, DEFAULT_MAX_BYTES)
        except FileReadError as e:
            raise AgentError(f"{path}: {e}") from None
        state = _parse_actual(raw, str(path))
    if state.nodeId != node_id:
        raise AgentError(f"{path}: nodeId {state.nodeId!r} is not {node_id!r}")
    return state.model_dump(mode="json")


# ---------------------------------------------------------------- stopping and starting


def _wait_stopped(runtime: ContainerRuntime, cids: Iterable[str], timeout: float) -> list[str]:
    """Poll until every container has stopped (or is gone); returns those still alive."""
    pending = list(cids)
    deadline = time.monotonic() + timeout
    while pending:
        alive = []
        for cid in pending:
            try:
                st = runtime.state(cid)
            except RuncError:
                st = None
            if st is not None and st.status != "stopped":
                alive.append(cid)
        pending = alive
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(POLL_INTERVAL)
    return pending


def _stop_containers(
    runtime: ContainerRuntime, cids: list[str], stop_timeout: float
) -> tuple[list[str], dict[str, str]]:
    """SIGTERM every live container, wait up to ``stop_timeout`` together, SIGKILL the rest,
    then ``delete --force`` them all. Returns (the containers that existed, errors by id);
    a container that does not exist is fine."""
    existed: list[str] = []
    errors: dict[str, str] = {}
    signalled: list[str] = []
    for cid in cids:
        try:
            st = runtime.state(cid)
        except RuncError as e:
            errors[cid] = str(e)
            continue
        if st is None:
            continue
        existed.append(cid)
        if st.status in ("running", "paused", "pausing"):
            try:
                runtime.kill(cid, signal.SIGTERM)
                signalled.append(cid)
            except RuncError as e:  # it may have exited meanwhile; delete --force decides
                log.debug("SIGTERM %s: %s", cid, e)
    alive = _wait_stopped(runtime, signalled, stop_timeout)
    for cid in alive:
        log.warning("%s did not stop within %gs of SIGTERM; sending SIGKILL", cid, stop_timeout)
        try:
            runtime.kill(cid, signal.SIGKILL)
        except RuncError as e:
            log.debug("SIGKILL %s: %s", cid, e)
    if alive:
        _wait_stopped(runtime, alive, KILL_GRACE)
    for cid in existed:
        if cid in errors:
            continue
        try:
            runtime.delete(cid, force=True)
        except RuncError as e:
            errors[cid] = str(e)
    return existed, errors


def _bundle_problem(bundle: Path) -> str | None:
    for d in (bundle.parent.parent, bundle.parent):  # out/ and out/instances/
        if d.is_symlink():
            return f"{d} is a symlink; bundles are not followed through symlinks"
    if bundle.is_symlink() or not bundle.is_dir():
        return f"no bundle directory {bundle} (the controller writes it on reconcile)"
    config = bundle / "config.json"
    if config.is_symlink() or not config.is_file():
        return f"no OCI config {config} (see out/status.json for why it was not built)"
    return None


def _start(
    runtime: ContainerRuntime, cid: str, bundle: Path, log_file: Path | None
) -> Literal["started", "already-running"] | str:
    """Start one container unless it runs; an error message when it cannot be started."""
    problem = _bundle_problem(bundle)
    if problem is not None:
        return problem
    try:
        st = runtime.state(cid)
        if st is not None and st.status in ("running", "paused", "pausing"):
            return "already-running"
        if st is not None:  # stopped, or created by an interrupted start: start afresh
            runtime.delete(cid, force=True)
        runtime.run_detached(cid, bundle, log_file)
    except RuncError as e:
        log.debug("%s", e)  # with the whole command
        delete_quietly(runtime, cid)
        return e.message or str(e)  # runc's own words: what status shows
    return "started"


# ---------------------------------------------------------------- the agent's own state


def agent_state_path(state_dir: Path, node_id: str) -> Path:
    """The agent's own state file (restart back-off per instance): ``DIR/.agent-<node>.json``.
    A hidden name at the top of the state directory: no input of the controller, never
    watched, never copied to a store."""
    return state_dir / f".agent-{node_id}.json"


def _read_memory(path: Path, node_id: str) -> dict[str, RestartRecord]:
    """The agent's records; a missing, unreadable or invalid file is an empty memory (logged):
    it only times restarts, and losing it restarts a down instance at once."""
    if not path.exists() and not path.is_symlink():
        return {}
    try:
        raw, _ = read_bytes_at(path, MAX_PATCH_BYTES)
        memory = AgentMemory.model_validate_json(raw)
    except (FileReadError, ValidationError, ValueError) as e:
        log.warning("%s: ignoring the agent state %s: %s", node_id, path, str(e).splitlines()[0])
        return {}
    if memory.nodeId != node_id:
        log.warning("%s: ignoring the agent state %s of node %s", node_id, path, memory.nodeId)
        return {}
    return dict(memory.instances)


def _write_memory(path: Path, node_id: str, records: Mapping[str, RestartRecord]) -> None:
    memory = AgentMemory(nodeId=node_id, instances=dict(sorted(records.items())))
    try:
        atomic_write(path, pretty_json(memory.model_dump(mode="json")))
    except FileReadError as e:
        raise AgentError(str(e)) from None


def _restart_policy(bundle: Path) -> RestartPolicy:
    """The instance's restart policy from its bundle's config (no readable config: the default;
    its start fails and says why)."""
    if _bundle_problem(bundle) is not None:
        return "always"
    try:
        raw, _ = read_bytes_at(bundle / "config.json", MAX_PATCH_BYTES)
        return policy_of_config(json.loads(raw))
    except (FileReadError, ValueError):
        return "always"


def _whole_seconds(now: float) -> datetime:
    return datetime.fromtimestamp(now, UTC).replace(microsecond=0)


def _down_reason(st: ContainerState | None) -> str:
    return "container missing" if st is None else f"the container is {st.status}"


@dataclass(frozen=True)
class _Starter:
    """Starts instances of one node from their bundles, each logging to its own file."""

    runtime: ContainerRuntime
    node_id: str
    instances: Path  # out/instances
    log_dir: Path | None
    prepare: Callable[[str, Path], Path | str] | None = None

    def bundle(self, iid: str) -> Path:
        return self.instances / iid

    def start(self, iid: str) -> Literal["started", "already-running"] | str:
        log_file = None
        if self.log_dir is not None:
            ensure_dir(self.log_dir)
            log_file = self.log_dir / f"{iid}.log"
        bundle = self.bundle(iid)
        if self.prepare is not None and _bundle_problem(bundle) is None:
            cid = container_id(self.node_id, iid)
            try:
                st = self.runtime.state(cid)
            except RuncError:
                st = None
            if st is None or st.status not in ("running", "paused", "pausing"):
                got = self.prepare(iid, bundle)
                if isinstance(got, str):
                    return got
                bundle = got
        return _start(self.runtime, container_id(self.node_id, iid), bundle, log_file)


def _already_applied(doc: Mapping[str, Any], ops: list[dict[str, Any]]) -> bool:
    """Whether ``doc`` already holds what ``ops`` would make of it: each id the patch removes
    is absent (unless added back), each it adds is there with the planned identity, version,
    runtime and devices (its own run after the plan: running twice is nothing to apply)."""
    result: dict[str, dict[str, Any] | None] = {}
    for op in ops[1:]:
        iid = str(op.get("path", "")).removeprefix("/instances/")
        if op.get("op") == "remove":
            result[iid] = None
        elif op.get("op") == "add":
            try:
                value = ActualInstance.model_validate(op.get("value")).model_dump(mode="json")
            except ValidationError:
                return False
            result[iid] = {k: value[k] for k in _PLANNED}
    have: Mapping[str, dict[str, Any]] = doc["instances"]
    for iid, want in result.items():
        got = have.get(iid)
        if want is None:
            if got is not None:
                return False
        elif got is None or {k: got[k] for k in _PLANNED} != want:
            return False
    return True


_PLANNED = ("itemId", "subjectId", "index", "version", "runtimeId", "devices")


# ---------------------------------------------------------------- restarts


@dataclass(frozen=True)
class _Seen:
    """One instance after the run looked at it (and maybe restarted it)."""

    state: InstanceState
    reason: str | None  # why it is failed
    memory: RestartRecord
    restarted: bool = False
    start_failed: bool = False
    due: float | None = None  # when its back-off ends


def _observe(
    starter: _Starter, iid: str, record: dict[str, Any], memory: RestartRecord, now: float
) -> _Seen:
    """Look at one desired instance's container; restart it when it is down and its policy
    and back-off say so. Updates ``record``'s ``lastExit`` and ``restartCount``."""
    cid = container_id(starter.node_id, iid)
    try:
        st = starter.runtime.state(cid)
    except RuncError as e:
        return _Seen("failed", f"runc state: {e}", memory)
    if st is not None and st.status != "stopped":
        state, why = observed_state(st)
        if state == "active":
            memory = seen_running(memory, now)
        return _Seen(state, why or None, memory)
    down = seen_down(memory, now)
    if down.downSince != memory.downSince or record.get("lastExit") is None:
        last = LastExit(reason=_down_reason(st), at=_whole_seconds(now))
        record["lastExit"] = last.model_dump(mode="json")
    policy = _restart_policy(starter.bundle(iid))
    decision = decide(policy, None, down, now)
    if not decision.restart:
        return _Seen("failed", f"{_down_reason(st)}; {decision.why}", down, due=decision.at)
    outcome = starter.start(iid)
    record["restartCount"] = record.get("restartCount", 0) + 1
    ok = outcome in ("started", "already-running")  # (running again meanwhile: fine)
    after = tried_start(down, now, ok=ok, restart=True)
    if not ok:
        log.error("%s: restarting %s failed: %s", starter.node_id, iid, outcome)
        return _Seen(
            "failed", outcome, after, start_failed=True, due=decide(policy, None, after, now).at
        )
    log.info("%s: restarted %s (%s)", starter.node_id, iid, _down_reason(st))
    try:
        st = starter.runtime.state(cid)
    except RuncError as e:
        return _Seen("failed", f"runc state: {e}", after, restarted=True)
    state, why = observed_state(st)
    return _Seen(state, why or None, after, restarted=True)


def next_revision(revision: int) -> int:
    """The revision an agent writes after ``revision``: one more, and 1 after the largest a
    document may hold (2^63-1), so the counter never leaves the range the loader accepts (a
    plan tests for equality only, so wrapping is safe)."""
    return revision + 1 if revision < INT64_MAX else 1


# ---------------------------------------------------------------- one run


@dataclass(frozen=True)
class _Options:
    stop_timeout: float
    log_dir: Path | None
    reap_orphans: bool
    now: Callable[[], float]
    memory_path: Path
    prepare: Prepare | None = None
    host_netns: str | None = None
    networks: bool = False
    uplink: str | None = None


def run_agent_once(
    state_dir: Path,
    node_id: str,
    runc: ContainerRuntime,
    *,
    stop_timeout: float = 10.0,
    log_dir: Path | None = None,
    lock_timeout: float | None = None,
    reap_orphans: bool = True,
    now: Callable[[], float] = time.time,
    agent_state: Path | None = None,
    prepare: Prepare | None = None,
    host_netns: str | None = None,
    networks: bool | None = None,
    uplink: str | None = None,
) -> AgentReport:
    """Apply the node's plan once and restart what died; see the module docstring.

    ``log_dir``: each container's stdout and stderr are appended to ``<log_dir>/<id>.log``
    (default: ``/dev/null``); keep it outside the state directory. ``reap_orphans``: stop
    containers named ``<node>.<uuid>`` under this runtime that no record of the patched
    document claims (left by an interrupted run whose plan then changed); only when a plan
    was applied. ``now``: the clock of the restart back-off (seconds since the epoch).
    ``agent_state``: the agent's own state file (default :func:`agent_state_path`).
    ``prepare``: called before each start with the instance's devices (see :data:`Prepare`).
    ``host_netns``: wire networks inside that named namespace instead of the host's own
    (:class:`~reconciler.agent.network.NodeNetwork`). ``networks``: wire the instances'
    networks (default: when the runtime is runc itself; a test double gets none). ``uplink``:
    the interface that carries the networks' VLANs (a VLAN sub-interface on it per network
    with a VLAN id). Raises
    :class:`AgentError` (an unknown node included: no ``nodes/<node>.yaml``, no plan and no
    actual document), :class:`~reconciler.agent.runc.RuncError` (when runc itself cannot be listed)
    or :class:`~reconciler.io.lock.LockTimeout`.
    """
    try:
        validate_id(node_id, "node id")
    except ValueError as e:
        raise AgentError(str(e)) from None
    if not state_dir.is_dir():
        raise AgentError(f"state directory {state_dir} does not exist")
    state_dir = state_dir.resolve()
    memory_path = agent_state or agent_state_path(state_dir, node_id)
    wire = isinstance(runc, Runc) if networks is None else networks
    opts = _Options(
        stop_timeout, log_dir, reap_orphans, now, memory_path, prepare, host_netns, wire, uplink
    )
    with StateLock(state_dir, lock_timeout):
        return _run_locked(state_dir, node_id, runc, opts)


def _wire_networks(
    state_dir: Path,
    node_id: str,
    host_netns: str | None,
    records: dict[str, dict[str, Any]],
    failed: dict[str, str],
    uplink: str | None = None,
) -> None:
    """:meth:`NodeNetwork.sync` for the desired instances; each one's address goes into its
    record, a failed setup into ``failed`` (the instance is not started)."""
    network = NodeNetwork(state_dir, node_id, host_netns, uplink=uplink)
    try:
        wired = network.sync(records)
    except (NetworkError, OSError) as e:
        log.error("%s: networks: %s", node_id, e)
        return
    for iid, why in network.problems.items():
        failed[iid] = why
    for iid, net in wired.items():
        records[iid]["ip"] = net["ip"]
        records[iid]["network"] = net["networkId"]


def _known_node(state_dir: Path, node_id: str, patch: Path, actual: Path) -> bool:
    return any(
        p.exists() or p.is_symlink()
        for p in (state_dir / "nodes" / f"{node_id}.yaml", patch, actual)
    )


def _run_locked(
    state_dir: Path, node_id: str, runtime: ContainerRuntime, opts: _Options
) -> AgentReport:
    patch_path = state_dir / "out" / "nodes" / f"{node_id}.json"
    actual_path = state_dir / "actual" / f"{node_id}.yaml"
    if not _known_node(state_dir, node_id, patch_path, actual_path):
        raise AgentError(
            f"{node_id!r} is not a node of this unit: no nodes/{node_id}.yaml, "
            f"no plan out/nodes/{node_id}.json and no actual/{node_id}.yaml"
        )
    ops = _read_patch(patch_path)
    old = _read_actual(actual_path, node_id)
    revision: int = old["revision"]

    removed: list[str] = []
    added: list[str] = []
    new = json.loads(json.dumps(old))
    message = ""
    if ops is not None:
        removed, added = _check_ops(ops, str(patch_path))
        try:
            new = jsonpatch.apply_patch(old, ops)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
            planned = ops[0].get("value")
            if planned != revision:
                why = (
                    f"the plan was computed from revision {planned!r} but "
                    f"actual/{node_id}.yaml has revision {revision}"
                )
            else:
                why = f"an operation does not apply to actual/{node_id}.yaml: {e}"
            if not _already_applied(old, ops):
                message = (
                    f"stale plan refused: {why}; nothing started or stopped (the controller's "
                    f"next plan will start from revision {revision})"
                )
                log.info("%s: %s", node_id, message)
                return AgentReport(node_id, revision, stale=True, message=message)
            message = f"the plan is already applied ({why})"
            log.info("%s: %s", node_id, message)
            ops, removed, added, new = None, [], [], json.loads(json.dumps(old))
        else:
            try:
                patched = ActualState.model_validate(new)
            except ValidationError as e:
                raise AgentError(f"{patch_path}: the patched document is invalid: {e}") from None
            if patched.nodeId != node_id:
                raise AgentError(f"{patch_path}: the patch changes nodeId to {patched.nodeId!r}")
            new = patched.model_dump(mode="json")
    records: dict[str, dict[str, Any]] = new["instances"]

    # stops: what the plan removes, plus orphans (containers of this node nobody claims)
    to_stop = [container_id(node_id, iid) for iid in sorted(set(removed))]
    orphans: list[str] = []
    if ops is not None and opts.reap_orphans:
        for st in runtime.list():
            iid = _instance_of_container(node_id, st.id)
            if iid is not None and iid not in records and st.id not in to_stop:
                orphans.append(st.id)
    existed, stop_errors = _stop_containers(runtime, to_stop + orphans, opts.stop_timeout)
    failed: dict[str, str] = {}
    for cid, err in stop_errors.items():
        iid = cid[len(node_id) + 1 :]
        failed[iid] = f"stop failed: {err}"
        log.error("%s: stopping %s failed: %s", node_id, iid, err)
    stopped = sorted(iid for iid in removed if container_id(node_id, iid) not in stop_errors)
    orphans_stopped = sorted(
        c[len(node_id) + 1 :] for c in orphans if c in existed and c not in stop_errors
    )

    # networks (SPEC §17): what stopped loses its namespace, what is desired gets one
    if opts.networks:
        _wire_networks(state_dir, node_id, opts.host_netns, records, failed, opts.uplink)
    # components (SPEC §18): installed and removed by their runtime's handler, not runc
    components = Components(state_dir, node_id).sync(records)

    # starts: the plan's, then the restarts of what is desired here and found down
    now = opts.now()
    memory = _read_memory(opts.memory_path, node_id)
    remembered = {iid: memory.get(iid, RestartRecord()) for iid in records}
    prepare = None
    if opts.prepare is not None:
        given = opts.prepare

        def prepare(iid: str, bundle: Path) -> Path | str:
            return given(iid, records.get(iid, {}).get("devices", {}), bundle)

    starter = _Starter(runtime, node_id, state_dir / "out" / "instances", opts.log_dir, prepare)
    started: list[str] = []
    already: list[str] = []
    start_failed: list[str] = []
    for iid in sorted(set(added)):
        if iid not in records:
            continue  # added, then removed again by the same patch
        if iid in components:
            done = components[iid]
            outcome = "started" if done.state == "active" else done.result
        else:
            outcome = starter.start(iid) if iid not in failed else failed[iid]
        if outcome == "started":
            started.append(iid)
            remembered[iid] = tried_start(RestartRecord(), now, ok=True, restart=False)
            log.info("%s: started %s", node_id, iid)
        elif outcome == "already-running":
            already.append(iid)
            log.info("%s: %s is already running; not started again", node_id, iid)
        else:
            failed[iid] = outcome
            start_failed.append(iid)
            remembered[iid] = tried_start(RestartRecord(), now, ok=False, restart=False)
            log.error("%s: starting %s failed: %s", node_id, iid, outcome)

    # observe every instance's real state; restart the down ones as their policy says
    restarted: list[str] = []
    due: list[float] = []
    states: dict[str, InstanceState] = {}
    for iid, record in sorted(records.items()):
        if iid in components:
            done = components[iid]
            problem = None if done.state == "active" else done.result
            seen = _Seen("active" if problem is None else "failed", problem, remembered[iid])
            record["handlerResult"] = done.result
        elif iid in failed:
            seen = _Seen("failed", failed[iid], remembered[iid])
        else:
            seen = _observe(starter, iid, record, remembered[iid], now)
        remembered[iid] = seen.memory
        if seen.restarted:
            restarted.append(iid)
        if seen.start_failed:
            start_failed.append(iid)
        if seen.due is not None:
            due.append(seen.due)
        if seen.reason is not None:
            failed[iid] = seen.reason
        record["state"] = states[iid] = seen.state
        record["reason"] = seen.reason
    if remembered != memory:
        _write_memory(opts.memory_path, node_id, remembered)

    changed = bool(removed or added) or records != old["instances"]
    written = False
    if changed:
        revision = next_revision(revision)
        new["revision"] = revision
        doc = ActualState.model_validate(new)  # never write what the loader would refuse
        data = pretty_json(doc.model_dump(mode="json", exclude_none=True)).decode()
        try:
            ensure_dir(actual_path.parent)
            atomic_write(actual_path, data.encode())
        except FileReadError as e:
            raise AgentError(str(e)) from None
        written = True
    report = AgentReport(
        node_id,
        revision,
        started=tuple(started),
        stopped=tuple(stopped),
        already_running=tuple(already),
        orphans_stopped=tuple(orphans_stopped),
        restarted=tuple(restarted),
        start_failed=tuple(sorted(start_failed)),
        next_restart=min(due) if due else None,
        failed=dict(sorted(failed.items())),
        states=states,
        applied=ops is not None,
        written=written,
        message=message,
    )
    log.info("%s", report.summary())
    return report


# ---------------------------------------------------------------- watch


AGENT_RUN_ERRORS: tuple[type[Exception], ...] = (
    AgentError,
    RuncError,
    LockTimeout,
    OSError,
    ValueError,
)
"""What one run of a long-running agent may fail with: logged, and the loop goes on."""


def run_agent_logged(
    node_id: str,
    reason: str,
    once: Callable[[], AgentReport],
    on_run: Callable[[AgentReport | None], None] | None,
    errors: tuple[type[Exception], ...] = AGENT_RUN_ERRORS,
) -> None:
    """One run of a watching agent: a failure is logged and reported as ``on_run(None)``."""
    started = time.monotonic()
    try:
        report = replace(once(), elapsed=time.monotonic() - started)
    except errors as e:
        log.error("%s: agent run failed (%s): %s", node_id, reason, e)
        if on_run is not None:
            on_run(None)
        return
    log.debug("%s: run done (%s)", node_id, reason)
    if on_run is not None:
        on_run(report)


def agent_watch(
    state_dir: Path,
    node_id: str,
    runc: ContainerRuntime,
    stop: threading.Event,
    resync: float = 30.0,
    *,
    stop_timeout: float = 10.0,
    log_dir: Path | None = None,
    debounce: float = 0.2,
    on_run: Callable[[AgentReport | None], None] | None = None,
    now: Callable[[], float] = time.time,
    prepare: Prepare | None = None,
    uplink: str | None = None,
) -> None:
    """Run the agent now, on every change of ``out/nodes/<node>.json``, every ``resync``
    seconds and when a restart's back-off ends, until ``stop`` is set (SIGTERM and SIGINT set
    it when called from the main thread). A failed run is logged (``on_run(None)``) and the
    loop goes on."""
    validate_id(node_id, "node id")
    stop_on_signals(stop, log)

    nodes_dir = state_dir / "out" / "nodes"
    target = f"{node_id}.json"
    wake: list[float] = []  # when a restart's back-off ends (seconds since the epoch)

    def seen(report: AgentReport | None) -> None:
        wake[:] = [] if report is None or report.next_restart is None else [report.next_restart]
        if on_run is not None:
            on_run(report)

    plan_path = nodes_dir / target
    plan_seen: tuple[int, int, int] | None = None  # the plan file as the last run began

    def plan_key() -> tuple[int, int, int] | None:
        try:
            st = os.stat(plan_path, follow_symlinks=False)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def run(reason: str) -> None:
        nonlocal plan_seen
        plan_seen = plan_key()  # before the run: a plan written during it is seen after
        run_agent_logged(
            node_id,
            reason,
            lambda: run_agent_once(
                state_dir,
                node_id,
                runc,
                stop_timeout=stop_timeout,
                log_dir=log_dir,
                now=now,
                prepare=prepare,
                uplink=uplink,
            ),
            seen,
        )

    def due() -> bool:
        return time.monotonic() - last >= resync or bool(wake and now() >= wake[0])

    def accept(_change: watchfiles.Change, path: str) -> bool:
        return Path(path).name == target

    log.info("%s: agent watching %s (resync every %.0f s)", node_id, nodes_dir, resync)
    run("start")
    last = time.monotonic()
    tick = max(0.05, min(resync, 1.0))
    while not stop.is_set():
        if not nodes_dir.is_dir():  # no plan yet: the controller creates out/nodes
            if stop.wait(tick):
                break
            if nodes_dir.is_dir():
                run("plans appeared")
                last = time.monotonic()
            elif due():
                run("periodic resync")
                last = time.monotonic()
            continue
        try:
            for changes in watchfiles.watch(
                nodes_dir,
                watch_filter=accept,
                debounce=1600,
                step=max(1, int(debounce * 1000)),
                stop_event=stop,
                rust_timeout=int(tick * 1000),
                yield_on_timeout=True,
                raise_interrupt=False,
            ):
                if stop.is_set():
                    break
                # a plan written before the watch began (or whose event was lost) is seen
                # at the next tick: the file's stat is not the one the last run began with
                if changes or plan_key() != plan_seen:
                    run("plan changed")
                    last = time.monotonic()
                elif due():
                    run("periodic resync or a back-off's end")
                    last = time.monotonic()
                if not nodes_dir.is_dir():
                    break  # the directory went away: watch it again once it is back
        except (FileNotFoundError, RuntimeError) as e:  # removed under the watcher
            log.warning("%s: watching %s failed: %s", node_id, nodes_dir, e)
            if stop.wait(tick):
                break
            if plan_key() != plan_seen:  # (no watcher: the plan's stat alone)
                run("plan changed")
                last = time.monotonic()
            elif due():
                run("periodic resync or a back-off's end")
                last = time.monotonic()
    log.info("%s: agent stopped", node_id)
