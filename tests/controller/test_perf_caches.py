"""The caches of the warm path (issue 9): each one must pick up every changed input.

- ``BuildMemo``: a memoized OCI config is rebuilt when the service, the node (a resource entry,
  a device pool), the uid/gid, or a host answer (a group's gid, a device node) changes;
- ``CheckpointCache``, ``Checkpoint.same_data`` and ``encode_checkpoint`` give what the plain
  canonical serialisation gives;
- ``NodeStatusCache``: the status' node section equals the one computed from scratch;
- ``ReconcileCache.outputs``: an out/ file edited behind the controller's back is rewritten;
- ``reconcile`` with a ``ReconcileCache`` and one builder across runs writes what a fresh
  process writes.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

import reconciler.io.fsio
from reconciler.accel.build import BuildMemo
from reconciler.accel.checkpoint import CheckpointCache
from reconciler.controller import status as status_module
from reconciler.controller.configs import default_config_builder
from reconciler.controller.reconcile import ReconcileCache, ReconcileOptions, reconcile
from reconciler.controller.status import (
    AllocationIds,
    NodeStatusCache,
    build_status,
    node_statuses,
    status_bytes,
)
from reconciler.io.loader import load_state
from reconciler.model.jsonbytes import pretty_json
from reconciler.oci.builder import ConfigJob, DevicePolicy, build_all, config_json
from reconciler.placement.instances import BalanceResult
from reconciler.planning.checkpoint import (
    FORMAT_VERSION,
    Allocation,
    Checkpoint,
    as_decoded,
    canonical,
    decode_checkpoint,
    encode_checkpoint,
)
from tests.support.builders import reported
from tests.support.oci import (
    GPU0,
    HOSTS,
    ROOTFS,
    FakeDevices,
    FakeGroups,
    cdev,
    make_node,
    make_placement,
    make_service,
)

# ---------------------------------------------------------------- BuildMemo


def _devices(minor: int = 3) -> FakeDevices:
    return FakeDevices(
        {"/dev/null": [cdev("/dev/null", 1, minor)], "/dev/zero": [cdev("/dev/zero", 1, 5)]}
    )


def _job(svc: Any, node: Any, *, index: int = 0, uid: int = 5000, gid: int = 5000) -> ConfigJob:
    return ConfigJob(svc, make_placement(svc, node, index), node, ROOTFS, uid, gid, HOSTS)


def _env(result: Any, iid: str) -> dict[str, str]:
    env = result.built[iid].config["process"]["env"]
    return dict(e.split("=", 1) for e in env)


def _run(memo: BuildMemo, jobs: list[ConfigJob], groups: Any, devices: Any) -> Any:
    plain = build_all(jobs, groups=groups, devices=devices)
    memoized = memo.build_all(jobs, groups=groups, devices=devices)
    # whatever the memo holds, the result is the one of a build from scratch
    assert memoized.errors == plain.errors
    assert {i: (config_json(b), b.hosts) for i, b in memoized.built.items()} == {
        i: (config_json(b), b.hosts) for i, b in plain.built.items()
    }
    return memoized


def test_memo_reuses_unchanged_builds() -> None:
    svc = make_service(resources=[{"name": "gpu0"}], instances=3)
    node = make_node(resources=[GPU0])
    jobs = [_job(svc, node, index=i) for i in range(3)]
    groups, devices = FakeGroups(), _devices()
    memo = BuildMemo()
    first = _run(memo, jobs, groups, devices)
    assert (memo.built, memo.reused) == (3, 0)
    second = _run(memo, jobs, groups, devices)
    assert (memo.built, memo.reused) == (0, 3)
    assert all(second.built[i] is first.built[i] for i in first.built)


def test_memo_picks_up_a_changed_service_env() -> None:
    svc = make_service(image={"cmd": ["true"], "env": ["MODE=a"]})
    node = make_node()
    groups, devices, memo = FakeGroups(), _devices(), BuildMemo()
    iid = _job(svc, node).placement.instance_id
    assert _env(_run(memo, [_job(svc, node)], groups, devices), iid)["MODE"] == "a"
    edited = make_service(image={"cmd": ["true"], "env": ["MODE=b"]})
    assert _env(_run(memo, [_job(edited, node)], groups, devices), iid)["MODE"] == "b"
    assert memo.built == 1


def test_memo_picks_up_a_changed_resource_entry_and_uid() -> None:
    svc = make_service(resources=[{"name": "gpu0"}])
    node = make_node(resources=[GPU0])
    groups, devices, memo = FakeGroups(), _devices(), BuildMemo()
    iid = _job(svc, node).placement.instance_id
    _run(memo, [_job(svc, node)], groups, devices)
    changed = make_node(resources=[{**GPU0, "envs": ["GPU_NAME=other"]}])
    assert _env(_run(memo, [_job(svc, changed)], groups, devices), iid)["GPU_NAME"] == "other"
    again = _run(memo, [_job(svc, changed, uid=5001)], groups, devices)
    assert again.built[iid].config["process"]["user"]["uid"] == 5001
    assert memo.built == 1


def test_memo_picks_up_a_changed_group_and_device_on_the_host() -> None:
    svc = make_service(resources=[{"name": "gpu0"}])
    node = make_node(resources=[GPU0])
    groups, memo = FakeGroups(), BuildMemo()
    devices = _devices(minor=3)
    iid = _job(svc, node).placement.instance_id
    jobs = [_job(svc, node)]
    first = _run(memo, jobs, groups, devices)
    assert first.built[iid].config["process"]["user"]["additionalGids"] == [44, 107]
    # the same lookup objects, answering differently now (the host changed)
    groups.gids = {"video": 45, "render": 107}
    second = _run(memo, jobs, groups, devices)
    assert memo.built == 1
    assert second.built[iid].config["process"]["user"]["additionalGids"] == [45, 107]
    devices.table = {**devices.table, "/dev/null": [cdev("/dev/null", 1, 9)]}
    third = _run(memo, jobs, groups, devices)
    assert memo.built == 1
    minors = [d["minor"] for d in third.built[iid].config["linux"]["devices"]]
    assert 9 in minors and 3 not in minors
    # a group that disappears: the build fails now, and succeeds again when it is back
    groups.gids = {"video": 45}
    assert iid in _run(memo, jobs, groups, devices).errors
    groups.gids = {"video": 45, "render": 107}
    assert iid in _run(memo, jobs, groups, devices).built
    # a device lookup that starts failing
    devices.table = {"/dev/zero": devices.table["/dev/zero"]}
    assert "no such device" in _run(memo, jobs, groups, devices).errors[iid]


def test_memo_picks_up_a_changed_pool_device_and_policy() -> None:
    pool = {
        "resource": "example.com/gpu",
        "policy": "exclusive",
        "devices": [{"id": "g0", "devices": ["/dev/null:/dev/g0"], "envs": ["G=0"]}],
    }
    svc = make_service()
    node = make_node(pools=[pool])
    groups, devices, memo = FakeGroups(), _devices(), BuildMemo()
    p = make_placement(svc, node, 0, [("example.com/gpu", ["g0"])])
    job = ConfigJob(svc, p, node, ROOTFS, 5000, 5000, HOSTS)
    assert _env(_run(memo, [job], groups, devices), p.instance_id)["G"] == "0"
    pool2 = {**pool, "devices": [{"id": "g0", "devices": ["/dev/null:/dev/g0"], "envs": ["G=1"]}]}
    node2 = make_node(pools=[pool2])
    job2 = ConfigJob(svc, p, node2, ROOTFS, 5000, 5000, HOSTS)
    assert _env(_run(memo, [job2], groups, devices), p.instance_id)["G"] == "1"
    strict = DevicePolicy(host_roots=("/srv",))
    out = memo.build_all([job2], groups=groups, devices=devices, policy=strict)
    assert p.instance_id in out.errors  # not the memoized success under the other policy


def test_memo_is_tied_to_its_lookups() -> None:
    svc = make_service()
    node = make_node()
    memo = BuildMemo()
    memo.build_all([_job(svc, node)], groups=FakeGroups(), devices=_devices())
    memo.build_all([_job(svc, node)], groups=FakeGroups(), devices=_devices())
    assert memo.built == 1  # other lookup objects: nothing reused


# ---------------------------------------------------------------- checkpoint


def _alloc(iid: int, **over: Any) -> Allocation:
    base = Allocation(
        "com.example.a",
        "s",
        iid,
        "1.0",
        "n1",
        "runc-1",
        (1, 2, 3, 4),
        ("r",),
        (("gpu", ("g0", "g1")),),
        5000 + iid,
        5000,
    )
    return replace(base, **over)


def _old_encode(cp: Checkpoint) -> bytes:
    data = cp.data()
    body = canonical(data)
    envelope = {
        "formatVersion": FORMAT_VERSION,
        "lineage": cp.lineage,
        "generation": cp.generation,
        "data": data,
        "checksum": "sha256:" + hashlib.sha256(body).hexdigest(),
    }
    return canonical(envelope) + b"\n"


def test_encode_checkpoint_is_the_canonical_envelope() -> None:
    cp = Checkpoint(
        "lineage-é",
        7,
        {f"i{k}": _alloc(k) for k in range(3)},
        {"com.example.a": 5000},
        {"n1": {"cpu": [1.5, 2]}},
    )
    assert encode_checkpoint(cp) == _old_encode(cp)
    assert decode_checkpoint(encode_checkpoint(cp), "lineage-é") == cp


def test_same_data_is_the_canonical_comparison() -> None:
    base = Checkpoint("l", 1, {"a": _alloc(0), "b": _alloc(1)}, {"x": 5000}, {"n": {"t": 1}})
    variants = [
        replace(base, generation=2),
        replace(base, allocations={"a": _alloc(0), "b": _alloc(1, uid=6000)}),
        replace(base, allocations={"a": _alloc(0)}),
        replace(base, allocations={"a": _alloc(0), "c": _alloc(1)}),
        replace(base, allocations={"a": _alloc(0), "b": _alloc(1, cause="rebalanced")}),
        replace(base, allocations={"a": _alloc(0), "b": _alloc(1, devices=())}),
        replace(base, gids={"x": 5001}),
        replace(base, alerts={"n": {"t": 1.0}}),
        replace(base, alerts={}),
        # unequal as values, equal as JSON: resources in another order of the same pairs
        replace(base, allocations={"a": _alloc(0), "b": _alloc(1, resources=["r"])}),
    ]
    for other in variants:
        want = canonical(base.data()) == canonical(other.data())
        assert base.same_data(other) is want and other.same_data(base) is want, other


def test_checkpoint_cache_decodes_changed_bytes() -> None:
    cache = CheckpointCache()
    one = Checkpoint("l", 1, {"a": _alloc(0)})
    two = Checkpoint("l", 2, {"a": _alloc(0, uid=7000)})
    assert cache.decode(encode_checkpoint(one), "l") == one
    assert cache.decode(encode_checkpoint(one), "l") is cache.decode(encode_checkpoint(one), "l")
    assert cache.decode(encode_checkpoint(two), "l") == two
    try:
        cache.decode(encode_checkpoint(two), "other")
    except ValueError as e:
        assert "lineage" in str(e)
    else:
        raise AssertionError("a cached decode skipped the lineage check")


# ---------------------------------------------------------------- status and reconcile


def _edit(path: Path, change: Any) -> None:
    doc = yaml.safe_load(path.read_text())
    change(doc)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def test_node_status_cache_matches_a_full_replay(demo_copy: Path) -> None:
    cache = NodeStatusCache()
    report = reconcile(demo_copy, ReconcileOptions())
    view, result = report.computed.view, report.computed.result
    assert node_statuses(view, result, cache) == node_statuses(view, result)
    assert node_statuses(view, result, cache) == node_statuses(view, result)
    assert cache.recomputed == 0
    node_file = sorted((demo_copy / "nodes").glob("*.yaml"))[0]
    _edit(node_file, lambda d: d.update(totalRAM="96Gi"))
    view2, _ = load_state(demo_copy, view)
    assert node_statuses(view2, result, cache) == node_statuses(view2, result)
    assert cache.recomputed == 1
    # a placement dropped: its node's reserved amounts go down
    fewer = BalanceResult(result.placements[1:], result.failures, result.preempted)
    assert node_statuses(view2, fewer, cache) == node_statuses(view2, fewer)
    assert cache.recomputed == 1


def test_allocation_ids_read_as_the_map_of_every_allocations_ids() -> None:
    allocs = {f"i{k}": _alloc(k) for k in range(3)}
    ids = AllocationIds(allocs)
    want = {iid: (a.uid, a.gid) for iid, a in allocs.items()}
    assert dict(ids) == want and len(ids) == 3 and list(ids) == list(want)
    assert ids["i1"] == want["i1"] and ids.get("i2") == want["i2"]
    assert ids.get("nope") is None and ids.get("nope", (0, 0)) == (0, 0) and "nope" not in ids
    assert not AllocationIds({})


def test_the_status_report_reads_the_actual_states_again_only_when_they_change(
    demo_copy: Path, monkeypatch: Any
) -> None:
    """The instances' observed states are made once per actual-state mapping the view hands
    out (a load replaces the mapping when an actual state changes), and a changed one shows."""
    c = reconcile(demo_copy, ReconcileOptions()).computed
    view, result = c.view, c.result
    uids = AllocationIds(c.checkpoint.allocations)
    made: list[object] = []
    real = status_module._observed

    def observed(v: Any) -> Any:
        made.append(v)
        return real(v)

    monkeypatch.setattr(status_module, "_observed", observed)
    cache = NodeStatusCache()
    first = status_bytes(view, result, (), uids=uids, cache=cache)
    assert status_bytes(view, result, (), uids=uids, cache=cache) == first
    assert len(made) == 1
    p = result.placements[0]
    assert json.loads(first)["instances"][p.instance_id]["state"] == "pending"
    doc = reported(p, p.node_id, "active")
    now = replace(view, actual={**view.actual, p.node_id: doc})
    got = status_bytes(now, result, (), uids=uids, cache=cache)
    assert len(made) == 2
    assert json.loads(got)["instances"][p.instance_id]["state"] == "active"
    assert got == pretty_json(build_status(now, result, None, (), uids=dict(uids)))


def _outputs(state: Path) -> dict[str, bytes]:
    out = {}
    for path in sorted((state / "out").rglob("*")):
        if path.is_file() and path.name != ".manifest.json":
            out[str(path.relative_to(state))] = path.read_bytes()
    return out


@pytest.mark.parametrize("config_failure", [False, True], ids=["", "a-config-failing"])
def test_warm_reconcile_writes_what_a_fresh_process_writes(
    demo_copy: Path, tmp_path: Path, config_failure: bool
) -> None:
    """One builder and one ReconcileCache across runs (as watch), against fresh options each
    run, on two copies of the same directory edited the same way. With an instance whose
    config fails (a group the host does not have), taken out after the balance: the memo
    still answers an edit of a service."""
    if config_failure:
        res = demo_copy / "resources" / "edge-1.json"
        res.write_text(res.read_text().replace('"groups": ["video"]', '"groups": ["no-such-x"]'))
    fresh_dir = tmp_path / "fresh"
    shutil.copytree(demo_copy, fresh_dir)

    def clock() -> float:  # the status page's time: the same in both
        return 1_700_000_000.0

    cache = ReconcileCache()
    warm = ReconcileOptions(configs=default_config_builder(), cache=cache, clock=clock)
    view = None

    def both() -> None:
        nonlocal view
        report = reconcile(demo_copy, warm, view)
        view = report.computed.view
        reconcile(fresh_dir, ReconcileOptions(configs=default_config_builder(), clock=clock))
        assert _outputs(demo_copy) == {
            k: v.replace(str(fresh_dir.resolve()).encode(), str(demo_copy.resolve()).encode())
            for k, v in _outputs(fresh_dir).items()
        }

    both()
    both()
    desired = sorted((demo_copy / "desired").glob("*.yaml"))[0]

    def add_env(doc: dict[str, Any]) -> None:
        doc["image"].setdefault("env", []).append("WARM_TEST=1")

    for state in (demo_copy, fresh_dir):
        _edit(state / "desired" / desired.name, add_env)
    both()
    assert cache.balance.incremental
    failed = json.loads((demo_copy / "out" / "plan.json").read_text())["failures"]
    assert [f["reason"] for f in failed] == (["Config"] if config_failure else [])
    configs = list((demo_copy / "out" / "instances").glob("*/config.json"))
    assert any("WARM_TEST=1" in json.loads(c.read_text())["process"]["env"] for c in configs)
    node_file = sorted((demo_copy / "nodes").glob("*.yaml"))[0].name
    for state in (demo_copy, fresh_dir):
        _edit(
            state / "nodes" / node_file, lambda d: d.update(numCores=int(d.get("numCores", 1)) + 1)
        )
    both()


def test_as_decoded_is_what_decoding_the_written_bytes_gives() -> None:
    odd = [
        _alloc(0),
        _alloc(1, cause="preempted"),
        _alloc(2, devices=(("zz", ("b", "a")), ("aa", ("x",)))),  # resources not sorted
        _alloc(3, devices=(("gpu", ("g0",)), ("gpu", ("g1",)))),  # a duplicate resource
        _alloc(4, resources=["r", "s"]),  # a list
        _alloc(5, reserved=(1, 2.0, 3, 4)),  # a float
        _alloc(6, uid=True),  # a bool where an int belongs
        _alloc(7, devices=[("gpu", ["g0"])]),  # lists
    ]
    cp = Checkpoint(
        "lin",
        3,
        {f"i{k}": a for k, a in reversed(list(enumerate(odd)))},
        {"b": 5001, "a": 5000},
        {"n2": {"cpu": (1, 2.5)}, "n1": {"ram": [True, None]}},
    )
    raw = encode_checkpoint(cp)
    want = decode_checkpoint(raw, "lin")
    got = as_decoded(cp)
    assert got == want
    assert list(got.allocations) == list(want.allocations)
    assert [type(v) for v in got.alerts["n2"]["cpu"]] == [type(v) for v in want.alerts["n2"]["cpu"]]
    for iid, a in want.allocations.items():
        b = got.allocations[iid]
        assert [type(getattr(b, f)) for f in a.__slots__] == [
            type(getattr(a, f)) for f in a.__slots__
        ]
    # the cache serves it for exactly those bytes and a matching lineage
    cache = CheckpointCache()
    cache.wrote(raw, cp)
    assert cache.decode(raw, "lin") == want
    assert cache.decode(raw, None) == want
    cache2 = CheckpointCache()
    cache2.wrote(raw, cp)
    try:
        cache2.decode(raw, "other")
    except ValueError as e:
        assert "lineage" in str(e)
    else:
        raise AssertionError("the lineage check was skipped")
    other = encode_checkpoint(replace(cp, generation=4))
    assert cache2.decode(other, "lin").generation == 4


def test_output_cache_notices_an_edited_output(demo_copy: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(reconciler.io.fsio, "RACY_WINDOW_NS", 0)  # every key settles at once
    opts = ReconcileOptions(cache=ReconcileCache())
    assert opts.cache is not None
    view = reconcile(demo_copy, opts).computed.view
    view = reconcile(demo_copy, opts, view).computed.view  # records the settled keys
    status = demo_copy / "out" / "status.json"
    assert status in opts.cache.outputs
    assert reconcile(demo_copy, opts, view).written == ()
    time.sleep(0.05)  # past the filesystem's timestamp tick
    good = status.read_bytes()
    status.write_bytes(good.replace(b'"formatVersion": 1', b'"formatVersion": 9'))
    assert len(status.read_bytes()) == len(good)
    report = reconcile(demo_copy, opts, view)
    assert report.written == ("out/status.json",)
    assert status.read_bytes() == good
