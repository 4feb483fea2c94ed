"""The checkpoint's delta (``allocations.delta.json``): a watcher writes what changed since the
whole generation, and whatever reads the checkpoint reads the whole one with its delta applied.

- a delta applied to its base is exactly the checkpoint it was made of (values and types, the
  bytes its whole encoding gives), for any change (hypothesis);
- along any sequence of a watcher's runs (its cache told which ids changed, as ``assign_ids``
  tells it), a fresh process loads each checkpoint written, whether as a delta or, past the
  compaction bound, whole;
- a damaged delta is quarantined and the generation before it used; a delta written against
  another whole generation (a run stopped between the whole write and the delta's removal) is
  ignored and then removed; a one-shot run writes the whole generation;
- a run stopped between any two steps of its commit leaves the old checkpoint or the new one.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.statedir import bump_instances, write_state_dir
from reconciler.accel import checkpoint as accel_checkpoint
from reconciler.accel.checkpoint import CheckpointCache
from reconciler.controller.reconcile import ReconcileCache, ReconcileOptions, reconcile
from reconciler.io import fsio
from reconciler.io.checkpoint_files import (
    CURRENT,
    DELTA,
    PREVIOUS,
    QUARANTINE,
    load_checkpoint,
    save_checkpoint,
)
from reconciler.planning.checkpoint import (
    Allocation,
    Checkpoint,
    decode_checkpoint,
    encode_checkpoint,
)
from reconciler.planning.checkpoint_delta import (
    apply_delta,
    base_checksum,
    decode_delta,
    delta_data,
    encode_delta,
)
from tests.planning.test_checkpoint_warm import ALERTS, SETTINGS, _same, _step, allocations


def _decoded(cp: Checkpoint) -> Checkpoint:
    """What a reader of ``cp``'s whole file gets."""
    return decode_checkpoint(encode_checkpoint(cp), None)


def _same_by_id(got: Checkpoint, want: Checkpoint) -> None:
    """:func:`_same` but for the order of the ids and items (a watcher's cache gives the ids
    and gids added by a run last: ``CheckpointMemo.decoded``, ``CheckpointCache``)."""
    by_id = dict(sorted(got.allocations.items()))
    _same(replace(got, allocations=by_id, gids=dict(sorted(got.gids.items()))), want)


# ---------------------------------------------------------------- the pure part


@SETTINGS
@given(st.data())
def test_a_delta_applied_to_its_base_is_the_checkpoint(data: st.DataObject) -> None:
    ids = [f"id-{k}" for k in range(8)]
    base = _decoded(
        Checkpoint(
            "lin",
            data.draw(st.integers(0, 5), label="generation"),
            {i: data.draw(allocations()) for i in data.draw(st.lists(st.sampled_from(ids)))},
            {"a": 5000, "b": 5001},
            data.draw(ALERTS, label="alerts"),
        )
    )
    allocs, gids = dict(base.allocations), dict(base.gids)
    alerts = dict(base.alerts)
    for step in range(data.draw(st.integers(0, 6), label="steps")):
        got = _step(data, allocs, gids, step)
        alerts = got if got is not None else alerts
    network = data.draw(st.sampled_from([{}, {"subnets": {"n": "10.0.0.0/24"}}]))
    cp = Checkpoint("lin", base.generation + 1, allocs, gids, alerts, network)
    checksum = base_checksum(encode_checkpoint(base))
    assert checksum is not None
    body, loose = delta_data(base, cp)
    # every id at which cp's allocation is not the base's object, and no other
    assert loose == {
        i
        for i in allocs.keys() | base.allocations.keys()
        if allocs.get(i) is not base.allocations.get(i)
    }
    raw = encode_delta(cp, base, checksum, body)
    got = apply_delta(base, decode_delta(raw, base, checksum))
    want = _decoded(cp)
    _same(got, want)
    assert got.network == want.network
    assert encode_checkpoint(got) == encode_checkpoint(want)
    # only what changed is in it: an unchanged checkpoint's delta names nothing
    same, _ = delta_data(base, base)
    assert same == {"gids": {}, "instances": {}}


def test_a_delta_names_its_base_by_checksum_and_generation() -> None:
    a = Allocation("svc", "s", 0, "1", "n1", "runc", (1, 2, 3, 4), (), (), 5000, 5000)
    base = _decoded(Checkpoint("lin", 3, {"i0": a}, {"svc": 5000}))
    checksum = base_checksum(encode_checkpoint(base)) or ""
    cp = Checkpoint("lin", 4, {}, {})
    raw = encode_delta(cp, base, checksum, delta_data(base, cp)[0])
    assert apply_delta(base, decode_delta(raw, base, checksum)) == cp
    other = _decoded(Checkpoint("lin", 3, {}, {"svc": 5000}))  # the same generation
    with pytest.raises(Exception, match="another full generation") as stale:
        decode_delta(raw, other, base_checksum(encode_checkpoint(other)) or "")
    assert getattr(stale.value, "reason", None) == "stale"
    with pytest.raises(Exception, match="lineage"):
        decode_delta(raw, _decoded(Checkpoint("other", 3, {"i0": a}, {"svc": 5000})), checksum)
    damaged = raw.replace(b'"i0":null', b'"i1":null', 1)
    assert damaged != raw
    with pytest.raises(Exception, match="checksum mismatch"):
        decode_delta(damaged, base, checksum)


# ---------------------------------------------------------------- a watcher's sequence


@SETTINGS
@given(st.data())
def test_a_watchers_checkpoints_load_in_a_fresh_process_along_any_sequence(
    data: st.DataObject,
) -> None:
    """Each run saves through one cache, told (``Checkpoint.since``) at which ids its
    allocations differ from the last run's, as ``assign_ids`` tells it; a fresh process and
    the cache both load exactly the checkpoint saved, every time, and a delta is what was
    written while it stays under the bound."""
    ids = [f"id-{k:02d}" for k in range(12)]
    cache = CheckpointCache()
    with tempfile.TemporaryDirectory() as tmp:
        cpdir = Path(tmp) / "checkpoint"
        allocs = {i: data.draw(allocations()) for i in data.draw(st.lists(st.sampled_from(ids)))}
        last = Checkpoint("lin", 1, allocs, {"a": 5000})
        save_checkpoint(cpdir, last, cache=cache)
        deltas = 0
        for generation in range(2, data.draw(st.integers(3, 8), label="runs")):
            loaded = load_checkpoint(cpdir, {}, cache=cache)
            assert loaded.source == "current" and not loaded.problems
            _same_by_id(loaded.checkpoint, _decoded(last))
            now = dict(last.allocations)
            for iid in data.draw(st.lists(st.sampled_from(ids), max_size=4), label="changed"):
                if data.draw(st.booleans(), label="remove") and iid in now:
                    del now[iid]
                elif data.draw(st.booleans(), label="equal copy") and iid in now:
                    now[iid] = Allocation(*(getattr(now[iid], f) for f in Allocation.__slots__))
                else:
                    now[iid] = data.draw(allocations())
            named = {i for i in ids if now.get(i) is not last.allocations.get(i)}
            named |= set(data.draw(st.lists(st.sampled_from(ids), max_size=2), label="too"))
            gids = dict(last.gids)
            if data.draw(st.booleans(), label="gids"):
                item = data.draw(st.sampled_from(["a", "b", "c"]))
                if data.draw(st.booleans(), label="remove gid"):
                    gids.pop(item, None)
                else:
                    gids[item] = data.draw(st.integers(5000, 5003))
            cp = Checkpoint(
                "lin",
                generation,
                now,
                gids if gids != last.gids else last.gids,  # (the very mapping, as IdsMemo)
                since=(last.allocations, frozenset(named)),
            )
            ratio = data.draw(st.sampled_from([1, 2, 8, 10_000]), label="compact ratio")
            files = save_checkpoint(
                cpdir,
                cp,
                cache=cache,
                current=loaded.current,
                base=loaded.base,
                compact_ratio=ratio,
            )
            deltas += files.delta is not None
            assert (cpdir / DELTA).exists() == (files.delta is not None)
            assert (cpdir / CURRENT).read_bytes() == files.current
            fresh = load_checkpoint(cpdir, {})
            assert fresh.delta == files.delta and not fresh.problems
            assert encode_checkpoint(fresh.checkpoint) == encode_checkpoint(cp)
            last = cp
        final = load_checkpoint(cpdir, {}, cache=cache)
        _same_by_id(final.checkpoint, _decoded(last))


# ---------------------------------------------------------------- the files


def _alloc(k: int) -> Allocation:
    return Allocation("svc", f"s{k}", k, "1", "n1", "runc", (k, 2, 3, 4), (), (), 5000 + k, 5000)


def _with_delta(tmp_path: Path) -> tuple[Path, Checkpoint, Checkpoint]:
    """A whole generation (1) and a delta (2) written against it."""
    cpdir = tmp_path / "checkpoint"
    base = Checkpoint("lin", 1, {f"i{k}": _alloc(k) for k in range(40)}, {"svc": 5000})
    save_checkpoint(cpdir, base)
    loaded = load_checkpoint(cpdir, {})
    now = dict(loaded.checkpoint.allocations)
    now["i3"] = _alloc(33)
    del now["i4"]
    new = Checkpoint("lin", 2, now, {"svc": 5000})
    files = save_checkpoint(cpdir, new, current=loaded.current, base=loaded.base)
    assert files.delta is not None and (cpdir / DELTA).read_bytes() == files.delta
    return cpdir, base, new


def test_a_watcher_reads_the_gids_of_its_own_delta_without_decoding_them_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gids of the delta a cache wrote come back as its base's, edited by the delta
    (a gid changed, one removed, one added), not sorted again whole; the same values as a
    fresh process reads."""
    cpdir = tmp_path / "checkpoint"
    cache = CheckpointCache()
    allocs = {f"i{k}": _alloc(k) for k in range(40)}
    save_checkpoint(
        cpdir, Checkpoint("lin", 1, allocs, {"b": 5001, "d": 5003, "a": 5000}), cache=cache
    )
    loaded = load_checkpoint(cpdir, {}, cache=cache)
    gids = {**loaded.checkpoint.gids, "c": 5002, "b": 5005}
    del gids["d"]
    now = dict(loaded.checkpoint.allocations)
    now["i3"] = _alloc(33)
    since = (loaded.checkpoint.allocations, frozenset({"i3"}))
    cp = Checkpoint("lin", 2, now, gids, since=since)
    files = save_checkpoint(cpdir, cp, cache=cache, current=loaded.current, base=loaded.base)
    assert files.delta is not None

    def whole(_gids: object) -> dict[str, int]:
        raise AssertionError("the gids were decoded whole")

    monkeypatch.setattr(accel_checkpoint, "decoded_gids", whole)
    got = load_checkpoint(cpdir, {}, cache=cache).checkpoint
    assert got.gids == {"a": 5000, "b": 5005, "c": 5002}
    assert list(got.gids) == ["a", "b", "c"]  # b edited where it was, d gone, c added last
    _same_by_id(got, load_checkpoint(cpdir, {}).checkpoint)


def test_a_damaged_delta_is_quarantined_and_the_generation_before_it_used(
    tmp_path: Path,
) -> None:
    cpdir, base, new = _with_delta(tmp_path)
    assert load_checkpoint(cpdir, {}).checkpoint == new
    raw = (cpdir / DELTA).read_bytes()
    (cpdir / DELTA).write_bytes(raw.replace(b'"cpu":33', b'"cpu":34'))
    plan = load_checkpoint(cpdir, {}, quarantine=False)  # read-only: nothing moved
    assert plan.checkpoint == base and plan.source == "previous"
    assert (cpdir / DELTA).exists()
    report = load_checkpoint(cpdir, {}, stamp=lambda: "x")
    assert report.checkpoint == base and report.source == "previous"
    assert report.problems == (
        f"{cpdir / DELTA}: checksum mismatch: stored "
        f"{report.problems[0].split('stored ')[1].split(',')[0]}, data "
        f"{report.problems[0].split('data ')[1].split(' ')[0]} (checksum); moved to "
        f"{cpdir / QUARANTINE / (DELTA + '.checksum.x')}",
    )
    assert not (cpdir / DELTA).exists()
    assert (cpdir / QUARANTINE / f"{DELTA}.checksum.x").exists()


def test_a_delta_against_another_whole_generation_is_ignored_then_removed(
    tmp_path: Path,
) -> None:
    cpdir, _base, new = _with_delta(tmp_path)
    stale = (cpdir / DELTA).read_bytes()
    newer = Checkpoint("lin", 3, dict(new.allocations), {"svc": 5000})
    save_checkpoint(cpdir, newer)  # whole (no base given): the delta goes
    assert not (cpdir / DELTA).exists()
    assert load_checkpoint(cpdir, {}).checkpoint == newer
    (cpdir / DELTA).write_bytes(stale)  # as a run stopped before the delta's removal left it
    report = load_checkpoint(cpdir, {})
    assert report.checkpoint == newer and report.source == "current" and not report.problems
    assert report.delta is None
    later = Checkpoint("lin", 4, dict(newer.allocations), {"svc": 5000, "x": 5001})
    files = save_checkpoint(cpdir, later, current=report.current, base=report.base)
    assert files.delta is not None and (cpdir / DELTA).read_bytes() == files.delta
    assert load_checkpoint(cpdir, {}).checkpoint == later


def test_the_whole_generation_is_written_past_the_bound(tmp_path: Path) -> None:
    cpdir, _base, _new = _with_delta(tmp_path)
    loaded = load_checkpoint(cpdir, {})
    base_bytes = (cpdir / CURRENT).read_bytes()
    grown = dict(loaded.checkpoint.allocations)
    for k in range(40, 60):  # 20 new allocations against 40: well past an eighth
        grown[f"j{k}"] = _alloc(k)
    cp = Checkpoint("lin", 3, grown, {"svc": 5000})
    files = save_checkpoint(cpdir, cp, current=loaded.current, base=loaded.base)
    assert files.delta is None and not (cpdir / DELTA).exists()
    assert (cpdir / CURRENT).read_bytes() == encode_checkpoint(cp) == files.current
    assert (cpdir / PREVIOUS).read_bytes() == base_bytes  # the generation before: its base
    assert load_checkpoint(cpdir, {}).checkpoint == cp


def test_a_watcher_writes_deltas_and_a_one_shot_run_the_whole_generation(
    tmp_path: Path,
) -> None:
    root = tmp_path / "unit"
    write_state_dir(root, 6, 24, actual_every=0)
    opts = ReconcileOptions(cache=ReconcileCache())
    view = reconcile(root, opts).computed.view  # the first run: whole
    assert not (root / "checkpoint" / DELTA).exists()
    service = sorted((root / "desired").rglob("*.yaml"))[0].stem
    bump_instances(root, service, +1)
    report = reconcile(root, opts, view)
    assert report.checkpoint_written and (root / "checkpoint" / DELTA).exists()
    whole = (root / "checkpoint" / CURRENT).read_bytes()
    assert load_checkpoint(root / "checkpoint", {}).checkpoint == report.computed.checkpoint
    bump_instances(root, service, +1)
    oneshot = reconcile(root, ReconcileOptions())
    assert not (root / "checkpoint" / DELTA).exists()
    assert (root / "checkpoint" / PREVIOUS).read_bytes() == whole
    assert (root / "checkpoint" / CURRENT).read_bytes() == encode_checkpoint(
        oneshot.computed.checkpoint
    )


# ---------------------------------------------------------------- crashes


@pytest.mark.parametrize(
    ("whole", "new_from"), [(False, 1), (True, 2)], ids=["delta", "whole generation"]
)
def test_a_run_stopped_between_any_two_steps_of_its_commit_leaves_old_or_new(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, whole: bool, new_from: int
) -> None:
    """The commit's steps applied up to each point, the rest not: the checkpoint loads as the
    one before the run or the one it wrote, never another. A delta is one step (its rename);
    a whole generation three (the previous file's link, the current file's rename, the
    delta's removal): after the second, the delta left is one against another generation."""
    real = fsio._apply
    for stop in range(5):
        cpdir, _base, old = _with_delta(tmp_path / f"{stop}")
        loaded = load_checkpoint(cpdir, {})
        now = dict(loaded.checkpoint.allocations)
        now["i5"] = _alloc(55)
        new = Checkpoint("lin", 3, now, {"svc": 5000})
        applied = [0]

        def step(
            kind: str, source: str, target: str, stop: int = stop, applied: list[int] = applied
        ) -> None:
            if applied[0] == stop:
                raise OSError(5, "stopped here")
            applied[0] += 1
            real(kind, source, target)

        monkeypatch.setattr(fsio, "_apply", step)
        base = None if whole else loaded.base
        try:
            with fsio.Commit() as commit:
                save_checkpoint(cpdir, new, current=loaded.current, base=base, commit=commit)
        except OSError:
            assert applied[0] == stop
        monkeypatch.undo()
        report = load_checkpoint(cpdir, {})
        assert not report.problems and report.source == "current"
        assert report.checkpoint == (new if stop >= new_from else old), stop
        assert (cpdir / DELTA).exists() == (not whole or stop < 3)
