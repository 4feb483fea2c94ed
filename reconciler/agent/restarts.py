"""The node agent's restart policy: a pure decision over its own record of an instance and now.

A service's ``restartPolicy`` (``always`` by default, ``on-failure``, ``never``) says what the
agent does with an instance whose container it finds stopped or missing while the instance is
desired on its node. Like the kubelet: the first restart comes at once, each further one after an
exponential back-off (10 s, doubling, at most 5 min) counted from when the agent found the
container down; an instance seen running 10 min after its last start has its back-off reset.

The agent keeps, per instance, a :class:`RestartRecord` in its own small state file (see
:func:`reconciler.agent.node.agent_state_path`), across runs; every function here maps a record and
``now`` (seconds since the epoch, injected) to a new record or a :class:`Decision`. Nothing here
reads a clock, a file or runc.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from reconciler.model.documents import RESTART_POLICIES, RestartPolicy
from reconciler.model.values import Id, NonNegInt
from reconciler.oci.builder import RESTART_POLICY_ANNOTATION

__all__ = [
    "BACKOFF_FIRST",
    "BACKOFF_MAX",
    "RESET_AFTER",
    "RESTART_POLICY_ANNOTATION",
    "AgentMemory",
    "Decision",
    "RestartRecord",
    "backoff_delay",
    "decide",
    "policy_of_config",
    "seen_down",
    "seen_running",
    "tried_start",
]

BACKOFF_FIRST = 10.0  # seconds before the second restart of a streak
BACKOFF_MAX = 300.0  # the back-off doubles up to this
RESET_AFTER = 600.0  # seen running this long after its last start: the streak starts over


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RestartRecord(_Frozen):
    """What the agent remembers of one instance between runs (times: seconds since the epoch)."""

    startedAt: float | None = None  # the last start that succeeded
    streak: NonNegInt = 0  # restarts since the instance last ran RESET_AFTER
    downSince: float | None = None  # when the agent found it down (None: not down)


class AgentMemory(_Frozen):
    """The agent's own state file: one record per instance desired on its node."""

    formatVersion: Literal[1] = 1
    nodeId: Id
    instances: dict[str, RestartRecord] = Field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Decision:
    """Whether to restart a down instance now; ``at``: when a restart is allowed (None:
    never, by policy); ``why``: the reason the instance stays failed meanwhile."""

    restart: bool
    at: float | None
    why: str


def backoff_delay(streak: int) -> float:
    """Seconds between finding an instance down and restarting it, after ``streak`` restarts:
    0, 10, 20, 40, … 300."""
    if streak <= 0:
        return 0.0
    return min(BACKOFF_FIRST * 2.0 ** min(streak - 1, 32), BACKOFF_MAX)


def decide(
    policy: RestartPolicy, exit_code: int | None, record: RestartRecord, now: float
) -> Decision:
    """The restart decision for an instance found down (``record`` through :func:`seen_down`).
    ``on-failure`` restarts unless the exit code is known to be 0; ``never`` never does."""
    if policy == "never":
        return Decision(False, None, "restartPolicy is never: not restarted")
    if policy == "on-failure" and exit_code == 0:
        return Decision(False, None, "exited with code 0; restartPolicy is on-failure")
    down = now if record.downSince is None else min(record.downSince, now)
    delay = backoff_delay(record.streak)
    at = down + delay
    if now >= at:
        return Decision(True, at, "")
    when = datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")
    return Decision(False, at, f"back-off {delay:g}s: restart {record.streak + 1} due at {when}")


def seen_down(record: RestartRecord, now: float) -> RestartRecord:
    """The record of an instance found down at ``now`` (keeps an earlier finding; a stored time
    after ``now``, from a clock that stepped back, becomes ``now``)."""
    if record.downSince is not None and record.downSince <= now:
        return record
    return record.model_copy(update={"downSince": now})


def seen_running(record: RestartRecord, now: float) -> RestartRecord:
    """The record of an instance found running at ``now``: not down, and its streak reset once
    it has run :data:`RESET_AFTER` since its last start."""
    started = record.startedAt
    if started is None or started > now:
        started = now
    streak = 0 if now - started >= RESET_AFTER else record.streak
    new = RestartRecord(startedAt=started, streak=streak, downSince=None)
    return record if new == record else new


def tried_start(record: RestartRecord, now: float, *, ok: bool, restart: bool) -> RestartRecord:
    """The record after a start at ``now``: a restart lengthens the streak; a plan's start
    (a new instance or version) begins a new one. A failed start leaves the instance down."""
    streak = record.streak + 1 if restart else 0
    if ok:
        return RestartRecord(startedAt=now, streak=streak, downSince=None)
    return RestartRecord(startedAt=record.startedAt, streak=streak, downSince=now)


def policy_of_config(config: object) -> RestartPolicy:
    """The restart policy an OCI config carries in its annotations (default ``always``)."""
    annotations = config.get("annotations") if isinstance(config, dict) else None
    value = annotations.get(RESTART_POLICY_ANNOTATION) if isinstance(annotations, dict) else None
    for policy in RESTART_POLICIES:
        if value == policy:
            return policy
    return "always"
