"""Typed, frozen documents of the state directory (SPEC §3).

Field names are exactly the YAML keys (camelCase), so a document, its JSON Schema and the code
read the same. Every model forbids unknown fields; scalars are strict (``"3"`` is not an int).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Annotated, Literal, Self

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    Strict,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from reconciler.model.network import (
    DEFAULT_SUBNETS,
    Connection,
    PortSpec,
    Subnet,
    check_connection,
    check_port,
    connection_spec,
    port_spec,
)
from reconciler.model.nodeinventories import NodeInventories, check_totals
from reconciler.model.policies import PolicyName, check_devices
from reconciler.model.sysctl import SysctlName
from reconciler.model.values import (
    AccessMode,
    Bool,
    Bytes,
    Duration,
    Id,
    Int,
    Label,
    NonNegInt,
    Percent,
    PosInt,
    ResourceName,
    SemVer,
    Str,
    instance_id,
)

__all__ = [
    "API_VERSION",
    "DEFAULT_UNIT_MAX_INSTANCES",
    "KINDS",
    "MAX_SERVICE_INSTANCES",
    "RESTART_POLICIES",
    "UNIT_MAX_INSTANCES_LIMIT",
    "ActualInstance",
    "ActualState",
    "AlertRule",
    "AlertRules",
    "Device",
    "DevicePool",
    "DeviceRequest",
    "Document",
    "HostEntry",
    "HostResource",
    "Image",
    "ImagePlatform",
    "LastExit",
    "Mount",
    "NetworkConfig",
    "Node",
    "NodeConfig",
    "NodeUsage",
    "OsInfo",
    "Partition",
    "Quotas",
    "RequestedResources",
    "ResourceRatios",
    "ResourceRequest",
    "RestartPolicy",
    "Runtime",
    "RuntimePlatform",
    "Service",
    "UnitConfig",
    "UsageReading",
]

_HOSTNAME = r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,62})$"
API_VERSION = "reconciler/v1"
MAX_SERVICE_INSTANCES = 10_000
"""The most instances one service may ask for (``instances``)."""
DEFAULT_UNIT_MAX_INSTANCES = 100_000
"""The default of ``maxInstances`` in unit.yaml: the most instances all services together may
ask for (without a unit.yaml too)."""
UNIT_MAX_INSTANCES_LIMIT = 1_000_000
"""The highest ``maxInstances`` unit.yaml may set."""
ApiVersion = Literal["reconciler/v1"]
InstanceCount = Annotated[int, Strict(), Field(ge=0, le=MAX_SERVICE_INSTANCES)]
UnitInstanceLimit = Annotated[int, Strict(), Field(ge=1, le=UNIT_MAX_INSTANCES_LIMIT)]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)


def _unique(values: list[str], what: str) -> None:
    seen: set[str] = set()
    for v in values:
        if v in seen:
            raise ValueError(f"duplicate {what} {v!r}")
        seen.add(v)


def _check_env(entries: tuple[str, ...]) -> None:
    for e in entries:
        if "=" not in e or e.startswith("="):
            raise ValueError(f"env entry {e!r} must look like NAME=value")


# ---------------------------------------------------------------- UnitConfig (§3.1)


class ResourceRatios(_Model):
    cpu: Percent = 50
    ram: Percent = 50
    storage: Percent = 50
    state: Percent = 50


class AlertRule(_Model):
    minThreshold: Percent
    maxThreshold: Percent
    minTimeout: Duration

    @model_validator(mode="after")
    def _order(self) -> Self:
        if self.minThreshold > self.maxThreshold:
            raise ValueError("minThreshold must not exceed maxThreshold")
        return self


class AlertRules(_Model):
    cpu: AlertRule | None = None
    ram: AlertRule | None = None


class NodeConfig(_Model):
    nodeType: Id
    nodeId: Id | None = None
    priority: Int = 0
    labels: tuple[Label, ...] = ()
    resourceRatios: ResourceRatios = ResourceRatios()
    alertRules: AlertRules | None = None


class NetworkConfig(_Model):
    """unit.yaml ``network``: the subnets networks take (in order), the ranges in use on the
    nodes that no network may overlap, and whether each network gets a VLAN id."""

    subnets: tuple[Subnet, ...] = Field(default=DEFAULT_SUBNETS, min_length=1)
    excludeSubnets: tuple[Subnet, ...] = ()
    vlan: Bool = False

    @model_validator(mode="after")
    def _checks(self) -> Self:
        _unique(list(self.subnets), "subnet")
        return self


class UnitConfig(_Model):
    apiVersion: ApiVersion
    kind: Literal["UnitConfig"]
    version: SemVer
    placement: Literal["stable", "fresh"] = "stable"
    maxInstances: UnitInstanceLimit = DEFAULT_UNIT_MAX_INSTANCES
    nodeTimeout: Duration = 60.0  # a node whose reportedAt is older fails NodeState (SPEC §19)
    nodes: tuple[NodeConfig, ...] = ()
    network: NetworkConfig | None = None

    @model_validator(mode="after")
    def _no_duplicate_entries(self) -> Self:
        keys = [f"{n.nodeType}/{n.nodeId or '*'}" for n in self.nodes]
        _unique(keys, "node entry (nodeType/nodeId)")
        return self

    def config_for(self, node_id: str, node_type: str) -> NodeConfig | None:
        """The entry with the exact nodeId wins over one matching only the nodeType (the first
        of each kind, in file order)."""
        named, typed = _entry_index(self)
        got = named.get(node_id)
        return got if got is not None else typed.get(node_type)


EntryIndex = tuple[dict[str, "NodeConfig"], dict[str, "NodeConfig"]]

_ENTRY_INDEXES: dict[int, tuple[weakref.ref[UnitConfig], EntryIndex]] = {}


def _entry_index(unit: UnitConfig) -> EntryIndex:
    """A unit's entries by the node id they name and, for those naming none, by node type (the
    first of each): ``config_for`` in two lookups on a unit with an entry per node. Kept per
    unit object while it lives (a copy with other entries is another object)."""
    got = _ENTRY_INDEXES.get(id(unit))
    if got is not None and got[0]() is unit:
        return got[1]
    named: dict[str, NodeConfig] = {}
    typed: dict[str, NodeConfig] = {}
    for entry in unit.nodes:
        if entry.nodeId is not None:
            named.setdefault(entry.nodeId, entry)
        else:
            typed.setdefault(entry.nodeType, entry)
    key = id(unit)
    _ENTRY_INDEXES[key] = (
        weakref.ref(unit, lambda _ref: _ENTRY_INDEXES.pop(key, None)),
        (named, typed),
    )
    return named, typed


# ---------------------------------------------------------------- Service (§3.2)


class ImagePlatform(_Model):
    architecture: Str
    os: Str | None = None
    variant: Str | None = None
    osVersion: Str | None = None
    osFeatures: tuple[Str, ...] = ()


class Image(_Model):
    rootfs: Str = Field(min_length=1)
    platform: ImagePlatform | None = None
    entrypoint: tuple[Str, ...] = ()
    cmd: tuple[Str, ...] = ()
    env: tuple[Str, ...] = ()
    workingDir: Str = "/"

    @model_validator(mode="after")
    def _checks(self) -> Self:
        _check_env(self.env)
        if not self.workingDir.startswith("/"):
            raise ValueError("workingDir must be an absolute path")
        return self


class Quotas(_Model):
    cpuDMIPSLimit: NonNegInt | None = None
    ramLimit: Bytes | None = None
    storageLimit: Bytes | None = None
    stateLimit: Bytes | None = None
    pidsLimit: PosInt | None = None
    noFileLimit: PosInt | None = None
    tmpLimit: Bytes | None = None
    downloadSpeed: NonNegInt | None = None  # kbit/s into the instance; 0 = unlimited
    uploadSpeed: NonNegInt | None = None  # kbit/s out of the instance; 0 = unlimited


class RequestedResources(_Model):
    cpu: NonNegInt | None = None
    ram: Bytes | None = None
    storage: Bytes | None = None
    state: Bytes | None = None


class ResourceRequest(_Model):
    name: ResourceName
    mode: AccessMode = "rwm"


class DeviceRequest(_Model):
    resource: ResourceName
    count: PosInt | None = None
    memory: Bytes | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Self:
        if (self.count is None) == (self.memory is None):
            raise ValueError("a device request gives exactly one of count or memory")
        if self.memory is not None and self.memory <= 0:
            raise ValueError("memory must be positive")
        return self


RestartPolicy = Literal["always", "on-failure", "never"]
RESTART_POLICIES: tuple[RestartPolicy, ...] = ("always", "on-failure", "never")


ItemType = Literal["service", "component"]
"""``service``: a container; ``component``: firmware, a rootfs or a boot image installed by its
runtime's handler (no CPU, RAM, network or OCI config)."""

_PortString = Annotated[
    str,
    Strict(),
    AfterValidator(check_port),
    WithJsonSchema({"type": "string", "pattern": r"^[0-9]{1,5}(/(tcp|udp))?$"}),
]
_ConnectionString = Annotated[
    str,
    Strict(),
    AfterValidator(check_connection),
    WithJsonSchema(
        {"type": "string", "pattern": r"^[A-Za-z0-9][A-Za-z0-9._-]*/[0-9]{1,5}(/(tcp|udp))?$"}
    ),
]


class Service(_Model):
    apiVersion: ApiVersion
    kind: Literal["Service"]
    type: ItemType = "service"
    id: Id
    version: SemVer
    subject: Id = "default"
    priority: Int = 0
    instances: InstanceCount = 1
    labels: tuple[Label, ...] = ()
    nodeId: Id | None = None
    balancingPolicy: Literal["enabled", "disabled"] = "enabled"
    restartPolicy: RestartPolicy = "always"  # what the node agent does when its container dies
    runtimes: tuple[Id, ...] = Field(default=("crun", "runc"), min_length=1)
    image: Image
    quotas: Quotas = Quotas()
    requestedResources: RequestedResources = RequestedResources()
    skipResourceLimits: Bool = False
    resources: tuple[ResourceRequest, ...] = ()
    devices: tuple[DeviceRequest, ...] = ()
    # the pattern on the plain type: on Str (whose NUL check is a validator) it left the schema
    hostname: Annotated[str, Strict(), Field(pattern=_HOSTNAME)] | None = None
    sysctl: Mapping[SysctlName, Str] = Field(default_factory=dict)
    # networks (SPEC §17): the provider whose network the instances join, the ports they serve
    # and the ports of other items they may reach
    owner: Id | None = None
    exposedPorts: tuple[_PortString, ...] = ()
    allowedConnections: tuple[_ConnectionString, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _component_defaults(cls, data: object) -> object:
        """A component keeps its node when rebalancing unless it says otherwise (SPEC §18)."""
        if (
            isinstance(data, Mapping)
            and data.get("type") == "component"
            and "balancingPolicy" not in data
        ):
            return {**data, "balancingPolicy": "disabled"}
        return data

    @model_validator(mode="after")
    def _unique_lists(self) -> Self:
        _unique([r.name for r in self.resources], "resource")
        _unique([d.resource for d in self.devices], "device request for resource")
        _unique(list(self.runtimes), "runtime")
        _unique([str(p) for p in self.ports], "exposed port")
        _unique([str(c) for c in self.connections], "allowed connection")
        if self.type == "component":
            for name in ("owner", "exposedPorts", "allowedConnections"):
                if name in self.model_fields_set:
                    raise ValueError(f"{name}: a component gets no network")
        return self

    @property
    def ports(self) -> tuple[PortSpec, ...]:
        """``exposedPorts`` parsed (``8080`` is ``8080/tcp``)."""
        return tuple(port_spec(p) for p in self.exposedPorts)

    @property
    def connections(self) -> tuple[Connection, ...]:
        """``allowedConnections`` parsed."""
        return tuple(connection_spec(c) for c in self.allowedConnections)

    @property
    def networked(self) -> bool:
        """Whether the service's instances get a network of their own even when unit.yaml
        declares none: it names an owner, exposes a port or connects to one."""
        return self.type == "service" and bool(
            self.owner is not None or self.exposedPorts or self.allowedConnections
        )

    @property
    def network_id(self) -> str:
        """The network the instances join: the owner's (SPEC §17), ``default`` without one."""
        return self.owner or "default"

    @property
    def key(self) -> tuple[str, str]:
        """(itemId, subjectId): the identity of a service."""
        return (self.id, self.subject)

    def instance_ids(self) -> list[str]:
        return [instance_id(self.id, self.subject, i) for i in range(self.instances)]


# ---------------------------------------------------------------- Node (§3.3, §6.2, §6.3)


class OsInfo(_Model):
    os: Str
    version: Str | None = None
    features: tuple[Str, ...] = ()


class Partition(_Model):
    name: Id
    types: tuple[Str, ...] = Field(min_length=1)
    totalSize: Bytes


class RuntimePlatform(_Model):
    architecture: Str
    os: Str = "linux"
    variant: Str | None = None
    osVersion: Str | None = None
    osFeatures: tuple[Str, ...] = ()


class Runtime(_Model):
    id: Id
    type: Id
    platform: RuntimePlatform
    maxInstances: NonNegInt = 0
    allowedDMIPS: NonNegInt | None = None
    allowedRAM: Bytes | None = None
    handler: tuple[Str, ...] = ()
    """A component runtime's installer (argv): the agent runs ``handler install ITEM VERSION
    ARTIFACT`` and ``handler remove ITEM VERSION`` (SPEC §18)."""

    @model_validator(mode="before")
    @classmethod
    def _one_component_each(cls, data: object) -> object:
        """A runtime with a handler hosts one component unless ``maxInstances`` says otherwise."""
        if isinstance(data, Mapping) and data.get("handler") and "maxInstances" not in data:
            return {**data, "maxInstances": 1}
        return data


class Mount(_Model):
    destination: Str
    type: Str = "bind"
    source: Str
    options: tuple[Str, ...] = ()


class HostEntry(_Model):
    hostname: Str = Field(min_length=1)
    ip: Str = Field(min_length=1)


class HostResource(_Model):
    """One entry of the resource manager's resources file (SPEC §6.2)."""

    name: ResourceName
    sharedCount: NonNegInt = 0
    groups: tuple[Str, ...] = ()
    mounts: tuple[Mount, ...] = ()
    envs: tuple[Str, ...] = ()
    hosts: tuple[HostEntry, ...] = ()
    devices: tuple[Str, ...] = ()

    @model_validator(mode="after")
    def _checks(self) -> Self:
        _check_env(self.envs)
        return self


class Device(_Model):
    """One device of a pool; ``devices``, ``envs``, ``mounts`` and ``annotations`` go into the
    OCI config of each instance it is allocated to (the kubelet's ContainerAllocateResponse)."""

    id: Id
    healthy: Bool = True
    memory: Bytes | None = None
    devices: tuple[Str, ...] = ()
    envs: tuple[Str, ...] = ()
    mounts: tuple[Mount, ...] = ()
    annotations: Mapping[Annotated[Str, Field(min_length=1)], Str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _checks(self) -> Self:
        _check_env(self.envs)
        return self


class DevicePool(_Model):
    resource: ResourceName
    policy: PolicyName  # a registered sharing policy (reconciler.placement.sharing)
    devices: tuple[Device, ...] = ()

    @model_validator(mode="after")
    def _checks(self) -> Self:
        _unique([d.id for d in self.devices], "device id")
        check_devices(self.policy, self.devices)  # the policy's own rules
        return self


class UsageReading(_Model):
    cpu: NonNegInt = 0
    ram: Bytes = 0


class NodeUsage(_Model):
    cpu: NonNegInt = 0
    ram: Bytes = 0
    instances: Mapping[Str, UsageReading] = Field(default_factory=dict)


class Node(_Model):
    apiVersion: ApiVersion
    kind: Literal["Node"]
    id: Id
    type: Id
    state: Literal["provisioned", "unprovisioned", "paused", "error"] = "provisioned"
    connected: Bool = True
    maxDMIPS: NonNegInt
    totalRAM: Bytes
    numCores: PosInt = 1
    osInfo: OsInfo | None = None
    partitions: tuple[Partition, ...] = ()
    runtimes: tuple[Runtime, ...] = ()
    resources: tuple[HostResource, ...] | None = None
    resourcesFile: Str | None = None
    devicePools: tuple[DevicePool, ...] = ()
    inventories: NodeInventories = NodeInventories()
    usage: NodeUsage | None = None
    reportedAt: AwareDatetime | None = None  # when its agent wrote it (SPEC §19); None: by hand
    _no_report: str | None = PrivateAttr(default=None)
    """Set on the controller's copy of a node whose report is too old: why it fails NodeState
    (never read from or written to the file)."""

    @field_validator("partitions")
    @classmethod
    def _one_partition_per_type(cls, parts: tuple[Partition, ...]) -> tuple[Partition, ...]:
        """Storage and state each come from one partition (SPEC §7.3): two partitions typed
        alike would make placement depend on the order of the list."""
        for kind in ("storages", "states"):
            typed = [p.name for p in parts if kind in p.types]
            if len(typed) > 1:
                names = ", ".join(repr(n) for n in typed)
                raise ValueError(f"{names} are all typed {kind}: a node has one partition per type")
        return parts

    @field_validator("inventories")
    @classmethod
    def _within_totals(cls, inventories: NodeInventories, info: ValidationInfo) -> NodeInventories:
        """A reserved part is at most what the node has, a capacity fits 64 bits (SPEC §6.1)."""
        data = info.data
        if inventories.declared and "maxDMIPS" in data and "totalRAM" in data:
            sizes = {k: p for p in data.get("partitions", ()) for k in p.types}
            storage, state = sizes.get("storages"), sizes.get("states")
            check_totals(
                inventories,
                max_dmips=data["maxDMIPS"],
                total_ram=data["totalRAM"],
                storage=storage.totalSize if storage is not None else None,
                state=state.totalSize if state is not None else None,
                shared=storage is not None and storage is state,
            )
        return inventories

    @model_validator(mode="after")
    def _checks(self) -> Self:
        if self.resources is not None and self.resourcesFile is not None:
            raise ValueError("give either resources or resourcesFile, not both")
        _unique([r.id for r in self.runtimes], "runtime id")
        _unique([p.name for p in self.partitions], "partition name")
        _unique([p.resource for p in self.devicePools], "device pool resource")
        if self.resources is not None:
            _unique([r.name for r in self.resources], "resource name")
        return self

    @property
    def no_report(self) -> str | None:
        """Why the node has no fresh report (see :attr:`_no_report`), or None."""
        return self._no_report

    def marked_stale(self, why: str) -> Node:
        """A disconnected copy of this node that says ``why`` it fails NodeState."""
        copy = self.model_copy(update={"connected": False})
        copy._no_report = why
        return copy

    @property
    def host_resources(self) -> tuple[HostResource, ...]:
        """The node's named resources (inline, or loaded from resourcesFile by the loader)."""
        return self.resources or ()


# ---------------------------------------------------------------- ActualState (§3.4)


class LastExit(_Model):
    """How an instance's container last ended, as its agent saw it: ``code`` and ``signal``
    when known (runc keeps neither for a detached container), ``reason`` (``stopped``,
    ``container missing`` or ``start failed: ...``) and ``at``, when the agent noticed."""

    code: Int | None = None
    signal: Int | None = None
    reason: Str
    at: AwareDatetime


class ActualInstance(_Model):
    itemId: Id
    subjectId: Id
    index: NonNegInt
    version: SemVer
    runtimeId: Id
    state: Literal["activating", "active", "inactive", "failed"]
    devices: Mapping[ResourceName, tuple[Id, ...]] = Field(default_factory=dict)
    # observed by the agent, never planned (like state)
    restartCount: NonNegInt = 0
    lastExit: LastExit | None = None
    reason: Str | None = None  # why the state is failed
    ip: Str | None = None  # the instance's address in its network (SPEC §17)
    network: Id | None = None  # that network's id
    handlerResult: Str | None = None  # a component: what its runtime's handler said (SPEC §18)

    @property
    def instance_id(self) -> str:
        return instance_id(self.itemId, self.subjectId, self.index)


class ActualState(_Model):
    apiVersion: ApiVersion
    kind: Literal["ActualState"]
    nodeId: Id
    revision: NonNegInt = 0
    instances: Mapping[Str, ActualInstance] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _ids_match(self) -> Self:
        for key, inst in self.instances.items():
            if key != inst.instance_id:
                raise ValueError(
                    f"instance key {key!r} is not the id of "
                    f"{inst.itemId}:{inst.subjectId}:{inst.index} ({inst.instance_id})"
                )
        return self


Document = UnitConfig | Service | Node | ActualState
KINDS: dict[str, type[_Model]] = {
    "UnitConfig": UnitConfig,
    "Service": Service,
    "Node": Node,
    "ActualState": ActualState,
}
