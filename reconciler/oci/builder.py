"""OCI runtime configs for placed instances (SPEC §11): a pure builder.

:func:`build_config` turns (service, placement, node) plus the instance's uid/gid, rootfs and
hosts-file path into the content of ``config.json`` (OCI runtime-spec 1.0.2, accepted by runc)
and of the instance's ``hosts`` file. It touches no file and no clock: the two lookups that need
the host (group names to gids, device paths to device nodes) are injected as :class:`GroupLookup`
and :class:`DeviceLookup`; :mod:`reconciler.oci.hostdevices` has the real ones.

The steps run in the order of SPEC §11 (see docs/oci.md): defaults, uid/gid, root, process from
the image, instance env, hostname and sysctl, quotas, the named resources in the service's order,
the allocated pool devices, hosts. Every problem is an :class:`OciError` with one line naming the
instance and the cause; :func:`build_all` builds many instances and keeps going past failures.

The build computes what a config takes from its service alone once per service (per
:func:`build_all` call), and for a service with several instances serializes its config.json
once with markers where each instance's values go; ``_build_reference`` is the same build step
by step, which the tests compare it with (bytes and errors).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import posixpath
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Literal, Protocol

import orjson

from reconciler.model.documents import Device, HostEntry, Mount, Node, Service
from reconciler.model.jsonbytes import pretty_json
from reconciler.model.values import INT64_MAX
from reconciler.placement.instances import Placement

__all__ = [
    "CPU_PERIOD",
    "DEFAULT_ENV",
    "KNOWN_OPTION_KEYS",
    "MIN_CPU_QUOTA",
    "NETNS_DIR",
    "NEVER_THROUGH",
    "OCI_VERSION",
    "RESTART_POLICY_ANNOTATION",
    "SERVICE_FIELDS_NOT_BUILT",
    "Asked",
    "BuildResult",
    "BuiltConfig",
    "ConfigJob",
    "DeviceLookup",
    "DeviceLookupError",
    "DeviceNode",
    "DevicePolicy",
    "DeviceSpec",
    "GroupLookup",
    "InstanceAddress",
    "OciError",
    "RunLookups",
    "build_all",
    "build_config",
    "build_job",
    "canonical_path",
    "config_json",
    "content_digest",
    "cpu_quota",
    "devices_env_name",
    "intersect_access",
    "is_glob",
    "is_under",
    "parse_device_string",
    "same_placement_inputs",
    "same_service_inputs",
]

OCI_VERSION = "1.0.2"
RESTART_POLICY_ANNOTATION = "org.reconciler.restartPolicy"
"""The OCI config annotation that carries a service's restartPolicy to the agent (absent:
``always``, the default)."""

CPU_PERIOD = 100_000
MIN_CPU_QUOTA = 1_000
DEFAULT_ENV = (
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "TERM=xterm",
)
KNOWN_OPTION_KEYS = frozenset({"size", "mode", "uid", "gid", "nr_inodes"})
# Per-process views of the host: a host device path may never be, or resolve through, these
# (``/dev/stdin`` -> ``/proc/self/fd/0`` is whatever the controller's stdin happens to be).
NEVER_THROUGH = ("/proc", "/dev/fd")
_MAX_ID = 2**32 - 1
_ACCESS_ORDER = "rwm"
_GLOB_CHARS = frozenset("*?[")
_HOSTNAME_RE = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
    r"(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*$"
)
_ENV_NAME_RE = re.compile(r"[^A-Za-z0-9]")

# The defaults of `runc spec` (runc 1.1), minus the terminal and with ambient capabilities left
# out (a non-root user cannot hold ambient capabilities without inheritable ones).
_CAPABILITIES = ("CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE")
_NAMESPACES = ("pid", "network", "ipc", "uts", "mount")
_MASKED_PATHS = (
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/sys/firmware",
    "/proc/scsi",
)
_READONLY_PATHS = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")
_DEFAULT_MOUNTS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("/proc", "proc", "proc", ()),
    ("/dev", "tmpfs", "tmpfs", ("nosuid", "strictatime", "mode=755", "size=65536k")),
    (
        "/dev/pts",
        "devpts",
        "devpts",
        ("nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"),
    ),
    ("/dev/shm", "tmpfs", "shm", ("nosuid", "noexec", "nodev", "mode=1777", "size=65536k")),
    ("/dev/mqueue", "mqueue", "mqueue", ("nosuid", "noexec", "nodev")),
    ("/sys", "sysfs", "sysfs", ("nosuid", "noexec", "nodev", "ro")),
    ("/sys/fs/cgroup", "cgroup", "cgroup", ("nosuid", "noexec", "nodev", "relatime", "ro")),
)
_TMP_OPTIONS = ("nosuid", "nodev", "mode=1777")
_HOSTS_OPTIONS = ("rbind", "ro")
NETNS_DIR = "/run/netns"
"""Where ``ip netns`` keeps named network namespaces (an instance's is its container id)."""

InstanceAddress = tuple[str, str]
"""An instance's (network id, address) (SPEC §17)."""


class OciError(ValueError):
    """An instance's config cannot be built; the message is one line naming instance and cause."""

    def __init__(self, instance: str, cause: str) -> None:
        super().__init__(f"{instance}: {cause}")
        self.instance = instance
        self.cause = cause


class DeviceLookupError(ValueError):
    """Raised by a :class:`DeviceLookup` when a host path cannot be expanded."""


@dataclass(frozen=True, slots=True)
class DeviceNode:
    """One character or block device found on the host.

    ``path`` is where it resolves (symlinks followed); ``found`` is where the expansion met it
    (inside the directory or glob that was expanded, symlinks not resolved), empty when that is
    ``path`` itself. The builder maps ``found`` to the container path.
    """

    path: str
    type: Literal["c", "b"]
    major: int
    minor: int
    file_mode: int  # permission bits, 0..0o777
    uid: int
    gid: int
    found: str = ""

    @property
    def where(self) -> str:
        return self.found or self.path


class GroupLookup(Protocol):
    """Group name → gid, or None when the system has no such group."""

    def __call__(self, name: str, /) -> int | None: ...


class DeviceLookup(Protocol):
    """Expands a host device path (a device, a directory, a glob) into device nodes.

    A directory is walked recursively (directory symlinks followed), a glob is expanded; only
    character and block devices are returned. Raises :class:`DeviceLookupError`.
    """

    def expand(self, host_path: str, /) -> Sequence[DeviceNode]: ...


@dataclass(frozen=True, slots=True)
class DevicePolicy:
    """Checks on top of the OCI schema (SPEC §11, last paragraph)."""

    host_roots: tuple[str, ...] = ("/dev",)  # host devices must resolve under one of these
    container_root: str = "/dev"  # container device paths live strictly below it
    protected_mounts: tuple[str, ...] = ("/proc", "/sys")  # no mount at or below these (nor /)
    option_keys: frozenset[str] = KNOWN_OPTION_KEYS  # allowed keys of key=value mount options


_DEFAULT_POLICY = DevicePolicy()


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """A resource's device string ``host[:container[:permissions]]``, parsed."""

    host: str
    container: str
    permissions: str


@dataclass(frozen=True)
class BuiltConfig:
    """A built config, kept as the bytes of its config.json (its :func:`content_digest` is
    memoized). Bytes, not the nested dicts: 20,000 configs held as dicts took about 140 MiB,
    as bytes about 70; a watcher keeps the last run's configs in its memo."""

    data: bytes  # config.json: sorted keys, two-space indent, a final newline
    hosts: str  # the content of the instance's hosts file
    _digest: str | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def of(cls, config: Mapping[str, Any], hosts: str) -> BuiltConfig:
        return cls(pretty_json(config), hosts)

    @property
    def config(self) -> dict[str, Any]:
        """config.json's content, parsed again (a new dict on every call)."""
        parsed: dict[str, Any] = json.loads(self.data)
        return parsed


# ---------------------------------------------------------------- small pure helpers


def is_glob(path: str) -> bool:
    return any(c in _GLOB_CHARS for c in path)


def is_under(path: str, root: str) -> bool:
    """``path`` is ``root`` or below it; both canonical (see :func:`canonical_path`)."""
    root = root.rstrip("/") or "/"
    return path == root or path.startswith("/" if root == "/" else root + "/")


def canonical_path(path: str) -> str:
    """The path the kernel (and runc, through Go's ``filepath.Clean``) means: ``.``, ``..``, a
    trailing ``/`` and repeated ``/`` removed, including the leading ``//`` that
    ``posixpath.normpath`` keeps (POSIX leaves it implementation-defined; Linux reads ``/``)."""
    norm = posixpath.normpath(path)
    return "/" + norm.lstrip("/") if norm.startswith("/") else norm


def _check_access(value: str, what: str) -> str:
    if not value or any(c not in _ACCESS_ORDER for c in value) or len(set(value)) != len(value):
        raise ValueError(f"invalid {what} {value!r}: use letters from 'rwm', each once")
    return value


def intersect_access(permissions: str, mode: str) -> str:
    """Letters present in both, in ``rwm`` order (``rw`` ∩ ``r`` = ``r``)."""
    return "".join(c for c in _ACCESS_ORDER if c in permissions and c in mode)


def parse_device_string(text: str) -> DeviceSpec:
    """``host[:container[:permissions]]``; the container path defaults to the host path (for a
    glob, to its literal directory prefix) and the permissions to ``rwm``."""
    parts = text.split(":")
    if len(parts) > 3:
        raise ValueError(f"device {text!r}: expected host[:container[:permissions]]")
    host = parts[0]
    if not host.startswith("/"):
        raise ValueError(f"device {text!r}: the host path must be absolute")
    container = parts[1] if len(parts) > 1 and parts[1] else ""
    if not container:
        container = _glob_base(host) if is_glob(host) else canonical_path(host)
    permissions = parts[2] if len(parts) > 2 and parts[2] else "rwm"
    _check_access(permissions, f"permissions in device {text!r}")
    return DeviceSpec(host, container, permissions)


def _glob_base(pattern: str) -> str:
    """The literal directory prefix of a glob: ``/dev/dri/render*`` → ``/dev/dri``."""
    parts = canonical_path(pattern).split("/")
    literal: list[str] = []
    for part in parts:
        if is_glob(part):
            break
        literal.append(part)
    return "/".join(literal) or "/"


def cpu_quota(dmips_limit: int, num_cores: int, max_dmips: int) -> int:
    """CFS quota for a period of 100000 µs: limit * period * cores / maxDMIPS, rounded down,
    at least 1000 and at most the runtime's int64."""
    if max_dmips <= 0:
        raise ValueError("cannot derive a cpu quota: the node's maxDMIPS is 0")
    return min(INT64_MAX, max(MIN_CPU_QUOTA, dmips_limit * CPU_PERIOD * num_cores // max_dmips))


def devices_env_name(resource: str) -> str:
    """``example.com/gpu`` → ``DEVICES_EXAMPLE_COM_GPU``."""
    return "DEVICES_" + _ENV_NAME_RE.sub("_", resource.upper())


def config_json(built: BuiltConfig) -> bytes:
    """The bytes of config.json: sorted keys, two-space indent, a final newline."""
    return built.data


def content_digest(built: BuiltConfig) -> str:
    """sha256 (hex) of the hosts file's bytes, a NUL, and config.json's bytes: what
    :mod:`reconciler.oci.writer` records per instance (computed once per :class:`BuiltConfig`,
    so a memoized build costs no serialisation)."""
    digest = built._digest
    if digest is None:
        digest = hashlib.sha256(built.hosts.encode() + b"\0" + config_json(built)).hexdigest()
        object.__setattr__(built, "_digest", digest)
    return digest


# ---------------------------------------------------------------- the draft being built


@dataclass
class _Draft:
    """Mutable working state of one build; never escapes :func:`build_config`."""

    env: list[str]
    mounts: list[dict[str, Any]]
    gids: list[int] = field(default_factory=list)
    devices: list[dict[str, Any]] = field(default_factory=list)
    rules: list[dict[str, Any]] = field(default_factory=list)  # one per entry of devices
    hosts: list[tuple[str, str]] = field(default_factory=list)
    annotations: dict[str, str] = field(default_factory=dict)

    def set_env(self, entry: str) -> None:
        name = entry.split("=", 1)[0]
        for i, existing in enumerate(self.env):
            if existing.split("=", 1)[0] == name:
                self.env[i] = entry
                return
        self.env.append(entry)

    def set_mount(self, mount: dict[str, Any]) -> None:
        for i, existing in enumerate(self.mounts):
            if existing["destination"] == mount["destination"]:
                self.mounts[i] = mount
                return
        self.mounts.append(mount)

    def add_gid(self, gid: int) -> None:
        if gid not in self.gids:
            self.gids.append(gid)

    def set_device(self, entry: dict[str, Any], rule: dict[str, Any]) -> None:
        for i, existing in enumerate(self.devices):
            if existing["path"] == entry["path"]:
                self.devices[i] = entry
                self.rules[i] = rule
                return
        self.devices.append(entry)
        self.rules.append(rule)

    def add_host(self, ip: str, hostname: str) -> None:
        if (ip, hostname) not in self.hosts:
            self.hosts.append((ip, hostname))


class _Fail(Exception):
    """Internal: a cause, turned into an OciError naming the instance by build_config."""


def _mount(destination: str, mtype: str, source: str, options: Iterable[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"destination": destination, "type": mtype, "source": source}
    opts = list(options)
    if opts:
        out["options"] = opts
    return out


# ---------------------------------------------------------------- policy checks


def _check_mount(m: Mount, origin: str, policy: DevicePolicy) -> None:
    """The destination is judged by its canonical form, the one runc mounts on: ``//proc``,
    ``/./proc``, ``/proc/`` and ``/data/../proc`` are all ``/proc``."""
    dest = m.destination
    if not dest.startswith("/"):
        raise _Fail(f"{origin}: mount destination {dest!r} is not absolute")
    canon = canonical_path(dest)
    means = "" if canon == dest else f" (it means {canon!r})"
    if canon == "/":
        raise _Fail(f"{origin}: mount destination {dest!r} is not allowed{means}: it is the root")
    for protected in policy.protected_mounts:
        if is_under(canon, protected):
            raise _Fail(
                f"{origin}: mount destination {dest!r} is not allowed{means}: "
                f"it is at or under {protected}"
            )
    if canon != dest:
        raise _Fail(f"{origin}: mount destination {dest!r} is not normalized (write {canon!r})")
    for opt in m.options:
        if "," in opt:
            raise _Fail(
                f"{origin}: mount option {opt!r} for {dest} holds ','; give one option per element"
            )
        if "=" in opt:
            key = opt.split("=", 1)[0]
            if key not in policy.option_keys:
                known = ", ".join(sorted(policy.option_keys))
                raise _Fail(
                    f"{origin}: mount option {opt!r} for {dest}: key {key!r} is not allowed "
                    f"(known keys: {known})"
                )


def _check_host_entry(h: HostEntry, origin: str) -> None:
    try:
        ipaddress.ip_address(h.ip)
    except ValueError:
        raise _Fail(f"{origin}: host entry {h.hostname!r} has an invalid ip {h.ip!r}") from None
    if not _HOSTNAME_RE.match(h.hostname):
        raise _Fail(f"{origin}: host entry has an invalid hostname {h.hostname!r}")


def _check_container_path(
    path: str, origin: str, policy: DevicePolicy, *, base: bool = False
) -> None:
    """A device's container path lies strictly below the container root; the base path of a
    directory or glob may also be the root itself (``/dev/dri/*:/dev``)."""
    root = policy.container_root.rstrip("/")
    if not path.startswith("/") or canonical_path(path) != path:
        raise _Fail(f"{origin}: container device path {path!r} is not absolute and normalized")
    if not path.startswith(root + "/") and not (base and path == root):
        raise _Fail(f"{origin}: container device path {path!r} is not under {root}/")


def _check_host_path(path: str, origin: str, policy: DevicePolicy) -> None:
    norm = canonical_path(path)
    if not path.startswith("/") or not any(is_under(norm, r) for r in policy.host_roots):
        roots = ", ".join(policy.host_roots)
        raise _Fail(f"{origin}: host device {path!r} is outside the allowed roots ({roots})")
    for never in NEVER_THROUGH:
        if is_under(norm, never):
            raise _Fail(f"{origin}: host device {path!r} is under {never}, never a device source")


# ---------------------------------------------------------------- steps


def _apply_device_string(
    draft: _Draft,
    text: str,
    mode: str,
    origin: str,
    devices: DeviceLookup,
    policy: DevicePolicy,
) -> None:
    try:
        spec = parse_device_string(text)
    except ValueError as e:
        raise _Fail(f"{origin}: {e}") from None
    _check_host_path(spec.host, f"{origin}: device {text!r}", policy)
    _check_container_path(spec.container, f"{origin}: device {text!r}", policy, base=True)
    try:
        found = devices.expand(spec.host)
    except DeviceLookupError as e:
        raise _Fail(f"{origin}: device {text!r}: {e}") from None
    access = intersect_access(spec.permissions, mode)
    host = canonical_path(spec.host)
    base = _glob_base(spec.host) if is_glob(spec.host) else host
    seen: set[str] = set()
    for node in sorted(found, key=lambda n: n.where):
        where = canonical_path(node.where)
        if where in seen:
            continue
        seen.add(where)
        what = f"{origin}: device {text!r}"
        if node.type not in ("c", "b"):
            raise _Fail(f"{what}: {node.path!r} is not a character or block device")
        numbers = (node.major, node.minor, node.uid, node.gid)
        if not all(0 <= n <= _MAX_ID for n in numbers) or not 0 <= node.file_mode <= 0o777:
            raise _Fail(f"{what}: {node.path!r} has an invalid major, minor, mode, uid or gid")
        _check_host_path(node.path, what, policy)
        _check_host_path(where, what, policy)
        rel = "." if where == host else posixpath.relpath(where, base)
        if rel == ".." or rel.startswith("../"):
            raise _Fail(f"{what}: {where!r} was found outside {base!r}")
        target = spec.container if rel == "." else posixpath.join(spec.container, rel)
        _check_container_path(target, what, policy)
        if not access:
            continue  # permissions ∩ mode is empty: the device is not exposed at all
        entry = {
            "path": target,
            "type": node.type,
            "major": node.major,
            "minor": node.minor,
            "fileMode": node.file_mode,
            "uid": node.uid,
            "gid": node.gid,
        }
        rule = {
            "allow": True,
            "type": node.type,
            "major": node.major,
            "minor": node.minor,
            "access": access,
        }
        draft.set_device(entry, rule)


def _apply_resources(
    draft: _Draft,
    service: Service,
    node: Node,
    groups: GroupLookup,
    devices: DeviceLookup,
    policy: DevicePolicy,
) -> None:
    by_name = {r.name: r for r in node.host_resources}
    for request in service.resources:
        origin = f"resource {request.name!r}"
        res = by_name.get(request.name)
        if res is None:
            raise _Fail(f"node {node.id!r} has no resource named {request.name!r}")
        for group in res.groups:
            gid = groups(group)
            if gid is None:
                raise _Fail(f"{origin}: unknown group {group!r} (not in the group database)")
            if not 0 <= gid <= _MAX_ID:
                raise _Fail(f"{origin}: group {group!r} has an invalid gid {gid}")
            draft.add_gid(gid)
        for m in res.mounts:
            _check_mount(m, origin, policy)
            draft.set_mount(_mount(m.destination, m.type, m.source, m.options))
        for env in res.envs:
            draft.set_env(env)
        for text in res.devices:
            _apply_device_string(draft, text, request.mode, origin, devices, policy)
        for h in res.hosts:
            _check_host_entry(h, origin)
            draft.add_host(h.ip, h.hostname)


def _apply_pool_devices(
    draft: _Draft,
    placement: Placement,
    node: Node,
    devices: DeviceLookup,
    policy: DevicePolicy,
) -> None:
    pools = {p.resource: p for p in node.devicePools}
    for resource, ids in placement.devices:
        pool = pools.get(resource)
        if pool is None:
            raise _Fail(f"node {node.id!r} has no device pool {resource!r}")
        by_id: dict[str, Device] = {d.id: d for d in pool.devices}
        for device_id in ids:
            dev = by_id.get(device_id)
            if dev is None:
                raise _Fail(f"device pool {resource!r} on node {node.id!r} has no {device_id!r}")
            origin = f"device {resource}/{device_id}"
            for text in dev.devices:
                _apply_device_string(draft, text, _ACCESS_ORDER, origin, devices, policy)
            for env in dev.envs:
                draft.set_env(env)
            for m in dev.mounts:
                _check_mount(m, origin, policy)
                draft.set_mount(_mount(m.destination, m.type, m.source, m.options))
            for key in sorted(dev.annotations):
                _check_annotation(key, origin)
                draft.annotations[key] = dev.annotations[key]
        draft.set_env(f"{devices_env_name(resource)}={','.join(ids)}")


_RESERVED_ANNOTATIONS = ("org.opencontainers.", "org.reconciler.")
"""Annotation key prefixes a device may not set: the OCI spec's own and the reconciler's
(``org.reconciler.restartPolicy`` is the agent's)."""


def _check_annotation(key: str, origin: str) -> None:
    for prefix in _RESERVED_ANNOTATIONS:
        if key.startswith(prefix):
            raise _Fail(f"{origin}: annotation {key!r} is reserved (keys under {prefix}*)")


def _check_final(config: Mapping[str, Any]) -> None:
    """Invariants of the finished config, whatever the steps did."""
    linux = config["linux"]
    rules = linux["resources"]["devices"]
    if rules[0] != {"allow": False, "access": "rwm"}:
        raise _Fail("the device cgroup rules do not start with deny-all")
    for rule in rules[1:]:
        if not rule.get("allow"):
            continue
        if rule.get("type") not in ("c", "b") or not all(
            isinstance(rule.get(k), int) for k in ("major", "minor")
        ):
            raise _Fail(f"device allow rule without type, major and minor: {rule}")
        if not rule.get("access"):
            raise _Fail(f"device allow rule without access: {rule}")


def build_config(
    service: Service,
    placement: Placement,
    node: Node,
    *,
    rootfs: str,
    uid: int,
    gid: int,
    hosts_path: str,
    groups: GroupLookup,
    devices: DeviceLookup,
    policy: DevicePolicy = _DEFAULT_POLICY,
    network: InstanceAddress | None = None,
) -> BuiltConfig:
    """The OCI config and hosts file of one placed instance (SPEC §11), or :class:`OciError`.

    ``network``: the instance's (network id, address) when it has a network (SPEC §17): the
    container joins the namespace ``/run/netns/<nodeId>.<instanceId>`` the node agent makes,
    its hosts file names its address, and ``resolv.conf`` beside the hosts file is bound
    read-only at ``/etc/resolv.conf``."""
    try:
        return _build_fast(
            _service_part(service),
            placement,
            node,
            rootfs,
            uid,
            gid,
            hosts_path,
            groups,
            devices,
            policy,
            network,
        )
    except _Fail as e:
        raise OciError(_label(placement), str(e)) from None


def _label(placement: Placement) -> str:
    return f"instance {placement.instance_id} ({placement.label})"


def _check_inputs(
    service: Service,
    placement: Placement,
    node: Node,
    rootfs: str,
    hosts_path: str,
    uid: int,
    gid: int,
) -> None:
    """The caller's inputs, checked before any step (both builds)."""
    if service.key != (placement.item_id, placement.subject_id):
        raise _Fail(f"service {service.id}:{service.subject} does not match the placement")
    if node.id != placement.node_id:
        raise _Fail(f"placed on node {placement.node_id!r}, not {node.id!r}")
    if not rootfs.startswith("/"):
        raise _Fail(f"rootfs {rootfs!r} is not an absolute path")
    if not hosts_path.startswith("/"):
        raise _Fail(f"hosts file path {hosts_path!r} is not absolute")
    if not 0 <= uid <= _MAX_ID:
        raise _Fail(f"uid {uid} is out of range")
    if not 0 <= gid <= _MAX_ID:
        raise _Fail(f"gid {gid} is out of range")


def _build_reference(
    service: Service,
    placement: Placement,
    node: Node,
    rootfs: str,
    uid: int,
    gid: int,
    hosts_path: str,
    groups: GroupLookup,
    devices: DeviceLookup,
    policy: DevicePolicy,
    network: InstanceAddress | None = None,
) -> BuiltConfig:
    """The build step by step in the order of SPEC §11, as docs/oci.md describes it: the
    reference that :func:`_build_fast` (what :func:`build_config` runs) must equal byte for
    byte and error for error (the tests compare them on drawn inputs). Change both together."""
    _check_inputs(service, placement, node, rootfs, hosts_path, uid, gid)

    # 1. defaults
    draft = _Draft(
        env=list(DEFAULT_ENV),
        mounts=[_mount(d, t, s, o) for d, t, s, o in _DEFAULT_MOUNTS],
    )
    # 2-4. uid/gid, root, process from the image
    image = service.image
    args = [*image.entrypoint, *image.cmd]
    if not args:
        raise _Fail("the image has neither entrypoint nor cmd: nothing to run")
    for env in image.env:
        draft.set_env(env)
    # 5. instance env
    draft.set_env(f"INSTANCE_ID={placement.instance_id}")
    draft.set_env(f"ITEM_ID={placement.item_id}")
    draft.set_env(f"SUBJECT_ID={placement.subject_id}")
    draft.set_env(f"INSTANCE_INDEX={placement.index}")
    # 6. hostname and sysctl
    hostname = service.hostname or placement.instance_id
    sysctl = {key: service.sysctl[key] for key in sorted(service.sysctl)}  # names: SysctlName
    # 7. quotas
    quotas = service.quotas
    resources: dict[str, Any] = {"devices": [{"allow": False, "access": "rwm"}]}
    rlimits: list[dict[str, Any]] = []
    if quotas.cpuDMIPSLimit is not None:
        try:
            quota = cpu_quota(quotas.cpuDMIPSLimit, node.numCores, node.maxDMIPS)
        except ValueError as e:
            raise _Fail(str(e)) from None
        resources["cpu"] = {"quota": quota, "period": CPU_PERIOD}
    if quotas.ramLimit is not None:
        resources["memory"] = {"limit": quotas.ramLimit}
    if quotas.pidsLimit is not None:
        resources["pids"] = {"limit": quotas.pidsLimit}
    if quotas.noFileLimit is not None:
        rlimits.append(
            {"type": "RLIMIT_NOFILE", "soft": quotas.noFileLimit, "hard": quotas.noFileLimit}
        )
    if quotas.tmpLimit is not None:
        options = (*_TMP_OPTIONS, f"size={quotas.tmpLimit}")
        draft.set_mount(_mount("/tmp", "tmpfs", "tmpfs", options))
    # 8. named resources, in the service's order
    _apply_resources(draft, service, node, groups, devices, policy)
    # 9. allocated pool devices, by resource
    _apply_pool_devices(draft, placement, node, devices, policy)
    # 10. hosts, bind-mounted read-only at /etc/hosts (last, so nothing shadows it)
    namespaces: list[dict[str, Any]] = [{"type": t} for t in _NAMESPACES]
    if network is None:
        lines = ["127.0.0.1 localhost", f"127.0.1.1 {hostname}"]
    else:  # SPEC §17: the instance's address under its network's name (and its hostname)
        net_id, address = network
        named = f"{address}\t{net_id}" + (f" {service.hostname}" if service.hostname else "")
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback", named]
        netns = f"{NETNS_DIR}/{placement.node_id}.{placement.instance_id}"
        namespaces = [
            {"type": t, "path": netns} if t == "network" else {"type": t} for t in _NAMESPACES
        ]
        resolv = hosts_path.rsplit("/", 1)[0] + "/resolv.conf"
        draft.set_mount(_mount("/etc/resolv.conf", "bind", resolv, _HOSTS_OPTIONS))
    lines += [f"{ip} {name}" for ip, name in draft.hosts]
    hosts = "\n".join(lines) + "\n"
    draft.set_mount(_mount("/etc/hosts", "bind", hosts_path, _HOSTS_OPTIONS))

    user: dict[str, Any] = {"uid": uid, "gid": gid}
    if draft.gids:
        user["additionalGids"] = list(draft.gids)
    caps = list(_CAPABILITIES)
    process: dict[str, Any] = {
        "terminal": False,
        "user": user,
        "args": args,
        "env": list(draft.env),
        "cwd": image.workingDir,
        "capabilities": {"bounding": caps, "effective": caps[:], "permitted": caps[:]},
        "noNewPrivileges": True,
    }
    if rlimits:
        process["rlimits"] = rlimits
    resources["devices"] += draft.rules
    linux: dict[str, Any] = {
        "resources": resources,
        "namespaces": namespaces,
        "maskedPaths": list(_MASKED_PATHS),
        "readonlyPaths": list(_READONLY_PATHS),
    }
    if draft.devices:
        linux["devices"] = list(draft.devices)
    if sysctl:
        linux["sysctl"] = sysctl
    config: dict[str, Any] = {
        "ociVersion": OCI_VERSION,
        "process": process,
        "root": {"path": rootfs, "readonly": False},
        "hostname": hostname,
        "mounts": list(draft.mounts),
        "linux": linux,
    }
    annotations = dict(sorted(draft.annotations.items()))  # the allocated devices'
    if service.restartPolicy != "always":  # for the node agent (absent: the default)
        annotations[RESTART_POLICY_ANNOTATION] = service.restartPolicy
    if annotations:
        config["annotations"] = annotations
    _check_final(config)
    return BuiltConfig.of(config, hosts)


# ---------------------------------------------------------------- the fast build
#
# Most of a config depends on the service only: its part is computed once per service object
# (per build_all call, see RunLookups.part) and each instance copies it and fills in the rest.
# An instance with no named resource and whose pool devices (if any) give it nothing but their
# ids (most) is not even built as a dict: its service's config.json is serialized once with a
# marker in place of each value of the instance (a _Template), and each instance's bytes are
# the template with its values. The shared lists and dicts below and in a _ServicePart go into
# many configs' dicts, which are only serialized: never mutate them.

_INSTANCE_ENV = ("INSTANCE_ID", "ITEM_ID", "SUBJECT_ID", "INSTANCE_INDEX")
_DENY_ALL: dict[str, Any] = {"allow": False, "access": "rwm"}
_SHARED_CAPS = list(_CAPABILITIES)
_SHARED_CAPABILITIES = {
    "bounding": _SHARED_CAPS,
    "effective": _SHARED_CAPS,
    "permitted": _SHARED_CAPS,
}
_SHARED_NAMESPACES: list[dict[str, Any]] = [{"type": t} for t in _NAMESPACES]
_SHARED_MASKED = list(_MASKED_PATHS)
_SHARED_READONLY = list(_READONLY_PATHS)
_SHARED_MOUNTS = [_mount(d, t, s, o) for d, t, s, o in _DEFAULT_MOUNTS]


def _env_name(entry: str) -> str:
    return entry.split("=", 1)[0]


def _put_mount(mounts: list[dict[str, Any]], mount: dict[str, Any]) -> None:
    """:meth:`_Draft.set_mount` on a list."""
    destination = mount["destination"]
    for i, existing in enumerate(mounts):
        if existing["destination"] == destination:
            mounts[i] = mount
            return
    mounts.append(mount)


class _IndexedDraft(_Draft):
    """A :class:`_Draft` whose env is found by name through an index (name -> position)."""

    def __init__(
        self, env: list[str], env_at: dict[str, int], mounts: list[dict[str, Any]]
    ) -> None:
        super().__init__(env, mounts)
        self.env_at = env_at

    def set_env(self, entry: str) -> None:
        name = _env_name(entry)
        at = self.env_at.get(name)
        if at is None:
            self.env_at[name] = len(self.env)
            self.env.append(entry)
        else:
            self.env[at] = entry


# A template's markers: a string of NUL (which no string of a document holds), one letter and
# NUL in place of each value of the instance (a number too: the marker's quotes go with it).
_MARK_ID, _MARK_INDEX, _MARK_HOSTNAME = "\0e\0", "\0x\0", "\0i\0"
_MARK_ROOTFS, _MARK_HOSTS, _MARK_RESOLV, _MARK_NETNS = "\0r\0", "\0h\0", "\0d\0", "\0p\0"
_MARK_UID, _MARK_GID, _MARK_QUOTA = "\0U\0", "\0G\0", "\0Q\0"
_MARK_POOLS = tuple(f"\0{k}\0" for k in range(10))  # the pool devices' env entries, in order
_MARKER_RE = re.compile(rb'"\\u0000([exirhdpUGQ0-9])\\u0000"')
_NUL = b"\\u0000"  # how a NUL is written in JSON
_FORMAT_KEYS = {c: b"%(" + c + b")b" for c in (b"%c" % c for c in b"exirhdpUGQ0123456789")}

_Template = bytes
"""A service's config.json with ``%(c)b`` in place of each value of the instance (``c``: the
letter or digit of its marker) and every other ``%`` doubled: ``template % values`` is an
instance's."""
_NO_TEMPLATE = b""  # (not made yet)


@dataclass(slots=True)
class _ServicePart:
    """What a config takes from its service alone: steps 1-7 of :func:`_build_reference` but
    for the instance env's values and the cpu quota (which needs the node). Never changed once
    made, but for its templates (its lists and dicts are shared: copy them to change them)."""

    service: Service  # (kept: a part is found by the id of its service)
    nothing_to_run: bool
    args: list[str]
    env: list[str]  # defaults, the image's, then the instance env's names (values filled in)
    env_at: dict[str, int]  # env: name -> position
    slots: tuple[int, int, int, int]  # env: the positions of _INSTANCE_ENV
    mounts: list[dict[str, Any]]  # the defaults and /tmp
    cpu_limit: int | None
    limits: dict[str, Any]  # linux.resources' memory and pids
    rlimits: list[dict[str, Any]]
    sysctl: dict[str, str]
    restart: str | None  # the restartPolicy annotation's value
    templated: bool  # instances are built from templates (worth it for a few instances or more)
    templates: dict[tuple[bool, tuple[str, ...]], _Template | None] = field(
        default_factory=dict
    )  # by (networked, the resources of the pool devices)

    def instance_env(self, instance_id: str, index: object) -> list[str]:
        env = self.env.copy()
        slot_id, slot_item, slot_subject, slot_index = self.slots
        env[slot_id] = f"INSTANCE_ID={instance_id}"
        env[slot_item] = f"ITEM_ID={self.service.id}"
        env[slot_subject] = f"SUBJECT_ID={self.service.subject}"
        env[slot_index] = f"INSTANCE_INDEX={index}"
        return env

    def template(self, networked: bool, pools: tuple[str, ...]) -> _Template | None:
        """The template of an instance without named resources, whose pool devices are of
        the resources ``pools`` and give it nothing but their ids (None when the service's own
        strings hold what looks like a marker: such are built as dicts)."""
        key = (networked, pools)
        template = self.templates.get(key, _NO_TEMPLATE)
        if template is _NO_TEMPLATE:
            template = self.templates[key] = _template(self, networked, pools)
        return template


def _env_of(image_env: Sequence[str]) -> tuple[list[str], dict[str, int]]:
    """The env (and its index) after the defaults, the image's and the instance env's names."""
    env = list(DEFAULT_ENV)
    env_at = {_env_name(e): i for i, e in enumerate(env)}
    for entry in (*image_env, *(f"{name}=" for name in _INSTANCE_ENV)):
        name = _env_name(entry)
        at = env_at.get(name)
        if at is None:
            env_at[name] = len(env)
            env.append(entry)
        else:
            env[at] = entry
    return env, env_at


_PLAIN_ENV = _env_of(())  # (an image without env: most; copied)


def _service_part(service: Service, templated: bool = False) -> _ServicePart:
    image = service.image
    args = [*image.entrypoint, *image.cmd]
    env, env_at = _env_of(image.env) if image.env else _PLAIN_ENV
    slots = (
        env_at["INSTANCE_ID"],
        env_at["ITEM_ID"],
        env_at["SUBJECT_ID"],
        env_at["INSTANCE_INDEX"],
    )
    quotas = service.quotas
    limits: dict[str, Any] = {}
    if quotas.ramLimit is not None:
        limits["memory"] = {"limit": quotas.ramLimit}
    if quotas.pidsLimit is not None:
        limits["pids"] = {"limit": quotas.pidsLimit}
    rlimits: list[dict[str, Any]] = []
    if quotas.noFileLimit is not None:
        rlimits.append(
            {"type": "RLIMIT_NOFILE", "soft": quotas.noFileLimit, "hard": quotas.noFileLimit}
        )
    mounts = _SHARED_MOUNTS.copy()
    if quotas.tmpLimit is not None:
        options = (*_TMP_OPTIONS, f"size={quotas.tmpLimit}")
        _put_mount(mounts, _mount("/tmp", "tmpfs", "tmpfs", options))
    restart = service.restartPolicy
    return _ServicePart(
        service=service,
        nothing_to_run=not args,
        args=args,
        env=env,
        env_at=env_at,
        slots=slots,
        mounts=mounts,
        cpu_limit=quotas.cpuDMIPSLimit,
        limits=limits,
        rlimits=rlimits,
        sysctl={key: service.sysctl[key] for key in sorted(service.sysctl)},
        restart=None if restart == "always" else restart,
        templated=templated,
    )


def _netns(node_id: str, instance_id: str) -> str:
    return f"{NETNS_DIR}/{node_id}.{instance_id}"


def _resolv(hosts_path: str) -> str:
    return hosts_path.rsplit("/", 1)[0] + "/resolv.conf"


def _hosts(service: Service, hostname: str, network: InstanceAddress | None) -> str:
    """The hosts file but for the named resources' entries."""
    if network is None:
        return f"127.0.0.1 localhost\n127.0.1.1 {hostname}\n"
    net_id, address = network
    named = f"{address}\t{net_id}" + (f" {service.hostname}" if service.hostname else "")
    return f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{named}\n"


def _assemble(
    part: _ServicePart,
    *,
    env: list[str],
    hostname: str,
    quota: object,
    mounts: list[dict[str, Any]],
    netns: str | None,
    rootfs: str,
    uid: object,
    gid: object,
    gids: list[int],
    devices: list[dict[str, Any]],
    rules: list[dict[str, Any]],
    annotations: dict[str, str],
) -> dict[str, Any]:
    """The config of :func:`_build_reference` from its pieces (``mounts``: /etc/hosts and
    /etc/resolv.conf included; ``quota``: None without a cpu limit)."""
    user: dict[str, Any] = {"uid": uid, "gid": gid}
    if gids:
        user["additionalGids"] = gids
    process: dict[str, Any] = {
        "terminal": False,
        "user": user,
        "args": part.args,
        "env": env,
        "cwd": part.service.image.workingDir,
        "capabilities": _SHARED_CAPABILITIES,
        "noNewPrivileges": True,
    }
    if part.rlimits:
        process["rlimits"] = part.rlimits
    resources: dict[str, Any] = {"devices": [_DENY_ALL, *rules]}
    if quota is not None:
        resources["cpu"] = {"quota": quota, "period": CPU_PERIOD}
    if part.limits:
        resources.update(part.limits)
    namespaces = _SHARED_NAMESPACES
    if netns is not None:
        namespaces = [
            {"type": t, "path": netns} if t == "network" else {"type": t} for t in _NAMESPACES
        ]
    linux: dict[str, Any] = {
        "resources": resources,
        "namespaces": namespaces,
        "maskedPaths": _SHARED_MASKED,
        "readonlyPaths": _SHARED_READONLY,
    }
    if devices:
        linux["devices"] = devices
    if part.sysctl:
        linux["sysctl"] = part.sysctl
    config: dict[str, Any] = {
        "ociVersion": OCI_VERSION,
        "process": process,
        "root": {"path": rootfs, "readonly": False},
        "hostname": hostname,
        "mounts": mounts,
        "linux": linux,
    }
    if part.restart is not None:
        annotations[RESTART_POLICY_ANNOTATION] = part.restart
    if annotations:
        config["annotations"] = annotations
    return config


def _template(part: _ServicePart, networked: bool, pools: tuple[str, ...]) -> _Template | None:
    service = part.service
    mounts = part.mounts.copy()
    if networked:
        _put_mount(mounts, _mount("/etc/resolv.conf", "bind", _MARK_RESOLV, _HOSTS_OPTIONS))
    _put_mount(mounts, _mount("/etc/hosts", "bind", _MARK_HOSTS, _HOSTS_OPTIONS))
    env = part.env.copy()
    slot_id, slot_item, slot_subject, slot_index = part.slots
    env[slot_id] = _MARK_ID
    env[slot_item] = f"ITEM_ID={service.id}"  # (the placement's: build checks they are equal)
    env[slot_subject] = f"SUBJECT_ID={service.subject}"
    env[slot_index] = _MARK_INDEX
    env_at = part.env_at.copy()
    for resource, mark in zip(pools, _MARK_POOLS, strict=False):  # as _apply_pool_devices
        name = devices_env_name(resource)  # sets them: each replaces an entry of its name
        at = env_at.get(name)
        if at is None:
            env_at[name] = len(env)
            env.append(mark)
        else:
            env[at] = mark
    config = _assemble(
        part,
        env=env,
        hostname=service.hostname or _MARK_HOSTNAME,
        quota=None if part.cpu_limit is None else _MARK_QUOTA,
        mounts=mounts,
        netns=_MARK_NETNS if networked else None,
        rootfs=_MARK_ROOTFS,
        uid=_MARK_UID,
        gid=_MARK_GID,
        gids=[],
        devices=[],
        rules=[],
        annotations={},
    )
    data = pretty_json(config)
    cut = _MARKER_RE.split(data.replace(b"%", b"%%"))  # literal, letter, literal, ...
    # every NUL written is a marker's (else a string of the service holds one: no template)
    if data.count(_NUL) != len(cut) - 1:
        return None
    cut[1::2] = [_FORMAT_KEYS[letter] for letter in cut[1::2]]
    return b"".join(cut)


def _fill(
    template: _Template,
    placement: Placement,
    quota: int | None,
    rootfs: str,
    uid: int,
    gid: int,
    hosts_path: str,
    network: InstanceAddress | None,
    pool_env: list[bytes],
) -> bytes:
    """An instance's config.json from its service's template (``pool_env``: the env entries
    of its pool devices, see :func:`_bare_pools`)."""
    instance_id = placement.instance_id
    dumps = orjson.dumps
    values = {
        b"e": dumps(f"INSTANCE_ID={instance_id}"),
        b"x": dumps(f"INSTANCE_INDEX={placement.index}"),
        b"i": dumps(instance_id),
        b"r": dumps(rootfs),
        b"h": dumps(hosts_path),
        b"U": dumps(uid),
        b"G": dumps(gid),
    }
    if quota is not None:
        values[b"Q"] = dumps(quota)
    if network is not None:
        values[b"d"] = dumps(_resolv(hosts_path))
        values[b"p"] = dumps(_netns(placement.node_id, instance_id))
    values.update(zip(_FORMAT_DIGITS, pool_env, strict=False))
    return template % values


_FORMAT_DIGITS = tuple(b"%d" % k for k in range(10))


def _bare_pools(placement: Placement, node: Node) -> list[bytes] | None:
    """The env entries (as JSON) an instance's pool devices set, by resource, when they give it
    nothing else (no device, env, mount or annotation); None when one does, or is not on the
    node (what :func:`_apply_pool_devices` does or says then), or when the instance has more
    pool devices' resources than a template has markers."""
    if len(placement.devices) > len(_MARK_POOLS):
        return None
    pools = {p.resource: p for p in node.devicePools}
    out = []
    for resource, ids in placement.devices:
        pool = pools.get(resource)
        if pool is None:
            return None
        by_id = {d.id: d for d in pool.devices}
        for device_id in ids:
            dev = by_id.get(device_id)
            if dev is None or dev.devices or dev.envs or dev.mounts or dev.annotations:
                return None
        out.append(orjson.dumps(f"{devices_env_name(resource)}={','.join(ids)}"))
    return out


def _build_fast(
    part: _ServicePart,
    placement: Placement,
    node: Node,
    rootfs: str,
    uid: int,
    gid: int,
    hosts_path: str,
    groups: GroupLookup,
    devices: DeviceLookup,
    policy: DevicePolicy,
    network: InstanceAddress | None,
) -> BuiltConfig:
    """:func:`_build_reference` from the service's part: the same bytes, the same errors."""
    service = part.service
    _check_inputs(service, placement, node, rootfs, hosts_path, uid, gid)
    if part.nothing_to_run:
        raise _Fail("the image has neither entrypoint nor cmd: nothing to run")
    quota: int | None = None
    if part.cpu_limit is not None:
        try:
            quota = cpu_quota(part.cpu_limit, node.numCores, node.maxDMIPS)
        except ValueError as e:
            raise _Fail(str(e)) from None
    hostname = service.hostname or placement.instance_id
    hosts = _hosts(service, hostname, network)
    if part.templated and not service.resources:
        pool_env = _bare_pools(placement, node) if placement.devices else []
        if pool_env is not None:
            pools = tuple(resource for resource, _ in placement.devices)
            template = part.template(network is not None, pools)
            if template is not None:
                data = _fill(
                    template, placement, quota, rootfs, uid, gid, hosts_path, network, pool_env
                )
                return BuiltConfig(data, hosts)
    env = part.instance_env(placement.instance_id, placement.index)
    mounts = part.mounts.copy()
    gids: list[int] = []
    devs: list[dict[str, Any]] = []
    rules: list[dict[str, Any]] = []
    annotations: dict[str, str] = {}
    if service.resources or placement.devices:
        draft = _IndexedDraft(env, part.env_at.copy(), mounts)
        if service.resources:
            _apply_resources(draft, service, node, groups, devices, policy)
        if placement.devices:
            _apply_pool_devices(draft, placement, node, devices, policy)
        gids, devs, rules = draft.gids, draft.devices, draft.rules
        annotations = dict(sorted(draft.annotations.items()))
        hosts += "".join(f"{ip} {name}\n" for ip, name in draft.hosts)
    netns = None
    if network is not None:
        netns = _netns(placement.node_id, placement.instance_id)
        resolv = _resolv(hosts_path)
        _put_mount(mounts, _mount("/etc/resolv.conf", "bind", resolv, _HOSTS_OPTIONS))
    _put_mount(mounts, _mount("/etc/hosts", "bind", hosts_path, _HOSTS_OPTIONS))
    config = _assemble(
        part,
        env=env,
        hostname=hostname,
        quota=quota,
        mounts=mounts,
        netns=netns,
        rootfs=rootfs,
        uid=uid,
        gid=gid,
        gids=gids,
        devices=devs,
        rules=rules,
        annotations=annotations,
    )
    if rules:  # (without an allow rule, nothing the final check reads can be wrong)
        _check_final(config)
    return BuiltConfig.of(config, hosts)


# ---------------------------------------------------------------- many instances


@dataclass(frozen=True, slots=True)
class ConfigJob:
    """The inputs of one :func:`build_config` call besides the lookups and the policy."""

    service: Service
    placement: Placement
    node: Node
    rootfs: str
    uid: int
    gid: int
    hosts_path: str
    network: InstanceAddress | None = None


@dataclass(frozen=True)
class BuildResult:
    built: dict[str, BuiltConfig]  # instance id → config, for every job that succeeded
    errors: dict[str, str]  # instance id → the one-line OciError message
    # (both in the order of the jobs given: instance order from ``reconcile``)
    since: tuple[Mapping[str, BuiltConfig], frozenset[str]] | None = field(
        default=None, compare=False, repr=False
    )
    """Set by a builder that patched its last result: that result's ``built`` and a superset
    of the ids whose entry is not the very same object in both (built, rebuilt or removed
    since); the configs writer then looks at those only."""


class RunLookups:
    """The host lookups of one :func:`build_all` call: each distinct question (a group name, a
    device path) is asked of the host once per call, and every answer a build used is recorded,
    so that a memoized build can be checked against this call's answers.

    It also keeps, for the call, the part of a config that depends on the service alone,
    computed once per service object (:meth:`part`): a pure function of the (frozen) service.
    ``jobs``: the call's jobs, when known: a service with a few of them or more gets a template
    of its configs (more work once, less per instance); unknown: every service does."""

    def __init__(
        self, groups: GroupLookup, devices: DeviceLookup, jobs: Sequence[ConfigJob] | None = None
    ) -> None:
        self._groups = groups
        self._devices = devices
        self._gids: dict[str, int | None] = {}
        self._nodes: dict[str, tuple[DeviceNode, ...] | str] = {}  # str: the lookup's error
        self._parts: dict[int, _ServicePart] = {}  # id of the service (the part holds it)
        self._jobs = jobs
        self._per_service: Counter[int] | None = None  # jobs per id of a service (held by them)
        self.asked: list[Asked] = []

    def part(self, service: Service) -> _ServicePart:
        part = self._parts.get(id(service))
        if part is None or part.service is not service:
            templated = True
            if self._jobs is not None:
                if self._per_service is None:  # (counted once a build needs it)
                    self._per_service = Counter(map(id, map(_SERVICE, self._jobs)))
                templated = self._per_service[id(service)] >= _TEMPLATED_FROM
            part = self._parts[id(service)] = _service_part(service, templated)
        return part

    def gid(self, name: str) -> int | None:
        if name not in self._gids:
            self._gids[name] = self._groups(name)
        return self._gids[name]

    def nodes(self, host_path: str) -> tuple[DeviceNode, ...] | str:
        answer = self._nodes.get(host_path)
        if answer is None:
            try:
                answer = tuple(self._devices.expand(host_path))
            except DeviceLookupError as e:
                answer = str(e)
            self._nodes[host_path] = answer
        return answer

    def answer(self, asked: Asked) -> object:
        kind, key, _ = asked
        return self.gid(key) if kind == "group" else self.nodes(key)

    # the GroupLookup and DeviceLookup a build is given

    def group(self, name: str, /) -> int | None:
        gid = self.gid(name)
        self.asked.append(("group", name, gid))
        return gid

    def expand(self, host_path: str, /) -> Sequence[DeviceNode]:
        answer = self.nodes(host_path)
        self.asked.append(("device", host_path, answer))
        if isinstance(answer, str):
            raise DeviceLookupError(answer)
        return answer


_SERVICE = attrgetter("service")
_TEMPLATED_FROM = 4
"""The jobs of a service in a call from which its instances are built from a template (measured
on 20,000 instances: with 4 per service, as fast as without; with 7, 25 % faster; with 1, 2 and
3, slower)."""

Asked = tuple[Literal["group", "device"], str, object]
"""A host lookup a build made: (kind, group name or host device path, the answer)."""


SERVICE_FIELDS_NOT_BUILT = frozenset(
    {"instances", "priority", "labels", "nodeId", "balancingPolicy"}
)
"""The fields of a service that :func:`build_config` never reads: where and how many instances
are placed (a test checks the build reads none of them)."""


def same_service_inputs(a: Service, b: Service) -> bool:
    """Whether two services are the same input to :func:`build_config`: equal but for
    :data:`SERVICE_FIELDS_NOT_BUILT` (an edit of a service's instance count or priority
    changes none of its instances' configs)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    mine, theirs = a.__dict__, b.__dict__
    if mine.keys() != theirs.keys():
        return False
    return all(
        mine[k] is theirs[k] or mine[k] == theirs[k]
        for k in mine
        if k not in SERVICE_FIELDS_NOT_BUILT
    )


def same_placement_inputs(a: Placement, b: Placement) -> bool:
    """Whether two placements are the same input to :func:`build_config`, which reads only
    these fields of a placement (its version, priority, runtime id, requested amounts, named
    resources and cause are not in the config; tests check the fields it reads)."""
    return a is b or (
        a.instance_id == b.instance_id
        and a.node_id == b.node_id
        and a.index == b.index
        and a.item_id == b.item_id
        and a.subject_id == b.subject_id
        and a.devices == b.devices
    )


def build_job(job: ConfigJob, lookups: RunLookups, policy: DevicePolicy) -> BuiltConfig | str:
    """One job's config, or its one-line error (an :class:`OciError`'s message). The host
    lookups it makes are recorded in ``lookups.asked`` (emptied first)."""
    lookups.asked = []
    placement = job.placement
    try:  # (build_config, with the service's part of this call)
        return _build_fast(
            lookups.part(job.service),
            placement,
            job.node,
            job.rootfs,
            job.uid,
            job.gid,
            job.hosts_path,
            lookups.group,
            lookups,
            policy,
            job.network,
        )
    except _Fail as e:
        return str(OciError(_label(placement), str(e)))


def build_all(
    jobs: Iterable[ConfigJob],
    *,
    groups: GroupLookup,
    devices: DeviceLookup,
    policy: DevicePolicy = _DEFAULT_POLICY,
) -> BuildResult:
    """Build every job; one instance's failure never stops the others (SPEC §11). Each
    distinct group name and host device path is looked up once per call (all instances see the
    same answers). This is the reference: a watcher builds through
    :class:`reconciler.accel.build.BuildMemo`, which gives the same result and reuses the last
    call's builds whose inputs and host answers are unchanged."""
    todo = list(jobs)
    lookups = RunLookups(groups, devices, todo)
    built: dict[str, BuiltConfig] = {}
    errors: dict[str, str] = {}
    for job in todo:
        outcome = build_job(job, lookups, policy)
        if isinstance(outcome, str):
            errors[job.placement.instance_id] = outcome
        else:
            built[job.placement.instance_id] = outcome
    return BuildResult(built, errors)
