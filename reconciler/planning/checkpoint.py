"""The allocation checkpoint's contents (after the kubelet device manager's checkpoint).

``checkpoint/allocations.json`` is ``{formatVersion, lineage, generation, data, checksum}``
where ``checksum`` is ``sha256:`` + the hex digest of the canonical bytes of ``data`` (sorted
keys, no spaces, UTF-8). The whole file is written in that canonical form, so the checksum covers
the stored bytes, not a re-serialisation of some in-memory structure (the kubelet's mistake).

This module holds the checkpoint's contents and their pure functions: allocations, the
canonical encoding and its checks, uid and gid assignment, the rebuild from ``actual/``. Reading
and writing the files (crash-safe, with the previous generation and the quarantine) is
:mod:`reconciler.io.checkpoint_files`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from reconciler.model.documents import ActualState
from reconciler.placement.instances import (
    BalanceResult,
    Cause,
    DeviceIds,
    Placement,
    PreviousAllocation,
    new_requested,
)

if TYPE_CHECKING:
    from reconciler.planning.checkpoint_delta import DeltaSince

__all__ = [
    "FORMAT_VERSION",
    "GID_RANGE",
    "IDS_FAILURE",
    "UID_RANGE",
    "Allocation",
    "AllocationsMemo",
    "Checkpoint",
    "CheckpointCodec",
    "CheckpointError",
    "as_decoded",
    "assign_gids",
    "assign_ids",
    "canonical",
    "canonical_plain",
    "checked_envelope",
    "checkpoint_bytes",
    "collect_allocations",
    "decode_checkpoint",
    "decoded_form",
    "decoded_gids",
    "encode_checkpoint",
    "envelope_tail",
    "id_failure",
    "id_failures",
    "next_generation",
    "node_allocations",
    "placements_by_node",
    "plain_envelope",
    "plain_gids",
    "plain_header",
    "rebuild_from_actual",
    "round_trip",
]

FORMAT_VERSION = 1
UID_RANGE = range(5000, 10000)
GID_RANGE = range(5000, 10000)
IDS_FAILURE = "Ids"
"""The reason of an instance placed by the balance that found no free uid on its node or whose
item found no free gid: it fails (a container without its ids is never started)."""


class CheckpointError(ValueError):
    """A checkpoint file that cannot be trusted; ``reason`` is a stable code."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def canonical(value: Any) -> bytes:
    """Sorted keys, no spaces, UTF-8: the bytes the checksum covers."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def canonical_plain(value: Any) -> bytes:
    """:func:`canonical`'s very bytes for a value made of strings, integers, booleans, None,
    lists and objects with string keys (no float: the two serialisers spell some differently),
    by orjson (an allocation's in a few microseconds: 20,000 of them are written by a cold
    run). Anything orjson refuses (an integer beyond 64 bits, a key that is not a string) is
    serialised by :func:`canonical`."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return canonical(value)


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
        if self.uid < 0:  # rebuilt from actual/: the amounts are not known, nothing to hold
            return PreviousAllocation(self.node_id, self.runtime_id, self.devices, self.cause)
        cpu, ram, storage, state = self.reserved
        return PreviousAllocation(
            self.node_id,
            self.runtime_id,
            self.devices,
            self.cause,
            self.version,
            new_requested(cpu, ram, storage, state),
            self.resources,
        )

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


class AllocationsMemo(Protocol):
    """What a checkpoint's memo (:class:`reconciler.accel.checkpoint.CheckpointMemo`) tells of
    the allocations it encoded last."""

    @property
    def previous_since(self) -> tuple[Mapping[str, PreviousAllocation], frozenset[str]] | None:
        """After :meth:`previous`: the mapping the call before handed out and the ids at which
        this one may differ from it, or None."""

    def previous(self, allocations: Mapping[str, Allocation]) -> dict[str, PreviousAllocation]:
        """``{iid: a.previous() for iid, a in allocations.items()}``."""

    def decoded(self, allocations: Mapping[str, Allocation]) -> dict[str, Allocation] | None:
        """``allocations`` as decoding gives them, when they are the mapping it encoded last
        (the very objects), else None."""


class CheckpointCodec(Protocol):
    """How the checkpoint files are encoded and decoded by a caller that keeps state from run
    to run (:class:`reconciler.accel.checkpoint.CheckpointCache`); the same bytes and values as
    :func:`encode_checkpoint` and :func:`decode_checkpoint`."""

    def decode(self, raw: bytes, expected_lineage: str | None) -> Checkpoint:
        """:func:`decode_checkpoint`."""

    def encode(self, cp: Checkpoint) -> bytes:
        """:func:`encode_checkpoint`."""

    def wrote(self, raw: bytes, cp: Checkpoint) -> None:
        """``raw`` is the encoding of ``cp``, just written."""

    def decode_delta(self, base: Checkpoint, current: bytes, delta: bytes) -> Checkpoint:
        """``base`` (what the current file's bytes ``current`` decode to) with the delta
        ``delta`` applied: :mod:`reconciler.planning.checkpoint_delta`'s ``apply_delta`` of its
        ``decode_delta``."""

    def delta_since(self, base: Checkpoint, cp: Checkpoint) -> DeltaSince | None:
        """What is known of the delta from ``base`` to ``cp`` from the last one written (see
        :func:`reconciler.planning.checkpoint_delta.delta_data`), or None."""

    def wrote_delta(
        self, delta: bytes, cp: Checkpoint, base: Checkpoint, since: DeltaSince
    ) -> None:
        """``delta`` makes ``base`` (what :meth:`decode` gave of the current file) into ``cp``;
        it was just written. ``since``: the ids at which ``cp``'s allocations are not ``base``'s
        objects, and the delta's gids (what :meth:`delta_since` starts from next time)."""


@dataclass(frozen=True)
class Checkpoint:
    lineage: str
    generation: int
    allocations: Mapping[str, Allocation] = field(default_factory=dict)
    gids: Mapping[str, int] = field(default_factory=dict)  # itemId -> gid
    alerts: Mapping[str, Any] = field(default_factory=dict)  # node -> alert timelines (SPEC §8)
    network: Mapping[str, Any] = field(default_factory=dict)
    """The network phase's state (SPEC §17, :mod:`reconciler.planning.network`): subnets, VLAN
    ids, host and instance addresses. Absent from the file while empty, so a unit without
    networks writes the checkpoint it wrote before networks existed (and reads old ones)."""
    memo: AllocationsMemo | None = field(default=None, kw_only=True, compare=False, repr=False)
    """Not part of the value: the memo of the decode cache that returned this checkpoint
    (:class:`reconciler.accel.checkpoint.CheckpointCache`), so that :meth:`previous` reuses
    what it built last run."""
    since: tuple[Mapping[str, Allocation], frozenset[str]] | None = field(
        default=None, kw_only=True, compare=False, repr=False
    )
    """Not part of the value: ``allocations`` is that mapping but at these ids (set from
    :attr:`IdsMemo.since`); an encoder that encoded that mapping last looks at these only."""

    def data(self) -> dict[str, Any]:
        out = {
            "instances": {iid: a.to_json() for iid, a in sorted(self.allocations.items())},
            "gids": dict(sorted(self.gids.items())),
            "alerts": dict(self.alerts),
        }
        if self.network:
            out["network"] = dict(self.network)
        return out

    def previous(self) -> dict[str, PreviousAllocation]:
        if self.memo is not None:
            return self.memo.previous(self.allocations)
        return {iid: a.previous() for iid, a in self.allocations.items()}

    def same_data(self, other: Checkpoint) -> bool:
        """``canonical(self.data()) == canonical(other.data())``, without serialising every
        allocation: the same object serialises alike, and any other pair is compared by its
        canonical bytes (equal values can serialise differently: ``0`` and ``0.0``).
        :func:`assign_ids` hands back the old object of every unchanged allocation, so after it
        only the changed ones are serialised. The cheapest differences are looked for
        first: a different number of allocations (distinct keys either way) answers before
        any gid is looked at."""
        mine, theirs = self.allocations, other.allocations
        if len(mine) != len(theirs):
            return False
        gids, others = self.gids, other.gids
        if gids is not others:
            if plain_gids(gids) and plain_gids(others):
                # exact str keys, int values: equal as canonical exactly when equal as dicts
                if (gids if type(gids) is dict else dict(gids)) != (
                    others if type(others) is dict else dict(others)
                ):
                    return False
            elif canonical(dict(sorted(gids.items()))) != canonical(dict(sorted(others.items()))):
                return False
        if canonical(dict(self.alerts)) != canonical(dict(other.alerts)):
            return False
        if canonical(dict(self.network)) != canonical(dict(other.network)):
            return False
        if mine.keys() != theirs.keys():
            return False
        for iid, a in mine.items():
            b = theirs[iid]
            if a is not b and canonical(a.to_json()) != canonical(b.to_json()):
                return False
        return True


def encode_checkpoint(cp: Checkpoint) -> bytes:
    """The file's bytes (:meth:`reconciler.accel.checkpoint.CheckpointMemo.encode` gives the
    same bytes, serialising only the allocations it has not seen)."""
    return checkpoint_bytes(cp, canonical(cp.data()))


def checkpoint_bytes(cp: Checkpoint, body: bytes) -> bytes:
    """The file's bytes around ``body``, the canonical bytes of ``cp.data()``: canonical() of
    the envelope {checksum, data, formatVersion, generation, lineage} (sorted keys), with the
    data's bytes spliced in rather than serialised a second time (one join: each + of the body
    would copy its megabytes)."""
    head = b'{"checksum":' + canonical("sha256:" + hashlib.sha256(body).hexdigest())
    return b"".join((head, b',"data":', body, envelope_tail(cp)))


def envelope_tail(cp: Checkpoint) -> bytes:
    """What follows ``data`` in a checkpoint file (the whole one or its delta): its keys
    after ``data`` in sorted order, the closing brace and the newline."""
    return b"".join(
        (
            b',"formatVersion":',
            canonical(FORMAT_VERSION),
            b',"generation":',
            canonical(cp.generation),
            b',"lineage":',
            canonical(cp.lineage),
            b"}\n",
        )
    )


def checked_envelope(raw: bytes, what: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The parsed file (``what`` names it in the errors) and its ``data``, whose checksum and
    ``formatVersion`` are checked: what the whole file and its delta
    (:mod:`reconciler.planning.checkpoint_delta`) share. Raises :class:`CheckpointError`."""
    if not raw.strip():
        raise CheckpointError("empty", f"{what} is empty")
    try:
        env = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise CheckpointError("unparsable", f"{what} is not valid JSON: {e}") from None
    if not isinstance(env, dict):
        raise CheckpointError("unparsable", f"{what} is not a JSON object")
    fmt = env.get("formatVersion")
    if fmt != FORMAT_VERSION:
        raise CheckpointError("format", f"unsupported formatVersion {fmt!r}")
    data, checksum = env.get("data"), env.get("checksum")
    if not isinstance(data, dict) or not isinstance(checksum, str):
        raise CheckpointError("unparsable", f"{what} lacks data or checksum")
    actual = "sha256:" + hashlib.sha256(canonical(data)).hexdigest()
    if checksum != actual:
        raise CheckpointError("checksum", f"checksum mismatch: stored {checksum}, data {actual}")
    return env, data


def decode_checkpoint(raw: bytes, expected_lineage: str | None) -> Checkpoint:
    """Parse and verify; raise :class:`CheckpointError` for anything untrustworthy."""
    env, data = checked_envelope(raw, "the checkpoint")
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
        network = dict(data.get("network", {}))  # absent in checkpoints written before it
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CheckpointError("unparsable", f"malformed checkpoint data: {e!r}") from None
    return Checkpoint(lineage, generation, allocations, gids, alerts, network)


def plain_envelope(cp: Checkpoint) -> bool:
    """The envelope fields are ones decoding accepts as they are (else: decode the bytes)."""
    return plain_header(cp) and set(map(type, cp.allocations)) <= STR_TYPES


def plain_header(cp: Checkpoint) -> bool:
    """:func:`plain_envelope` but for the allocations' ids: the lineage and generation."""
    return (
        exact_str(cp.lineage)
        and bool(cp.lineage)
        and type(cp.generation) is int
        and cp.generation >= 0
    )


def exact_str(value: object) -> bool:
    return type(value) is str


STR_TYPES = {str}
_INT = {int}


def plain_gids(gids: Mapping[str, int]) -> bool:
    """Exact ``str`` keys and exact ``int`` values (not ``bool``): what decoding gives, and
    equal as values exactly when equal as canonical JSON."""
    # (C-level passes: it runs several times a run over every item's gid)
    return set(map(type, gids)) <= STR_TYPES and set(map(type, gids.values())) <= _INT


def decoded_form(a: Allocation) -> bool:
    """Whether ``a`` is already what ``Allocation.from_json`` gives for its JSON: exact str and
    int fields, device resources in increasing order (sorted, no duplicate), str ids."""
    if not (
        all(exact_str(x) for x in (a.item_id, a.subject_id, a.version, a.node_id, a.runtime_id))
        and type(a.index) is int
        and type(a.uid) is int
        and type(a.gid) is int
        and type(a.reserved) is tuple
        and len(a.reserved) == 4
        and all(type(x) is int for x in a.reserved)
        and type(a.resources) is tuple
        and all(exact_str(x) for x in a.resources)
        and type(a.devices) is tuple
        and a.cause in (None, "rebalanced", "preempted")
    ):
        return False
    last: str | None = None
    for pair in a.devices:
        if type(pair) is not tuple or len(pair) != 2:
            return False
        resource, ids = pair
        if not exact_str(resource) or (last is not None and resource <= last):
            return False
        if type(ids) is not tuple or not all(exact_str(i) for i in ids):
            return False
        last = resource
    return True


def as_decoded(cp: Checkpoint) -> Checkpoint:
    """``decode_checkpoint(encode_checkpoint(cp), cp.lineage)``, without serialising and
    parsing the allocations that are already in decoded form
    (:meth:`reconciler.accel.checkpoint.CheckpointMemo.as_decoded` also skips checking each
    one it encoded)."""
    return Checkpoint(
        cp.lineage,
        cp.generation,
        {iid: a if decoded_form(a) else round_trip(a) for iid, a in sorted(cp.allocations.items())},
        decoded_gids(cp.gids),
        dict(json.loads(canonical(dict(cp.alerts)))),
        json.loads(canonical(dict(cp.network))),
    )


def decoded_gids(gids: Mapping[str, int]) -> dict[str, int]:
    """The gids as decoding their canonical bytes gives them."""
    if plain_gids(gids):  # what the round trip gives: the same str and int objects
        return dict(sorted(gids.items()))
    data_gids = json.loads(canonical(dict(sorted(gids.items()))))
    return {str(k): int(v) for k, v in data_gids.items()}


def round_trip(a: Allocation) -> Allocation:
    return Allocation.from_json(json.loads(canonical(a.to_json())))


def assign_gids(
    placements: Sequence[Placement], old_gids: Mapping[str, int]
) -> tuple[dict[str, int], list[str]]:
    """The gid of every placed item (SPEC §9): an item keeps its gid while it is placed, the
    others take the smallest free one in item order. Returns the gids and an error for each
    item that found none."""
    errors: list[str] = []
    gids: dict[str, int] = {}
    items = sorted(set(map(_ITEM_ID, placements)))
    for item in items:
        if item in old_gids and old_gids[item] in GID_RANGE:
            gids[item] = old_gids[item]
    used_gids = set(gids.values())
    # the smallest free gid only grows as gids are given (none is given back here): one
    # pass over the range for all the items, not one per item (20,000 items on 5,000 gids
    # scanned the whole range for each of the 15,000 left without one)
    free_gids = (g for g in GID_RANGE if g not in used_gids)
    for item in items:
        if item not in gids:
            gid = next(free_gids, None)
            if gid is None:
                errors.append(f"{item}: no free gid in {GID_RANGE.start}-{GID_RANGE.stop - 1}")
                continue
            gids[item] = gid
            used_gids.add(gid)
    return gids, errors


def placements_by_node(placements: Iterable[Placement]) -> dict[str, list[Placement]]:
    """The placements of each node, in placement order."""
    by_node: dict[str, list[Placement]] = {}
    on_node = by_node.get
    for p in placements:
        ps = on_node(p.node_id)
        if ps is None:
            by_node[p.node_id] = [p]
        else:
            ps.append(p)
    return by_node


def collect_allocations(
    placements: Iterable[Placement],
    given: Mapping[str, Allocation | str | None],
    errors: list[str],
) -> dict[str, Allocation]:
    """The allocations of :func:`node_allocations` in placement order; each uid error is
    added to ``errors`` (in placement order)."""
    allocations: dict[str, Allocation] = {}
    for p in placements:
        got = given[p.instance_id]
        if type(got) is Allocation:
            allocations[p.instance_id] = got
        elif isinstance(got, str):
            errors.append(got)
    return allocations


def assign_ids(
    result: BalanceResult, old: Mapping[str, Allocation], old_gids: Mapping[str, int]
) -> tuple[dict[str, Allocation], dict[str, int], list[str]]:
    """Uids and gids for every placement (SPEC §9), deterministically.

    A gid belongs to an item and is unique in the unit (:func:`assign_gids`). A uid belongs to
    an instance identity and is kept across versions; it is unique among the instances *of a
    node* (SPEC §9 asks for 5000-9999 per identity, which cannot be unit-wide at 20,000
    instances): an instance keeps its uid while no other instance on its node holds it, else it
    takes the smallest free one (:func:`node_allocations`). Returns the allocations (in
    placement order), the gids, and errors for instances that found no free id (gids first,
    then uids in placement order).

    This is the reference: a watcher assigns through :class:`reconciler.accel.ids.IdsMemo`,
    which gives the same, recomputing only the nodes whose placements changed."""
    gids, errors = assign_gids(result.placements, old_gids)
    given: dict[str, Allocation | str | None] = {}
    for ps in placements_by_node(result.placements).values():
        given.update(zip([p.instance_id for p in ps], node_allocations(ps, old, gids), strict=True))
    return collect_allocations(result.placements, given, errors), gids, errors


def id_failures(
    placements: Iterable[Placement], allocations: Mapping[str, Allocation], gids: Mapping[str, int]
) -> dict[str, str]:
    """Why each placement :func:`assign_ids` gave no allocation has none (the allocations and
    gids it returned): its item found no free gid, or its node no free uid."""
    return {
        p.instance_id: _id_failure(p, gids) for p in placements if p.instance_id not in allocations
    }


def id_failure(
    result: BalanceResult, iid: str, old: Mapping[str, Allocation], old_gids: Mapping[str, int]
) -> str | None:
    """Why :func:`assign_ids` would give placed ``iid`` no allocation (None: it gives one), from
    its item's gid and its node's placements only (for ``explain``)."""
    p = result.by_id.get(iid)
    if p is None:
        return None
    gids, _ = assign_gids(result.placements, old_gids)
    ps = [q for q in result.placements if q.node_id == p.node_id]
    got = node_allocations(ps, old, gids)[ps.index(p)]
    return None if type(got) is Allocation else _id_failure(p, gids)


def _id_failure(p: Placement, gids: Mapping[str, int]) -> str:
    if p.item_id not in gids:
        taken = f"{GID_RANGE.start}-{GID_RANGE.stop - 1}"
        return f"{p.label}: no free gid in {taken} for its item (each placed item holds one)"
    taken = f"{UID_RANGE.start}-{UID_RANGE.stop - 1}"
    return f"{p.label}: no free uid in {taken} on node {p.node_id} (each instance there holds one)"


_ITEM_ID = attrgetter("item_id")


def node_allocations(
    ps: list[Placement], old: Mapping[str, Allocation], gids: Mapping[str, int]
) -> list[Allocation | str | None]:
    """Per placement of one node (in placement order): its allocation, the error when no uid
    is free, or None when its item has no gid. Kept uids first, in order, then the smallest
    free uid for each of the others."""
    olds = [old.get(p.instance_id) for p in ps]
    taken: set[int] = set()
    kept_uid: list[int | None] = []
    for prev in olds:
        uid = prev.uid if prev is not None else None
        if uid is not None and uid in UID_RANGE and uid not in taken:
            taken.add(uid)
            kept_uid.append(uid)
        else:
            kept_uid.append(None)
    out: list[Allocation | str | None] = []
    free_uids = (u for u in UID_RANGE if u not in taken)  # (one pass: see the gids')
    for p, prev, kept in zip(ps, olds, kept_uid, strict=True):
        if kept is None:
            kept = next(free_uids, None)
            if kept is None:
                out.append(f"{p.label}: no free uid on node {p.node_id}")
                continue
            taken.add(kept)
        uid = kept
        gid = gids.get(p.item_id)
        if gid is None:
            out.append(None)
            continue
        r = p.requested
        reserved = (r.cpu, r.ram, r.storage, r.state)
        if prev is not None and _unchanged(prev, p, reserved, uid, gid):
            out.append(prev)  # the same object: later caches hit by identity
            continue
        out.append(
            Allocation(
                p.item_id,
                p.subject_id,
                p.index,
                p.version,
                p.node_id,
                p.runtime_id,
                reserved,
                p.resources,
                p.devices,
                uid,
                gid,
                p.cause,
            )
        )
    return out


def _unchanged(
    prev: Allocation, p: Placement, reserved: tuple[int, int, int, int], uid: int, gid: int
) -> bool:
    """Whether the allocation :func:`assign_ids` would build for ``p`` equals ``prev`` and
    serialises to the same bytes: every field equal, and the numbers of the same type (``1``,
    ``1.0`` and ``True`` are equal but written differently; equal strings and tuples are written
    alike)."""
    held = prev.reserved
    return (
        prev.uid == uid
        and prev.node_id == p.node_id
        and prev.runtime_id == p.runtime_id
        and prev.devices == p.devices
        and prev.version == p.version
        and prev.gid == gid
        and held == reserved
        and prev.resources == p.resources
        and prev.cause == p.cause
        and prev.index == p.index
        and prev.item_id == p.item_id
        and prev.subject_id == p.subject_id
        and type(prev.uid) is type(uid)
        and type(prev.gid) is type(gid)
        and type(prev.index) is type(p.index)
        and type(held[0]) is type(reserved[0])
        and type(held[1]) is type(reserved[1])
        and type(held[2]) is type(reserved[2])
        and type(held[3]) is type(reserved[3])
    )


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


def next_generation(old: Checkpoint, **changes: Any) -> Checkpoint:
    """The checkpoint that follows ``old``, with ``changes`` applied."""
    return replace(old, generation=old.generation + 1, **changes)
