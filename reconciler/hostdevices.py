"""The shell side of the OCI builder: real group and device lookups (SPEC §11).

:class:`SystemGroups` reads the system group database; :class:`HostDevices` expands a resource's
host device path into the character and block devices it names:

- a device (or a symlink to one) gives that device;
- a directory (or a symlink to one) is walked recursively, following directory symlinks, each
  directory visited once (so a symlink loop ends);
- a glob pattern (``*``, ``?``, ``[``) is expanded and each match treated as above.

Everything resolves through symlinks and must land under the allow-list (default ``/dev``): a path
given literally that resolves outside it is refused with :class:`DeviceLookupError`; an entry met
during a walk or a glob that resolves outside it (``/dev/fd`` → ``/proc/self/fd``) is skipped.
A literal path that does not exist, or is neither a device nor a directory, is an error; a glob
that matches nothing or a directory without devices gives no devices.
"""

from __future__ import annotations

import glob
import grp
import os
import posixpath
import stat
from collections.abc import Sequence

from .oci import DeviceLookupError, DeviceNode, is_glob

__all__ = ["HostDevices", "SystemGroups"]


class SystemGroups:
    """Group name → gid through the system group database (``getgrnam``)."""

    def __call__(self, name: str, /) -> int | None:
        try:
            return grp.getgrnam(name).gr_gid
        except (KeyError, ValueError):  # ValueError: a name holding NUL
            return None


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


class HostDevices:
    """Device lookup over the real filesystem, confined to ``allowed_roots``."""

    def __init__(self, allowed_roots: Sequence[str] = ("/dev",), *, max_devices: int = 4096):
        if not allowed_roots:
            raise ValueError("HostDevices needs at least one allowed root")
        self.allowed_roots = tuple(os.path.realpath(r) for r in allowed_roots)
        self.max_devices = max_devices

    def _allowed(self, real: str) -> bool:
        return any(_under(real, r) for r in self.allowed_roots)

    def expand(self, host_path: str, /) -> list[DeviceNode]:
        if not host_path.startswith("/"):
            raise DeviceLookupError(f"{host_path!r} is not an absolute path")
        if "\0" in host_path:
            raise DeviceLookupError("a device path may not hold NUL")
        found: dict[str, DeviceNode] = {}
        if is_glob(host_path):
            for match in sorted(glob.glob(posixpath.normpath(host_path))):
                self._collect(match, found, literal=False)
        else:
            self._collect(posixpath.normpath(host_path), found, literal=True)
        return [found[k] for k in sorted(found)]

    def _collect(self, path: str, found: dict[str, DeviceNode], *, literal: bool) -> None:
        real = os.path.realpath(path)
        if not self._allowed(real):
            if literal:
                raise DeviceLookupError(
                    f"{path!r} resolves to {real!r}, outside {', '.join(self.allowed_roots)}"
                )
            return
        try:
            st = os.stat(real)
        except OSError as e:
            if literal:
                raise DeviceLookupError(f"{path!r}: {e.strerror or e}") from None
            return
        if stat.S_ISDIR(st.st_mode):
            self._walk(path, real, found, {(st.st_dev, st.st_ino)})
        elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            self._add(path, real, st, found)
        elif literal:
            raise DeviceLookupError(f"{path!r} is neither a device nor a directory")

    def _walk(
        self,
        found_dir: str,
        real_dir: str,
        found: dict[str, DeviceNode],
        visited: set[tuple[int, int]],
    ) -> None:
        try:
            with os.scandir(real_dir) as it:
                names = sorted(e.name for e in it)
        except OSError:
            return
        for name in names:
            where = posixpath.join(found_dir, name)
            real = os.path.realpath(posixpath.join(real_dir, name))
            if not self._allowed(real):
                continue
            try:
                st = os.stat(real)
            except OSError:
                continue  # vanished, or a dangling symlink
            if stat.S_ISDIR(st.st_mode):
                key = (st.st_dev, st.st_ino)
                if key not in visited:
                    visited.add(key)
                    self._walk(where, real, found, visited)
            elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                self._add(where, real, st, found)

    def _add(self, where: str, real: str, st: os.stat_result, found: dict[str, DeviceNode]) -> None:
        if where in found:
            return
        if len(found) >= self.max_devices:
            raise DeviceLookupError(f"more than {self.max_devices} devices found; refusing")
        found[where] = DeviceNode(
            path=real,
            type="c" if stat.S_ISCHR(st.st_mode) else "b",
            major=os.major(st.st_rdev),
            minor=os.minor(st.st_rdev),
            file_mode=st.st_mode & 0o777,
            uid=st.st_uid,
            gid=st.st_gid,
            found=where,
        )
