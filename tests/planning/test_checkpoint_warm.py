"""The checkpoint's warm path (issue 9): ``CheckpointMemo`` and ``assign_ids``' reuse of the
previous allocation objects must give exactly what the plain functions give, through any
sequence of checkpoints, and a run after one change must do work for that change only.

- ``memo.encode(cp)`` is ``encode_checkpoint(cp)`` byte for byte, ``memo.as_decoded(cp)``
  is ``decode_checkpoint`` of those bytes (values, types, order), ``Checkpoint.previous``
  through a memo is the plain one, along hypothesis-generated sequences of changes (allocations
  added, removed, copied, changed in one field, made mutable and mutated; gids and alerts
  changed; an id that is not an exact ``str``);
- ``assign_ids`` equals the reference implementation (the one before the reuse), and reuses an
  old allocation exactly when building it again would give the same value;
- a checkpoint file changed on disk behind the cache is decoded and verified in full;
- after one desired-file edit, a warm ``reconcile`` serialises, checks and converts only the
  allocations that changed, and writes the bytes a process without a cache writes.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.strategies import DrawFn

from benchmarks.statedir import bump_instances, write_state_dir
from reconciler.accel.checkpoint import CheckpointCache, CheckpointMemo
from reconciler.accel.ids import IdsMemo
from reconciler.controller.reconcile import ReconcileCache, ReconcileOptions, reconcile
from reconciler.io.checkpoint_files import (
    CURRENT,
    load_checkpoint,
    save_checkpoint,
)
from reconciler.placement.instances import BalanceResult, Placement, PreviousAllocation, Requested
from reconciler.planning.checkpoint import (
    GID_RANGE,
    UID_RANGE,
    Allocation,
    Checkpoint,
    assign_ids,
    canonical,
    decode_checkpoint,
    encode_checkpoint,
)

SETTINGS = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


class _Key(str):
    """An instance id that is a ``str`` subclass: the memo must take the plain path."""


def _shape(value: Any) -> Any:
    """The value with the type of every part, to compare what ``==`` does not tell apart
    (``1``, ``1.0`` and ``True``; a list and a tuple inside an allocation)."""
    if isinstance(value, Allocation):
        return (Allocation, tuple(_shape(getattr(value, f.name)) for f in fields(value)))
    if isinstance(value, list | tuple):
        return (type(value), tuple(_shape(v) for v in value))
    if isinstance(value, Mapping):
        return (type(value), tuple((_shape(k), _shape(v)) for k, v in value.items()))
    return (type(value), value)


def _same(got: Checkpoint, want: Checkpoint, *, exact_ids: bool = True) -> None:
    """Equal, and of the same types all the way down. ``exact_ids=False``: an id of a str
    subclass may stay one (``as_decoded`` keeps the caller's id objects)."""
    assert got == want
    for name in ("allocations", "gids", "alerts"):
        mine, theirs = getattr(got, name), getattr(want, name)
        if not exact_ids:
            mine, theirs = ({str(k): v for k, v in m.items()} for m in (mine, theirs))
        assert _shape(mine) == _shape(theirs), name


# ---------------------------------------------------------------- strategies

TEXT = st.sampled_from(["a", "b", "é", 'q"x', "z\\", "😀", "n1", "n2"])
NUMBER = st.integers(0, 2**40)


@st.composite
def devices(draw: DrawFn) -> tuple[tuple[str, tuple[str, ...]], ...]:
    kinds = draw(st.lists(st.sampled_from(["gpu", "npu", "é"]), unique=True, max_size=2))
    return tuple((k, tuple(draw(st.lists(TEXT, max_size=2)))) for k in sorted(kinds))


@st.composite
def allocations(draw: DrawFn) -> Allocation:
    """In decoded form (exact types, device resources sorted): what the controller makes."""
    return Allocation(
        draw(TEXT),
        draw(TEXT),
        draw(st.integers(0, 9)),
        draw(TEXT),
        draw(TEXT),
        draw(TEXT),
        (draw(NUMBER), draw(NUMBER), draw(NUMBER), draw(NUMBER)),
        tuple(draw(st.lists(TEXT, max_size=2))),
        draw(devices()),
        draw(st.integers(4990, 10010)),
        draw(st.integers(4990, 10010)),
        draw(st.sampled_from([None, "rebalanced", "preempted"])),
    )


def _odd(a: Allocation, how: int) -> Allocation:
    """Not in decoded form, yet encodable and decodable (as ``test_perf_caches`` lists)."""
    odd: list[dict[str, Any]] = [
        {"resources": list(a.resources)},  # a list: mutable
        {"devices": [(r, list(ids)) for r, ids in a.devices]},
        {"reserved": (float(a.reserved[0]), *a.reserved[1:])},
        {"uid": True},
        {"devices": (("zz", ("b", "a")), ("aa", ("x",)))},  # not sorted
        {"devices": (("gpu", ("g0",)), ("gpu", ("g1",)))},  # a resource twice
        {"index": float(a.index)},
    ]
    return replace(a, **odd[how % len(odd)])


ALERTS = st.dictionaries(
    TEXT,
    st.recursive(
        st.none() | st.booleans() | st.integers(-5, 5) | st.floats(-2, 2) | TEXT,
        lambda inner: st.lists(inner, max_size=2) | st.dictionaries(TEXT, inner, max_size=2),
        max_leaves=4,
    ),
    max_size=2,
)

STEPS = st.sampled_from(
    ["add", "remove", "field", "copy", "odd", "mutate", "gids", "alerts", "same", "key", "many"]
)


def _step(
    data: st.DataObject, allocs: dict[str, Allocation], gids: dict[str, int], step: int
) -> Any:
    """One change to ``allocs`` or ``gids``, in place; returns new alerts or None."""
    what = data.draw(STEPS, label=f"step {step}")
    ids = sorted(allocs)
    pick = data.draw(st.sampled_from(ids), label="which") if ids else None
    if what == "add" or pick is None:
        new_id = data.draw(st.sampled_from([f"n{step}", f"i{step}x", "a0", "zz", "é"]))
        allocs[new_id] = data.draw(allocations())
    elif what == "remove":
        del allocs[pick]
    elif what == "field":
        a = allocs[pick]
        change: dict[str, Any] = data.draw(
            st.sampled_from(
                [
                    {"uid": a.uid + 1},
                    {"node_id": a.node_id + "x"},
                    {"devices": ()},
                    {"cause": "rebalanced" if a.cause is None else None},
                    {"reserved": (a.reserved[0] + 1, *a.reserved[1:])},
                ]
            )
        )
        allocs[pick] = replace(a, **change)
    elif what == "copy":  # an equal allocation, another object
        allocs[pick] = replace(allocs[pick])
    elif what == "odd":
        allocs[pick] = _odd(allocs[pick], data.draw(st.integers(0, 20)))
    elif what == "mutate":  # a list inside an allocation seen last time, changed in place
        a = allocs[pick]
        if isinstance(a.resources, list):
            a.resources.append(data.draw(TEXT))
        else:
            listed: Any = [*a.resources, "added"]
            allocs[pick] = replace(a, resources=listed)
    elif what == "gids":
        gid: Any = data.draw(st.sampled_from([5000, 5002, 7000, True, 5000.0]))
        gids[data.draw(st.sampled_from(["a", "b", "c"]))] = gid
    elif what == "alerts":
        return data.draw(ALERTS)
    elif what == "key":  # an id of a str subclass
        allocs[_Key(pick + "k")] = allocs.pop(pick)
    elif what == "many":  # more than a few ids at once: the order is sorted afresh
        for k in range(data.draw(st.integers(1, 12))):
            allocs[f"m{step}-{k}"] = data.draw(allocations())
    return None


# ---------------------------------------------------------------- encode, decode, previous


@SETTINGS
@given(st.data())
def test_memo_gives_the_plain_results_along_any_sequence(data: st.DataObject) -> None:
    """Each checkpoint of the sequence encoded, decoded and converted through one memo (and
    one cache), each compared with the plain functions; the objects are changed in place
    between steps, as a caller's would be."""
    n = data.draw(st.integers(0, 6), label="allocations")
    allocs: dict[str, Allocation] = {f"i{k}": data.draw(allocations()) for k in range(n)}
    gids: dict[str, int] = {"a": 5000, "b": 5001}
    alerts: Any = {}
    memo = CheckpointMemo()
    cache = CheckpointCache()
    last: Checkpoint | None = None
    for generation in range(data.draw(st.integers(1, 8), label="steps")):
        if generation:
            got = _step(data, allocs, gids, generation)
            alerts = alerts if got is None else got
        cp = Checkpoint("lin", generation, dict(allocs), dict(gids), alerts)
        plain = encode_checkpoint(cp)
        assert memo.encode(cp) == plain
        if last is not None:
            same = canonical(cp.data()) == canonical(last.data())
            assert cp.same_data(last) is same and last.same_data(cp) is same
            # a checkpoint other than the one the memo saw last: its objects are checked
            want_last = decode_checkpoint(encode_checkpoint(last), "lin")
            exact = not any(type(k) is _Key for k in last.allocations)
            _same(memo.as_decoded(last), want_last, exact_ids=exact)
        last = replace(cp, allocations=dict(cp.allocations), gids=dict(cp.gids))
        want = decode_checkpoint(plain, "lin")
        decoded = memo.as_decoded(cp)
        _same(decoded, want, exact_ids=not any(type(k) is _Key for k in allocs))
        assert list(decoded.allocations) == list(want.allocations)
        prev = memo.previous(cp.allocations)
        assert prev == {iid: a.previous() for iid, a in cp.allocations.items()}
        assert list(prev) == list(cp.allocations)
        # the same through the cache, as save_checkpoint and load_checkpoint use it
        assert cache.memo.encode(cp) == plain
        cache.wrote(plain, cp)
        loaded = cache.decode(plain, "lin")
        _same(loaded, want)
        assert list(loaded.allocations) == list(want.allocations)
        assert loaded.memo is cache.memo
        assert loaded.previous() == {iid: a.previous() for iid, a in want.allocations.items()}


def _alloc(k: int, **over: Any) -> Allocation:
    base = Allocation(
        "com.example.a",
        "s",
        k,
        "1.0",
        f"n{k % 7}",
        "runc-1",
        (100, 200, 0, 0),
        ("r",),
        (("gpu", (f"g{k}",)),),
        5000 + k,
        5000,
    )
    return replace(base, **over)


def _big(n: int = 300) -> Checkpoint:
    return Checkpoint("lin", 1, {f"id-{k:04d}": _alloc(k) for k in range(n)}, {"a": 5000})


def test_a_run_after_one_change_serialises_checks_and_converts_that_one() -> None:
    cache = CheckpointCache()
    memo = cache.memo
    cp = _big()
    raw = memo.encode(cp)
    assert memo.serialised == 300
    cache.wrote(raw, cp)
    loaded = cache.decode(raw, "lin")
    assert memo.checked == 0  # every allocation known from its fragment
    loaded.previous()
    assert memo.converted == 300
    # one allocation changed, one added, one removed
    allocs = dict(loaded.allocations)
    allocs["id-0007"] = replace(allocs["id-0007"], uid=9999)
    allocs["id-0150x"] = _alloc(150, node_id="n9")
    del allocs["id-0200"]
    nxt = Checkpoint("lin", 2, allocs, dict(loaded.gids))
    raw2 = memo.encode(nxt)
    assert raw2 == encode_checkpoint(nxt)
    assert memo.serialised == 302
    assert memo.placed == 300 + 1  # the new id inserted, the others kept in order
    cache.wrote(raw2, nxt)
    loaded2 = cache.decode(raw2, "lin")
    _same(loaded2, decode_checkpoint(raw2, "lin"))
    assert memo.checked == 0
    assert loaded2.previous() == {i: a.previous() for i, a in nxt.allocations.items()}
    assert memo.converted == 302
    # the tables hold the last call's allocations only (all in decoded form: with fragments)
    assert set(memo._fragments) == set(allocs) and not memo._previous
    # the file just written decodes to the very objects the encoding saw, in id order
    assert loaded2.allocations is memo.decoded(nxt.allocations)
    assert list(loaded2.allocations) == sorted(allocs)


def test_a_mutable_allocation_is_serialised_again_after_a_change() -> None:
    memo = CheckpointMemo()
    odd = _alloc(1, resources=["r"])
    cp = Checkpoint("lin", 1, {"x": odd, "y": _alloc(2)})
    assert memo.encode(cp) == encode_checkpoint(cp)
    odd.resources.append("s")  # type: ignore[attr-defined]
    raw = memo.encode(cp)
    assert raw == encode_checkpoint(cp)
    assert json.loads(raw)["data"]["instances"]["x"]["resources"] == ["r", "s"]
    _same(memo.as_decoded(cp), decode_checkpoint(raw, "lin"))


def test_as_decoded_checks_an_object_the_memo_did_not_see() -> None:
    """The memo saw an allocation in decoded form under an id; another checkpoint holds an
    object of another shape there: known by id, not by object, so it is checked."""
    cache = CheckpointCache()
    seen = Checkpoint("lin", 1, {"x": _alloc(1), "y": _alloc(2)})
    cache.memo.encode(seen)
    for odd in (_odd(_alloc(1), k) for k in range(7)):
        other = Checkpoint("lin", 2, {"x": odd, "y": seen.allocations["y"]})
        raw = encode_checkpoint(other)
        want = decode_checkpoint(raw, "lin")
        _same(cache.memo.as_decoded(other), want)
        cache.wrote(raw, other)  # written without the memo
        _same(cache.decode(raw, "lin"), want)


def test_ids_that_are_not_strings_take_the_plain_path() -> None:
    memo = CheckpointMemo()
    cp = Checkpoint("lin", 1, {"x": _alloc(1)})
    assert memo.encode(cp) == encode_checkpoint(cp)
    numbered: Any = {7: _alloc(7), 10: _alloc(10)}  # json writes the keys as strings
    other = Checkpoint("lin", 2, numbered)
    raw = memo.encode(other)
    assert raw == encode_checkpoint(other)
    assert set(json.loads(raw)["data"]["instances"]) == {"7", "10"}
    assert memo.encode(cp) == encode_checkpoint(cp)


# ---------------------------------------------------------------- assign_ids


def _smallest_free(used: set[int], space: range) -> int | None:
    for candidate in space:
        if candidate not in used:
            return candidate
    return None


def _assign_ids_reference(
    result: BalanceResult, old: Mapping[str, Allocation], old_gids: Mapping[str, int]
) -> tuple[dict[str, Allocation], dict[str, int], list[str]]:
    """``assign_ids`` as it was before it reused allocations: every one built anew."""
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
    for p in result.placements:
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


AMOUNT: st.SearchStrategy[Any] = st.integers(0, 3) | st.sampled_from([1.0, True])  # all equal


@st.composite
def placements(draw: DrawFn) -> list[Placement]:
    out = []
    for k in range(draw(st.integers(0, 12))):
        req: Any = Requested(draw(AMOUNT), draw(AMOUNT), draw(AMOUNT), draw(AMOUNT))
        index: Any = draw(st.integers(0, 2) | st.sampled_from([True, 1.0]))
        out.append(
            Placement(
                f"i{k}",
                draw(st.sampled_from(["a", "b", "c"])),
                draw(st.sampled_from(["s", "t"])),
                index,
                draw(st.sampled_from(["1", "2"])),
                0,
                draw(st.sampled_from(["n1", "n2"])),
                draw(st.sampled_from(["runc", "crun"])),
                req,
                tuple(draw(st.lists(st.sampled_from(["r", "q"]), max_size=2))),
                draw(st.sampled_from([(), (("gpu", ("g0",)),), (("gpu", ("g1",)),)])),
                (),
                draw(st.sampled_from([None, "rebalanced"])),
            )
        )
    return out


@st.composite
def assign_cases(
    draw: DrawFn,
) -> tuple[BalanceResult, dict[str, Allocation], dict[str, int]]:
    """Placements, and old allocations as the placements made them in an earlier call (the
    warm case), some left out, some with one field or one number's type changed, some uids
    taken by another instance of the node or out of range; gids as they were, or changed."""
    result = BalanceResult(tuple(draw(placements())), ())
    first_gids: dict[str, int] = {}
    for item in ("a", "b", "c"):
        gid: Any = draw(st.sampled_from([None, 5000, 5001, 5002, 4000, 5001.0]))
        if gid is not None:
            first_gids[item] = gid
    first, old_gids, _ = _assign_ids_reference(result, {}, first_gids)
    if draw(st.booleans()):
        item = draw(st.sampled_from(["a", "b", "c"]))
        changed: Any = draw(st.sampled_from([None, 5000, 5003, 4000, 5001.0]))
        if changed is None:
            old_gids.pop(item, None)
        else:
            old_gids[item] = changed
    uids = [a.uid for a in first.values()]
    old: dict[str, Allocation] = {}
    for iid, a in first.items():
        if draw(st.integers(0, 5)) == 0:
            continue
        r = a.reserved
        change: dict[str, Any] = draw(
            st.sampled_from(
                [
                    {},
                    {},
                    {},
                    {},
                    {"uid": draw(st.sampled_from(uids))},  # maybe another's on the node
                    {"uid": float(a.uid)},
                    {"uid": 4999},
                    {"gid": float(a.gid)},
                    {"node_id": "n3"},
                    {"runtime_id": "other"},
                    {"version": "9"},
                    {"devices": (("gpu", ("g9",)),)},
                    {"devices": [("gpu", ["g0"])]},
                    {"resources": list(a.resources)},
                    {"cause": "preempted"},
                    {"index": float(a.index)},
                    {"index": not a.index},
                    {"reserved": (float(r[0]), *r[1:])},
                    {"reserved": (*r[:3], r[3] + 1)},
                    {"reserved": list(r)},
                    {"item_id": "zz"},
                    {"subject_id": "zz"},
                ]
            ),
            label=f"change of {iid}",
        )
        old[iid] = replace(a, **change)
    return result, old, old_gids


@SETTINGS
@given(assign_cases())
def test_assign_ids_reuses_exactly_what_it_would_build_again(
    case: tuple[BalanceResult, dict[str, Allocation], dict[str, int]],
) -> None:
    result, old, old_gids = case
    got, gids, errors = assign_ids(result, old, old_gids)
    want, want_gids, want_errors = _assign_ids_reference(result, old, old_gids)
    assert (gids, errors) == (want_gids, want_errors)
    assert list(got) == list(want)
    assert _shape(got) == _shape(want)
    for iid, a in got.items():
        prev = old.get(iid)
        rebuilt_is_old = prev is not None and _shape(prev) == _shape(want[iid])
        assert (a is prev) is rebuilt_is_old, iid  # reused exactly when nothing differs


def test_assign_ids_keeps_the_old_objects_of_unchanged_placements() -> None:
    ps = [
        Placement(f"i{k}", "a", "s", k, "1", 0, f"n{k % 3}", "runc", Requested(1, 2, 3, 4), (), ())
        for k in range(50)
    ]
    result = BalanceResult(tuple(ps), ())
    first, gids, _ = assign_ids(result, {}, {})
    moved = replace(ps[7], node_id="n9")
    second, _, _ = assign_ids(BalanceResult((*ps[:7], moved, *ps[8:]), ()), first, gids)
    assert [iid for iid in second if second[iid] is not first[iid]] == ["i7"]
    assert second["i7"].node_id == "n9"


@SETTINGS
@given(data=st.data(), small_ranges=st.booleans())
def test_assign_ids_with_a_memo_gives_what_it_gives_without(
    data: st.DataObject, small_ranges: bool
) -> None:
    """Along a sequence of calls, each given the allocations the last one made (as a watcher
    does), sometimes changed behind the memo's back: the memo's answer is the plain one, object
    for object. With ``small_ranges`` (3 uids, 2 gids) nodes and items run out of ids."""
    from unittest import mock

    import reconciler.planning.checkpoint as checkpoint

    uids = range(5000, 5003) if small_ranges else UID_RANGE
    gid_range = range(5000, 5002) if small_ranges else GID_RANGE
    with (
        mock.patch.object(checkpoint, "UID_RANGE", uids),
        mock.patch.object(checkpoint, "GID_RANGE", gid_range),
    ):
        memo = IdsMemo()
        ps = data.draw(placements(), label="placements")
        old: dict[str, Allocation] = {}
        gids: dict[str, int] = {}
        for step in range(data.draw(st.integers(1, 6), label="steps")):
            result = BalanceResult(tuple(ps), ())
            got = memo.assign(result, old, gids)
            want = assign_ids(result, old, gids)
            assert got[1:] == want[1:]
            assert list(got[0]) == list(want[0]) and _shape(got[0]) == _shape(want[0])
            assert all((got[0][i] is old.get(i)) == (want[0][i] is old.get(i)) for i in got[0])
            old, gids = dict(got[0]), dict(got[1])
            how = data.draw(st.integers(0, 6), label=f"change {step}")
            if how == 1 and ps:  # a placement moves
                k = data.draw(st.integers(0, len(ps) - 1))
                ps[k] = replace(ps[k], node_id=data.draw(st.sampled_from(["n1", "n2", "n3"])))
            elif how == 2 and ps:  # one leaves
                del ps[data.draw(st.integers(0, len(ps) - 1))]
            elif how == 3:  # new ones
                ps += [
                    replace(q, instance_id=f"{q.instance_id}x{step}")
                    for q in data.draw(placements())
                ]
            elif how == 4 and old:  # an allocation changed behind the memo's back
                iid = data.draw(st.sampled_from(sorted(old)))
                old[iid] = replace(old[iid], uid=data.draw(st.sampled_from([5000, 5001, 5002])))
            elif how == 5 and gids:  # a gid changed
                item = data.draw(st.sampled_from(sorted(gids)))
                others = [g for g in (5000, 5001, 5002, 4000) if g != gids[item]]
                gids[item] = data.draw(st.sampled_from(others))
            elif how == 6 and ps:  # the same placement, a new object
                k = data.draw(st.integers(0, len(ps) - 1))
                ps[k] = replace(ps[k])


# ---------------------------------------------------------------- a file changed on disk


def _cpdir(tmp_path: Path) -> tuple[Path, CheckpointCache, Checkpoint, Checkpoint]:
    cpdir = tmp_path / "checkpoint"
    cache = CheckpointCache()
    one = _big(40)
    two = Checkpoint("lin", 2, {**one.allocations, "id-0003": _alloc(3, uid=9000)}, one.gids)
    save_checkpoint(cpdir, one, cache=cache)
    loaded = load_checkpoint(cpdir, {}, cache=cache).checkpoint
    save_checkpoint(cpdir, two, cache=cache)
    assert loaded == one
    assert load_checkpoint(cpdir, {}, cache=cache).checkpoint == two  # now cached
    return cpdir, cache, one, two


def test_a_corrupted_file_is_detected_though_the_cache_holds_the_last_bytes(
    tmp_path: Path,
) -> None:
    cpdir, cache, one, _two = _cpdir(tmp_path)
    raw = (cpdir / CURRENT).read_bytes()
    bad = raw.replace(b'"uid":9000', b'"uid":9001', 1)  # same length, checksum now wrong
    assert bad != raw and len(bad) == len(raw)
    (cpdir / CURRENT).write_bytes(bad)
    report = load_checkpoint(cpdir, {}, cache=cache, stamp=lambda: "t")
    assert report.source == "previous"
    assert any("checksum" in p for p in report.problems)
    assert report.checkpoint == one
    assert (cpdir / "quarantine" / f"{CURRENT}.checksum.t").read_bytes() == bad


def test_a_valid_file_written_by_another_process_is_read_as_written(tmp_path: Path) -> None:
    cpdir, cache, _one, two = _cpdir(tmp_path)
    # another writer: same lineage, one allocation changed, a correct checksum
    other = Checkpoint("lin", 3, {**two.allocations, "id-0005": _alloc(5, node_id="far")})
    (cpdir / CURRENT).write_bytes(encode_checkpoint(other))
    report = load_checkpoint(cpdir, {}, cache=cache)
    assert report.source == "current" and not report.problems
    _same(report.checkpoint, decode_checkpoint(encode_checkpoint(other), "lin"))
    assert report.checkpoint.previous()["id-0005"].node_id == "far"
    # and the next save through the memo writes what a fresh encoding writes
    nxt = replace(report.checkpoint, generation=4, memo=None)
    save_checkpoint(cpdir, nxt, cache=cache)
    assert (cpdir / CURRENT).read_bytes() == encode_checkpoint(nxt)


# ---------------------------------------------------------------- reconcile


def _run(root: Path, opts: ReconcileOptions, view: Any = None) -> Any:
    return reconcile(root, opts, view).computed


def test_warm_reconcile_after_an_edit_works_on_the_change_only(tmp_path: Path) -> None:
    warm_dir, cold_dir = tmp_path / "warm", tmp_path / "cold"
    write_state_dir(warm_dir, 30, 120, actual_every=0)
    cache = ReconcileCache()
    opts = ReconcileOptions(cache=cache)
    memo = cache.checkpoint.memo
    computed = _run(warm_dir, opts)  # cold: writes the checkpoint
    shutil.copytree(warm_dir, cold_dir)  # the same lineage from here on
    view = _run(warm_dir, opts, computed.view).view  # unchanged inputs
    service = min(a.item_id for a in computed.checkpoint.allocations.values())  # one placed
    for delta in (+1, -1, +2):
        for root in (warm_dir, cold_dir):
            bump_instances(root, service, delta)
        before = dict(vars(memo))
        last = load_checkpoint(warm_dir / "checkpoint", {}).checkpoint.allocations
        computed = _run(warm_dir, opts, view)
        view = computed.view
        _run(cold_dir, ReconcileOptions())  # a process without any cache
        # the watcher wrote a delta; what it holds, read by a fresh process, is the very
        # checkpoint a one-shot run writes whole
        loaded = load_checkpoint(warm_dir / "checkpoint", {})
        assert loaded.source == "current" and loaded.delta is not None
        assert len(loaded.delta) * 8 < len(loaded.current or b"")
        raw = (cold_dir / "checkpoint" / CURRENT).read_bytes()
        assert encode_checkpoint(loaded.checkpoint) == raw
        assert raw == encode_checkpoint(decode_checkpoint(raw, None))
        new = computed.checkpoint.allocations
        changed = [i for i in new if i not in last or new[i] != last[i]]
        removed = [i for i in last if i not in new]
        assert 1 <= len(changed) + len(removed) <= abs(delta)
        work = {k: v - before[k] for k, v in vars(memo).items() if isinstance(v, int)}
        assert work["serialised"] == len(changed), work  # the others joined from fragments
        assert work["checked"] == 0, work  # the file just written: known, not checked
        assert work["converted"] <= 2, work  # the previous run's new allocations only
        assert memo.patched  # told by assign_ids which allocations changed


@SETTINGS
@given(st.data())
def test_an_encoder_told_what_changed_gives_the_plain_results(data: st.DataObject) -> None:
    """A checkpoint naming the ids at which its allocations differ from the mapping the memo
    encoded last (``Checkpoint.since``, as ``assign_ids`` sets it): its bytes, what decoding
    them gives and its previous placements are the plain ones, whether ids were replaced,
    removed or added (the memo edits its last lists and mappings)."""
    memo = CheckpointMemo()
    ids = [f"id-{k:02d}" for k in range(12)]
    allocs: dict[str, Allocation] = {
        iid: data.draw(allocations()) for iid in data.draw(st.lists(st.sampled_from(ids)))
    }
    memo.encode(Checkpoint("lin", 1, allocs))
    patched = 0
    handed: dict[str, PreviousAllocation] | None = None  # by previous() right before
    for generation in range(2, data.draw(st.integers(3, 6), label="checkpoints")):
        now = dict(allocs)
        for iid in data.draw(st.lists(st.sampled_from(ids), max_size=4), label="changed"):
            if data.draw(st.booleans(), label="remove") and iid in now:
                del now[iid]
            else:
                now[iid] = data.draw(allocations())
        named = {i for i in ids if now.get(i) is not allocs.get(i)}
        named |= set(data.draw(st.lists(st.sampled_from(ids), max_size=2), label="named too"))
        cp = Checkpoint("lin", generation, now, since=(allocs, frozenset(named)))
        raw = memo.encode(cp)
        assert raw == encode_checkpoint(cp)
        patched += memo.patched
        want = decode_checkpoint(raw, "lin").allocations
        back = memo.decoded(now)  # (in id order but for the ids added: see decoded())
        assert back is not None and back == want
        assert all(back[iid] is now[iid] for iid in want)  # the very objects
        allocs = now
        if not data.draw(st.booleans(), label="previous asked"):  # (a run that failed)
            handed = None
            continue
        previous = memo.previous(back)
        assert previous == {i: a.previous() for i, a in want.items()}
        since = memo.previous_since  # (what the balancer's memo is told: see balance())
        assert (since is not None) == (handed is not None)  # after a previous() right before
        if since is not None:
            assert since[0] is handed
            for iid in (previous.keys() | since[0].keys()) - since[1]:
                assert previous.get(iid) is since[0].get(iid), iid
        handed = previous
    assert patched == generation - 1  # each one after the first edited the last one's lists
