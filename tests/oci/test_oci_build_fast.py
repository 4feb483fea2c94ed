"""The fast OCI build equals the step-by-step reference (issue 26).

``build_config``, ``build_all`` and ``BuildMemo.build_all`` build a config from its service's
part (computed once per service per call) and, for an instance of a service with a few jobs in
the call or more, without named resources and whose pool devices give it only their ids, from
its service's config.json template. ``_build_reference`` is the build step by step as SPEC §11
orders it. On drawn services (hostname or none, image env overriding the
defaults and the instance env, every quota, sysctl, restartPolicy, named resources), nodes
(resources and device pools, good and bad), placements, networks and caller inputs, every
instance gives the reference's bytes and hosts file, or its very error message, whether built
alone or together with other instances of its service that fail anywhere along the way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reconciler.oci.builder as oci
from reconciler.accel.build import BuildMemo
from reconciler.model.documents import Node, Service
from reconciler.oci.builder import (
    BuildResult,
    BuiltConfig,
    ConfigJob,
    DevicePolicy,
    OciError,
    RunLookups,
    build_all,
    build_config,
)
from tests.support.oci import FakeDevices, FakeGroups, cdev, make_node, make_placement, make_service

# ---------------------------------------------------------------- the host and the reference

GROUPS = FakeGroups({"video": 44, "render": 107, "huge": 2**32})
DEVICES = FakeDevices(
    {
        "/dev/null": [cdev("/dev/null", 1, 3)],
        "/dev/zero": [cdev("/dev/zero", 1, 5)],
        "/dev/dri": [
            cdev("/dev/dri/card0", 226, 0, found="/dev/dri/card0"),
            cdev("/dev/dri/renderD128", 226, 128, found="/dev/dri/renderD128"),
        ],
        "/dev/bad": [cdev("/dev/bad", -1, 0)],
    }
)
POLICY = DevicePolicy()


def reference(job: ConfigJob) -> BuiltConfig | str:
    """The reference's config, or its one-line error."""
    p = job.placement
    try:
        return oci._build_reference(
            job.service,
            p,
            job.node,
            job.rootfs,
            job.uid,
            job.gid,
            job.hosts_path,
            GROUPS,
            DEVICES,
            POLICY,
            job.network,
        )
    except oci._Fail as e:
        return str(OciError(f"instance {p.instance_id} ({p.label})", str(e)))


def public(job: ConfigJob) -> BuiltConfig | str:
    """``build_config`` of the job alone, or its error."""
    try:
        return build_config(
            job.service,
            job.placement,
            job.node,
            rootfs=job.rootfs,
            uid=job.uid,
            gid=job.gid,
            hosts_path=job.hosts_path,
            groups=GROUPS,
            devices=DEVICES,
            policy=POLICY,
            network=job.network,
        )
    except OciError as e:
        return str(e)


def outcome(result: BuildResult, iid: str) -> BuiltConfig | str:
    return result.errors[iid] if iid in result.errors else result.built[iid]


def assert_same(got: BuiltConfig | str, expected: BuiltConfig | str, how: str) -> None:
    if isinstance(expected, str):
        assert got == expected, how
        return
    assert isinstance(got, BuiltConfig), f"{how}: {got}"
    assert got.hosts == expected.hosts, how
    assert got.data == expected.data, how


# ---------------------------------------------------------------- what is drawn

# text with what JSON escapes, what %-formatting reads, and what looks like a template's marker
TOKENS = ["a", "Z", "0", "_", "-", ".", "/", " ", "=", "%", "%%", "%(e)b", "%s", "\\", '"', "'"]
TOKENS += ["é", "☃", "\n", "\t", "\x01", "\x7f"]
MARKERS = ["\\u0000", "\\u0000e\\u0000", '"\\u0000U\\u0000"']  # as a template writes its own
TEXT = st.lists(st.sampled_from(TOKENS), max_size=5).map("".join) | st.lists(
    st.sampled_from(TOKENS + MARKERS), max_size=5
).map("".join)
ENV_NAMES = ["PATH", "TERM", "HOME", "INSTANCE_ID", "ITEM_ID", "SUBJECT_ID", "INSTANCE_INDEX"]
ENV_NAMES += ["G", "GPU_NAME", "DEVICES_EXAMPLE_COM_GPU", "A%"]
ENV = st.builds(lambda n, v: f"{n}={v}", st.sampled_from(ENV_NAMES), TEXT)
SYSCTL = st.dictionaries(
    st.sampled_from(["net.ipv4.ip_forward", "kernel.msgmax", "net.core.somaxconn"]),
    TEXT,
    max_size=2,
)


def _resource(name: str, variant: int) -> dict[str, Any]:
    """A named host resource; variants 3-6 make a build fail at one of its steps."""
    res: dict[str, Any] = {
        "name": name,
        "sharedCount": 4,
        "groups": ["video"] if variant % 2 else ["render", "video"],
        "mounts": [{"destination": f"/mnt/{name}", "source": f"/srv/{name}", "options": ["ro"]}],
        "envs": [f"RES_{name.upper()}=1", "PATH=/res/bin", "INSTANCE_ID=overridden"],
        "hosts": [{"hostname": f"{name}-server", "ip": "10.0.0.100"}],
        "devices": ["/dev/null:/dev/x0", "/dev/dri:/dev/dri:rw"],
    }
    if variant == 1:  # a mount over the service's /tmp and the default /dev/shm
        res["mounts"] = [
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["size=1k"]},
            {"destination": "/dev/shm", "source": "/srv/shm"},
        ]
    if variant == 2:  # no devices, hosts or groups: an env and a mount only
        res.update(groups=[], hosts=[], devices=[])
    if variant == 3:
        res["groups"] = ["video", "nosuchgroup"]
    if variant == 4:
        res["devices"] = ["/dev/null:/dev/x0", "/dev/nosuchdevice"]
    if variant == 5:
        res["hosts"] = [{"hostname": "x", "ip": "not-an-ip"}]
    if variant == 6:
        res["groups"] = ["huge"]
    return res


def _pool(variant: int) -> dict[str, Any]:
    """A device pool: g0 gives devices, envs, mounts and annotations, g1 devices, g4 envs, g5
    mounts, g6 annotations; g2 and g3 only their ids."""
    g0: dict[str, Any] = {
        "id": "g0",
        "devices": ["/dev/zero:/dev/g0"],
        "envs": ["G=0", "TERM=dumb"],
        "mounts": [{"destination": "/opt/g0", "source": "/srv/g0"}],
        "annotations": {"example.com/g0": "yes", "a%": "%(x)b"},
    }
    g1: dict[str, Any] = {"id": "g1", "devices": ["/dev/null:/dev/g1:r"]}
    if variant == 1:  # a device whose lookup gives an invalid major
        g1["devices"] = ["/dev/bad:/dev/g1"]
    if variant == 2:
        g0["annotations"] = {"org.reconciler.x": "1"}
    bare = [{"id": "g2"}, {"id": "g3", "memory": "1Gi"}]
    g4 = {"id": "g4", "envs": ["G=4"]}
    g5 = {"id": "g5", "mounts": [{"destination": "/opt/g5", "source": "/srv/g5"}]}
    g6 = {"id": "g6", "annotations": {"example.com/g6": "%s"}}
    devices = [g0, g1, *bare, g4, g5, g6]
    return {"resource": "example.com/gpu", "policy": "exclusive", "devices": devices}


# its env entry has the name of example.com/gpu's (DEVICES_EXAMPLE_COM_GPU): the last one wins
TWIN_POOL = {"resource": "example.com-gpu", "policy": "exclusive", "devices": [{"id": "b0"}]}


@st.composite
def nodes(draw: st.DrawFn) -> Node:
    resources = [
        _resource("gpu0", draw(st.integers(0, 6))),
        _resource("cam", draw(st.integers(0, 2))),
    ]
    return make_node(
        resources=resources,
        pools=[_pool(draw(st.integers(0, 2))), TWIN_POOL],
        dmips=draw(st.sampled_from([1000, 4000, 2**40, 0])),  # 0: no cpu quota
        cores=draw(st.sampled_from([1, 4, 64])),
    )


REQUESTS = st.sampled_from(
    [
        {"name": "gpu0"},
        {"name": "gpu0", "mode": "r"},
        {"name": "cam"},
        {"name": "cam", "mode": "m"},
        {"name": "nosuch"},  # the node has no such resource
    ]
)


@st.composite
def services(draw: st.DrawFn, item: str) -> Service:
    quotas: dict[str, Any] = {}
    for key, values in {
        "cpuDMIPSLimit": st.integers(0, 10**7),  # (on a node of maxDMIPS 0: an error)
        "ramLimit": st.integers(1, 2**40),
        "pidsLimit": st.integers(1, 10**6),
        "noFileLimit": st.integers(1, 10**6),
        "tmpLimit": st.integers(1, 2**40),
    }.items():
        if draw(st.booleans()):
            quotas[key] = draw(values)
    image: dict[str, Any] = {
        "entrypoint": draw(st.lists(TEXT, max_size=2)),
        "cmd": [] if draw(st.integers(0, 3)) == 0 else draw(st.lists(TEXT, min_size=1, max_size=2)),
        "env": draw(st.lists(ENV, max_size=5)),
        "workingDir": draw(st.sampled_from(["/", "/srv/a b", "/100%"])),
    }
    over: dict[str, Any] = {
        "id": item,
        "subject": draw(st.sampled_from(["default", "s2"])),
        "image": image,
        "quotas": quotas,
        "sysctl": draw(SYSCTL),
        "restartPolicy": draw(st.sampled_from(["always", "on-failure", "never"])),
        "resources": draw(st.lists(REQUESTS, max_size=2, unique_by=lambda r: r["name"]))
        if draw(st.booleans())
        else [],
    }
    hostname = draw(st.sampled_from([None, "nav", "a.b-c"]))
    if hostname is not None:
        over["hostname"] = hostname
    return make_service(**over)


POOL_DEVICES: list[tuple[tuple[str, Sequence[str]], ...]] = [
    (),
    (("example.com/gpu", ("g0",)),),
    (("example.com/gpu", ("g1", "g0")),),
    (("example.com/gpu", ("gX",)),),  # no such device
    (("example.com/tpu", ("g0",)),),  # no such pool
    (("example.com/gpu", ("g2",)),),  # ids only: the template's path
    (("example.com/gpu", ("g3", "g2")),),
    (("example.com/gpu", ()),),
    (("example.com-gpu", ("b0",)), ("example.com/gpu", ("g2",))),
    (("example.com/gpu", ("g3",)), ("example.com-gpu", ("b0",))),
    (("example.com/gpu", ("g2", "g0")),),  # one with more than ids
    (("example.com/gpu", ("g2", "g4")),),
    (("example.com/gpu", ("g5", "g2")),),
    (("example.com/gpu", ("g6",)),),
    (("example.com/gpu", ("g1",)),),
    (("example.com-gpu", ("b0",)), ("example.com/gpu", ("g1",))),
    (("example.com/gpu", ("g2",)), ("example.com/tpu", ("g0",))),
    (("example.com/gpu", ("g2", "gX")),),
]


@st.composite
def jobs_of(draw: st.DrawFn, svc: Service, node: Node) -> list[ConfigJob]:
    """Instances of one service (mostly good, some failing at one of the caller's checks)."""
    jobs = []
    for index in draw(st.sets(st.integers(0, 20), min_size=1, max_size=6)):
        devices = draw(st.sampled_from(POOL_DEVICES)) if draw(st.booleans()) else ()
        p = make_placement(svc, node, index, devices)
        iid = p.instance_id
        hosts_path = f"/state/out/instances/{iid}/hosts"
        rootfs, uid, gid = "/srv/rootfs", 5000 + index, 5000
        network: tuple[str, str] | None = None
        if draw(st.booleans()):
            network = (draw(st.sampled_from(["default", "net-%", "n\\1"])), f"10.1.0.{index}")
        match draw(st.integers(0, 24)):
            case 1:
                p = replace(p, node_id="elsewhere")
            case 2:
                p = replace(p, subject_id="other")
            case 3:
                rootfs = "relative/rootfs"
            case 4:
                hosts_path = "hosts"
            case 5:
                uid = -1
            case 6:
                gid = 2**32
            case 7:
                rootfs = '/srv/%(e)b "\\u0000e\\u0000" é'
            case 8:
                hosts_path = "/state/%s/\\u0000h\\u0000/hosts"
            case _:
                pass
        jobs.append(ConfigJob(svc, p, node, rootfs, uid, gid, hosts_path, network))
    return jobs


# ---------------------------------------------------------------- the comparisons


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_fast_build_equals_the_reference(data: st.DataObject) -> None:
    node = data.draw(nodes())
    svcs = [data.draw(services(f"com.example.s{k}")) for k in range(data.draw(st.integers(1, 3)))]
    jobs = [job for svc in svcs for job in data.draw(jobs_of(svc, node))]
    jobs = data.draw(st.permutations(jobs))
    ids = [j.placement.instance_id for j in jobs]
    together = build_all(jobs, groups=GROUPS, devices=DEVICES, policy=POLICY)
    memo = BuildMemo()
    memoized = memo.build_all(jobs, groups=GROUPS, devices=DEVICES, policy=POLICY)
    again = memo.build_all(jobs, groups=GROUPS, devices=DEVICES, policy=POLICY)
    assert list(together.built) == [i for i in ids if i in together.built]
    assert list(together.errors) == [i for i in ids if i not in together.built]
    for job in jobs:
        iid = job.placement.instance_id
        expected = reference(job)
        assert_same(outcome(together, iid), expected, "build_all, all together")
        assert_same(outcome(memoized, iid), expected, "BuildMemo")
        assert_same(outcome(again, iid), expected, "BuildMemo, again")
        assert_same(public(job), expected, "build_config")
        alone = build_all([job], groups=GROUPS, devices=DEVICES, policy=POLICY)
        assert_same(outcome(alone, iid), expected, "build_all, alone")


def _jobs(svc: Service, node: Node, n: int, **kw: Any) -> list[ConfigJob]:
    out = []
    for i in range(n):
        p = make_placement(svc, node, i, kw.get("devices", ()))
        out.append(
            ConfigJob(svc, p, node, "/srv/rootfs", 5000, 5000, f"/h/{i}/hosts", kw.get("net"))
        )
    return out


def test_a_service_part_is_made_once_per_call_and_its_template_used() -> None:
    svc, node = make_service(hostname="nav"), make_node()
    lookups = RunLookups(GROUPS, DEVICES)
    parts = set()
    for job in _jobs(svc, node, 5):
        assert_same(oci.build_job(job, lookups, POLICY), reference(job), job.placement.label)
        parts.add(id(lookups.part(svc)))
    assert len(parts) == 1
    part = lookups.part(svc)
    assert set(part.templates) == {(False, ())} and part.templates[(False, ())] is not None
    (job,) = _jobs(svc, node, 1, net=("default", "10.0.0.1"))
    assert_same(oci.build_job(job, lookups, POLICY), reference(job), "networked")
    assert set(part.templates) == {(False, ()), (True, ())}
    assert part.templates[(True, ())] is not None


def test_instances_whose_pool_devices_give_only_ids_are_built_from_a_template() -> None:
    svc = make_service(image={"cmd": ["run"], "env": ["DEVICES_EXAMPLE_COM_GPU=x", "Z=1"]})
    node = make_node(pools=[_pool(0), TWIN_POOL])
    lookups = RunLookups(GROUPS, DEVICES)
    gpu, twin = "example.com/gpu", "example.com-gpu"
    for devices in [((gpu, ("g2",)),), ((gpu, ("g3", "g2")),), ((twin, ("b0",)), (gpu, ("g3",)))]:
        for job in _jobs(svc, node, 2, devices=devices):
            assert_same(oci.build_job(job, lookups, POLICY), reference(job), str(devices))
    more = [((gpu, (g,)),) for g in ("g0", "g1", "g4", "g5", "g6", "g9")]  # (g9: not there)
    for devices in more:
        for job in _jobs(svc, node, 2, devices=devices):
            assert_same(oci.build_job(job, lookups, POLICY), reference(job), str(devices))
    templates = lookups.part(svc).templates
    assert set(templates) == {(False, (gpu,)), (False, (twin, gpu))}
    assert None not in templates.values()


def test_a_template_is_made_for_a_service_with_a_few_jobs_in_the_call_or_more() -> None:
    many, one = make_service(id="com.example.many"), make_service(id="com.example.one")
    node = make_node()
    jobs = [*_jobs(many, node, oci._TEMPLATED_FROM), *_jobs(one, node, 1)]
    lookups = RunLookups(GROUPS, DEVICES, jobs)
    for job in jobs:
        assert_same(oci.build_job(job, lookups, POLICY), reference(job), job.placement.label)
    assert lookups.part(many).templates and not lookups.part(one).templates


def test_a_service_whose_strings_look_like_markers_is_built_without_a_template() -> None:
    svc = make_service(image={"cmd": ["echo", "\\u0000e\\u0000"], "env": ["A=%(e)b"]})
    node = make_node()
    lookups = RunLookups(GROUPS, DEVICES)
    for job in _jobs(svc, node, 3):
        assert_same(oci.build_job(job, lookups, POLICY), reference(job), job.placement.label)
    assert lookups.part(svc).templates == {(False, ()): None}


def test_an_instance_failing_midway_leaves_the_others_of_its_service_as_built_alone() -> None:
    svc = make_service(
        resources=[{"name": "gpu0"}], image={"cmd": ["run"], "env": ["INSTANCE_ID=img", "Z=1"]}
    )
    good, bad = (
        make_node(resources=[_resource("gpu0", 0)]),
        make_node(resources=[_resource("gpu0", 4)]),
    )
    failing = _jobs(svc, bad, 2)
    passing = [replace(j, node=good) for j in _jobs(svc, good, 4)[2:]]
    result = build_all([*failing, *passing], groups=GROUPS, devices=DEVICES, policy=POLICY)
    assert set(result.errors) == {j.placement.instance_id for j in failing}
    assert "/dev/nosuchdevice" in next(iter(result.errors.values()))
    for job in [*failing, *passing]:
        assert_same(outcome(result, job.placement.instance_id), reference(job), "after a failure")
        assert_same(public(job), reference(job), "build_config")


@pytest.mark.parametrize("dmips", [0, 4000])
def test_the_cpu_quota_is_the_nodes_whatever_the_template(dmips: int) -> None:
    svc = make_service(quotas={"cpuDMIPSLimit": 1000})
    small, big = make_node(dmips=dmips), make_node(dmips=8000, cores=8)
    jobs = [*_jobs(svc, small, 1), *(replace(j, node=big) for j in _jobs(svc, big, 2)[1:])]
    result = build_all(jobs, groups=GROUPS, devices=DEVICES, policy=POLICY)
    for job in jobs:
        assert_same(outcome(result, job.placement.instance_id), reference(job), str(job.node))
