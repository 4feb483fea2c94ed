"""Writes the built OCI configs under ``out/instances/<id>/`` (SPEC §2, §11).

Each placed instance gets ``config.json`` and ``hosts`` (both 0644: the runtime reads them, and
``hosts`` is bind-mounted into the container). A file is rewritten only when its bytes or its mode
differ; the directories of instances that are no longer built are removed. Instance ids are
validated before any path is formed, and no symlink is ever followed: ``out`` or
``out/instances`` being a symlink is an error, an instance entry that is not a real directory is
replaced, and files are compared through ``O_NOFOLLOW`` and replaced by rename.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .fsio import FileReadError, atomic_write, atomic_write_many, read_bytes_at
from .jsonio import pretty_json
from .oci import BuiltConfig, config_json, content_digest
from .values import validate_id

__all__ = [
    "CONFIG_MODE",
    "OutputPathError",
    "WriteReport",
    "hosts_path",
    "instance_dir",
    "instances_dir",
    "write_instance_outputs",
]

CONFIG_MODE = 0o644
_DIR_MODE = 0o755


class OutputPathError(OSError):
    """A path under ``out/`` is not what the controller left there (a symlink, a file)."""


@dataclass(frozen=True, slots=True)
class WriteReport:
    written: tuple[str, ...]  # files rewritten, relative to out/ ("instances/<id>/config.json")
    unchanged: tuple[str, ...]  # files left as they were, same form
    removed: tuple[str, ...]  # instance ids whose directories were removed

    @property
    def counts(self) -> dict[str, int]:
        return {
            "written": len(self.written),
            "unchanged": len(self.unchanged),
            "removed": len(self.removed),
        }


def instances_dir(state_dir: Path) -> Path:
    return Path(os.path.abspath(state_dir)) / "out" / "instances"


def instance_dir(state_dir: Path, instance_id: str) -> Path:
    """``<state>/out/instances/<id>`` as an absolute path; the id is validated first."""
    validate_id(instance_id, "instance id")
    return instances_dir(state_dir) / instance_id


def hosts_path(state_dir: Path, instance_id: str) -> Path:
    """The absolute path of an instance's hosts file (what the builder mounts at /etc/hosts)."""
    return instance_dir(state_dir, instance_id) / "hosts"


def _ensure_dir(path: Path, *, replace: bool) -> None:
    """Make ``path`` a real directory; an existing symlink or file is replaced or refused."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        os.mkdir(path, _DIR_MODE)
        return
    if stat.S_ISDIR(st.st_mode):
        return
    if not replace:
        raise OutputPathError(f"{path} is not a directory (a symlink or a file); refusing")
    os.unlink(path)  # a symlink or a file: removed, never followed
    os.mkdir(path, _DIR_MODE)


def _unchanged(path: Path, data: bytes) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode) or stat.S_IMODE(st.st_mode) != CONFIG_MODE:
        return False
    if st.st_size != len(data):
        return False
    try:
        current, _key = read_bytes_at(path, len(data))
    except FileReadError:
        return False
    return current == data


MANIFEST = ".manifest.json"
"""out/instances/.manifest.json: per instance, the digest of the hosts and config.json this
writer wrote last, so that an unchanged instance costs no read (outputs are the controller's)."""


_FILES = ("hosts", "config.json")


def _read_manifest(root: Path) -> dict[str, Any]:
    try:
        raw, _ = read_bytes_at(root / MANIFEST, 64 * 1024 * 1024)
        data = json.loads(raw)
    except (FileReadError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _fingerprints(directory: str) -> dict[str, list[int]] | None:
    """(inode, size, mtime_ns, mode) of each file, as lstat sees them; None if one is not a
    regular file."""
    out: dict[str, list[int]] = {}
    for name in _FILES:
        try:
            st = os.lstat(f"{directory}/{name}")
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        out[name] = [st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode]
    return out


def _untouched(directory: str, recorded: object) -> bool:
    """The files are exactly those this writer recorded (a replaced, edited or planted file has
    another inode, size, mtime or mode)."""
    return recorded is not None and _fingerprints(directory) == recorded


def write_instance_outputs(
    state_dir: Path, built: Mapping[str, BuiltConfig], *, sync: bool = True
) -> WriteReport:
    """Write ``config.json`` and ``hosts`` for every built instance; remove stale instances."""
    ids = sorted(built)
    for iid in ids:
        validate_id(iid, "instance id")
    out = Path(os.path.abspath(state_dir)) / "out"
    root = out / "instances"
    _ensure_dir(out, replace=False)
    _ensure_dir(root, replace=False)

    written: list[str] = []
    unchanged: list[str] = []
    batch: list[tuple[Path, bytes, int]] = []
    manifest = _read_manifest(root)
    new_manifest: dict[str, Any] = {}
    root_str = str(root)
    for iid in ids:
        digest = content_digest(built[iid])
        known = manifest.get(iid)
        if (
            isinstance(known, dict)
            and known.get("digest") == digest
            and _untouched(f"{root_str}/{iid}", known.get("files"))
        ):
            # written by this writer with this content and not touched since: no read needed
            new_manifest[iid] = known
            unchanged += [f"instances/{iid}/{name}" for name in _FILES]
            continue
        # hosts first: a config never points at a hosts file that is not there yet
        files = (("hosts", built[iid].hosts.encode()), ("config.json", config_json(built[iid])))
        directory = root / iid
        new_manifest[iid] = {"digest": digest, "files": None}
        _ensure_dir(directory, replace=True)
        for name, data in files:
            rel = f"instances/{iid}/{name}"
            target = directory / name
            if _unchanged(target, data):
                unchanged.append(rel)
                continue
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            if sync:
                batch.append((target, data, CONFIG_MODE))
            else:
                atomic_write(target, data, mode=CONFIG_MODE, sync=False)
            written.append(rel)
    # one batch: every temp written, one filesystem flush, every rename, one more flush; hosts
    # files come before their configs in the batch, so a config never names a missing hosts file;
    # the manifest comes last
    atomic_write_many(batch)
    for iid, entry in new_manifest.items():
        if entry["files"] is None:
            entry["files"] = _fingerprints(f"{root_str}/{iid}")
    if new_manifest != manifest:
        atomic_write_many([(root / MANIFEST, pretty_json(new_manifest), 0o600)])

    removed: list[str] = []
    keep = set(ids)
    with os.scandir(root) as it:
        stale = sorted(
            e.name
            for e in it
            if e.name not in keep and _is_id(e.name) and e.is_dir(follow_symlinks=False)
        )
    for name in stale:
        shutil.rmtree(root / name)
        removed.append(name)
    return WriteReport(tuple(written), tuple(unchanged), tuple(removed))


def _is_id(name: str) -> bool:
    try:
        validate_id(name)
    except ValueError:
        return False
    return True
