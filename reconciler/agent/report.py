"""The agent's report of its node (SPEC §19): declared facts merged with measured ones.

``agent --node-config FILE`` reads a :class:`NodeAgentConfig` (what a person declares: type,
maxDMIPS, runtimes, partitions with their mount ``path``, resources or resourcesFile, static
device pools) and writes ``nodes/<id>.yaml`` with what the agent measures:

- ``totalRAM``: ``MemTotal`` of /proc/meminfo;
- ``numCores``: the CPUs this process may run on (``os.sched_getaffinity``);
- ``osInfo``: ``os`` from /etc/os-release (``ID``), ``version`` its ``VERSION_ID``, and the
  kernel release as the feature ``kernel=<release>`` (after the declared features);
- each partition's ``totalSize``: ``statvfs`` of its ``path`` (blocks times fragment size);
- ``devicePools``: the static ones, then those of the registered device plugins;
- ``usage`` (over the window since the last sample): node CPU in DMIPS, maxDMIPS times the busy
  share of the CPUs above (from /proc/stat), node RAM as MemTotal - MemAvailable, and per
  running container its CPU (from its cgroup's ``cpu.stat`` ``usage_usec``; on a v1 hierarchy
  ``cpuacct.usage``) in DMIPS and its memory (``memory.current``; v1 ``memory.usage_in_bytes``);
- ``reportedAt``: when the report was made.

Measuring (:class:`Sampler`, :func:`measure_static`) touches /proc, /sys and the filesystem;
:func:`node_document` merges the values into a document (pure).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from reconciler.io.fsio import FileReadError, atomic_write, ensure_dir, read_bytes_at
from reconciler.io.loader import format_validation_error
from reconciler.io.lock import StateLock
from reconciler.io.yamlsafe import DEFAULT_MAX_BYTES, YamlRejected, parse_yaml
from reconciler.model.documents import (
    DevicePool,
    HostResource,
    Node,
    NodeUsage,
    Runtime,
    UsageReading,
)
from reconciler.model.jsonbytes import pretty_json
from reconciler.model.values import Id, NonNegInt, Str

__all__ = [
    "DeclaredPartition",
    "NodeAgentConfig",
    "NodeReportError",
    "Sampler",
    "StaticFacts",
    "UsageSample",
    "load_node_config",
    "measure_static",
    "node_document",
    "write_node_report",
]

log = logging.getLogger("reconciler.agent.report")

DEFAULT_USAGE_INTERVAL = 10.0


class NodeReportError(RuntimeError):
    """The node config cannot be read or the report cannot be made or written."""


# ---------------------------------------------------------------- the declared part


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)


class DeclaredPartition(_Model):
    name: Id
    types: tuple[Str, ...]
    path: Str  # where it is mounted: its totalSize is measured there

    @model_validator(mode="after")
    def _checks(self) -> Self:
        if not self.types:
            raise ValueError("a partition has at least one type")
        if not self.path.startswith("/"):
            raise ValueError(f"partition path {self.path!r} must be absolute")
        return self


class NodeAgentConfig(_Model):
    """What a person declares of a node; the agent adds what it measures."""

    apiVersion: Literal["reconciler/v1"]
    kind: Literal["NodeAgentConfig"]
    id: Id
    type: Id
    state: Literal["provisioned", "unprovisioned", "paused", "error"] = "provisioned"
    maxDMIPS: NonNegInt
    osFeatures: tuple[Str, ...] = ()
    partitions: tuple[DeclaredPartition, ...] = ()
    runtimes: tuple[Runtime, ...] = ()
    resources: tuple[HostResource, ...] | None = None
    resourcesFile: Str | None = None
    devicePools: tuple[DevicePool, ...] = ()


def load_node_config(path: Path) -> NodeAgentConfig:
    """The node config at ``path``; errors as ``file:line:col: message``."""
    try:
        raw, _ = read_bytes_at(path, DEFAULT_MAX_BYTES)
    except FileReadError as e:
        raise NodeReportError(f"{path}: {e}") from None
    try:
        parsed = parse_yaml(raw)
    except YamlRejected as e:
        raise NodeReportError(f"{path}:{e.line}:{e.col}: {e.message}") from None
    try:
        return NodeAgentConfig.model_validate(parsed.data)
    except ValidationError as e:
        diags = format_validation_error(str(path), parsed, e, NodeAgentConfig)
        raise NodeReportError("\n".join(str(d) for d in diags)) from None


# ---------------------------------------------------------------- measuring


def _meminfo(proc: Path) -> dict[str, int]:
    """/proc/meminfo in bytes."""
    out = {}
    for line in (proc / "meminfo").read_text().splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            scale = 1024 if len(parts) > 1 and parts[1] == "kB" else 1
            out[name] = int(parts[0]) * scale
    return out


def _os_release(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, eq, value = line.partition("=")
        if eq and key.strip() and not key.startswith("#"):
            out[key.strip()] = value.strip().strip('"').strip("'")
    return out


@dataclass(frozen=True)
class StaticFacts:
    """What the agent measures once per report, besides usage."""

    total_ram: int
    num_cores: int
    os: str
    os_version: str | None
    kernel: str
    partition_sizes: Mapping[str, int]  # partition name -> bytes


def measure_static(
    config: NodeAgentConfig, proc: Path = Path("/proc"), etc: Path = Path("/etc")
) -> StaticFacts:
    """MemTotal, the CPUs this process may use, os-release, the kernel, each partition's size."""
    mem = _meminfo(proc)
    if "MemTotal" not in mem:
        raise NodeReportError(f"{proc / 'meminfo'} has no MemTotal")
    release = _os_release(etc / "os-release")
    sizes = {}
    for part in config.partitions:
        try:
            st = os.statvfs(part.path)
        except OSError as e:
            raise NodeReportError(f"partition {part.name}: statvfs {part.path}: {e}") from None
        sizes[part.name] = st.f_blocks * st.f_frsize
    return StaticFacts(
        total_ram=mem["MemTotal"],
        num_cores=max(1, len(os.sched_getaffinity(0))),
        os=release.get("ID", "linux") or "linux",
        os_version=release.get("VERSION_ID") or None,
        kernel=os.uname().release,
        partition_sizes=sizes,
    )


@dataclass(frozen=True)
class UsageSample:
    """Usage over one window: node CPU (DMIPS) and RAM (bytes), each container's."""

    cpu: int
    ram: int
    instances: Mapping[str, tuple[int, int]]  # instance id -> (cpu DMIPS, memory bytes)

    def to_usage(self) -> NodeUsage:
        return NodeUsage(
            cpu=self.cpu,
            ram=self.ram,
            instances={
                iid: UsageReading(cpu=c, ram=m) for iid, (c, m) in sorted(self.instances.items())
            },
        )


def _cpu_times(proc: Path, cpus: Iterable[int]) -> tuple[int, int]:
    """(busy, total) jiffies summed over ``cpus`` from /proc/stat."""
    wanted = {f"cpu{c}" for c in cpus}
    busy = total = 0
    for line in (proc / "stat").read_text().splitlines():
        parts = line.split()
        if not parts or parts[0] not in wanted:
            continue
        values = [int(v) for v in parts[1:9]]  # user nice system idle iowait irq softirq steal
        idle = values[3] + (values[4] if len(values) > 4 else 0)
        busy += sum(values) - idle
        total += sum(values)
    return busy, total


def _cgroup_paths(proc: Path, pid: int) -> dict[str, str]:
    """A process's cgroups: ``""`` for the v2 (unified) one, else per v1 controller."""
    out: dict[str, str] = {}
    for line in (proc / str(pid) / "cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            out[""] = path
        for c in controllers.split(","):
            if c:
                out[c] = path
    return out


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def container_usage(proc: Path, cgroup_root: Path, pid: int) -> tuple[int | None, int | None]:
    """(CPU time in microseconds, memory in bytes) of the container whose init is ``pid``, from
    its cgroup v2 (``cpu.stat`` usage_usec, ``memory.current``), each falling back to the v1
    hierarchy (``cpuacct.usage``, ``memory.usage_in_bytes``) where v2 lacks the controller."""
    try:
        groups = _cgroup_paths(proc, pid)
    except OSError:
        return None, None
    cpu = mem = None
    unified = groups.get("")
    if unified is not None:
        for base in (cgroup_root, cgroup_root / "unified"):
            d = base / unified.lstrip("/")
            stat_file = d / "cpu.stat"
            if stat_file.is_file():
                for line in stat_file.read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "usage_usec" and value.strip().isdigit():
                        cpu = int(value)
                mem = _read_int(d / "memory.current")
                break
    if cpu is None and "cpuacct" in groups:
        for name in ("cpuacct", "cpu,cpuacct"):
            ns = _read_int(cgroup_root / name / groups["cpuacct"].lstrip("/") / "cpuacct.usage")
            if ns is not None:
                cpu = ns // 1000
                break
    if mem is None and "memory" in groups:
        mem = _read_int(
            cgroup_root / "memory" / groups["memory"].lstrip("/") / "memory.usage_in_bytes"
        )
    return cpu, mem


class Sampler:
    """Usage over the window between two calls of :meth:`sample` (the first call only takes
    the starting point and returns None)."""

    def __init__(
        self,
        max_dmips: int,
        *,
        proc: Path = Path("/proc"),
        cgroup_root: Path = Path("/sys/fs/cgroup"),
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_dmips = max_dmips
        self.proc = proc
        self.cgroup_root = cgroup_root
        self.monotonic = monotonic
        self.cpus = sorted(os.sched_getaffinity(0))
        self._last: tuple[float, tuple[int, int], dict[str, int]] | None = None

    def sample(self, containers: Mapping[str, int]) -> UsageSample | None:
        """``containers``: instance id -> the pid of its container's init (running ones)."""
        now = self.monotonic()
        times = _cpu_times(self.proc, self.cpus)
        cpu_now: dict[str, int] = {}
        mem_now: dict[str, int] = {}
        for iid, pid in sorted(containers.items()):
            cpu, mem = container_usage(self.proc, self.cgroup_root, pid)
            if cpu is not None:
                cpu_now[iid] = cpu
            if mem is not None:
                mem_now[iid] = mem
        last, self._last = self._last, (now, times, cpu_now)
        if last is None:
            return None
        then, (busy0, total0), cpu_then = last
        window = max(now - then, 1e-6)
        busy = max(0, times[0] - busy0)
        total = max(1, times[1] - total0)
        node_cpu = min(self.max_dmips, round(self.max_dmips * busy / total))
        info = _meminfo(self.proc)
        ram = max(0, info.get("MemTotal", 0) - info.get("MemAvailable", 0))
        per: dict[str, tuple[int, int]] = {}
        for iid in sorted(set(cpu_now) | set(mem_now)):
            used_us = cpu_now.get(iid, 0) - cpu_then.get(iid, cpu_now.get(iid, 0))
            share = max(0, used_us) / 1e6 / window / max(1, len(self.cpus))
            per[iid] = (min(self.max_dmips, round(self.max_dmips * share)), mem_now.get(iid, 0))
        return UsageSample(node_cpu, ram, per)


# ---------------------------------------------------------------- the document


def node_document(
    config: NodeAgentConfig,
    facts: StaticFacts,
    plugin_pools: Iterable[DevicePool],
    usage: UsageSample | None,
    reported_at: datetime,
) -> Node:
    """The node document: the declared part with the measured one (pure). A plugin pool whose
    resource a static pool already names is left out (the static one wins)."""
    static = {p.resource for p in config.devicePools}
    pools = list(config.devicePools)
    for pool in sorted(plugin_pools, key=lambda p: p.resource):
        if pool.resource in static:
            log.warning(
                "%s: device plugin pool %s ignored: a static pool", config.id, pool.resource
            )
            continue
        pools.append(pool)
    doc: dict[str, Any] = {
        "apiVersion": "reconciler/v1",
        "kind": "Node",
        "id": config.id,
        "type": config.type,
        "state": config.state,
        "connected": True,
        "maxDMIPS": config.maxDMIPS,
        "totalRAM": facts.total_ram,
        "numCores": facts.num_cores,
        "osInfo": {
            "os": facts.os,
            **({"version": facts.os_version} if facts.os_version else {}),
            "features": [*config.osFeatures, f"kernel={facts.kernel}"],
        },
        "partitions": [
            {"name": p.name, "types": list(p.types), "totalSize": facts.partition_sizes[p.name]}
            for p in config.partitions
        ],
        "runtimes": [r.model_dump(mode="json", exclude_none=True) for r in config.runtimes],
        "devicePools": [p.model_dump(mode="json", exclude_none=True) for p in pools],
        "reportedAt": reported_at.astimezone(UTC).isoformat().replace("+00:00", "Z"),
    }
    if config.resources is not None:
        doc["resources"] = [r.model_dump(mode="json", exclude_none=True) for r in config.resources]
    if config.resourcesFile is not None:
        doc["resourcesFile"] = config.resourcesFile
    if usage is not None:
        doc["usage"] = usage.to_usage().model_dump(mode="json")
    return Node.model_validate(doc)


def node_bytes(node: Node) -> bytes:
    return pretty_json(node.model_dump(mode="json", exclude_none=True))


def write_node_report(state_dir: Path, node: Node, lock_timeout: float | None = None) -> Path:
    """Write ``nodes/<id>.yaml`` atomically under the state lock (JSON, which YAML reads)."""
    path = state_dir / "nodes" / f"{node.id}.yaml"
    try:
        with StateLock(state_dir, lock_timeout):
            ensure_dir(path.parent)
            atomic_write(path, node_bytes(node))
    except FileReadError as e:
        raise NodeReportError(str(e)) from None
    return path
