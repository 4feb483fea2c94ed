"""The warm path of the OCI step (issue 9): what a long-running ``watch`` saves between runs
must never change what is built or written.

- ``build_all`` with a ``BuildMemo``: a sequence of builds, one input changed at a time, gives
  what a build from scratch gives; a job passed back by identity and host answers checked once
  per call for all the builds that asked the same questions are the warm path;
- ``default_config_builder`` passes the previous job back only when its inputs are the same;
- ``write_instance_outputs`` with a ``WriteMemo``: ``verify=False`` costs no system call for an
  unchanged instance and writes exactly the changed ones; ``verify=True`` rewrites a file
  tampered with on disk; stale instances are removed in both modes; another writer's run and a
  failed call are noticed; the manifest has the bytes the plain writer gives it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

import pytest

import reconciler.io.fsio
import reconciler.oci.builder as oci
import reconciler.oci.writer as oci_writer
from benchmarks.statedir import bump_instances, write_state_dir
from reconciler.accel.build import BuildMemo
from reconciler.controller.configs import default_config_builder
from reconciler.controller.reconcile import ReconcileCache, ReconcileOptions, reconcile
from reconciler.io.loader import StateView
from reconciler.model.documents import Node, Service
from reconciler.model.jsonbytes import pretty_json
from reconciler.model.values import instance_id
from reconciler.oci.builder import (
    SERVICE_FIELDS_NOT_BUILT,
    BuildResult,
    BuiltConfig,
    ConfigJob,
    DevicePolicy,
    build_all,
    build_config,
    config_json,
    content_digest,
    same_placement_inputs,
    same_service_inputs,
)
from reconciler.oci.writer import WriteMemo, WriteReport, write_instance_outputs
from reconciler.placement.instances import BalanceResult, Changes, Placement
from reconciler.planning.checkpoint import Allocation, Checkpoint, assign_ids
from tests.support.oci import (
    GPU0,
    FakeDevices,
    FakeGroups,
    built_configs,
    cdev,
    expected_files,
    make_node,
    make_placement,
    make_service,
)

# ---------------------------------------------------------------- build_all and BuildMemo

POOL: dict[str, Any] = {
    "resource": "example.com/gpu",
    "policy": "exclusive",
    "devices": [{"id": "g0", "devices": ["/dev/null:/dev/g0"], "envs": ["G=0"]}],
}


@dataclass
class Inputs:
    """Everything a build reads; a step of a test replaces one of them."""

    gpu: Service = field(default_factory=lambda: make_service(resources=[{"name": "gpu0"}]))
    plain: Service = field(
        default_factory=lambda: make_service(id="com.example.plain", image={"cmd": ["true"]})
    )
    node: Node = field(default_factory=lambda: make_node(resources=[GPU0], pools=[POOL]))
    uids: dict[str, tuple[int, int]] = field(default_factory=dict)  # instance -> (uid, gid)
    pool: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = field(default_factory=dict)
    version: str = "1.2.0"  # a placement field the build does not read
    policy: DevicePolicy = field(default_factory=DevicePolicy)


def _placements(inp: Inputs) -> list[Placement]:
    """New Placement objects each time, as the balancer makes them every run."""
    out = []
    for svc in (inp.gpu, inp.plain):
        for i in range(3):
            p = make_placement(svc, inp.node, i)
            out.append(replace(p, version=inp.version, devices=inp.pool.get(p.instance_id, ())))
    return out


def _jobs(inp: Inputs, memo: BuildMemo | None) -> list[ConfigJob]:
    """The jobs of a run, made as ``default_config_builder`` makes them: the memo's previous job
    when every input is the same object or value, else a new job."""
    jobs = []
    for p in _placements(inp):
        svc = inp.gpu if p.item_id == inp.gpu.id else inp.plain
        uid, gid = inp.uids.get(p.instance_id, (5000, 5000))
        old = memo.job(p.instance_id) if memo is not None else None
        if (
            old is not None
            and old.service is svc
            and old.node is inp.node
            and (old.uid, old.gid) == (uid, gid)
            and same_placement_inputs(old.placement, p)
        ):
            jobs.append(old)
        else:
            hosts = f"/state/out/instances/{p.instance_id}/hosts"
            jobs.append(ConfigJob(svc, p, inp.node, "/srv/rootfs", uid, gid, hosts))
    return jobs


def _outcome(result: BuildResult) -> dict[str, tuple[bytes, str] | str]:
    out: dict[str, tuple[bytes, str] | str] = dict(result.errors)
    out.update({i: (config_json(b), b.hosts) for i, b in result.built.items()})
    return out


def _step(memo: BuildMemo, inp: Inputs, groups: FakeGroups, devices: FakeDevices) -> BuildResult:
    """A memoized run; its outcome must be the one of a build from scratch."""
    memoized = memo.build_all(_jobs(inp, memo), groups=groups, devices=devices, policy=inp.policy)
    plain = build_all(_jobs(inp, None), groups=groups, devices=devices, policy=inp.policy)
    assert _outcome(memoized) == _outcome(plain)
    assert list(memoized.built) == list(plain.built)  # the same order too
    return memoized


def _devices() -> FakeDevices:
    return FakeDevices(
        {"/dev/null": [cdev("/dev/null", 1, 3)], "/dev/zero": [cdev("/dev/zero", 1, 5)]}
    )


def test_one_input_changed_at_a_time_gives_what_a_fresh_build_gives() -> None:
    inp, groups, devices, memo = Inputs(), FakeGroups(), _devices(), BuildMemo()
    gpu_ids = {p.instance_id for p in _placements(inp) if p.item_id == inp.gpu.id}
    plain_ids = {p.instance_id for p in _placements(inp)} - gpu_ids
    a0, a1, a2 = sorted(gpu_ids)
    b0 = sorted(plain_ids)[0]

    def run(rebuilt: int) -> BuildResult:
        result = _step(memo, inp, groups, devices)
        assert (memo.built, memo.reused) == (rebuilt, 6 - rebuilt)
        return result

    run(6)
    run(0)  # nothing changed
    inp.plain = make_service(id="com.example.plain", image={"cmd": ["true"], "env": ["M=b"]})
    run(3)  # the service of three instances
    inp.pool = {a0: (("example.com/gpu", ("g0",)),)}
    assert "DEVICES_EXAMPLE_COM_GPU=g0" in config_json(run(1).built[a0]).decode()  # a placement
    inp.version = "1.3.0"
    run(0)  # a placement field the build does not read
    inp.node = make_node(resources=[{**GPU0, "envs": ["GPU_NAME=x"]}], pools=[POOL])
    run(6)  # the node of every instance
    inp.uids = {b0: (5001, 5000)}
    run(1)
    inp.uids = {b0: (5001, 5000), a1: (5000, 5002)}
    assert run(1).built[a1].config["process"]["user"]["gid"] == 5002
    groups.gids = {"video": 45, "render": 107}
    assert run(3).built[a2].config["process"]["user"]["additionalGids"] == [45, 107]
    devices.table = {**devices.table, "/dev/null": [cdev("/dev/null", 1, 9)]}
    run(3)  # a device node of the host: the instances that asked for it
    groups.gids = {"render": 107}
    assert set(run(3).errors) == gpu_ids  # a group gone
    groups.gids = {"video": 45, "render": 107}
    run(3)
    inp.policy = DevicePolicy()  # another, equal object
    run(0)
    inp.policy = DevicePolicy(host_roots=("/srv",))
    assert set(run(6).errors) == gpu_ids  # every build ran again; the plain ones still build
    inp.policy = DevicePolicy()
    run(6)
    devices.table = {"/dev/zero": devices.table["/dev/zero"]}
    assert set(run(3).errors) == gpu_ids  # a device lookup that fails now


def test_a_job_passed_back_and_shared_host_answers_are_checked_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    svc = make_service(resources=[{"name": "gpu0"}], instances=40)
    node = make_node(resources=[GPU0])
    groups, devices, memo = FakeGroups(), _devices(), BuildMemo()

    def jobs() -> list[ConfigJob]:
        out = []
        for i in range(40):
            p = make_placement(svc, node, i)
            old = memo.job(p.instance_id)
            if old is not None and same_placement_inputs(old.placement, p):
                out.append(old)
            else:
                out.append(ConfigJob(svc, p, node, "/srv/rootfs", 5000, 5000, "/h/hosts"))
        return out

    first = memo.build_all(jobs(), groups=groups, devices=devices)
    # one asked tuple (two groups, two devices) for the 40 builds that asked the same questions
    assert len({id(e.asked) for e in memo._entries.values()}) == 1
    answered: list[object] = []
    real_answer = oci.RunLookups.answer

    def answer(self: Any, asked: Any) -> object:
        answered.append(asked)
        return real_answer(self, asked)

    monkeypatch.setattr(oci.RunLookups, "answer", answer)
    second = memo.build_all(jobs(), groups=groups, devices=devices)
    assert (memo.built, memo.reused) == (0, 40)
    assert len(answered) == 4  # not 4 per instance
    assert all(second.built[i] is first.built[i] for i in first.built)
    # a changed answer is seen by every build that asked it
    groups.gids = {"video": 46, "render": 107}
    third = memo.build_all(jobs(), groups=groups, devices=devices)
    assert memo.built == 40
    assert {tuple(b.config["process"]["user"]["additionalGids"]) for b in third.built.values()} == {
        (46, 107)
    }


def test_interned_answers_do_not_pile_up() -> None:
    svc = make_service(resources=[{"name": "gpu0"}])
    node = make_node(resources=[GPU0])
    groups, devices, memo = FakeGroups(), _devices(), BuildMemo()
    job = ConfigJob(svc, make_placement(svc, node), node, "/srv/rootfs", 5000, 5000, "/h/hosts")
    for gid in range(300):
        groups.gids = {"video": 1000 + gid, "render": 107}
        memo.build_all([job], groups=groups, devices=devices)
        assert memo.built == 1
    assert len(memo._interned) <= 2 + 64


class _Recording:
    """A placement or a service that records the fields read from it."""

    def __init__(self, real: object, read: set[str]) -> None:
        self._real, self._read = real, read

    def __getattr__(self, name: str) -> object:
        self._read.add(name)
        return getattr(self._real, name)


def _reads(svc: Service, p: Placement, node: Node, *, of_placement: bool) -> set[str]:
    """The fields a build reads of the placement (or of the service)."""
    read: set[str] = set()
    build_config(
        svc if of_placement else cast(Service, _Recording(svc, read)),
        cast(Placement, _Recording(p, read)) if of_placement else p,
        node,
        rootfs="/srv/rootfs",
        uid=1,
        gid=1,
        hosts_path="/h/hosts",
        groups=FakeGroups(),
        devices=_devices(),
    )
    return read


def test_the_build_reads_only_the_placement_fields_that_are_compared() -> None:
    svc = make_service(resources=[{"name": "gpu0"}])
    node = make_node(resources=[GPU0], pools=[POOL])
    p = make_placement(svc, node, 1, [("example.com/gpu", ["g0"])])
    read = _reads(svc, p, node, of_placement=True)
    compared = {"instance_id", "node_id", "index", "item_id", "subject_id", "devices"}
    label = {"item_id", "subject_id", "index"}  # Placement.label is made of these
    assert read - {"label"} <= compared and ("label" not in read or label <= compared)
    # each compared field matters, the others do not
    other: dict[str, Any] = {"instance_id": "x", "node_id": "n", "index": 7, "item_id": "i"}
    other["subject_id"] = "s"
    for name in compared:
        value = other.get(name, ())
        assert not same_placement_inputs(p, replace(p, **cast(dict[str, Any], {name: value}))), name
    marker = object()
    for f in dataclasses.fields(Placement):
        if f.name not in compared:
            changed = replace(p, **cast(dict[str, Any], {f.name: marker}))
            assert changed != p and same_placement_inputs(p, changed), f.name


def _full_service(**over: Any) -> Service:
    """A service that sets every field the builder could read."""
    return make_service(
        **{
            "resources": [{"name": "gpu0"}],
            "hostname": "nav",
            "sysctl": {"net.ipv4.ip_forward": "1"},
            "restartPolicy": "on-failure",
            "quotas": {"cpuDMIPSLimit": 1000, "ramLimit": "64Mi", "pidsLimit": 10},
            "labels": ["gpu"],
            "priority": 5,
            "instances": 3,
            "balancingPolicy": "disabled",
            **over,
        }
    )


def test_the_build_reads_no_service_field_said_not_built() -> None:
    svc = _full_service()
    node = make_node(resources=[GPU0], pools=[POOL])
    p = make_placement(svc, node, 1, [("example.com/gpu", ["g0"])])
    read = _reads(svc, p, node, of_placement=False)
    assert read and not read & SERVICE_FIELDS_NOT_BUILT


def test_a_service_is_the_same_input_but_for_the_fields_not_built() -> None:
    svc = _full_service()
    for name, value in {"instances": 9, "priority": 0, "labels": [], "nodeId": "n9"}.items():
        assert same_service_inputs(svc, _full_service(**{name: value})), name
    assert same_service_inputs(svc, _full_service(balancingPolicy="enabled"))
    for name, value in {
        "hostname": "other",
        "restartPolicy": "always",
        "version": "9.9.9",
        "sysctl": {},
        "quotas": {"cpuDMIPSLimit": 500},
        "image": {"cmd": ["true"]},
    }.items():
        assert not same_service_inputs(svc, _full_service(**{name: value})), name


def test_an_edit_of_the_instance_count_rebuilds_no_config() -> None:
    node = make_node(resources=[GPU0], pools=[POOL])
    groups, devices, memo = FakeGroups(), _devices(), BuildMemo()

    def jobs(svc: Service) -> list[ConfigJob]:
        return [
            ConfigJob(svc, make_placement(svc, node, k, []), node, "/srv/rootfs", 5000, 5000, "/h")
            for k in range(3)
        ]

    first = memo.build_all(jobs(_full_service()), groups=groups, devices=devices)
    edited = _full_service(instances=4, priority=50)
    second = memo.build_all(jobs(edited), groups=groups, devices=devices)
    assert (memo.built, memo.reused) == (0, 3)
    assert second == build_all(jobs(edited), groups=groups, devices=devices) == first
    # the kept entries hold the new jobs: the next call finds them by identity
    again = jobs(edited)
    assert all(memo.job(j.placement.instance_id) is not None for j in again)
    memo.build_all(jobs(_full_service(hostname="other")), groups=groups, devices=devices)
    assert memo.built == 3


# ---------------------------------------------------------------- default_config_builder


@pytest.fixture
def spied_jobs(monkeypatch: pytest.MonkeyPatch) -> list[list[ConfigJob]]:
    """The jobs the builder of ``default_config_builder`` gives its memo's ``build_all``, per
    call."""
    calls: list[list[ConfigJob]] = []
    real = BuildMemo.build_all

    def spy(memo: BuildMemo, jobs: list[ConfigJob], **kw: Any) -> BuildResult:
        calls.append(list(jobs))
        return real(memo, jobs, **kw)

    monkeypatch.setattr(BuildMemo, "build_all", spy)
    return calls


def _by_id(jobs: list[ConfigJob]) -> dict[str, ConfigJob]:
    return {j.placement.instance_id: j for j in jobs}


def _instance_files(state: Path) -> dict[str, bytes]:
    root = state / "out" / "instances"
    return {str(f.relative_to(root)): f.read_bytes() for f in sorted(root.glob("*/*"))}


def test_builder_passes_back_unchanged_jobs_only(
    demo_copy: Path, spied_jobs: list[list[ConfigJob]]
) -> None:
    builder = default_config_builder()
    opts = ReconcileOptions(configs=builder)
    first = reconcile(demo_copy, opts)
    placed = {p.instance_id for p in first.computed.result.placements}
    second = reconcile(demo_copy, opts, first.computed.view)
    one, two = _by_id(spied_jobs[0]), _by_id(spied_jobs[1])
    # the warm path: nothing is rebuilt
    assert set(one) == placed and all(two[i] is one[i] for i in two)
    jobs_now = {**one, **two}  # each instance's job, as the builder knows it

    vision = demo_copy / "desired" / "apps" / "vision.yaml"
    vision.write_text(vision.read_text().replace("image:\n", "image:\n  env: [MODE=night]\n"))
    third = reconcile(demo_copy, opts, second.computed.view)
    three = _by_id(spied_jobs[2])
    vids = {p.instance_id for p in third.computed.result.placements if "vision" in p.item_id}
    assert vids and {i for i in three if three[i] is not jobs_now.get(i)} == vids
    jobs_now.update(three)
    # what the warm runs left is what a fresh builder writes: it finds nothing to write
    files = _instance_files(demo_copy)
    fresh = ReconcileOptions(configs=default_config_builder())
    assert not [w for w in reconcile(demo_copy, fresh).written if "instances" in w]
    assert _instance_files(demo_copy) == files

    # a changed uid or gid (the checkpoint), node or state directory: new jobs for exactly the
    # instances concerned, and what a fresh builder builds
    c = third.computed
    view, result, last = c.view, c.result, jobs_now
    first_id, second_id = sorted(c.checkpoint.allocations)[:2]
    allocations = dict(c.checkpoint.allocations)

    def check(state: Path, expected: set[str]) -> BuildResult:
        nonlocal last
        cp = Checkpoint(
            c.checkpoint.lineage,
            c.checkpoint.generation,
            allocations,
            network=c.checkpoint.network,
        )
        built = builder(state, view, result, cp)
        jobs = _by_id(spied_jobs[-1])
        assert {i for i in jobs if jobs[i] is not last.get(i)} == expected
        assert _outcome(built) == _outcome(default_config_builder()(state, view, result, cp))
        last = {**last, **jobs}
        return built

    allocations[first_id] = replace(allocations[first_id], uid=allocations[first_id].uid + 1)
    built = check(demo_copy, {first_id})
    assert built.built[first_id].config["process"]["user"]["uid"] == allocations[first_id].uid
    allocations[second_id] = replace(allocations[second_id], gid=allocations[second_id].gid + 1)
    check(demo_copy, {second_id})
    check(demo_copy, set())
    node_id = result.by_id[first_id].node_id
    node = view.nodes[node_id]
    nodes = {**view.nodes, node_id: node.model_copy(update={"maxDMIPS": node.maxDMIPS * 2})}
    view = replace(view, nodes=nodes)
    check(demo_copy, {p.instance_id for p in result.placements if p.node_id == node_id})
    # a service edited while its placements stay the very same objects: its jobs only
    edited = result.by_id[second_id]
    key = (edited.item_id, edited.subject_id)
    svc = view.services[key]
    image = svc.image.model_copy(update={"env": ["MODE=day"]})
    view = replace(view, services={**view.services, key: svc.model_copy(update={"image": image})})
    check(demo_copy, {p.instance_id for p in result.placements if (p.item_id, p.subject_id) == key})
    other = demo_copy.parent / "other"
    shutil.copytree(demo_copy, other)
    moved = check(other, set(last))
    for b in moved.built.values():
        hosts = [m for m in b.config["mounts"] if m["destination"] == "/etc/hosts"]
        assert hosts[0]["source"].startswith(f"{other.resolve()}/")


# ---------------------------------------------------------------- write_instance_outputs


def _root(state: Path) -> Path:
    return state / "out" / "instances"


def _files(state: Path) -> dict[str, bytes]:
    """The instances' files, by path relative to out/instances (not the manifest)."""
    return {
        str(p.relative_to(_root(state))): p.read_bytes()
        for p in sorted(_root(state).glob("*/*"))
        if p.is_file()
    }


@pytest.fixture
def syscalls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The paths under an out/instances/<id>/ that lstat, stat and open were called on."""
    seen: list[str] = []

    def wrap(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(path: Any, *args: Any, **kw: Any) -> Any:
            if "/out/instances/" in str(path) and not str(path).endswith(oci_writer.MANIFEST):
                seen.append(str(path))
            return real(path, *args, **kw)

        return call

    for name in ("lstat", "stat", "open"):
        monkeypatch.setattr(os, name, wrap(getattr(os, name)))
    yield seen


def _write(
    state: Path, built: dict[str, BuiltConfig], memo: WriteMemo | None, verify: bool = True
) -> WriteReport:
    return write_instance_outputs(state, built, sync=False, memo=memo, verify=verify)


def test_unverified_run_writes_exactly_the_changed_instance(
    tmp_path: Path, syscalls: list[str]
) -> None:
    built, memo = built_configs(4), WriteMemo()
    _write(tmp_path, built, memo)
    assert (memo.trusted, memo.verified, memo.compared) == (0, 0, 4)
    syscalls.clear()
    report = _write(tmp_path, built, memo, verify=False)
    assert report.written == () and len(report.unchanged) == 8
    assert (memo.trusted, memo.verified, memo.compared) == (4, 0, 0)
    assert syscalls == []  # the warm path: no system call for an unchanged instance

    ids = sorted(built)
    changed = dict(built)
    changed[ids[2]] = BuiltConfig.of(
        {"ociVersion": "1.0.2", "hostname": "new"}, built[ids[2]].hosts
    )
    changed[ids[0]] = BuiltConfig.of(built[ids[0]].config, built[ids[0]].hosts)  # same bytes
    report = _write(tmp_path, changed, memo, verify=False)
    assert report.written == (f"instances/{ids[2]}/config.json",)
    assert report.unchanged == tuple(
        f"instances/{i}/{name}"
        for i in ids
        for name in ("hosts", "config.json")
        if (i, name) != (ids[2], "config.json")
    )
    assert (memo.trusted, memo.compared) == (3, 1)
    assert not [p for p in syscalls if ids[0] in p or ids[1] in p or ids[3] in p]
    assert _files(tmp_path) == expected_files(changed)


def test_verified_run_rewrites_what_was_tampered_with(tmp_path: Path, syscalls: list[str]) -> None:
    built, memo = built_configs(3), WriteMemo()
    ids = sorted(built)
    _write(tmp_path, built, memo)
    syscalls.clear()
    _write(tmp_path, built, memo, verify=True)
    assert (memo.trusted, memo.verified, memo.compared) == (0, 3, 0)
    assert sorted(syscalls) == sorted(
        f"{_root(tmp_path)}/{i}/{name}" for i in ids for name in ("hosts", "config.json")
    )  # an lstat of each file, no read

    config = _root(tmp_path) / ids[0] / "config.json"
    hosts = _root(tmp_path) / ids[1] / "hosts"
    config.write_bytes(config.read_bytes() + b" ")  # edited in place
    hosts.chmod(0o600)  # a mode that drifted
    (_root(tmp_path) / ids[2] / "config.json").unlink()
    # not looked at without verify: the caller's periodic verified run is what repairs them
    assert _write(tmp_path, built, memo, verify=False).written == ()
    report = _write(tmp_path, built, memo, verify=True)
    assert sorted(report.written) == sorted(
        [
            f"instances/{ids[0]}/config.json",
            f"instances/{ids[1]}/hosts",
            f"instances/{ids[2]}/config.json",
        ]
    )
    assert _files(tmp_path) == expected_files(built)
    assert oct(hosts.stat().st_mode & 0o777) == oct(oci_writer.CONFIG_MODE)
    assert _write(tmp_path, built, memo, verify=True).written == ()


@pytest.mark.parametrize("verify", [False, True])
def test_stale_instances_are_removed_in_both_modes(tmp_path: Path, verify: bool) -> None:
    built, memo = built_configs(3), WriteMemo()
    ids = sorted(built)
    _write(tmp_path, built, memo)
    planted = instance_id("com.example.planted", "default", 0)
    (_root(tmp_path) / planted).mkdir()  # not the controller's doing
    fewer = {i: built[i] for i in ids[1:]}
    report = _write(tmp_path, fewer, memo, verify=verify)
    assert report.removed == (tuple(sorted((ids[0], planted))) if verify else (ids[0],))
    assert not (_root(tmp_path) / ids[0]).exists()
    assert _files(tmp_path) == expected_files(fewer)
    # without verify, a directory the controller never wrote waits for a verified run
    report = _write(tmp_path, fewer, memo, verify=True)
    assert report.removed == (() if verify else (planted,))
    # an instance removed by hand is not an error, and is written again when built again
    shutil.rmtree(_root(tmp_path) / ids[1])
    assert _write(tmp_path, {ids[2]: built[ids[2]]}, memo, verify=verify).removed == ()
    _write(tmp_path, built, memo, verify=verify)
    assert _files(tmp_path) == expected_files(built)


def test_another_writer_is_noticed(tmp_path: Path) -> None:
    """Another process's run (through the manifest it rewrites) makes the memo unusable."""
    built, memo = built_configs(3), WriteMemo()
    ids = sorted(built)
    _write(tmp_path, built, memo)
    other = dict(built)
    other[ids[0]] = BuiltConfig.of(
        {"ociVersion": "1.0.2", "hostname": "theirs"}, built[ids[0]].hosts
    )
    del other[ids[1]]
    _write(tmp_path, other, None)  # e.g. a `reconcile` run from the command line
    report = _write(tmp_path, built, memo, verify=False)
    assert sorted(report.written) == [
        f"instances/{ids[0]}/config.json",
        f"instances/{ids[1]}/config.json",
        f"instances/{ids[1]}/hosts",
    ]
    assert _files(tmp_path) == expected_files(built)
    # and the manifest they leave serves the next plain run: nothing to read or write
    assert _write(tmp_path, built, None).written == ()


def test_a_failed_call_leaves_the_memo_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built, memo = built_configs(2), WriteMemo()
    ids = sorted(built)
    write_instance_outputs(tmp_path, built, memo=memo)
    changed = dict(built)
    changed[ids[0]] = BuiltConfig.of({"ociVersion": "1.0.2", "hostname": "b"}, built[ids[0]].hosts)
    real = reconciler.io.fsio.Commit.flush

    def fails_after_the_renames(commit: reconciler.io.fsio.Commit) -> None:
        real(commit)
        raise OSError("disk full")  # the instance files are in, the manifest is the old one

    monkeypatch.setattr(reconciler.io.fsio.Commit, "flush", fails_after_the_renames)
    with pytest.raises(OSError, match="disk full"):
        write_instance_outputs(tmp_path, changed, memo=memo, verify=False)
    monkeypatch.setattr(reconciler.io.fsio.Commit, "flush", real)
    assert len(memo) == 0
    # the memo's old entry (the first config, the very same object) must not be trusted
    report = write_instance_outputs(tmp_path, built, memo=memo, verify=False)
    assert report.written == (f"instances/{ids[0]}/config.json",)
    assert _files(tmp_path) == expected_files(built)


def test_a_memo_of_another_directory_is_not_used(tmp_path: Path) -> None:
    built, memo = built_configs(2), WriteMemo()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _write(tmp_path / "a", built, memo)
    report = _write(tmp_path / "b", built, memo, verify=False)
    assert len(report.written) == 4 and memo.compared == 2
    assert _files(tmp_path / "b") == expected_files(built)
    # neither directory has a manifest (nothing was ever built): still not the same directory
    (tmp_path / "c").mkdir()
    (tmp_path / "d").mkdir()
    _write(tmp_path / "c", {}, memo)
    stale = _root(tmp_path / "d") / sorted(built)[0]
    stale.mkdir(parents=True)
    assert _write(tmp_path / "d", {}, memo, verify=False).removed == (stale.name,)


def _manifest(state: Path) -> bytes:
    return (_root(state) / oci_writer.MANIFEST).read_bytes()


def test_memo_runs_write_the_plain_writers_files_and_manifest(tmp_path: Path) -> None:
    memo = WriteMemo()
    (tmp_path / "memo").mkdir()
    (tmp_path / "plain").mkdir()
    versions = [built_configs(3), built_configs(4), built_configs(4, "x"), {}, built_configs(2)]
    versions[2] = {**versions[1], **dict(list(versions[2].items())[1:2])}  # one config changed
    for n, built in enumerate(versions):
        for verify in (True, False):
            _write(tmp_path / "memo", built, memo, verify=verify)
            _write(tmp_path / "plain", built, None)
            assert _files(tmp_path / "memo") == _files(tmp_path / "plain") == expected_files(built)
            # the same manifest content; its bytes are pretty_json's
            data = _manifest(tmp_path / "memo")
            assert data == pretty_json(json.loads(data)), n
            manifest = json.loads(data)
            assert sorted(manifest) == sorted(built)
            for iid, entry in manifest.items():
                assert entry["digest"] == content_digest(built[iid])
                assert entry["files"] == oci_writer._fingerprints(
                    f"{_root(tmp_path / 'memo')}/{iid}"
                )
            # and a plain run finds nothing to do
            assert _write(tmp_path / "memo", built, None).written == ()


def test_manifest_bytes_from_fragments_are_pretty_json() -> None:
    """The manifest a memo assembles from its entries' cached fragments has the bytes
    pretty_json gives the whole manifest."""
    built = built_configs(4)
    odd = {"hosts": [2**40, 3, -5, 0o100644], "config.json": [7, 2**20, 2**62, 0o100600]}
    entries = {
        iid: oci_writer._Written(b, oci_writer._pack(odd if n % 2 else None))
        for n, (iid, b) in enumerate(built.items())
    }
    plain = {
        iid: {"digest": content_digest(w.built), "files": oci_writer._unpack(w.files)}
        for iid, w in entries.items()
    }
    assert oci_writer._manifest_bytes(entries) == pretty_json(plain)
    assert all(w.fragment is not None for w in entries.values())  # kept for the next time
    del entries[sorted(entries)[1]], plain[sorted(plain)[1]]
    assert oci_writer._manifest_bytes(entries) == pretty_json(plain)
    assert oci_writer._manifest_bytes({}) == pretty_json({}) == b"{}\n"


def test_a_manifest_edited_by_hand_is_not_trusted(tmp_path: Path) -> None:
    built, memo = built_configs(2), WriteMemo()
    _write(tmp_path, built, None)
    path = _root(tmp_path) / oci_writer.MANIFEST
    manifest = json.loads(path.read_bytes())
    iid = sorted(built)[0]
    files = manifest[iid]["files"]
    # sizes and modes as equal floats, not the writer's ints
    manifest[iid]["files"] = {
        k: [ino, float(size), mtime, float(mode)] for k, (ino, size, mtime, mode) in files.items()
    }
    path.write_bytes(pretty_json(manifest))
    assert _write(tmp_path, built, memo).written == ()
    assert _write(tmp_path, built, memo, verify=False).written == ()
    assert (memo.trusted, memo.compared) == (1, 1)  # looked at again, found unchanged
    assert json.loads(path.read_bytes())[iid]["files"] == files


def _reconcile_opts() -> ReconcileOptions:
    return ReconcileOptions(configs=default_config_builder())


def test_a_run_stopped_before_the_deferred_manifest_leaves_nothing_wrong(
    demo_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The configs' manifest is written after the plan: a run that dies before it leaves the
    older manifest, which the next writer (another process, no memo) must not trust for the
    instances whose files changed meanwhile."""
    from reconciler.oci.writer import PendingManifest

    logger = demo_copy / "desired" / "apps" / "logger.yaml"
    original = logger.read_text()
    reconcile(demo_copy, _reconcile_opts())
    manifest = demo_copy / "out" / "instances" / ".manifest.json"
    old_manifest = manifest.read_bytes()
    logger.write_text(original.replace("pidsLimit: 16", "pidsLimit: 17"))

    def crash(self: PendingManifest) -> bytes:
        raise RuntimeError("killed before the manifest")

    monkeypatch.setattr(PendingManifest, "data", crash)
    with pytest.raises(RuntimeError):
        reconcile(demo_copy, _reconcile_opts())
    monkeypatch.undo()
    assert manifest.read_bytes() == old_manifest  # older than the configs on disk
    assert b'"limit": 17' in b"".join(_instance_files(demo_copy).values())
    logger.write_text(original)  # back to what the old manifest describes
    reconcile(demo_copy, _reconcile_opts())
    recovered = _instance_files(demo_copy)
    assert b'"limit": 17' not in b"".join(recovered.values())
    shutil.rmtree(demo_copy / "out")  # what a writer starting from nothing makes of the same
    reconcile(demo_copy, _reconcile_opts())
    assert recovered == _instance_files(demo_copy)


@pytest.mark.parametrize("verify", [True, False])
def test_a_watchers_edits_rebuild_only_what_changed_and_write_what_a_fresh_run_writes(
    tmp_path: Path, spied_jobs: list[list[ConfigJob]], verify: bool
) -> None:
    """With a watcher's cache, the balancer's memo names what it placed anew since its last
    result, and the builder builds those instances only (plus those of an edited service or a
    changed allocation), and a trusting writer (``verify=False``, a watcher's event runs) looks
    at those only; what it writes is what a process without any cache writes."""
    warm, cold = tmp_path / "warm", tmp_path / "cold"
    write_state_dir(warm, 12, 60, actual_every=0)
    opts = ReconcileOptions(configs=default_config_builder(), cache=ReconcileCache())
    view = reconcile(warm, opts).computed.view
    opts = dataclasses.replace(opts, verify=verify)
    writer = opts.cache.configs if opts.cache is not None else None
    services = sorted(s.id for s in view.services.values())
    edits: list[tuple[str, int]] = [(services[0], +2), (services[1], -1), (services[0], -2)]
    edits += [(services[2], 0), (services[3], +1)]
    for service, delta in edits:
        if delta:
            bump_instances(warm, service, delta)
        else:  # the image changes, the placements stay
            path = warm / "desired" / f"{service}.yaml"
            text = path.read_text()  # a command line changes (not the placement)
            assert "\n  - /" in text
            path.write_text(text.replace("\n  - /", "\n  - /x/", 1))
        calls = len(spied_jobs)
        computed = reconcile(warm, opts, view).computed
        view = computed.view
        jobs = [j for call in spied_jobs[calls:] for j in call]
        ids_of_service = {p.instance_id for p in computed.result.placements if p.item_id == service}
        if not delta:  # an edit the build reads: every instance of the service is looked at
            assert {j.placement.instance_id for j in jobs} >= ids_of_service
        assert len(jobs) < len(computed.result.placements) // 2, "not built again in full"
        if not verify:
            assert writer is not None and writer.compared <= len(jobs)
            assert writer.trusted + writer.compared == len(computed.result.placements)
        shutil.rmtree(cold, ignore_errors=True)
        shutil.copytree(warm, cold, ignore=shutil.ignore_patterns("out"))
        reconcile(cold, ReconcileOptions(configs=default_config_builder()))
        here = {
            k: v.replace(bytes(warm.resolve()), b"DIR") for k, v in _instance_files(warm).items()
        }
        there = {
            k: v.replace(bytes(cold.resolve()), b"DIR") for k, v in _instance_files(cold).items()
        }
        assert here == there
        assert (warm / "out" / "plan.json").read_bytes() == (
            cold / "out" / "plan.json"
        ).read_bytes()


def test_a_result_the_builder_saw_last_rebuilds_what_can_differ_only(
    tmp_path: Path, spied_jobs: list[list[ConfigJob]]
) -> None:
    """Given the result of its last run again (or one that names its changes since), the builder
    looks only at the instances of an edited service, with another allocation, or whose build
    asked the host something; each step builds what a fresh builder builds."""
    inp, groups, devices = Inputs(), FakeGroups(), _devices()
    builder = default_config_builder(groups=groups, devices=devices, policy=inp.policy)
    result = BalanceResult(tuple(_placements(inp)), ())
    gpu_ids = {p.instance_id for p in result.placements if p.item_id == inp.gpu.id}
    plain_ids = set(result.by_id) - gpu_ids
    allocations = assign_ids(result, {}, {})[0]

    nodes = {inp.node.id: inp.node}  # the same mapping each run (the loader's: none changed)

    def step(
        services: dict[tuple[str, str], Service], allocs: dict[str, Allocation]
    ) -> tuple[BuildResult, set[str]]:
        view = StateView(tmp_path, None, services, nodes)
        cp = Checkpoint("lin", 1, allocs)
        calls = len(spied_jobs)
        got = builder(tmp_path, view, result, cp)
        looked_at = {j.placement.instance_id for c in spied_jobs[calls:] for j in c}
        fresh = default_config_builder(groups=groups, devices=devices, policy=inp.policy)
        assert _outcome(got) == _outcome(fresh(tmp_path, view, result, cp))
        return got, looked_at

    services = {s.key: s for s in (inp.gpu, inp.plain)}  # the loader's mapping: kept if equal
    assert step(services, allocations)[1] == set(result.by_id)  # the first run: every one
    assert step(services, allocations)[1] == gpu_ids  # the host is asked again, only that
    edited = make_service(id="com.example.plain", image={"cmd": ["false"]})
    services = {**services, edited.key: edited}
    # an edited service, the same result: which placements are its is not known, all are built
    assert step(services, allocations)[1] == gpu_ids | plain_ids
    groups.gids = {"video": 45, "render": 107}  # the host's answer changes
    built, _ = step(services, allocations)
    assert all(
        built.built[i].config["process"]["user"]["additionalGids"] == [45, 107] for i in gpu_ids
    )
    one = min(plain_ids)
    allocs = {**allocations, one: replace(allocations[one], uid=5009)}
    assert step(services, allocs)[1] == gpu_ids | {one}  # another allocation
    del allocs[one]
    built, asked = step(services, allocs)  # an allocation gone: no config for it
    assert one not in built.built and asked == gpu_ids


def test_the_allocations_told_changed_are_the_only_ones_compared(
    tmp_path: Path, spied_jobs: list[list[ConfigJob]]
) -> None:
    """A checkpoint that says at which ids its allocations differ from a mapping (``since``,
    the uid memo's) is trusted when that mapping is the very one the builder was given last:
    the builder looks at those ids, not at every allocation. Told of another mapping, it
    compares them all (a change the stale claim leaves out is still built)."""
    inp, groups, devices = Inputs(), FakeGroups(), _devices()
    builder = default_config_builder(groups=groups, devices=devices, policy=inp.policy)
    result = BalanceResult(tuple(_placements(inp)), ())
    gpu_ids = {p.instance_id for p in result.placements if p.item_id == inp.gpu.id}
    plain_ids = sorted(set(result.by_id) - gpu_ids)
    allocations = assign_ids(result, {}, {})[0]
    nodes = {inp.node.id: inp.node}
    services = {s.key: s for s in (inp.gpu, inp.plain)}
    view = StateView(tmp_path, None, services, nodes)

    def step(cp: Checkpoint) -> set[str]:
        calls = len(spied_jobs)
        got = builder(tmp_path, view, result, cp)
        looked_at = {j.placement.instance_id for c in spied_jobs[calls:] for j in c}
        fresh = default_config_builder(groups=groups, devices=devices, policy=inp.policy)
        assert _outcome(got) == _outcome(fresh(tmp_path, view, result, cp))
        return looked_at

    assert step(Checkpoint("lin", 1, allocations)) == set(result.by_id)
    one, other, two = plain_ids[0], plain_ids[1], plain_ids[-1]
    allocs = {**allocations, one: replace(allocations[one], uid=5009)}
    told = frozenset({one, other})  # (a superset: ``other`` did not change)
    assert step(Checkpoint("lin", 1, allocs, since=(allocations, told))) == gpu_ids | {one}
    # told of no change, the builder trusts it: a change it is not told of is not looked at
    # (this is what makes the claim worth making; the uid memo names every changed id)
    allocs_b = {**allocs, other: replace(allocs[other], uid=5011)}
    calls = len(spied_jobs)
    builder(tmp_path, view, result, Checkpoint("lin", 1, allocs_b, since=(allocs, frozenset())))
    assert {j.placement.instance_id for c in spied_jobs[calls:] for j in c} == gpu_ids
    builder(tmp_path, view, result, Checkpoint("lin", 1, allocs))  # (back: compared)
    # a claim about a mapping the builder was not given last: compared, ``two`` found
    allocs2 = {**allocs, two: replace(allocs[two], uid=5010)}  # (given allocs last)
    stale = (allocations, frozenset[str]())
    assert step(Checkpoint("lin", 1, allocs2, since=stale)) == gpu_ids | {two}


def test_an_instance_count_edit_passes_the_last_jobs_back(
    tmp_path: Path, spied_jobs: list[list[ConfigJob]]
) -> None:
    """A service edited in a field the build never reads (its instance count) is another
    object. Given the same result again (its placements not known to be the service's), the
    builder looks at every instance and passes each one's last job back as is (the memo takes
    it by identity); given a result that names its changes, it does not look at the service's
    instances at all, and tells the writer of none of them."""
    inp, groups, devices = Inputs(), FakeGroups(), _devices()
    builder = default_config_builder(groups=groups, devices=devices, policy=inp.policy)
    result = BalanceResult(tuple(_placements(inp)), (), revision=1)
    plain_ids = {p.instance_id for p in result.placements if p.item_id == inp.plain.id}
    allocations = assign_ids(result, {}, {})[0]
    cp = Checkpoint("l", 1, allocations)
    nodes = {inp.node.id: inp.node}
    services = {s.key: s for s in (inp.gpu, inp.plain)}
    first = builder(tmp_path, StateView(tmp_path, None, services, nodes), result, cp)
    last_jobs = {j.placement.instance_id: j for j in spied_jobs[-1]}
    fresh = default_config_builder(groups=groups, devices=devices, policy=inp.policy)
    for count in (9, 11):
        edited = inp.plain.model_copy(update={"instances": count})
        services = {**services, edited.key: edited}
        view = StateView(tmp_path, None, services, nodes)
        got = builder(tmp_path, view, result, cp)
        passed = {j.placement.instance_id: j for j in spied_jobs[-1]}
        if count == 9:  # the same result: every instance looked at, its last job passed back
            assert plain_ids <= passed.keys()
            assert all(passed[i] is last_jobs[i] for i in plain_ids)
        else:  # the memo's next result (every placement the last one's): none looked at
            assert not passed.keys() & plain_ids
            assert got.since is not None and not got.since[1] & plain_ids
        assert _outcome(got) == _outcome(fresh(tmp_path, view, result, cp)) == _outcome(first)
        result = replace(result, revision=2, changes=Changes(1, frozenset()))


def test_a_write_joined_to_a_commit_shows_at_its_flush_and_records_what_it_renames(
    tmp_path: Path,
) -> None:
    """With the caller's commit nothing is visible before its flush; an instance of which one
    file of two changed is recorded with the new file's stat (its rename waits for the
    flush), so a verifying call after it finds every file as recorded and writes nothing."""
    built, memo = built_configs(3), WriteMemo()
    ids = sorted(built)
    write_instance_outputs(tmp_path, built, memo=memo)
    changed = dict(built)
    changed[ids[0]] = dataclasses.replace(built[ids[0]], hosts="10.0.0.9 other\n")  # hosts only
    del changed[ids[2]]  # a stale instance: its directory goes at the flush
    commit = reconciler.io.fsio.Commit()
    report = write_instance_outputs(tmp_path, changed, memo=memo, commit=commit)
    assert report.written == (f"instances/{ids[0]}/hosts",)
    assert report.removed == (ids[2],)
    visible = {k: v for k, v in _files(tmp_path).items() if ".tmp-" not in k}
    assert visible == expected_files(built)
    commit.flush()
    assert _files(tmp_path) == expected_files(changed)
    again = write_instance_outputs(tmp_path, changed, memo=memo, verify=True)
    assert again.written == () and again.removed == ()
    assert memo.compared == 0  # every file's stat as recorded: none read
    fresh = WriteMemo()  # the manifest on disk says the same
    write_instance_outputs(tmp_path, changed, memo=fresh, verify=True)
    assert fresh.compared == 0
