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
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True, defer_build=True)


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
    """Percent of a service's cpuDMIPSLimit quota requested on this node when the service sets no
    requestedResources.cpu."""
    ram: Percent = 50
    """Percent of a service's ramLimit quota requested on this node when the service sets no
    requestedResources.ram."""
    storage: Percent = 50
    """Percent of a service's storageLimit quota requested on this node when the service sets no
    requestedResources.storage."""
    state: Percent = 50
    """Percent of a service's stateLimit quota requested on this node when the service sets no
    requestedResources.state."""


class AlertRule(_Model):
    minThreshold: Percent
    """Percent of the node's capacity: a raised alert falls once usage stays below it for
    minTimeout."""
    maxThreshold: Percent
    """Percent of the node's capacity: usage at or above it for minTimeout raises the alert (and
    triggers a rebalance)."""
    minTimeout: Duration
    """How long usage must stay above maxThreshold (or below minThreshold) before the alert rises
    (or falls)."""

    @model_validator(mode="after")
    def _order(self) -> Self:
        if self.minThreshold > self.maxThreshold:
            raise ValueError("minThreshold must not exceed maxThreshold")
        return self


class AlertRules(_Model):
    cpu: AlertRule | None = None
    """The alert rule on the node's CPU usage (usage.cpu against maxDMIPS)."""
    ram: AlertRule | None = None
    """The alert rule on the node's RAM usage (usage.ram against totalRAM)."""


class NodeConfig(_Model):
    nodeType: Id
    """The node type this entry applies to (the Node document's type)."""
    nodeId: Id | None = None
    """Only this node; an entry with the exact nodeId wins over one matching only nodeType."""
    priority: Int = 0
    """Node priority: among the nodes that fit, only those of the highest priority are chosen."""
    labels: tuple[Label, ...] = ()
    """Labels the node carries; a service's labels must all be among them."""
    resourceRatios: ResourceRatios = ResourceRatios()
    """Percent of a quota requested when a service sets no requested amount (default 50 each)."""
    alertRules: AlertRules | None = None
    """Sustained-load alerts on CPU and RAM that trigger a rebalance; none when absent."""


class NetworkConfig(_Model):
    """unit.yaml ``network``: the subnets networks take (in order), the ranges in use on the
    nodes that no network may overlap, and whether each network gets a VLAN id."""

    subnets: tuple[Subnet, ...] = Field(default=DEFAULT_SUBNETS, min_length=1)
    """The IPv4 subnets (CIDR) networks take, in this order, one per network."""
    excludeSubnets: tuple[Subnet, ...] = ()
    """Address ranges in use on the nodes that no network may overlap."""
    vlan: Bool = False
    """Whether each network gets a VLAN id."""

    @model_validator(mode="after")
    def _checks(self) -> Self:
        _unique(list(self.subnets), "subnet")
        return self


class UnitConfig(_Model):
    apiVersion: ApiVersion
    """Always reconciler/v1."""
    kind: Literal["UnitConfig"]
    """Always UnitConfig."""
    version: SemVer
    """The unit configuration's version (semver)."""
    placement: Literal["stable", "fresh"] = "stable"
    """stable: instances keep their node while it still fits; fresh: every run places every
    instance anew."""
    maxInstances: UnitInstanceLimit = DEFAULT_UNIT_MAX_INSTANCES
    """The most instances all services together may ask for; a desired state asking for more is
    invalid."""
    nodeTimeout: Duration = 60.0  # a node whose reportedAt is older fails NodeState (SPEC §19)
    """A node whose agent report (reportedAt) is older than this is treated as disconnected."""
    nodes: tuple[NodeConfig, ...] = ()
    """Per-node settings: priority, labels, resource ratios, alert rules, matched by nodeType or
    nodeId."""
    network: NetworkConfig | None = None
    """Subnets and VLANs of the unit's networks; defaults apply when absent."""

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
    """CPU architecture the image needs (amd64, arm64, ...); must equal the runtime's."""
    os: Str | None = None
    """Operating system the image needs; compared only when set."""
    variant: Str | None = None
    """Architecture variant (e.g. v8); compared only when set."""
    osVersion: Str | None = None
    """Operating system version; compared only when set."""
    osFeatures: tuple[Str, ...] = ()
    """Features the runtime's platform must all have."""


class Image(_Model):
    rootfs: Str = Field(min_length=1)
    """The root filesystem directory: relative to the state directory, or absolute."""
    platform: ImagePlatform | None = None
    """The platform the image needs; a runtime of another platform is filtered out (Platform)."""
    entrypoint: tuple[Str, ...] = ()
    """The command run in the container (argv); cmd is appended to it."""
    cmd: tuple[Str, ...] = ()
    """Arguments after the entrypoint (or the command itself without one)."""
    env: tuple[Str, ...] = ()
    """Environment variables, each NAME=value."""
    workingDir: Str = "/"
    """The container's working directory (absolute)."""

    @model_validator(mode="after")
    def _checks(self) -> Self:
        _check_env(self.env)
        if not self.workingDir.startswith("/"):
            raise ValueError("workingDir must be an absolute path")
        return self


class Quotas(_Model):
    cpuDMIPSLimit: NonNegInt | None = None
    """CPU limit in DMIPS (Dhrystone million instructions per second); becomes the container's CFS
    quota: limit x 100000 x numCores / maxDMIPS per 100000 us period."""
    ramLimit: Bytes | None = None
    """Memory limit of the container (bytes)."""
    storageLimit: Bytes | None = None
    """Storage limit (bytes) taken from the node's partition typed storages."""
    stateLimit: Bytes | None = None
    """State limit (bytes) taken from the node's partition typed states."""
    pidsLimit: PosInt | None = None
    """The most processes the container may run."""
    noFileLimit: PosInt | None = None
    """The most open files per process (RLIMIT_NOFILE)."""
    tmpLimit: Bytes | None = None
    """Size of the container's /tmp (bytes)."""
    downloadSpeed: NonNegInt | None = None  # kbit/s into the instance; 0 = unlimited
    """Ingress bandwidth limit in kbit/s; 0 is unlimited."""
    uploadSpeed: NonNegInt | None = None  # kbit/s out of the instance; 0 = unlimited
    """Egress bandwidth limit in kbit/s; 0 is unlimited."""


class RequestedResources(_Model):
    cpu: NonNegInt | None = None
    """CPU reserved per instance on its node, in DMIPS (Dhrystone million instructions per second);
    capped at cpuDMIPSLimit."""
    ram: Bytes | None = None
    """RAM reserved per instance (bytes); capped at ramLimit."""
    storage: Bytes | None = None
    """Storage reserved per instance (bytes); capped at storageLimit."""
    state: Bytes | None = None
    """State storage reserved per instance (bytes); capped at stateLimit."""


class ResourceRequest(_Model):
    name: ResourceName
    """The named host resource (from the node's resources) each instance takes one slot of."""
    mode: AccessMode = "rwm"
    """Device access for the resource's devices: letters from rwm (read, write, mknod)."""


class DeviceRequest(_Model):
    resource: ResourceName
    """The device pool's resource name (e.g. example.com/gpu)."""
    count: PosInt | None = None
    """Whole devices per instance (a pool with policy exclusive); give count or memory."""
    memory: Bytes | None = None
    """Device memory per instance on one shared device (a pool with policy fractional); give count
    or memory."""

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
    """Always reconciler/v1."""
    kind: Literal["Service"]
    """Always Service."""
    type: ItemType = "service"
    """service: a container; component: firmware or an image installed by its runtime's handler."""
    id: Id
    """The item id (e.g. com.example.nav)."""
    version: SemVer
    """Semver; a new version stops the old instances and starts new ones."""
    subject: Id = "default"
    """The subject id; (id, subject) identifies the service."""
    priority: Int = 0
    """Higher is placed first and may preempt lower-priority instances."""
    instances: InstanceCount = 1
    """How many instances to run (0 allowed)."""
    labels: tuple[Label, ...] = ()
    """Node labels (from unit.yaml) every chosen node must have."""
    nodeId: Id | None = None
    """Only this node may host the instances."""
    balancingPolicy: Literal["enabled", "disabled"] = "enabled"
    """enabled: a rebalance may move the instances; disabled: they stay on their node."""
    restartPolicy: RestartPolicy = "always"  # what the node agent does when its container dies
    """What the node agent does when a container dies: always, on-failure or never restart it."""
    runtimes: tuple[Id, ...] = Field(default=("crun", "runc"), min_length=1)
    """Accepted runtime types (a node runtime's type), in no order."""
    image: Image
    """The container image: root filesystem, platform, command, environment."""
    quotas: Quotas = Quotas()
    """Limits of each instance, written into its OCI config; also the base of requests by ratio."""
    requestedResources: RequestedResources = RequestedResources()
    """Amounts reserved per instance on its node; without them, quota x the node's
    resourceRatios."""
    skipResourceLimits: Bool = False
    """Request no CPU, RAM, storage or state at all."""
    resources: tuple[ResourceRequest, ...] = ()
    """Named host resources each instance needs one slot of."""
    devices: tuple[DeviceRequest, ...] = ()
    """Device-pool requests: whole devices (count) or a share of one (memory)."""
    # the pattern on the plain type: on Str (whose NUL check is a validator) it left the schema
    hostname: Annotated[str, Strict(), Field(pattern=_HOSTNAME)] | None = None
    """The container's hostname."""
    sysctl: Mapping[SysctlName, Str] = Field(default_factory=dict)
    """Namespaced kernel parameters set in the container (net.*, kernel.msg*, ...)."""
    # networks (SPEC §17): the provider whose network the instances join, the ports they serve
    # and the ports of other items they may reach
    owner: Id | None = None
    """The provider whose network the instances join (default: the network default)."""
    exposedPorts: tuple[_PortString, ...] = ()
    """Ports the instances serve, port[/tcp|udp] (tcp when omitted)."""
    allowedConnections: tuple[_ConnectionString, ...] = ()
    """Ports of other items the instances may reach: itemId/port[/proto]."""

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
    """The node's operating system."""
    version: Str | None = None
    """The operating system's version."""
    features: tuple[Str, ...] = ()
    """Operating system features."""


class Partition(_Model):
    name: Id
    """The partition's name (unique on the node)."""
    types: tuple[Str, ...] = Field(min_length=1)
    """What it holds: storages (services' storage), states (services' state) or other types."""
    totalSize: Bytes
    """The partition's size (bytes)."""


class RuntimePlatform(_Model):
    architecture: Str
    """CPU architecture (amd64, arm64, ...)."""
    os: Str = "linux"
    """Operating system."""
    variant: Str | None = None
    """Architecture variant."""
    osVersion: Str | None = None
    """Operating system version."""
    osFeatures: tuple[Str, ...] = ()
    """Operating system features."""


class Runtime(_Model):
    id: Id
    """The runtime's id on the node."""
    type: Id
    """The runtime type (runc, crun, ...) services list in runtimes."""
    platform: RuntimePlatform
    """The platform the runtime runs images of."""
    maxInstances: NonNegInt = 0
    """The most instances on this runtime; 0 is unlimited."""
    allowedDMIPS: NonNegInt | None = None
    """A CPU pool of its own, in DMIPS (Dhrystone million instructions per second), instead of the
    node's."""
    allowedRAM: Bytes | None = None
    """A RAM pool of its own (bytes) instead of the node's."""
    handler: tuple[Str, ...] = ()
    """A component runtime's installer (argv): the agent runs ``handler install ITEM VERSION
    ARTIFACT`` and ``handler remove ITEM VERSION`` (see the components page of the docs)."""

    @model_validator(mode="before")
    @classmethod
    def _one_component_each(cls, data: object) -> object:
        """A runtime with a handler hosts one component unless ``maxInstances`` says otherwise."""
        if isinstance(data, Mapping) and data.get("handler") and "maxInstances" not in data:
            return {**data, "maxInstances": 1}
        return data


class Mount(_Model):
    destination: Str
    """The path inside the container."""
    type: Str = "bind"
    """The mount type (bind by default)."""
    source: Str
    """The path on the host (or the filesystem source)."""
    options: tuple[Str, ...] = ()
    """Mount options (ro, rbind, ...)."""


class HostEntry(_Model):
    hostname: Str = Field(min_length=1)
    """A host name added to the instance's /etc/hosts."""
    ip: Str = Field(min_length=1)
    """Its address."""


class HostResource(_Model):
    """One entry of the resource manager's resources file (a node's named resources)."""

    name: ResourceName
    """The resource's name, which services list in resources."""
    sharedCount: NonNegInt = 0
    """How many instances may hold it at once; 0 is unlimited."""
    groups: tuple[Str, ...] = ()
    """Host groups whose gids the container's process gets."""
    mounts: tuple[Mount, ...] = ()
    """Mounts added to the instance's OCI config."""
    envs: tuple[Str, ...] = ()
    """Environment variables (NAME=value) added to the instance."""
    hosts: tuple[HostEntry, ...] = ()
    """Entries added to the instance's /etc/hosts."""
    devices: tuple[Str, ...] = ()
    """Host devices, host_path[:container_path[:permissions]]."""

    @model_validator(mode="after")
    def _checks(self) -> Self:
        _check_env(self.envs)
        return self


class Device(_Model):
    """One device of a pool; ``devices``, ``envs``, ``mounts`` and ``annotations`` go into the
    OCI config of each instance it is allocated to (the kubelet's ContainerAllocateResponse)."""

    id: Id
    """The device's id in its pool."""
    healthy: Bool = True
    """An unhealthy device is given to no new instance."""
    memory: Bytes | None = None
    """The device's memory (bytes), shared out by a fractional pool."""
    devices: tuple[Str, ...] = ()
    """Host device nodes added to the instance's OCI config."""
    envs: tuple[Str, ...] = ()
    """Environment variables (NAME=value) added to the instance."""
    mounts: tuple[Mount, ...] = ()
    """Mounts added to the instance's OCI config."""
    annotations: Mapping[Annotated[Str, Field(min_length=1)], Str] = Field(default_factory=dict)
    """OCI annotations added to the instance's config."""

    @model_validator(mode="after")
    def _checks(self) -> Self:
        _check_env(self.envs)
        return self


class DevicePool(_Model):
    resource: ResourceName
    """The resource name services request (e.g. example.com/gpu)."""
    policy: PolicyName  # a registered sharing policy (reconciler.placement.sharing)
    """The sharing policy: exclusive (whole devices by count) or fractional (a share of one
    device's memory)."""
    devices: tuple[Device, ...] = ()
    """The pool's devices."""

    @model_validator(mode="after")
    def _checks(self) -> Self:
        _unique([d.id for d in self.devices], "device id")
        check_devices(self.policy, self.devices)  # the policy's own rules
        return self


class UsageReading(_Model):
    cpu: NonNegInt = 0
    """Measured CPU of the instance, in DMIPS (Dhrystone million instructions per second)."""
    ram: Bytes = 0
    """Measured memory of the instance (bytes)."""


class NodeUsage(_Model):
    cpu: NonNegInt = 0
    """Measured CPU of the whole node, in DMIPS (Dhrystone million instructions per second)."""
    ram: Bytes = 0
    """Measured memory in use on the node (bytes)."""
    instances: Mapping[Str, UsageReading] = Field(default_factory=dict)
    """Measured usage per running instance id."""


class Node(_Model):
    apiVersion: ApiVersion
    """Always reconciler/v1."""
    kind: Literal["Node"]
    """Always Node."""
    id: Id
    """The node id; equal to the file name (nodes/<id>.yaml)."""
    type: Id
    """The node type, matched by unit.yaml's nodes entries."""
    state: Literal["provisioned", "unprovisioned", "paused", "error"] = "provisioned"
    """Only a provisioned node hosts instances."""
    connected: Bool = True
    """A disconnected node hosts no instances."""
    maxDMIPS: NonNegInt
    """The node's whole CPU capacity in DMIPS (Dhrystone million instructions per second): a CPU
    speed unit that compares across nodes, e.g. 4 cores of 5000 DMIPS each is 20000."""
    totalRAM: Bytes
    """The node's memory (bytes)."""
    numCores: PosInt = 1
    """CPU cores; used to turn a DMIPS limit into a CFS quota."""
    osInfo: OsInfo | None = None
    """The node's operating system."""
    partitions: tuple[Partition, ...] = ()
    """Disk partitions; those typed storages and states are the storage and state pools."""
    runtimes: tuple[Runtime, ...] = ()
    """The container runtimes of the node; an instance runs on one of them."""
    resources: tuple[HostResource, ...] | None = None
    """Named host resources, inline (or use resourcesFile, not both)."""
    resourcesFile: Str | None = None
    """Path of a JSON file listing the named host resources (relative to the state directory, or
    absolute)."""
    devicePools: tuple[DevicePool, ...] = ()
    """Pools of devices (GPUs, NPUs, ...) shared out by a sharing policy."""
    inventories: NodeInventories = NodeInventories()
    """Per resource: reserved amount, allocation ratio (overcommit) and unit rules."""
    usage: NodeUsage | None = None
    """Measured usage (written by the agent); drives alerts and lowers available CPU and RAM."""
    reportedAt: AwareDatetime | None = None  # when its agent wrote it (SPEC §19); None: by hand
    """When the agent wrote this file; a report older than unit.yaml's nodeTimeout marks the node
    disconnected."""
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
        private = self.__pydantic_private__  # (pydantic's __getattr__ is slow; read its dict)
        why: str | None = private.get("_no_report") if private else None
        return why

    def marked_stale(self, why: str) -> Node:
        """A disconnected copy of this node that says ``why`` it fails NodeState."""
        copy = self.model_copy(update={"connected": False})
        copy._no_report = why
        return copy

    @property
    def device_kinds(self) -> tuple[tuple[str, str], ...]:
        """Each device pool's resource and sharing policy, sorted: which device requests the
        node can serve at all, whatever its devices and their health (the class index reads
        it, so nodes that differ here are never in one class)."""
        return tuple(sorted([(p.resource, p.policy) for p in self.devicePools]))

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
    """The exit code, when known."""
    signal: Int | None = None
    """The signal that ended it, when known."""
    reason: Str
    """stopped, container missing, or start failed: ..."""
    at: AwareDatetime
    """When the agent noticed."""


class ActualInstance(_Model):
    itemId: Id
    """The service's item id."""
    subjectId: Id
    """The service's subject id."""
    index: NonNegInt
    """The instance's index (0 to instances-1)."""
    version: SemVer
    """The running version."""
    runtimeId: Id
    """The runtime it runs on."""
    state: Literal["activating", "active", "inactive", "failed"]
    """Observed state: activating, active, inactive or failed."""
    devices: Mapping[ResourceName, tuple[Id, ...]] = Field(default_factory=dict)
    """Device ids held, per resource."""
    # observed by the agent, never planned (like state)
    restartCount: NonNegInt = 0
    """How many times the agent restarted it."""
    lastExit: LastExit | None = None
    """How its container last ended."""
    reason: Str | None = None  # why the state is failed
    """Why the state is failed."""
    ip: Str | None = None  # the instance's address in its network (SPEC §17)
    """The instance's address in its network."""
    network: Id | None = None  # that network's id
    """The network's id."""
    handlerResult: Str | None = None  # a component: what its runtime's handler said (SPEC §18)
    """A component: what its runtime's handler said."""

    @property
    def instance_id(self) -> str:
        return instance_id(self.itemId, self.subjectId, self.index)


class ActualState(_Model):
    apiVersion: ApiVersion
    """Always reconciler/v1."""
    kind: Literal["ActualState"]
    """Always ActualState."""
    nodeId: Id
    """The node this file describes (actual/<nodeId>.yaml)."""
    revision: NonNegInt = 0
    """Incremented by every writer; a plan made against another revision is stale."""
    instances: Mapping[Str, ActualInstance] = Field(default_factory=dict)
    """What runs on the node, by instance id."""

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
