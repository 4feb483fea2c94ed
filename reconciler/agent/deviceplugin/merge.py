"""Merging a device plugin's ``Allocate`` answer into a container's OCI config.

The answer's ``envs`` replace variables of the same name in ``process.env``; its ``mounts``
become bind mounts (``ro`` when ``read_only``), replacing a mount with the same destination;
each of its ``devices`` becomes a ``linux.devices`` entry at ``container_path`` (type, major and
minor from the real host device, which must lie under ``/dev``) with an allow rule of exactly
that device and the ``permissions`` (default ``rwm``); its ``annotations`` go to the config's
``annotations``. The same checks as the controller's configs apply: container device paths
absolute under ``/dev/``, mount destinations absolute and never ``/``, ``/proc`` or ``/sys``.
"""

from __future__ import annotations

import copy
import os
import posixpath
import stat
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from reconciler.oci.builder import DeviceLookupError
from reconciler.oci.hostdevices import HostDevices

__all__ = ["AllocateAnswer", "DeviceInfo", "MergeError", "host_device_info", "merge_allocation"]

DeviceInfo = tuple[str, int, int, int, int, int]
"""A host device: (type ``c`` or ``b``, major, minor, file mode, uid, gid)."""

_FORBIDDEN_DESTINATIONS = ("/", "/proc", "/sys")


class MergeError(ValueError):
    """The answer cannot go into the config (a bad path, a host path that is no device)."""


class _Mount(Protocol):
    container_path: str
    host_path: str
    read_only: bool


class _DeviceSpec(Protocol):
    container_path: str
    host_path: str
    permissions: str


class AllocateAnswer(Protocol):
    """What is read of a ``ContainerAllocateResponse``."""

    @property
    def envs(self) -> Mapping[str, str]: ...
    @property
    def mounts(self) -> Sequence[_Mount]: ...
    @property
    def devices(self) -> Sequence[_DeviceSpec]: ...
    @property
    def annotations(self) -> Mapping[str, str]: ...


def host_device_info(path: str) -> DeviceInfo:
    """The real device at ``path`` (confined to ``/dev``, symlinks checked hop by hop)."""
    try:
        _real, st = HostDevices().resolve(path)
    except DeviceLookupError as e:
        raise MergeError(str(e)) from None
    if stat.S_ISCHR(st.st_mode):
        kind = "c"
    elif stat.S_ISBLK(st.st_mode):
        kind = "b"
    else:
        raise MergeError(f"{path!r} is not a character or block device")
    return (
        kind,
        os.major(st.st_rdev),
        os.minor(st.st_rdev),
        stat.S_IMODE(st.st_mode),
        st.st_uid,
        st.st_gid,
    )


def _absolute(path: str, what: str) -> str:
    if not path.startswith("/") or posixpath.normpath(path) != path.rstrip("/") or "\0" in path:
        raise MergeError(f"{what} {path!r} is not an absolute, normalized path")
    return path


def merge_allocation(
    config: Mapping[str, Any],
    answer: AllocateAnswer,
    lookup: Callable[[str], DeviceInfo] = host_device_info,
) -> dict[str, Any]:
    """A copy of ``config`` with ``answer`` merged in (see the module docstring)."""
    out: dict[str, Any] = copy.deepcopy(dict(config))
    process = out.setdefault("process", {})
    env: list[str] = list(process.get("env", []))
    for name, value in sorted(answer.envs.items()):
        if not name or "=" in name or "\0" in name or "\0" in value:
            raise MergeError(f"invalid environment variable name {name!r}")
        env = [e for e in env if e.split("=", 1)[0] != name]
        env.append(f"{name}={value}")
    process["env"] = env

    mounts: list[dict[str, Any]] = list(out.get("mounts", []))
    for m in answer.mounts:
        dest = _absolute(m.container_path, "mount destination")
        if dest in _FORBIDDEN_DESTINATIONS:
            raise MergeError(f"mount destination {dest!r} is not allowed")
        source = _absolute(m.host_path, "mount source")
        mounts = [x for x in mounts if x.get("destination") != dest]
        options = ["rbind", "ro" if m.read_only else "rw"]
        mounts.append({"destination": dest, "type": "bind", "source": source, "options": options})
    out["mounts"] = mounts

    linux = out.setdefault("linux", {})
    devices: list[dict[str, Any]] = list(linux.get("devices", []))
    resources = linux.setdefault("resources", {})
    rules: list[dict[str, Any]] = list(resources.get("devices", []))
    for d in answer.devices:
        dest = _absolute(d.container_path, "container device path")
        if not dest.startswith("/dev/"):
            raise MergeError(f"container device path {dest!r} is not under /dev/")
        access = d.permissions or "rwm"
        if not access or any(c not in "rwm" for c in access):
            raise MergeError(f"device permissions {access!r} are not a subset of 'rwm'")
        kind, major, minor, mode, uid, gid = lookup(_absolute(d.host_path, "host device path"))
        devices = [x for x in devices if x.get("path") != dest]
        devices.append(
            {
                "path": dest,
                "type": kind,
                "major": major,
                "minor": minor,
                "fileMode": mode,
                "uid": uid,
                "gid": gid,
            }
        )
        rules.append(
            {"allow": True, "type": kind, "major": major, "minor": minor, "access": access}
        )
    linux["devices"] = devices
    resources["devices"] = rules

    if answer.annotations:
        annotations = dict(out.get("annotations", {}))
        annotations.update(sorted(answer.annotations.items()))
        out["annotations"] = annotations
    return out
