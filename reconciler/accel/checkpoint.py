"""The checkpoint's memo and decode cache: what a long-running caller (``watch``) carries
from one run to the next, so that writing and reading back a checkpoint of 20,000 allocations
serialises, checks and converts only the allocations that changed. The bytes and values are
those of :func:`reconciler.planning.checkpoint.encode_checkpoint`, ``decode_checkpoint`` and
``as_decoded`` (the references; the tests compare)."""

from __future__ import annotations

import bisect
import json
from collections.abc import Mapping, Sequence
from dataclasses import replace

from reconciler.placement.instances import PreviousAllocation
from reconciler.planning.checkpoint import (
    STR_TYPES,
    Allocation,
    Checkpoint,
    as_decoded,
    canonical,
    canonical_plain,
    checkpoint_bytes,
    decode_checkpoint,
    decoded_form,
    decoded_gids,
    plain_envelope,
    plain_gids,
    plain_header,
    round_trip,
)
from reconciler.planning.checkpoint_delta import DeltaSince, with_delta

__all__ = ["CheckpointCache", "CheckpointMemo"]


class CheckpointMemo:
    """What was derived from each allocation object in the last call, per instance id, so that a
    long-running caller (``watch``, through :class:`CheckpointCache`) serialises, checks and
    converts only the allocations that changed since its last run.

    - :meth:`data_chunks`: the canonical bytes of ``cp.data()``, made of each allocation's
      canonical fragment (``,"<id>":{...}``). Fragments are kept for allocations in decoded form
      only (see :func:`~reconciler.planning.checkpoint.decoded_form`): their fields are exact
      ``str``, ``int`` and ``tuple`` values, immutable all the way down, so a fragment stays
      right while its object lives.
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
        """:func:`~reconciler.planning.checkpoint.encode_checkpoint`'s bytes, serialising only
        the allocations this memo has not seen (and keeping this call's fragments)."""
        chunks = self.data_chunks(cp)
        return checkpoint_bytes(cp, canonical(cp.data()) if chunks is None else b"".join(chunks))

    def as_decoded(self, cp: Checkpoint, gids: dict[str, int] | None = None) -> Checkpoint:
        """:func:`~reconciler.planning.checkpoint.as_decoded` of a checkpoint this memo encoded
        last: an allocation it kept a fragment of is known to be in decoded form, and the ids
        are in the order it sorted them (the same result, without checking each
        allocation). ``gids``: ``cp.gids`` as decoding gives them, when the caller knows them
        (:meth:`CheckpointCache.decode_delta`)."""
        if gids is None:
            gids = decoded_gids(cp.gids)
        alerts = json.loads(canonical(dict(cp.alerts)))
        network = json.loads(canonical(dict(cp.network)))
        known_form = self.decoded(cp.allocations)
        if known_form is not None:  # encoded last here, every allocation in decoded form
            return Checkpoint(cp.lineage, cp.generation, known_form, gids, dict(alerts), network)
        order = self.sorted_ids(cp.allocations)
        if order is None:
            return as_decoded(cp)
        allocations = {}
        known = self._fragments  # kept by data_chunks for allocations in decoded form only
        for iid in order:
            a = cp.allocations[iid]
            got = known.get(iid)
            if got is None or got[0] is not a:
                self.checked += 1
                if not decoded_form(a):
                    a = round_trip(a)
            allocations[iid] = a
        return Checkpoint(cp.lineage, cp.generation, allocations, gids, dict(alerts), network)

    def plain_envelope(self, cp: Checkpoint) -> bool:
        """:func:`~reconciler.planning.checkpoint.plain_envelope`, without looking at each id
        of allocations :meth:`decoded` answers for (their ids are exact ``str``: the last
        :meth:`data_chunks` or :meth:`took` call checked them, or kept them from the call
        before)."""
        if self.decoded(cp.allocations) is None:
            return plain_envelope(cp)
        return plain_header(cp)

    def sorted_ids(self, allocations: Mapping[str, object]) -> tuple[str, ...] | None:
        """``tuple(sorted(allocations))``; None when an id is not exactly a ``str`` (the
        caller then takes the plain path)."""
        if not set(map(type, allocations)) <= STR_TYPES:
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
        return self._chunks(cp, framed=True)

    def took(self, cp: Checkpoint) -> None:
        """What :meth:`data_chunks` keeps of ``cp``, without making its chunks: ``cp`` was
        written another way (a delta), and what this memo answers next is of ``cp``."""
        self._chunks(cp, framed=False)

    def _chunks(self, cp: Checkpoint, *, framed: bool) -> list[bytes] | None:
        allocations = cp.allocations
        last, lists, since = self._decoded, self._lists, cp.since
        self._decoded = self._lists = None
        self.patched = False
        self._prev_edit = None
        if since is not None and last is not None and lists is not None and since[0] is last[0]:
            frags = self._patched_chunks(cp, since[1], lists, last)
            if frags is not None:
                self.patched = True
                return self._framed(cp, [b"", *frags]) if framed else None
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
                if not decoded_form(a):  # (its types unchecked: the stdlib serialiser)
                    part = b"," + canonical(iid) + b":" + canonical(a.to_json())
                    if got is not None:  # mutable, could change under us: not kept
                        del known[iid]
                    chunks.append(part)
                    every = False
                    continue
                self.converted += 1
                part = b"," + canonical_plain(iid) + b":" + canonical_plain(a.to_json())
                got = known[iid] = (a, part, a.previous())
            chunks.append(got[1])
            if every:
                decoded[iid] = a
                previous[iid] = got[2]
        if every:
            self._decoded = (allocations, decoded, previous)
            self._lists = (order, chunks[1:])
        return self._framed(cp, chunks) if framed else None

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
        """The fragments (each with its leading comma) of allocations that are the last
        call's but at ``ids``: the last call's fragments in id order (``lists``, this memo's
        own: edited in place), edited at those ids, and its decoded and previous mappings
        (``last``) copied and edited. None (the caller takes the whole pass) when one is not
        in decoded form, or when :meth:`sorted_ids` was given other ids since."""
        if lists[0] is not self._order:
            return None
        allocations = cp.allocations
        order: Sequence[str] = lists[0]  # (a list once an id is added or removed)
        frags = lists[1]
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
                    order = order if isinstance(order, list) else list(order)
                    del order[pos], frags[pos]
                    known.pop(iid, None)
                    removed.append(iid)
                continue
            got = known.get(iid)
            if got is None or got[0] is not a:
                if not decoded_form(a):
                    return None
                self.serialised += 1
                self.converted += 1
                part = b"," + canonical_plain(iid) + b":" + canonical_plain(a.to_json())
                got = known[iid] = (a, part, a.previous())
            if present:
                frags[pos] = got[1]
            else:
                order = order if isinstance(order, list) else list(order)
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
        return frags

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
        if not plain_gids(gids):
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
        # the last delta decoded and the last written: the base it applies to (the very object
        # decode() returned, so the same current file's bytes), its bytes, the checkpoint
        self._delta: tuple[Checkpoint, bytes, Checkpoint] | None = None
        self._written_delta: tuple[Checkpoint, bytes, Checkpoint] | None = None
        # the base and the checkpoint of the last delta written, and what delta_since needs
        self._since: tuple[Checkpoint, Mapping[str, Allocation], DeltaSince] | None = None
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
            and plain_envelope(written[1])
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

    def encode(self, cp: Checkpoint) -> bytes:
        """:func:`~reconciler.planning.checkpoint.encode_checkpoint`, through the memo."""
        return self.memo.encode(cp)

    def wrote(self, raw: bytes, cp: Checkpoint) -> None:
        """``raw`` is ``encode_checkpoint(cp)``, just written."""
        self._written = (raw, cp)
        self._written_delta = None

    def decode_delta(self, base: Checkpoint, current: bytes, delta: bytes) -> Checkpoint:
        """``apply_delta(base, decode_delta(...))``, or what the same delta on the same base
        (the very object :meth:`decode` returned) gave last time; for the delta this process
        wrote on the file it was written against, what decoding gives of the checkpoint
        written, without parsing (as :meth:`decode` does for a whole generation)."""
        last = self._delta
        if last is not None and last[0] is base and last[1] == delta:
            return last[2]
        written = self._written_delta
        cp: Checkpoint | None = None
        if (
            written is not None
            and written[0] is base
            and written[1] == delta
            and self.memo.plain_envelope(written[2])
        ):
            try:  # (the memo encoded it: see save_checkpoint)
                cp = self.memo.as_decoded(written[2], self._patched_gids(base, written[2]))
            except (KeyError, TypeError, ValueError, AttributeError):
                cp = None
        if cp is None:
            cp = with_delta(base, current, delta)
        cp = replace(cp, memo=self.memo)
        self._delta = (base, delta, cp)
        return cp

    def _patched_gids(self, base: Checkpoint, cp: Checkpoint) -> dict[str, int] | None:
        """``cp``'s gids as decoding the delta written last on ``base`` gives them: ``base``'s
        (as decoding gave them: :meth:`decode` returned it) edited by the delta's gids, when
        that delta was written for ``cp`` and its gids are exact ``str`` items and ``int``
        gids (what decoding gives of them); None otherwise (the caller decodes them whole).
        A gid edited or removed keeps the order of the file; an item added comes last (looked
        up by item only, as :meth:`CheckpointMemo.decoded` says of the ids)."""
        last = self._since
        if last is None or last[0] is not base or last[2].gids is None:
            return None
        written, changes = last[2].gids
        if written is not cp.gids:
            return None
        gids = dict(base.gids)
        for item, gid in changes.items():
            if type(item) is not str or (gid is not None and type(gid) is not int):
                return None
            if gid is None:
                gids.pop(item, None)
            else:
                gids[item] = gid
        return gids

    def delta_since(self, base: Checkpoint, cp: Checkpoint) -> DeltaSince | None:
        """The ids of the last delta written and those ``cp.since`` names, when that delta
        was against ``base`` and ``cp``'s allocations are its checkpoint's but at those ids."""
        last, since = self._since, cp.since
        if last is None or last[0] is not base or since is None or since[0] is not last[1]:
            return None
        return DeltaSince(last[2].ids | since[1], last[2].gids)

    def wrote_delta(
        self, delta: bytes, cp: Checkpoint, base: Checkpoint, since: DeltaSince
    ) -> None:
        """``delta`` makes ``base`` (what :meth:`decode` returned) into ``cp``; it was just
        written (``since``: see the protocol). The memo takes ``cp``'s allocations as if it had
        encoded them (what it keeps from run to run is theirs then, as after a whole
        write)."""
        self.memo.took(cp)
        self._written_delta = (base, delta, cp)
        self._since = (base, cp.allocations, since)
