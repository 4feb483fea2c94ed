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

import bisect
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import Any

from reconciler.model.documents import ActualState
from reconciler.placement.instances import (
    BalanceResult,
    Cause,
    DeviceIds,
    Placement,
    PreviousAllocation,
    new_requested,
)

__all__ = [
    "FORMAT_VERSION",
    "GID_RANGE",
    "UID_RANGE",
    "Allocation",
    "Checkpoint",
    "CheckpointCache",
    "CheckpointError",
    "CheckpointMemo",
    "as_decoded",
    "assign_gids",
    "assign_ids",
    "canonical",
    "collect_allocations",
    "decode_cached",
    "decode_checkpoint",
    "encode_checkpoint",
    "next_generation",
    "node_allocations",
    "placements_by_node",
    "rebuild_from_actual",
]

FORMAT_VERSION = 1
UID_RANGE = range(5000, 10000)
GID_RANGE = range(5000, 10000)


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
    memo: CheckpointMemo | None = field(default=None, kw_only=True, compare=False, repr=False)
    """Not part of the value: the :class:`CheckpointMemo` of the :class:`CheckpointCache` that
    returned this checkpoint, so that :meth:`previous` reuses what it built last run."""
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
        only the changed ones are serialised."""
        if _plain_gids(self.gids) and _plain_gids(other.gids):
            if dict(self.gids) != dict(other.gids):  # exact str keys, int values: as canonical
                return False
        elif canonical(dict(sorted(self.gids.items()))) != canonical(
            dict(sorted(other.gids.items()))
        ):
            return False
        if canonical(dict(self.alerts)) != canonical(dict(other.alerts)):
            return False
        if canonical(dict(self.network)) != canonical(dict(other.network)):
            return False
        mine, theirs = self.allocations, other.allocations
        if mine.keys() != theirs.keys():
            return False
        for iid, a in mine.items():
            b = theirs[iid]
            if a is not b and canonical(a.to_json()) != canonical(b.to_json()):
                return False
        return True


def encode_checkpoint(cp: Checkpoint) -> bytes:
    """The file's bytes (:meth:`CheckpointMemo.encode` gives the same bytes, serialising only
    the allocations it has not seen)."""
    return _encode(cp, None)


def _encode(cp: Checkpoint, memo: CheckpointMemo | None) -> bytes:
    """:func:`encode_checkpoint`, with ``memo``'s chunks when it has them."""
    chunks = memo.data_chunks(cp) if memo is not None else None
    body = canonical(cp.data()) if chunks is None else b"".join(chunks)
    checksum = "sha256:" + hashlib.sha256(body).hexdigest()
    # canonical() of the envelope {checksum, data, formatVersion, generation, lineage} (sorted
    # keys), with the data's canonical bytes spliced in rather than serialised a second time
    # (one join: each + of the body would copy its megabytes)
    return b"".join(
        (
            b'{"checksum":',
            canonical(checksum),
            b',"data":',
            body,
            b',"formatVersion":',
            canonical(FORMAT_VERSION),
            b',"generation":',
            canonical(cp.generation),
            b',"lineage":',
            canonical(cp.lineage),
            b"}\n",
        )
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
        network = dict(data.get("network", {}))  # absent in checkpoints written before it
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CheckpointError("unparsable", f"malformed checkpoint data: {e!r}") from None
    return Checkpoint(lineage, generation, allocations, gids, alerts, network)


class CheckpointMemo:
    """What was derived from each allocation object in the last call, per instance id, so that a
    long-running caller (``watch``, through :class:`CheckpointCache`) serialises, checks and
    converts only the allocations that changed since its last run.

    - :meth:`data_chunks`: the canonical bytes of ``cp.data()``, made of each allocation's
      canonical fragment (``,"<id>":{...}``). Fragments are kept for allocations in decoded form
      only (see :func:`_decoded_form`): their fields are exact ``str``, ``int`` and ``tuple``
      values, immutable all the way down, so a fragment stays right while its object lives.
      Being in that table also tells :func:`as_decoded` that the allocation is in decoded form.
      When every allocation of the call is in decoded form, the same loop also leaves what
      decoding the bytes gives (:meth:`decoded`: the allocations, the same objects) and
      their ``PreviousAllocation`` values, so that loading the file just written and
      :meth:`previous` of what it gives cost no pass over the allocations.
    - :meth:`sorted_ids`: the instance ids in sorted order, from the last call's order with the
      ids added inserted and the ids removed left out.
    - :meth:`previous`: :meth:`Checkpoint.previous`, reusing the ``PreviousAllocation`` built for
      the same allocation object (its fields are that object's fields, so it is what building
      it again gives), kept beside its fragment; for the allocations :meth:`decoded` gave, a
      copy of the mapping the encoding loop built.

    An entry holds the allocation object itself: a strong reference, so its ``id`` cannot be
    reused while the entry lives, and it serves only that very object (``is``), never an equal
    one. Entries of ids absent from the last call are dropped, so a table holds the last call's
    allocations only. A memo belongs to one caller (not thread-safe, like the cache). The
    counters tell how much work was done (the tests and benchmarks read them)."""

    def __init__(self) -> None:
        self._fragments: dict[str, tuple[Allocation, bytes, PreviousAllocation]] = {}
        self._previous: dict[str, tuple[Allocation, PreviousAllocation]] = {}  # not in decoded form
        # the last data_chunks call's allocations (the mapping it was given), as decoding gives
        # them (see decoded() on the order) and their PreviousAllocations, when every one was
        # in decoded form
        self._decoded: (
            tuple[Mapping[str, Allocation], dict[str, Allocation], dict[str, PreviousAllocation]]
            | None
        ) = None
        # with _decoded: the ids in order (the _order tuple itself) and the fragments aligned
        # with them, each with its leading comma (a patched call edits copies of these)
        self._lists: tuple[tuple[str, ...], list[bytes]] | None = None
        self._order: tuple[str, ...] = ()  # sorted
        self._ids: set[str] = set()  # the same ids
        self._version = 0  # of _order and _ids, counted up when they change
        self._fragments_version = 0  # the version _fragments was made for
        self._gids: tuple[dict[str, int], bytes] | None = None
        self.serialised = 0  # allocations serialised by data_chunks
        self.checked = 0  # allocations as_decoded checked (not known from a fragment)
        self.converted = 0  # PreviousAllocations built
        self.placed = 0  # ids sorted or inserted by sorted_ids (not kept from the last order)
        self.patched = False  # whether the last data_chunks call edited the last one's lists
        # the previous mapping a patched data_chunks call copied and the ids it edited; the
        # last mapping previous() copied and the copy it handed out
        self._prev_edit: tuple[dict[str, PreviousAllocation], frozenset[str]] | None = None
        self._handed: tuple[dict[str, PreviousAllocation], dict[str, PreviousAllocation]] | None
        self._handed = None
        self.previous_since: tuple[Mapping[str, PreviousAllocation], frozenset[str]] | None = None
        """After :meth:`previous`: the mapping the call before handed out and the ids at which
        this one may differ from it (they are copies of the encoder's mappings, one edited
        from the other), for :func:`~reconciler.placement.balancer.balance`'s ``previous_since``;
        None
        when that does not hold."""

    def encode(self, cp: Checkpoint) -> bytes:
        """:func:`encode_checkpoint`'s bytes, serialising only the allocations this memo has
        not seen (and keeping this call's fragments)."""
        return _encode(cp, self)

    def as_decoded(self, cp: Checkpoint) -> Checkpoint:
        """:func:`as_decoded` of a checkpoint this memo encoded last, without checking the
        allocations it knows to be in decoded form."""
        return _as_decoded(cp, self)

    def sorted_ids(self, allocations: Mapping[str, object]) -> tuple[str, ...] | None:
        """``tuple(sorted(allocations))``; None when an id is not exactly a ``str`` (the
        caller then takes the plain path)."""
        if not set(map(type, allocations)) <= _STR:
            return None
        known = self._ids
        ids = allocations.keys()
        if ids == known:
            return self._order
        added = ids - known
        gone = len(known) - (len(ids) - len(added))
        removed = known - ids if gone else set()
        if 64 * (len(added) + gone) > len(ids):  # many changes: sorting beats editing
            order = sorted(ids)
            self._ids = set(order)
            self.placed += len(order)
        else:
            order = list(self._order)
            for k in removed:
                del order[bisect.bisect_left(order, k)]
            for k in added:
                bisect.insort(order, k)
            known -= removed
            known |= added
            self.placed += len(added)
        self._order = tuple(order)
        self._version += 1
        return self._order

    def data_chunks(self, cp: Checkpoint) -> list[bytes] | None:
        """Chunks whose concatenation is ``canonical(cp.data())``, the allocations' fragments
        taken from the last call where the allocation is the same object; None when an id is
        not exactly a ``str``."""
        allocations = cp.allocations
        last, lists, since = self._decoded, self._lists, cp.since
        self._decoded = self._lists = None
        self.patched = False
        self._prev_edit = None
        if since is not None and last is not None and lists is not None and since[0] is last[0]:
            patched = self._patched_chunks(cp, since[1], lists, last)
            if patched is not None:
                self.patched = True
                return patched
        order = self.sorted_ids(allocations)
        if order is None:
            return None
        known = self._fragments
        if self._fragments_version != self._version:  # other ids than last time: drop gone ones
            for iid in known.keys() - self._ids:
                del known[iid]
            self._fragments_version = self._version
        chunks: list[bytes] = [b""]
        decoded: dict[str, Allocation] = {}  # what decoding gives: id order, the same objects
        previous: dict[str, PreviousAllocation] = {}
        every = True  # every allocation in decoded form so far
        for iid in order:
            a = allocations[iid]
            got = known.get(iid)
            if got is None or got[0] is not a:
                self.serialised += 1
                part = b"," + canonical(iid) + b":" + canonical(a.to_json())
                if not _decoded_form(a):
                    if got is not None:  # mutable, could change under us: not kept
                        del known[iid]
                    chunks.append(part)
                    every = False
                    continue
                self.converted += 1
                got = known[iid] = (a, part, a.previous())
            chunks.append(got[1])
            if every:
                decoded[iid] = a
                previous[iid] = got[2]
        if every:
            self._decoded = (allocations, decoded, previous)
            self._lists = (order, chunks[1:])
        return self._framed(cp, chunks)

    def _framed(self, cp: Checkpoint, chunks: list[bytes]) -> list[bytes]:
        """``chunks`` (an empty first one, then each fragment with its leading comma) made the
        canonical bytes of ``cp.data()``: the keys sorted (alerts, gids, instances), the
        instances' ids sorted, no spaces; each fragment is exactly what the whole dump writes
        for that pair. Changes ``chunks`` in place."""
        if len(chunks) > 1:
            chunks[1] = chunks[1][1:]  # no comma before the first
        chunks[0] = (
            b'{"alerts":'
            + canonical(dict(cp.alerts))
            + b',"gids":'
            + self._gids_bytes(cp.gids)
            + b',"instances":{'
        )
        chunks.append(b"}" + self._network_bytes(cp) + b"}")
        return chunks

    @staticmethod
    def _network_bytes(cp: Checkpoint) -> bytes:
        """``,"network":{...}`` after the instances (keys sorted), or nothing while empty."""
        return b',"network":' + canonical(dict(cp.network)) if cp.network else b""

    def _patched_chunks(
        self,
        cp: Checkpoint,
        ids: frozenset[str],
        lists: tuple[tuple[str, ...], list[bytes]],
        last: tuple[Mapping[str, Allocation], dict[str, Allocation], dict[str, PreviousAllocation]],
    ) -> list[bytes] | None:
        """:meth:`data_chunks` for allocations that are the last call's but at ``ids``: the
        last call's fragments in id order, edited at those ids, and its decoded and previous
        mappings (``last``) copied and edited. None (the
        caller takes the whole pass) when one is not in decoded form, or when
        :meth:`sorted_ids` was given other ids since."""
        if lists[0] is not self._order:
            return None
        allocations = cp.allocations
        order = list(lists[0])
        frags = list(lists[1])
        known = self._fragments
        added: list[str] = []
        removed: list[str] = []
        for iid in sorted(ids):
            if type(iid) is not str:
                return None
            pos = bisect.bisect_left(order, iid)
            present = pos < len(order) and order[pos] == iid
            a = allocations.get(iid)
            if a is None:
                if present:
                    del order[pos], frags[pos]
                    known.pop(iid, None)
                    removed.append(iid)
                continue
            got = known.get(iid)
            if got is None or got[0] is not a:
                if not _decoded_form(a):
                    return None
                self.serialised += 1
                self.converted += 1
                part = b"," + canonical(iid) + b":" + canonical(a.to_json())
                got = known[iid] = (a, part, a.previous())
            if present:
                frags[pos] = got[1]
            else:
                order.insert(pos, iid)
                frags.insert(pos, got[1])
                added.append(iid)
        if len(order) != len(allocations):  # (not expected: ``ids`` names every change)
            return None
        if added or removed:
            self._ids.difference_update(removed)
            self._ids.update(added)
            self._order = tuple(order)
            self._version += 1
            self._fragments_version = self._version
            self.placed += len(added)
        # the last mappings copied (C-level, no rehashing) and edited: an edit or a removal
        # keeps the id order, an added id comes last (see decoded())
        decoded, previous = dict(last[1]), dict(last[2])
        self._prev_edit = (last[2], ids)
        for iid in ids:
            a = allocations.get(iid)
            if a is None:
                decoded.pop(iid, None)
                previous.pop(iid, None)
            else:
                decoded[iid] = a
                previous[iid] = known[iid][2]
        self._decoded = (allocations, decoded, previous)
        self._lists = (self._order, frags)
        return self._framed(cp, [b"", *frags])

    def decoded(self, allocations: Mapping[str, Allocation]) -> dict[str, Allocation] | None:
        """``allocations`` as decoding gives them (the very objects, every one in decoded
        form), when they are the mapping the last :meth:`data_chunks` call encoded (unchanged
        since: the caller's promise) and every one was in decoded form; else None. The same
        mapping each time: a caller must not change it.

        In id order, as decoding gives them, except after calls that edited the last call's
        lists (:attr:`Checkpoint.since`): an id added by one of those comes last (a dictionary
        cannot insert in the middle, and building 20,000 entries again costs 2 ms). The
        checkpoint read back is only looked up by id (``assign_ids``' old allocations, the
        balancer's ``previous``); whatever writes one sorts by id (``Checkpoint.data``)."""
        last = self._decoded
        if last is None or allocations is not last[0] or len(allocations) != len(last[1]):
            return None
        return last[1]

    def _gids_bytes(self, gids: Mapping[str, int]) -> bytes:
        """``canonical(dict(sorted(gids.items())))``, the last bytes again for equal plain
        gids (exact ``str`` keys and ``int`` values serialise alike when equal)."""
        if not _plain_gids(gids):
            return canonical(dict(sorted(gids.items())))
        last = self._gids
        if last is not None and last[0] == gids:
            return last[1]
        snapshot = dict(gids)
        data = canonical(dict(sorted(snapshot.items())))
        self._gids = (snapshot, data)
        return data

    def previous(self, allocations: Mapping[str, Allocation]) -> dict[str, PreviousAllocation]:
        """``{iid: a.previous() for iid, a in allocations.items()}``."""
        last = self._decoded
        handed, edit = self._handed, self._prev_edit
        self._handed = self.previous_since = None
        if last is not None and allocations is last[1]:  # what decoded() handed out
            copy = dict(last[2])
            if handed is not None and edit is not None and edit[0] is handed[0]:
                # last[2] is the mapping the call before copied, edited at these ids
                self.previous_since = (handed[1], edit[1])
            self._handed = (last[2], copy)
            return copy
        fragments = self._fragments
        known = self._previous
        out: dict[str, PreviousAllocation] = {}
        for iid, a in allocations.items():
            got = fragments.get(iid)
            if got is not None and got[0] is a:
                out[iid] = got[2]
                continue
            was = known.get(iid)
            if was is None or was[0] is not a:
                self.converted += 1
                was = known[iid] = (a, a.previous())
            out[iid] = was[1]
        if known.keys() - out.keys():  # ids removed since the last call: drop their entries
            for iid in [k for k in known if k not in out]:
                del known[iid]
        return out


class CheckpointCache:
    """The last checkpoint file this process decoded or wrote, by its exact bytes (and the
    lineage it was checked against): decoding the same bytes again gives the same checkpoint,
    so a long-running caller (``watch``) parses and verifies an unchanged checkpoint file once,
    and does not parse the file it has just written.

    It also carries a :class:`CheckpointMemo` from run to run: :func:`save_checkpoint` encodes
    through it, :func:`as_decoded` (the file just written) checks through it, and the
    checkpoints :meth:`decode` returns carry it so that their :meth:`Checkpoint.previous` uses
    it. Bytes that are not exactly the ones written or decoded last are decoded and verified in
    full (checksum, lineage); the memo only saves work on the objects it has seen."""

    def __init__(self) -> None:
        self._key: tuple[bytes, str | None] | None = None
        self._checkpoint: Checkpoint | None = None
        self._written: tuple[bytes, Checkpoint] | None = None  # decoded when first needed
        self.memo = CheckpointMemo()

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
                cp = self.memo.as_decoded(written[1])
            except (KeyError, TypeError, ValueError, AttributeError):
                cp = decode_checkpoint(raw, expected_lineage)  # raises what decoding raises
        else:
            cp = decode_checkpoint(raw, expected_lineage)
        cp = replace(cp, memo=self.memo)
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
        and set(map(type, cp.allocations)) <= _STR
    )


def _exact_str(value: object) -> bool:
    return type(value) is str


_STR = {str}
_INT = {int}


def _plain_gids(gids: Mapping[str, int]) -> bool:
    """Exact ``str`` keys and exact ``int`` values (not ``bool``): what decoding gives, and
    equal as values exactly when equal as canonical JSON."""
    # (C-level passes: it runs several times a run over every item's gid)
    return set(map(type, gids)) <= _STR and set(map(type, gids.values())) <= _INT


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
    parsing the allocations that are already in decoded form (:meth:`CheckpointMemo.as_decoded`
    also skips checking each one)."""
    return _as_decoded(cp, None)


def _as_decoded(cp: Checkpoint, memo: CheckpointMemo | None) -> Checkpoint:
    """:func:`as_decoded`. ``memo``: the one ``cp`` was encoded with; an allocation it kept a
    fragment of is known to be in decoded form, and the ids are in the order it sorted them
    (the same result, without checking each allocation)."""
    if _plain_gids(cp.gids):  # what the round trip gives: the same str and int objects
        gids = dict(sorted(cp.gids.items()))
    else:
        data_gids = json.loads(canonical(dict(sorted(cp.gids.items()))))
        gids = {str(k): int(v) for k, v in data_gids.items()}
    alerts = json.loads(canonical(dict(cp.alerts)))
    network = json.loads(canonical(dict(cp.network)))
    known_form = memo.decoded(cp.allocations) if memo is not None else None
    if known_form is not None:  # encoded last by the memo, every allocation in decoded form
        return Checkpoint(cp.lineage, cp.generation, known_form, gids, dict(alerts), network)
    order = memo.sorted_ids(cp.allocations) if memo is not None else None
    if order is None or memo is None:
        allocations = {
            iid: a if _decoded_form(a) else _round_trip(a)
            for iid, a in sorted(cp.allocations.items())
        }
    else:
        allocations = {}
        known = memo._fragments  # kept by data_chunks for allocations in decoded form only
        for iid in order:
            a = cp.allocations[iid]
            got = known.get(iid)
            if got is None or got[0] is not a:
                memo.checked += 1
                if not _decoded_form(a):
                    a = _round_trip(a)
            allocations[iid] = a
    return Checkpoint(cp.lineage, cp.generation, allocations, gids, dict(alerts), network)


def _round_trip(a: Allocation) -> Allocation:
    return Allocation.from_json(json.loads(canonical(a.to_json())))


def decode_cached(raw: bytes, expected: str | None, cache: CheckpointCache | None) -> Checkpoint:
    return cache.decode(raw, expected) if cache is not None else decode_checkpoint(raw, expected)


# ----------------------------------------------------------------------------- uids and gids


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
