"""The checkpoint's delta: what changed since the last full generation, in a small file.

A watcher's run changes a handful of allocations; rewriting, hashing and syncing the whole
checkpoint (5.5 MB at 20,000 instances) for them is most of what its edit costs. So a
long-running controller writes ``checkpoint/allocations.delta.json`` instead: the changes of the
current generation against the full file (the *base*, ``allocations.json``), named by the
base's checksum, with its own checksum. The checkpoint is the base with its delta applied.
When the delta grows past an eighth of the base, or when a one-shot run writes the checkpoint,
the whole generation is written again and the delta removed (:mod:`reconciler.io.checkpoint_files`).

The delta file is ``{base, baseGeneration, checksum, data, formatVersion, generation, lineage}``
in canonical form (sorted keys, no spaces): ``base`` is the base's ``checksum`` field,
``checksum`` is ``sha256:`` + the hex digest of the canonical bytes of ``data``, and ``data``
holds

- ``instances``: each instance id whose allocation differs from the base's, with its allocation
  (as in the base) or ``null`` where the base has one and the current generation has none;
- ``gids``: each item whose gid differs, with its gid or ``null``;
- ``alerts`` and ``network``: the whole section, only when it differs from the base's.

This module is the pure part: computing, encoding, decoding and applying a delta.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reconciler.planning.checkpoint import (
    Allocation,
    Checkpoint,
    CheckpointError,
    canonical,
    checked_envelope,
    envelope_tail,
    plain_gids,
)

__all__ = [
    "COMPACT_RATIO",
    "DeltaSince",
    "apply_delta",
    "base_checksum",
    "decode_delta",
    "delta_data",
    "encode_delta",
    "with_delta",
]

COMPACT_RATIO = 8
"""A delta whose bytes reach ``1/COMPACT_RATIO`` of the base's is not written: the whole
generation is, and the delta removed (a delta only grows until then: it holds every change
since the base)."""

_CANONICAL_HEAD = re.compile(rb'\{"checksum":"(sha256:[0-9a-f]{64})"')


def base_checksum(raw: bytes) -> str | None:
    """The ``checksum`` field of a full checkpoint file's bytes (read at its head, where the
    canonical form puts it; parsed otherwise), None when it has none. The caller has decoded
    ``raw`` (so the field is the verified checksum of its data)."""
    head = _CANONICAL_HEAD.match(raw)
    if head is not None:
        return head.group(1).decode()
    try:
        env = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    value = env.get("checksum") if isinstance(env, dict) else None
    return value if isinstance(value, str) else None


def _differs(a: Allocation, b: Allocation) -> bool:
    return a is not b and canonical(a.to_json()) != canonical(b.to_json())


def delta_data(
    base: Checkpoint, cp: Checkpoint, since: DeltaSince | None = None
) -> tuple[dict[str, Any], frozenset[str]]:
    """The ``data`` of the delta that makes ``base`` into ``cp`` (see the module docstring),
    and the ids at which ``cp``'s allocation is not the base's very object (the changed ones
    and those equal to the base's). ``base`` is in decoded form (what decoding gives: its
    allocations are immutable), so an allocation that is the base's object is the base's
    value: it costs an identity check. ``since``: what the caller knows from the last delta
    it wrote against this base; the result is the same."""
    was, now = base.allocations, cp.allocations
    instances: dict[str, Any] = {}
    loose: list[str] = []
    if since is not None:
        for iid in since.ids:
            a, old = now.get(iid), was.get(iid)
            if a is old:
                continue
            loose.append(iid)
            if a is None:
                instances[iid] = None
            elif old is None or _differs(a, old):
                instances[iid] = a.to_json()
    else:
        for iid, a in now.items():
            old = was.get(iid)
            if old is not a:
                loose.append(iid)
                if old is None or _differs(a, old):
                    instances[iid] = a.to_json()
        if len(was) + len(loose) != len(now):  # some of the base's are gone
            for iid in was.keys() - now.keys():
                instances[iid] = None
                loose.append(iid)
    gids: dict[str, int | None] = {}
    old_gids, new_gids = base.gids, cp.gids
    if since is not None and since.gids is not None and since.gids[0] is new_gids:
        gids = dict(since.gids[1])
    elif plain_gids(old_gids) and plain_gids(new_gids):  # exact str and int: == is canonical's
        if dict(old_gids) != dict(new_gids):
            gids = {item: gid for item, gid in new_gids.items() if old_gids.get(item) != gid}
            gids.update(dict.fromkeys(old_gids.keys() - new_gids.keys()))
    else:
        for item, gid in new_gids.items():
            if item not in old_gids or canonical(old_gids[item]) != canonical(gid):
                gids[item] = gid
        for item in old_gids.keys() - new_gids.keys():
            gids[item] = None
    out: dict[str, Any] = {"gids": gids, "instances": instances}
    if canonical(dict(cp.alerts)) != canonical(dict(base.alerts)):
        out["alerts"] = dict(cp.alerts)
    if canonical(dict(cp.network)) != canonical(dict(base.network)):
        out["network"] = dict(cp.network)
    return out, frozenset(loose)


@dataclass(frozen=True)
class DeltaSince:
    """What the writer of the last delta knows of the next one's: every id at which the
    allocations may not be the base's very objects (those of the last delta's
    :func:`delta_data` and those changed since), and the last gids mapping (the very
    object) with its part of the delta."""

    ids: frozenset[str]
    gids: tuple[Mapping[str, int], Mapping[str, int | None]] | None = None


def encode_delta(cp: Checkpoint, base: Checkpoint, checksum: str, data: Mapping[str, Any]) -> bytes:
    """The delta file's bytes: ``data`` (from :func:`delta_data`) for ``cp`` against ``base``,
    whose file's checksum field is ``checksum``."""
    body = canonical(dict(data))
    return b"".join(  # canonical() of the envelope, the data's bytes spliced in
        (
            b'{"base":',
            canonical(checksum),
            b',"baseGeneration":',
            canonical(base.generation),
            b',"checksum":',
            canonical("sha256:" + hashlib.sha256(body).hexdigest()),
            b',"data":',
            body,
            envelope_tail(cp),
        )
    )


def decode_delta(raw: bytes, base: Checkpoint, checksum: str) -> dict[str, Any]:
    """The delta's parsed envelope, checked: its own checksum, format and generation, and that
    it was written against ``base`` (whose file's checksum field is ``checksum``) of the same
    lineage. Raises :class:`CheckpointError`; the reason ``stale`` names a delta written
    against another base (one replaced by a later full generation, whose run stopped before
    it removed the delta): not a damaged file, only one to ignore."""
    env, data = checked_envelope(raw, "the checkpoint's delta")
    if env.get("lineage") != base.lineage:
        raise CheckpointError(
            "lineage", f"the delta belongs to lineage {env.get('lineage')}, not {base.lineage}"
        )
    if env.get("base") != checksum or env.get("baseGeneration") != base.generation:
        raise CheckpointError("stale", "the delta was written against another full generation")
    generation = env.get("generation")
    if type(generation) is not int or generation < base.generation:
        raise CheckpointError("unparsable", f"invalid generation {generation!r}")
    for key in ("instances", "gids"):
        if not isinstance(data.get(key), dict):
            raise CheckpointError("unparsable", f"the delta's data lacks {key}")
    return env


def apply_delta(base: Checkpoint, env: Mapping[str, Any]) -> Checkpoint:
    """The checkpoint ``env`` (from :func:`decode_delta`) makes of ``base``: what decoding the
    whole generation's file would give. Raises :class:`CheckpointError` for malformed data."""
    data = env["data"]
    try:
        allocations = dict(base.allocations)
        added = False
        for iid, a in data["instances"].items():
            if a is None:
                allocations.pop(iid, None)
            else:
                added = added or iid not in allocations
                allocations[str(iid)] = Allocation.from_json(a)
        gids = dict(base.gids)
        for item, gid in data["gids"].items():
            if gid is None:
                gids.pop(item, None)
            else:
                gids[str(item)] = int(gid)
        alerts = dict(data["alerts"]) if "alerts" in data else dict(base.alerts)
        network = dict(data["network"]) if "network" in data else dict(base.network)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CheckpointError("unparsable", f"malformed delta data: {e!r}") from None
    return Checkpoint(
        base.lineage,
        env["generation"],
        dict(sorted(allocations.items())) if added else allocations,
        dict(sorted(gids.items())),
        alerts,
        network,
    )


def with_delta(base: Checkpoint, current: bytes, delta: bytes) -> Checkpoint:
    """``base``, decoded from the whole file's bytes ``current``, with the delta file's bytes
    ``delta`` checked and applied. Raises :class:`CheckpointError`."""
    checksum = base_checksum(current)
    if checksum is None:
        raise CheckpointError("stale", "the current file has no checksum to name")
    return apply_delta(base, decode_delta(delta, base, checksum))
