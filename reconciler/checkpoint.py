"""The allocation checkpoint (SPEC §9), after the kubelet device manager's, made crash-safe.

``checkpoint/allocations.json`` is ``{formatVersion, lineage, generation, data, checksum}``
where ``checksum`` is ``sha256:`` + the hex digest of the canonical bytes of ``data`` (sorted
keys, no spaces, UTF-8). The whole file is written in that canonical form, so the checksum covers
the stored bytes, not a re-serialisation of some in-memory structure (the kubelet's mistake).

- Writes go through :func:`reconciler.fsio.atomic_write`; before a new generation replaces the
  current one, the current file's bytes are kept as ``allocations.prev.json``. A crash at any
  step leaves the old or the new checkpoint, never a torn one.
- ``checkpoint/LINEAGE`` names the lineage this state directory belongs to; a checkpoint of
  another lineage (copied from another unit) is refused.
- :func:`load_checkpoint` quarantines a bad checkpoint (``checkpoint/quarantine/``) and falls back
  to the previous generation; when that is bad too, allocations are rebuilt from ``actual/``. A
  bad checkpoint is never read as "nothing allocated".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from .fsio import FileReadError, WriteHook, atomic_write, read_bytes_at
from .models import ActualState
from .placement import BalanceResult, Cause, DeviceIds, PreviousAllocation

__all__ = [
    "FORMAT_VERSION",
    "GID_RANGE",
    "UID_RANGE",
    "Allocation",
    "Checkpoint",
    "CheckpointCache",
    "CheckpointError",
    "LoadReport",
    "as_decoded",
    "assign_ids",
    "canonical",
    "decode_checkpoint",
    "encode_checkpoint",
    "load_checkpoint",
    "next_generation",
    "rebuild_from_actual",
    "save_checkpoint",
]

FORMAT_VERSION = 1
UID_RANGE = range(5000, 10000)
GID_RANGE = range(5000, 10000)
CURRENT = "allocations.json"
PREVIOUS = "allocations.prev.json"
LINEAGE = "LINEAGE"
QUARANTINE = "quarantine"
MAX_BYTES = 512 * 1024 * 1024


class CheckpointError(ValueError):
    """A checkpoint file that cannot be trusted; ``reason`` is a stable code."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def canonical(value: Any) -> bytes:
    """Sorted keys, no spaces, UTF-8: the bytes the checksum covers."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass(frozen=True, slots=True)
class Allocation:
    """What the controller decided for one instance."""

    item_id: str
    subject_id: str
    index: int
    version: str
    node_id: str
    runtime_id: str
    reserved: tuple[int, int, int, int]  # cpu, ram, storage, state
    resources: tuple[str, ...]
    devices: DeviceIds
    uid: int
    gid: int
    cause: Cause | None = None  # a move by a rebalance or a preemption, until the next move

    def previous(self) -> PreviousAllocation:
        return PreviousAllocation(self.node_id, self.runtime_id, self.devices, self.cause)

    def to_json(self) -> dict[str, Any]:
        cpu, ram, storage, state = self.reserved
        return {
            "itemId": self.item_id,
            "subjectId": self.subject_id,
            "index": self.index,
            "version": self.version,
            "nodeId": self.node_id,
            "runtimeId": self.runtime_id,
            "reserved": {"cpu": cpu, "ram": ram, "storage": storage, "state": state},
            "resources": list(self.resources),
            "devices": {r: list(ids) for r, ids in self.devices},
            "uid": self.uid,
            "gid": self.gid,
        } | ({"cause": self.cause} if self.cause is not None else {})

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Allocation:
        r = d["reserved"]
        return Allocation(
            str(d["itemId"]),
            str(d["subjectId"]),
            int(d["index"]),
            str(d["version"]),
            str(d["nodeId"]),
            str(d["runtimeId"]),
            (int(r["cpu"]), int(r["ram"]), int(r["storage"]), int(r["state"])),
            tuple(str(x) for x in d["resources"]),
            tuple(sorted((str(k), tuple(str(i) for i in v)) for k, v in d["devices"].items())),
            int(d["uid"]),
            int(d["gid"]),
            _cause(d.get("cause")),
        )


def _cause(value: object) -> Cause | None:
    if value is None:
        return None
    if value == "rebalanced" or value == "preempted":
        return value
    raise ValueError(f"unknown cause {value!r}")


@dataclass(frozen=True)
class Checkpoint:
    lineage: str
    generation: int
    allocations: Mapping[str, Allocation] = field(default_factory=dict)
    gids: Mapping[str, int] = field(default_factory=dict)  # itemId -> gid
    alerts: Mapping[str, Any] = field(default_factory=dict)  # node -> alert timelines (SPEC §8)

    def data(self) -> dict[str, Any]:
        return {
            "instances": {iid: a.to_json() for iid, a in sorted(self.allocations.items())},
            "gids": dict(sorted(self.gids.items())),
            "alerts": dict(self.alerts),
        }

    def previous(self) -> dict[str, PreviousAllocation]:
        return {iid: a.previous() for iid, a in self.allocations.items()}

    def same_data(self, other: Checkpoint) -> bool:
        """``canonical(self.data()) == canonical(other.data())``, without serialising every
        allocation: equal allocations (typed fields) serialise equally, and an allocation that
        differs as a value is compared by its canonical bytes."""
        if canonical(dict(sorted(self.gids.items()))) != canonical(
            dict(sorted(other.gids.items()))
        ) or canonical(dict(self.alerts)) != canonical(dict(other.alerts)):
            return False
        mine, theirs = self.allocations, other.allocations
        if mine.keys() != theirs.keys():
            return False
        for iid, a in mine.items():
            b = theirs[iid]
            if a is not b and a != b and canonical(a.to_json()) != canonical(b.to_json()):
                return False
        return True


def encode_checkpoint(cp: Checkpoint) -> bytes:
    body = canonical(cp.data())
    checksum = "sha256:" + hashlib.sha256(body).hexdigest()
    # canonical() of the envelope {checksum, data, formatVersion, generation, lineage} (sorted
    # keys), with the data's canonical bytes spliced in rather than serialised a second time
    return (
        b'{"checksum":'
        + canonical(checksum)
        + b',"data":'
        + body
        + b',"formatVersion":'
        + canonical(FORMAT_VERSION)
        + b',"generation":'
        + canonical(cp.generation)
        + b',"lineage":'
        + canonical(cp.lineage)
        + b"}\n"
    )


def decode_checkpoint(raw: bytes, expected_lineage: str | None) -> Checkpoint:
    """Parse and verify; raise :class:`CheckpointError` for anything untrustworthy."""
    if not raw.strip():
        raise CheckpointError("empty", "the checkpoint is empty")
    try:
        env = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise CheckpointError("unparsable", f"the checkpoint is not valid JSON: {e}") from None
    if not isinstance(env, dict):
        raise CheckpointError("unparsable", "the checkpoint is not a JSON object")
    fmt = env.get("formatVersion")
    if fmt != FORMAT_VERSION:
        raise CheckpointError("format", f"unsupported formatVersion {fmt!r}")
    data, checksum = env.get("data"), env.get("checksum")
    if not isinstance(data, dict) or not isinstance(checksum, str):
        raise CheckpointError("unparsable", "the checkpoint lacks data or checksum")
    actual = "sha256:" + hashlib.sha256(canonical(data)).hexdigest()
    if checksum != actual:
        raise CheckpointError("checksum", f"checksum mismatch: stored {checksum}, data {actual}")
    lineage = env.get("lineage")
    if not isinstance(lineage, str) or not lineage:
        raise CheckpointError("lineage", "the checkpoint has no lineage")
    if expected_lineage is not None and lineage != expected_lineage:
        raise CheckpointError(
            "lineage", f"the checkpoint belongs to lineage {lineage}, not {expected_lineage}"
        )
    generation = env.get("generation")
    if not isinstance(generation, int) or isinstance(generation, bool) or generation < 0:
        raise CheckpointError("unparsable", f"invalid generation {generation!r}")
    try:
        allocations = {
            str(iid): Allocation.from_json(a) for iid, a in data.get("instances", {}).items()
        }
        gids = {str(k): int(v) for k, v in data.get("gids", {}).items()}
        alerts = dict(data.get("alerts", {}))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CheckpointError("unparsable", f"malformed checkpoint data: {e!r}") from None
    return Checkpoint(lineage, generation, allocations, gids, alerts)


class CheckpointCache:
    """The last checkpoint file this process decoded or wrote, by its exact bytes (and the
    lineage it was checked against): decoding the same bytes again gives the same checkpoint,
    so a long-running caller (``watch``) parses and verifies an unchanged checkpoint file once,
    and does not parse the file it has just written."""

    def __init__(self) -> None:
        self._key: tuple[bytes, str | None] | None = None
        self._checkpoint: Checkpoint | None = None
        self._written: tuple[bytes, Checkpoint] | None = None  # decoded when first needed

    def decode(self, raw: bytes, expected_lineage: str | None) -> Checkpoint:
        """:func:`decode_checkpoint`, or the checkpoint these bytes gave last time."""
        if self._checkpoint is not None and self._key == (raw, expected_lineage):
            return self._checkpoint
        written = self._written
        if (
            written is not None
            and written[0] == raw
            and expected_lineage in (None, written[1].lineage)
            and _plain(written[1])
        ):
            try:  # what decoding our own encoding gives, without parsing it
                cp = as_decoded(written[1])
            except (KeyError, TypeError, ValueError, AttributeError):
                cp = decode_checkpoint(raw, expected_lineage)  # raises what decoding raises
        else:
            cp = decode_checkpoint(raw, expected_lineage)
        self._key, self._checkpoint = (raw, expected_lineage), cp
        return cp

    def wrote(self, raw: bytes, cp: Checkpoint) -> None:
        """``raw`` is ``encode_checkpoint(cp)``, just written."""
        self._written = (raw, cp)


def _plain(cp: Checkpoint) -> bool:
    """The envelope fields are ones decoding accepts as they are (else: decode the bytes)."""
    return (
        _exact_str(cp.lineage)
        and bool(cp.lineage)
        and type(cp.generation) is int
        and cp.generation >= 0
        and all(_exact_str(k) for k in cp.allocations)
    )


def _exact_str(value: object) -> bool:
    return type(value) is str


def _decoded_form(a: Allocation) -> bool:
    """Whether ``a`` is already what ``Allocation.from_json`` gives for its JSON: exact str and
    int fields, device resources in increasing order (sorted, no duplicate), str ids."""
    if not (
        all(_exact_str(x) for x in (a.item_id, a.subject_id, a.version, a.node_id, a.runtime_id))
        and type(a.index) is int
        and type(a.uid) is int
        and type(a.gid) is int
        and type(a.reserved) is tuple
        and len(a.reserved) == 4
        and all(type(x) is int for x in a.reserved)
        and type(a.resources) is tuple
        and all(_exact_str(x) for x in a.resources)
        and type(a.devices) is tuple
        and a.cause in (None, "rebalanced", "preempted")
    ):
        return False
    last: str | None = None
    for pair in a.devices:
        if type(pair) is not tuple or len(pair) != 2:
            return False
        resource, ids = pair
        if not _exact_str(resource) or (last is not None and resource <= last):
            return False
        if type(ids) is not tuple or not all(_exact_str(i) for i in ids):
            return False
        last = resource
    return True


def as_decoded(cp: Checkpoint) -> Checkpoint:
    """``decode_checkpoint(encode_checkpoint(cp), cp.lineage)``, without serialising and
    parsing the allocations that are already in decoded form."""
    data_gids = json.loads(canonical(dict(sorted(cp.gids.items()))))
    alerts = json.loads(canonical(dict(cp.alerts)))
    allocations = {
        iid: a if _decoded_form(a) else Allocation.from_json(json.loads(canonical(a.to_json())))
        for iid, a in sorted(cp.allocations.items())
    }
    gids = {str(k): int(v) for k, v in data_gids.items()}
    return Checkpoint(cp.lineage, cp.generation, allocations, gids, dict(alerts))


def _decode(raw: bytes, expected: str | None, cache: CheckpointCache | None) -> Checkpoint:
    return cache.decode(raw, expected) if cache is not None else decode_checkpoint(raw, expected)


# ----------------------------------------------------------------------------- uids and gids


def _smallest_free(used: set[int], space: range) -> int | None:
    for candidate in space:
        if candidate not in used:
            return candidate
    return None


def assign_ids(
    result: BalanceResult, old: Mapping[str, Allocation], old_gids: Mapping[str, int]
) -> tuple[dict[str, Allocation], dict[str, int], list[str]]:
    """Uids and gids for every placement (SPEC §9), deterministically.

    A gid belongs to an item and is unique in the unit. A uid belongs to an instance identity
    and is kept across versions; it is unique among the instances *of a node* (SPEC §9 asks for
    5000-9999 per identity, which cannot be unit-wide at 20,000 instances): an instance keeps
    its uid while no other instance on its node holds it, else it takes the smallest free one.
    Returns the allocations, the gids, and errors for instances that found no free id.
    """
    errors: list[str] = []
    gids: dict[str, int] = {}
    items = sorted({p.item_id for p in result.placements})
    for item in items:
        if item in old_gids and old_gids[item] in GID_RANGE:
            gids[item] = old_gids[item]
    used_gids = set(gids.values())
    for item in items:
        if item not in gids:
            gid = _smallest_free(used_gids, GID_RANGE)
            if gid is None:
                errors.append(f"{item}: no free gid in {GID_RANGE.start}-{GID_RANGE.stop - 1}")
                continue
            gids[item] = gid
            used_gids.add(gid)
    used_uids: dict[str, set[int]] = {}
    uid_of: dict[str, int] = {}
    for p in result.placements:  # keep previous uids first, in instance order
        prev = old.get(p.instance_id)
        taken = used_uids.setdefault(p.node_id, set())
        if prev is not None and prev.uid in UID_RANGE and prev.uid not in taken:
            uid_of[p.instance_id] = prev.uid
            taken.add(prev.uid)
    allocations: dict[str, Allocation] = {}
    for p in result.placements:
        taken = used_uids.setdefault(p.node_id, set())
        uid = uid_of.get(p.instance_id)
        if uid is None:
            uid = _smallest_free(taken, UID_RANGE)
            if uid is None:
                errors.append(f"{p.label}: no free uid on node {p.node_id}")
                continue
            taken.add(uid)
        if p.item_id not in gids:
            continue
        r = p.requested
        allocations[p.instance_id] = Allocation(
            p.item_id,
            p.subject_id,
            p.index,
            p.version,
            p.node_id,
            p.runtime_id,
            (r.cpu, r.ram, r.storage, r.state),
            p.resources,
            p.devices,
            uid,
            gids[p.item_id],
            p.cause,
        )
    return allocations, gids, errors


# ----------------------------------------------------------------------------- recovery


def rebuild_from_actual(actual: Mapping[str, ActualState]) -> dict[str, Allocation]:
    """Allocations as the node agents report them (node, runtime, version, device ids); the
    reserved amounts and ids are filled in by the next balance."""
    out: dict[str, Allocation] = {}
    for node_id in sorted(actual, reverse=True):  # the smallest node id wins a duplicate
        for iid, inst in actual[node_id].instances.items():
            devices = tuple(sorted((r, tuple(sorted(ids))) for r, ids in inst.devices.items()))
            out[iid] = Allocation(
                inst.itemId,
                inst.subjectId,
                inst.index,
                inst.version,
                node_id,
                inst.runtimeId,
                (0, 0, 0, 0),
                (),
                devices,
                -1,
                -1,
            )
    return out


Source = Literal["current", "previous", "actual", "new"]


@dataclass(frozen=True)
class LoadReport:
    checkpoint: Checkpoint
    source: Source  # where the allocations came from
    problems: tuple[str, ...] = ()  # what was quarantined and why


def _read(path: Path) -> bytes | None:
    try:
        raw, _ = read_bytes_at(path, MAX_BYTES)
    except FileReadError:
        if path.exists() or path.is_symlink():
            return b""  # present but unreadable: treat as corrupt, never as absent
        return None
    return raw


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
    cache: CheckpointCache | None = None,
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
        src: Source = "current" if name == CURRENT else "previous"
        return LoadReport(cp, src, tuple(problems))
    lineage = expected or new_lineage()
    rebuilt = rebuild_from_actual(actual)
    origin: Source = "actual" if (problems or rebuilt) else "new"
    return LoadReport(Checkpoint(lineage, 0, rebuilt), origin, tuple(problems))


def save_checkpoint(
    directory: Path,
    cp: Checkpoint,
    *,
    hook: WriteHook | None = None,
    cache: CheckpointCache | None = None,
) -> Path:
    """Write ``cp`` as the current generation, keeping the current file as the previous one."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    lineage_path = directory / LINEAGE
    if not lineage_path.exists():
        atomic_write(lineage_path, cp.lineage.encode() + b"\n", hook=hook)
    current = directory / CURRENT
    raw = _read(current)
    if raw:
        with contextlib.suppress(CheckpointError):  # never keep a bad file as the previous one
            _decode(raw, cp.lineage, cache)
            atomic_write(directory / PREVIOUS, raw, hook=hook)
    encoded = encode_checkpoint(cp)
    atomic_write(current, encoded, hook=hook)
    if cache is not None:
        cache.wrote(encoded, cp)
    return current


def next_generation(old: Checkpoint, **changes: Any) -> Checkpoint:
    """The checkpoint that follows ``old``, with ``changes`` applied."""
    return replace(old, generation=old.generation + 1, **changes)
