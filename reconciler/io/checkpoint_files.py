"""Reading and writing the allocation checkpoint's files (SPEC §9), crash-safe.

- Writes go through :func:`reconciler.io.fsio.atomic_write`; before a new generation replaces the
  current one, the current file's bytes are kept as ``allocations.prev.json``. A crash at any
  step leaves the old or the new checkpoint, never a torn one.
- A long-running controller (``watch``) writes most runs as a delta against the current file
  (``allocations.delta.json``, :mod:`reconciler.planning.checkpoint_delta`): the checkpoint is
  the current file with its delta applied. A bad delta is quarantined and the current file
  alone used (the generation before the delta's); a delta written against another current
  file (a run stopped between writing a whole generation and removing the delta) is ignored
  and removed by the next write.
- ``checkpoint/LINEAGE`` names the lineage this state directory belongs to; a checkpoint of
  another lineage (copied from another unit) is refused.
- :func:`load_checkpoint` quarantines a bad checkpoint (``checkpoint/quarantine/``) and falls back
  to the previous generation; when that is bad too, allocations are rebuilt from ``actual/``. A
  bad checkpoint is never read as "nothing allocated".

The contents (allocations, encoding, checksums) are :mod:`reconciler.planning.checkpoint`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from reconciler.io.fsio import (
    Commit,
    FileReadError,
    WriteHook,
    atomic_write,
    fsync_dir,
    read_bytes_at,
)
from reconciler.model.documents import ActualState
from reconciler.planning.checkpoint import (
    Checkpoint,
    CheckpointCodec,
    CheckpointError,
    decode_checkpoint,
    encode_checkpoint,
    rebuild_from_actual,
)
from reconciler.planning.checkpoint_delta import (
    COMPACT_RATIO,
    DeltaSince,
    base_checksum,
    delta_data,
    encode_delta,
    with_delta,
)
from reconciler.planning.network import (
    state_from_actual,
)

__all__ = [
    "CURRENT",
    "DELTA",
    "LINEAGE",
    "PREVIOUS",
    "QUARANTINE",
    "CheckpointFiles",
    "LoadReport",
    "Source",
    "files_digest",
    "fingerprint",
    "load_checkpoint",
    "save_checkpoint",
]

CURRENT = "allocations.json"
DELTA = "allocations.delta.json"
PREVIOUS = "allocations.prev.json"
LINEAGE = "LINEAGE"
QUARANTINE = "quarantine"
MAX_BYTES = 512 * 1024 * 1024

Source = Literal["current", "previous", "actual", "new"]


@dataclass(frozen=True)
class LoadReport:
    checkpoint: Checkpoint
    source: Source  # where the allocations came from
    problems: tuple[str, ...] = ()  # what was quarantined and why
    # the current file's bytes, when the checkpoint is that file's (for save_checkpoint)
    current: bytes | None = field(default=None, repr=False, compare=False)
    # with ``current``: what that file decodes to (a delta is written against it) and the
    # bytes of the delta applied to it, if one was
    base: Checkpoint | None = field(default=None, repr=False, compare=False)
    delta: bytes | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class CheckpointFiles:
    """The checkpoint's bytes after a write: the current file's and its delta's, if any."""

    current: bytes
    delta: bytes | None = None

    def digest(self) -> str:
        return files_digest(self.current, self.delta)


def files_digest(current: bytes, delta: bytes | None) -> str:
    """``sha256:`` + the hex digest of the current file's bytes, or, with a delta, of the two
    files' own digests one after the other."""
    h = hashlib.sha256(current)
    if delta is not None:
        h = hashlib.sha256(h.digest() + hashlib.sha256(delta).digest())
    return "sha256:" + h.hexdigest()


def _read(path: Path) -> bytes | None:
    try:
        raw, _ = read_bytes_at(path, MAX_BYTES)
    except FileReadError:
        if path.exists() or path.is_symlink():
            return b""  # present but unreadable: treat as corrupt, never as absent
        return None
    return raw


def fingerprint(directory: Path) -> str:
    """SHA-256 over everything :func:`load_checkpoint` reads in ``directory`` (the lineage and
    both generations, as it reads them): equal fingerprints load the same checkpoint for the
    same actual state."""
    h = hashlib.sha256()
    for name in (LINEAGE, CURRENT, DELTA, PREVIOUS):
        raw = _read(directory / name)
        h.update(b"absent\0" if raw is None else hashlib.sha256(raw).digest())
    return h.hexdigest()


def _quarantine(directory: Path, name: str, reason: str, suffix_source: Callable[[], str]) -> Path:
    qdir = directory / QUARANTINE
    qdir.mkdir(mode=0o700, exist_ok=True)
    target = qdir / f"{name}.{reason}.{suffix_source()}"
    os.replace(directory / name, target)
    return target


def load_checkpoint(
    directory: Path,
    actual: Mapping[str, ActualState],
    *,
    new_lineage: Callable[[], str] = lambda: str(uuid.uuid4()),
    stamp: Callable[[], str] = lambda: uuid.uuid4().hex[:12],
    quarantine: bool = True,
    cache: CheckpointCodec | None = None,
) -> LoadReport:
    """Read the checkpoint directory; see the module docstring for the fallbacks.

    With ``quarantine=False`` (the read-only ``plan``) nothing is moved. ``cache`` skips
    decoding a file whose bytes were decoded last time.
    """
    lineage_raw = _read(directory / LINEAGE)
    expected = lineage_raw.decode(errors="replace").strip() if lineage_raw else None
    problems: list[str] = []
    for name in (CURRENT, PREVIOUS):
        raw = _read(directory / name)
        if raw is None:
            continue
        try:
            cp = _decode(raw, expected, cache)
        except CheckpointError as e:
            problems.append(f"{directory / name}: {e} ({e.reason})")
            if quarantine:
                moved = _quarantine(directory, name, e.reason, stamp)
                problems[-1] += f"; moved to {moved}"
            continue
        if name == PREVIOUS:
            return LoadReport(cp, "previous", tuple(problems))
        base, delta = cp, _read(directory / DELTA)
        src: Source = "current"
        if delta is not None:
            try:
                cp = _apply(base, raw, delta, cache)
            except CheckpointError as e:
                delta = None
                if e.reason != "stale":  # (stale: see the module docstring)
                    problems.append(f"{directory / DELTA}: {e} ({e.reason})")
                    if quarantine:
                        moved = _quarantine(directory, DELTA, e.reason, stamp)
                        problems[-1] += f"; moved to {moved}"
                    src = "previous"
        return LoadReport(cp, src, tuple(problems), raw, base, delta)
    lineage = expected or new_lineage()
    rebuilt = rebuild_from_actual(actual)
    origin: Source = "actual" if (problems or rebuilt) else "new"
    # the addresses node agents report (SPEC §17): sticky even when no checkpoint is trusted
    network = state_from_actual(
        (iid, inst.network, inst.ip)
        for doc in actual.values()
        for iid, inst in doc.instances.items()
    )
    return LoadReport(Checkpoint(lineage, 0, rebuilt, network=network), origin, tuple(problems))


def _keep_as_previous(
    current: Path, previous: Path, raw: bytes, hook: WriteHook | None, commit: Commit | None
) -> None:
    """Make the current file (holding ``raw``, read under the lock) the previous generation:
    a hard link to its inode renamed over ``previous`` and the directory synced, so the 5.5 MB
    of a 20,000-instance checkpoint are not written and synced a second time. The current file
    is then replaced by a rename, which leaves this inode to ``previous``. A crash leaves
    ``previous`` old or new (a stray temp link is removed with the other temp files); where the
    filesystem has no hard links the bytes are copied as before."""
    step = hook or (lambda _name: None)
    tmp = previous.parent / f".{previous.name}.tmp-{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    with contextlib.suppress(OSError):
        a, b = os.stat(current, follow_symlinks=False), os.stat(previous, follow_symlinks=False)
        if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino):
            # already linked (a save that stopped after this step): rename() between two
            # links of one file does nothing and would leave the temp link behind
            return
    if commit is not None:  # renamed over ``previous`` at the commit's flush, before current
        # the generation before it, 5.5 MB at 20,000 instances, is freed after the flush
        commit.free_later(previous)
        try:
            commit.link(current, previous)
        except OSError:
            commit.replace(previous, raw)
        return
    step("link")
    try:
        os.link(current, tmp, follow_symlinks=False)
    except OSError:
        atomic_write(previous, raw, hook=hook)
        return
    try:
        step("rename")
        os.replace(tmp, previous)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    step("fsync-dir")
    fsync_dir(previous.parent)


def save_checkpoint(
    directory: Path,
    cp: Checkpoint,
    *,
    hook: WriteHook | None = None,
    cache: CheckpointCodec | None = None,
    current: bytes | None = None,
    commit: Commit | None = None,
    base: Checkpoint | None = None,
    compact_ratio: int = COMPACT_RATIO,
) -> CheckpointFiles:
    """Write ``cp`` as the current generation, keeping the current file as the previous one;
    returns the bytes written. ``current``: the current file's bytes as
    :func:`load_checkpoint` read them under the same lock (:attr:`LoadReport.current`), so
    that they are not read again; None: read them. ``commit``: the files join it (the lineage,
    then the previous generation, then the current one, visible in that order at its flush,
    the caller's) instead of being written and synced one by one.

    ``base``: what ``current`` decodes to (:attr:`LoadReport.base`); given, and the changes
    since it less than ``1/compact_ratio`` of its bytes, only the delta is written (the
    current and previous files stay as they are); otherwise the whole generation is, and a
    delta there is removed after it."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)

    def write(target: Path, data: bytes) -> None:
        if commit is not None:
            commit.replace(target, data)
        else:
            atomic_write(target, data, hook=hook)

    if base is not None and current and base.lineage == cp.lineage:
        checksum = base_checksum(current)
        if checksum is not None:
            since = cache.delta_since(base, cp) if cache is not None else None
            data, loose = delta_data(base, cp, since)
            delta = encode_delta(cp, base, checksum, data)
            if len(delta) * compact_ratio < len(current):
                write(directory / DELTA, delta)
                if cache is not None:
                    cache.wrote_delta(delta, cp, base, DeltaSince(loose, (cp.gids, data["gids"])))
                return CheckpointFiles(current, delta)

    lineage_path = directory / LINEAGE
    if not lineage_path.exists():
        write(lineage_path, cp.lineage.encode() + b"\n")
    path = directory / CURRENT
    raw = current if current is not None else _read(path)
    if raw:
        with contextlib.suppress(CheckpointError):  # never keep a bad file as the previous one
            _decode(raw, cp.lineage, cache)
            _keep_as_previous(path, directory / PREVIOUS, raw, hook, commit)
    encoded = cache.encode(cp) if cache is not None else encode_checkpoint(cp)
    write(path, encoded)
    if cache is not None:
        cache.wrote(encoded, cp)
    if os.path.lexists(directory / DELTA):  # after the whole generation: see load_checkpoint
        if commit is not None:
            commit.unlink(directory / DELTA)
        else:
            with Commit(hook=hook) as own:
                own.unlink(directory / DELTA)
    return CheckpointFiles(encoded)


def _decode(raw: bytes, expected: str | None, cache: CheckpointCodec | None) -> Checkpoint:
    return cache.decode(raw, expected) if cache is not None else decode_checkpoint(raw, expected)


def _apply(base: Checkpoint, raw: bytes, delta: bytes, cache: CheckpointCodec | None) -> Checkpoint:
    """``base`` (decoded from the current file's bytes ``raw``) with the delta ``delta``."""
    return (
        cache.decode_delta(base, raw, delta) if cache is not None else with_delta(base, raw, delta)
    )
