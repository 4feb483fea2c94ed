"""The shell side of the OCI builder: real group and device lookups (SPEC §11).

:class:`SystemGroups` reads the system group database; :class:`HostDevices` expands a resource's
host device path into the character and block devices it names:

- a device (or a symlink to one) gives that device;
- a directory (or a symlink to one) is walked recursively, following directory symlinks, each
  directory visited once (so a symlink loop ends);
- a glob pattern (``*``, ``?``, ``[``) is expanded and each match treated as above.

Symlinks are resolved here, one hop at a time, never by the kernel's own resolution (which
would follow ``/proc``'s per-process links: ``/dev/stdin`` -> ``/proc/self/fd/0`` is the
controller's own terminal, ``/dev/null`` or a pipe, depending on how it was started). The path
(made canonical) must lie under the allow-list (default ``/dev``), and so must every step of
the resolution: a symlink whose target leaves it, or any step into ``/proc`` or ``/dev/fd``, is
refused. The allowed roots themselves are trusted configuration and resolved once. A path
given literally that is refused raises :class:`DeviceLookupError`; an entry met during a walk
or a glob that is refused is skipped. A literal path that does not exist, or is neither a device
nor a directory, is an error; a glob that matches nothing or a directory without devices gives
no devices.
"""

from __future__ import annotations

import errno
import glob
import grp
import os
import posixpath
import stat
from collections.abc import Sequence

from reconciler.oci.builder import (
    NEVER_THROUGH,
    DeviceLookupError,
    DeviceNode,
    canonical_path,
    is_glob,
    is_under,
)

__all__ = ["MAX_SYMLINKS", "HostDevices", "SystemGroups"]

MAX_SYMLINKS = 40  # as the kernel's MAXSYMLINKS: more hops than this is a loop (ELOOP)


class SystemGroups:
    """Group name → gid through the system group database (``getgrnam``)."""

    def __call__(self, name: str, /) -> int | None:
        try:
            return grp.getgrnam(name).gr_gid
        except (KeyError, ValueError):  # ValueError: a name holding NUL
            return None


class HostDevices:
    """Device lookup over the real filesystem, confined to ``allowed_roots``."""

    def __init__(self, allowed_roots: Sequence[str] = ("/dev",), *, max_devices: int = 4096):
        if not allowed_roots:
            raise ValueError("HostDevices needs at least one allowed root")
        # each root as given (canonical) and as it resolves, longest first: a path is matched
        # to the most specific root and continues from that root's real directory
        pairs = {(canonical_path(r), os.path.realpath(r)) for r in allowed_roots}
        pairs |= {(real, real) for _, real in pairs}
        self._roots = sorted(pairs, key=lambda p: (-len(p[0]), p))
        self.allowed_roots = tuple(sorted({real for _, real in pairs}))
        self.max_devices = max_devices

    def _allowed(self, real: str) -> bool:
        return any(is_under(real, r) for r in self.allowed_roots) and not any(
            is_under(real, n) for n in NEVER_THROUGH
        )

    def _refused(self, asked: str, step: str) -> DeviceLookupError:
        lead = f"{asked!r} is"
        if step != asked:
            lead = f"{asked!r} resolves through {step!r}, which is"
        for never in NEVER_THROUGH:
            if is_under(step, never):
                return DeviceLookupError(
                    f"{lead} under {never} (a per-process view, never a device source)"
                )
        return DeviceLookupError(f"{lead} outside {', '.join(self.allowed_roots)}")

    def _enter(self, path: str, asked: str) -> tuple[str, list[str]]:
        """(the real directory of the root ``path`` lies under, the components below it)."""
        canon = canonical_path(path)
        if not any(is_under(canon, n) for n in NEVER_THROUGH):
            for given, real in self._roots:
                if is_under(canon, given):
                    rest = canon[len(given) :].strip("/")
                    return real, rest.split("/") if rest else []
        raise self._refused(asked, canon)

    @staticmethod
    def _lstat(path: str, asked: str) -> os.stat_result:
        try:
            return os.lstat(path)
        except OSError as e:
            raise DeviceLookupError(f"{asked!r}: {e.strerror or e}") from None

    def resolve(self, path: str, /) -> tuple[str, os.stat_result]:
        """Where ``path`` leads, symlinks followed one hop at a time with every step checked,
        and the ``lstat`` of that (never a symlink). Raises :class:`DeviceLookupError`."""
        current, rest = self._enter(path, path)
        pending = rest[::-1]  # a stack: the next component last
        hops = 0
        while pending:
            name = pending.pop()
            if name in ("", "."):
                continue
            current = posixpath.dirname(current) if name == ".." else posixpath.join(current, name)
            if not self._allowed(current):
                raise self._refused(path, current)
            if not stat.S_ISLNK(self._lstat(current, path).st_mode):
                continue
            hops += 1
            if hops > MAX_SYMLINKS:
                raise DeviceLookupError(f"{path!r}: {os.strerror(errno.ELOOP)}")
            try:
                target = os.readlink(current)
            except OSError as e:  # replaced since the lstat
                raise DeviceLookupError(f"{path!r}: {e.strerror or e}") from None
            if target.startswith("/"):
                current, below = self._enter(target, path)
            else:
                current, below = posixpath.dirname(current), target.split("/")
            pending.extend(below[::-1])
        st = self._lstat(current, path)
        if stat.S_ISLNK(st.st_mode):  # replaced by a symlink since it was resolved
            raise DeviceLookupError(f"{path!r} changed while it was resolved")
        return current, st

    def expand(self, host_path: str, /) -> list[DeviceNode]:
        if not host_path.startswith("/"):
            raise DeviceLookupError(f"{host_path!r} is not an absolute path")
        if "\0" in host_path:
            raise DeviceLookupError("a device path may not hold NUL")
        found: dict[str, DeviceNode] = {}
        if is_glob(host_path):
            for match in sorted(glob.glob(canonical_path(host_path))):
                self._collect(match, found, literal=False)
        else:
            self._collect(canonical_path(host_path), found, literal=True)
        return [found[k] for k in sorted(found)]

    def _collect(self, path: str, found: dict[str, DeviceNode], *, literal: bool) -> None:
        try:
            real, st = self.resolve(path)
        except DeviceLookupError:
            if literal:
                raise
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
            try:
                real, st = self.resolve(posixpath.join(real_dir, name))
            except DeviceLookupError:
                continue  # leaves the allow-list, vanished, or a dangling symlink
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
