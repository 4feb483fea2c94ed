"""OCI runtime configs (SPEC §11, issue 4): the pure builder, the host lookups and the writer.

Every config a test builds goes through :func:`build`, which validates it against the OCI
runtime-spec v1.0.2 JSON Schema (draft 4, sibling schema files registered);
``test_schema_is_available`` fails when the schema is missing.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.model.values import instance_id
from reconciler.oci.builder import (
    CPU_PERIOD,
    BuiltConfig,
    ConfigJob,
    DeviceLookupError,
    DeviceNode,
    DevicePolicy,
    OciError,
    build_all,
    build_config,
    config_json,
    cpu_quota,
    devices_env_name,
    intersect_access,
    parse_device_string,
)
from reconciler.oci.hostdevices import HostDevices, SystemGroups
from reconciler.oci.writer import (
    OutputPathError,
    hosts_path,
    instance_dir,
    write_instance_outputs,
)
from tests.support.oci import (
    GPU0,
    HOSTS,
    NO_DEVICES,
    ROOTFS,
    SCHEMA_DIR,
    SHARED_SCHEMA_DIR,
    VALIDATOR,
    FakeDevices,
    FakeGroups,
    assert_valid,
    build,
    built_configs,
    cdev,
    make_node,
    make_placement,
    make_service,
    mounts_of,
    schema_errors,
)

# ---------------------------------------------------------------- schema


# ---------------------------------------------------------------- fakes and builders


def real_node(path: str) -> DeviceNode:
    """The expected DeviceNode of a real device file, straight from os.stat."""
    s = os.stat(path)
    return DeviceNode(
        os.path.realpath(path),
        "c" if stat.S_ISCHR(s.st_mode) else "b",
        os.major(s.st_rdev),
        os.minor(s.st_rdev),
        s.st_mode & 0o777,
        s.st_uid,
        s.st_gid,
    )


def env_of(built: BuiltConfig) -> dict[str, str]:
    entries: list[str] = built.config["process"]["env"]
    names = [e.split("=", 1)[0] for e in entries]
    assert len(names) == len(set(names)), f"duplicate env names: {entries}"
    return dict(e.split("=", 1) for e in entries)


def allow_rules(built: BuiltConfig) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = built.config["linux"]["resources"]["devices"]
    assert rules[0] == {"allow": False, "access": "rwm"}
    return rules[1:]


def devices_of(built: BuiltConfig) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = built.config["linux"].get("devices", [])
    return out


def assert_one_rule_per_device(built: BuiltConfig) -> None:
    devs, rules = devices_of(built), allow_rules(built)
    assert len(rules) == len(devs)
    for dev, rule in zip(devs, rules, strict=True):
        assert rule["allow"] is True
        assert (rule["type"], rule["major"], rule["minor"]) == (
            dev["type"],
            dev["major"],
            dev["minor"],
        )


# ---------------------------------------------------------------- the schema itself


def test_schema_is_available() -> None:
    """The schema is part of the contract (SPEC §11: ../shared/oci-runtime-spec-v1.0.2): without
    it no config would be validated, so its absence fails here instead of passing silently."""
    assert VALIDATOR is not None, f"OCI runtime-spec schema not found at {SCHEMA_DIR}"
    for sibling in ("defs.json", "defs-linux.json", "config-linux.json"):
        assert (SCHEMA_DIR / sibling).is_file(), sibling


def test_the_copied_schema_is_the_shared_one() -> None:
    if not SHARED_SCHEMA_DIR.is_dir():
        pytest.skip(f"no shared schema at {SHARED_SCHEMA_DIR} to compare the copy with")
    shared = {p.name: p.read_bytes() for p in sorted(SHARED_SCHEMA_DIR.glob("*.json"))}
    copied = {p.name: p.read_bytes() for p in sorted(SCHEMA_DIR.glob("*.json"))}
    assert copied == shared


def test_schema_validator_resolves_refs_and_rejects_bad_configs() -> None:
    if VALIDATOR is None:
        pytest.skip(f"OCI runtime-spec schema not found at {SCHEMA_DIR}")
    good = build(make_service(), make_node()).config
    bad = json.loads(json.dumps(good))
    bad["linux"]["devices"] = [{"path": "/dev/x", "type": "c", "fileMode": 4096}]
    bad["process"]["user"]["uid"] = -1
    errors = schema_errors(bad)
    assert any("fileMode" in e for e in errors), errors  # resolved through defs-linux.json
    assert any("uid" in e for e in errors), errors  # resolved through defs.json


# ---------------------------------------------------------------- defaults, process, identity


def test_defaults_follow_runc_spec() -> None:
    svc = make_service()
    built = build(svc, make_node())
    c = built.config
    assert c["ociVersion"] == "1.0.2"
    assert c["process"]["terminal"] is False
    assert c["process"]["noNewPrivileges"] is True
    env = env_of(built)
    assert env["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert env["TERM"] == "xterm"
    assert [n["type"] for n in c["linux"]["namespaces"]] == [
        "pid",
        "network",
        "ipc",
        "uts",
        "mount",
    ]
    assert "/proc/kcore" in c["linux"]["maskedPaths"]
    assert "/proc/sys" in c["linux"]["readonlyPaths"]
    assert c["linux"]["resources"]["devices"] == [{"allow": False, "access": "rwm"}]
    assert list(mounts_of(built))[:2] == ["/proc", "/dev"]
    assert "cpu" not in c["linux"]["resources"] and "memory" not in c["linux"]["resources"]
    assert "rlimits" not in c["process"]


def test_user_root_and_process_from_image() -> None:
    svc = make_service(
        image={
            "entrypoint": ["/bin/nav"],
            "cmd": ["--region", "eu"],
            "env": ["MAP_REGION=eu", "PATH=/opt/nav/bin:/bin"],
            "workingDir": "/opt/nav",
        }
    )
    built = build(svc, make_node(), uid=5123, gid=6001)
    c = built.config
    assert c["process"]["user"] == {"uid": 5123, "gid": 6001}
    assert c["root"] == {"path": ROOTFS, "readonly": False}
    assert c["process"]["args"] == ["/bin/nav", "--region", "eu"]
    assert c["process"]["cwd"] == "/opt/nav"
    env = c["process"]["env"]
    assert env[0] == "PATH=/opt/nav/bin:/bin"  # replaced in place, not appended
    assert "MAP_REGION=eu" in env


def test_instance_env_and_default_hostname() -> None:
    svc = make_service(subject="fleet", instances=3)
    built = build(svc, make_node(), index=2)
    iid = instance_id("com.example.nav", "fleet", 2)
    env = env_of(built)
    assert env["INSTANCE_ID"] == iid
    assert env["ITEM_ID"] == "com.example.nav"
    assert env["SUBJECT_ID"] == "fleet"
    assert env["INSTANCE_INDEX"] == "2"
    assert built.config["hostname"] == iid  # no hostname given: the instance id
    assert built.hosts == f"127.0.0.1 localhost\n127.0.1.1 {iid}\n"


def test_hostname_and_sysctl() -> None:
    svc = make_service(hostname="nav", sysctl={"net.ipv4.ip_forward": "1", "kernel.msgmax": "8"})
    c = build(svc, make_node()).config
    assert c["hostname"] == "nav"
    assert c["linux"]["sysctl"] == {"kernel.msgmax": "8", "net.ipv4.ip_forward": "1"}


def test_no_command_fails_clearly() -> None:
    svc = make_service(image={"cmd": []})
    with pytest.raises(OciError, match="neither entrypoint nor cmd"):
        build(svc, make_node())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rootfs": "rootfs/busybox"}, "rootfs 'rootfs/busybox' is not an absolute path"),
        ({"hosts_path": "hosts"}, "hosts file path 'hosts' is not absolute"),
        ({"uid": -1}, "uid -1 is out of range"),
    ],
)
def test_caller_inputs_checked(kwargs: dict[str, Any], message: str) -> None:
    svc, node = make_service(), make_node()
    args: dict[str, Any] = {"rootfs": ROOTFS, "uid": 1, "gid": 1, "hosts_path": HOSTS} | kwargs
    with pytest.raises(OciError) as info:
        build_config(
            svc,
            make_placement(svc, node),
            node,
            groups=FakeGroups(),
            devices=NO_DEVICES,
            **args,
        )
    assert message in str(info.value)
    assert instance_id(svc.id, svc.subject, 0) in str(info.value)


def test_output_is_deterministic() -> None:
    svc = make_service(resources=[{"name": "gpu0", "mode": "rw"}], hostname="nav")
    node = make_node(resources=[GPU0])
    a = build(svc, node, devices=HostDevices())
    b = build(svc, node, devices=HostDevices())
    assert a == b
    assert config_json(a) == config_json(b)
    assert json.loads(config_json(a)) == a.config


# ---------------------------------------------------------------- quotas


def test_quotas_map_to_cgroups_rlimits_and_tmpfs() -> None:
    svc = make_service(
        quotas={
            "cpuDMIPSLimit": 1000,
            "ramLimit": "512Mi",
            "pidsLimit": 64,
            "noFileLimit": 2048,
            "tmpLimit": "64Mi",
        }
    )
    built = build(svc, make_node(dmips=4000, cores=4))
    res = built.config["linux"]["resources"]
    assert res["cpu"] == {"quota": 100_000, "period": 100_000}  # a quarter of 4 cores
    assert res["memory"] == {"limit": 512 * 1024**2}
    assert res["pids"] == {"limit": 64}
    assert built.config["process"]["rlimits"] == [
        {"type": "RLIMIT_NOFILE", "soft": 2048, "hard": 2048}
    ]
    tmp = mounts_of(built)["/tmp"]
    assert tmp["type"] == "tmpfs"
    assert f"size={64 * 1024**2}" in tmp["options"]


@pytest.mark.parametrize(
    ("limit", "cores", "max_dmips", "expected"),
    [
        (1000, 4, 4000, 100_000),
        (1, 1, 3000, 1000),  # 33 rounds down, then the minimum of 1000
        (0, 2, 1000, 1000),
        (999, 3, 7000, 42_814),  # 299_700_000 / 7000 = 42814.28…
        (8000, 4, 4000, 800_000),
    ],
)
def test_cpu_quota_examples(limit: int, cores: int, max_dmips: int, expected: int) -> None:
    svc = make_service(quotas={"cpuDMIPSLimit": limit})
    cpu = build(svc, make_node(dmips=max_dmips, cores=cores)).config["linux"]["resources"]["cpu"]
    assert cpu == {"quota": expected, "period": CPU_PERIOD}


@given(
    limit=st.integers(0, 100_000),
    cores=st.integers(1, 256),
    max_dmips=st.integers(1, 1_000_000),
)
def test_cpu_quota_property(limit: int, cores: int, max_dmips: int) -> None:
    exact = Fraction(limit * 100_000 * cores, max_dmips)
    q = cpu_quota(limit, cores, max_dmips)
    assert q >= 1000
    assert q == max(1000, int(exact))  # int() of a non-negative Fraction rounds down
    assert q == 1000 or q <= exact < q + 1


def test_cpu_quota_needs_max_dmips() -> None:
    svc = make_service(quotas={"cpuDMIPSLimit": 100})
    with pytest.raises(OciError, match="maxDMIPS is 0"):
        build(svc, make_node(dmips=0))


# ---------------------------------------------------------------- named resources


def test_gpu0_example_with_real_devices() -> None:
    """The resource manager's gpu0 entry, against /dev/null and /dev/zero."""
    svc = make_service(resources=[{"name": "gpu0", "mode": "rw"}], hostname="nav")
    built = build(svc, make_node(resources=[GPU0]), devices=HostDevices())
    c = built.config
    assert c["process"]["user"]["additionalGids"] == [44, 107]
    assert mounts_of(built)["/dev/dri"] == {
        "destination": "/dev/dri",
        "type": "bind",
        "source": "/dev/dri",
        "options": ["rbind", "rw"],
    }
    assert env_of(built)["GPU_NAME"] == "gpu0"
    assert built.hosts == "127.0.0.1 localhost\n127.0.1.1 nav\n10.0.0.100 gpu-server\n"
    assert mounts_of(built)["/etc/hosts"] == {
        "destination": "/etc/hosts",
        "type": "bind",
        "source": HOSTS,
        "options": ["rbind", "ro"],
    }
    null, zero = real_node("/dev/null"), real_node("/dev/zero")
    assert devices_of(built) == [
        {
            "path": "/dev/gpu0",
            "type": null.type,
            "major": null.major,
            "minor": null.minor,
            "fileMode": null.file_mode,
            "uid": null.uid,
            "gid": null.gid,
        },
        {
            "path": "/dev/gpu0-ctl",
            "type": zero.type,
            "major": zero.major,
            "minor": zero.minor,
            "fileMode": zero.file_mode,
            "uid": zero.uid,
            "gid": zero.gid,
        },
    ]
    # Linux fixes /dev/null at c 1:3 and /dev/zero at c 1:5; access: rwm ∩ rw and rw ∩ rw
    assert (null.type, null.major, null.minor) == ("c", 1, 3)
    assert (zero.type, zero.major, zero.minor) == ("c", 1, 5)
    assert allow_rules(built) == [
        {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rw"},
        {"allow": True, "type": "c", "major": 1, "minor": 5, "access": "rw"},
    ]


@pytest.mark.parametrize(
    ("permissions", "mode", "access"),
    [("rw", "r", "r"), ("", "rw", "rw"), ("rwm", "mr", "rm"), ("m", "rwm", "m"), ("wr", "wm", "w")],
)
def test_access_is_permissions_intersected_with_mode(
    permissions: str, mode: str, access: str
) -> None:
    spec = "/dev/null:/dev/gpu0" + (f":{permissions}" if permissions else "")
    res = {"name": "gpu0", "devices": [spec]}
    svc = make_service(resources=[{"name": "gpu0", "mode": mode}])
    built = build(svc, make_node(resources=[res]), devices=HostDevices())
    assert [r["access"] for r in allow_rules(built)] == [access]


def test_no_common_access_leaves_the_device_out() -> None:
    res = {"name": "gpu0", "devices": ["/dev/null:/dev/gpu0:w", "/dev/zero:/dev/gpu0-ctl:r"]}
    svc = make_service(resources=[{"name": "gpu0", "mode": "r"}])
    built = build(svc, make_node(resources=[res]), devices=HostDevices())
    assert [d["path"] for d in devices_of(built)] == ["/dev/gpu0-ctl"]
    assert_one_rule_per_device(built)


@given(st.text("rwm", max_size=3), st.text("rwm", min_size=1, max_size=3))
def test_intersect_access_property(permissions: str, mode: str) -> None:
    out = intersect_access(permissions, mode)
    assert set(out) == set(permissions) & set(mode)
    assert out == "".join(sorted(out, key="rwm".index))


def test_groups_mounts_envs_replace_and_deduplicate_in_service_order() -> None:
    first = {
        "name": "a",
        "groups": ["video", "render"],
        "mounts": [{"destination": "/data", "type": "bind", "source": "/srv/a"}],
        "envs": ["SHARED=a", "ONLY_A=1"],
    }
    second = {
        "name": "b",
        "groups": ["render", "dialout"],
        "mounts": [
            {"destination": "/data", "type": "bind", "source": "/srv/b", "options": ["ro"]},
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["size=1m"]},
        ],
        "envs": ["SHARED=b", "ITEM_ID=overridden"],
    }
    svc = make_service(
        resources=[{"name": "a"}, {"name": "b"}],
        quotas={"tmpLimit": "64Mi"},
    )
    groups = FakeGroups({"video": 44, "render": 107, "dialout": 20})
    built = build(svc, make_node(resources=[second, first]), groups=groups)
    assert built.config["process"]["user"]["additionalGids"] == [44, 107, 20]
    mounts = mounts_of(built)
    assert mounts["/data"]["source"] == "/srv/b"
    assert mounts["/tmp"]["options"] == ["size=1m"]  # the resource replaced the tmpLimit tmpfs
    dests = list(mounts)
    assert dests.index("/tmp") < dests.index("/data") < dests.index("/etc/hosts")
    env = env_of(built)
    assert (env["SHARED"], env["ONLY_A"], env["ITEM_ID"]) == ("b", "1", "overridden")


def test_unknown_group_fails_with_its_name() -> None:
    svc = make_service(resources=[{"name": "gpu0", "mode": "rw"}])
    with pytest.raises(OciError) as info:
        build(svc, make_node(resources=[GPU0]), groups=FakeGroups({"video": 44}))
    msg = str(info.value)
    assert "'render'" in msg and "unknown group" in msg
    assert instance_id(svc.id, svc.subject, 0) in msg and "com.example.nav:default:0" in msg
    assert "\n" not in msg


def test_unknown_group_fails_only_that_instance() -> None:
    good = make_service(id="com.example.ok", resources=[{"name": "serial0"}])
    bad = make_service(id="com.example.bad", resources=[{"name": "gpu0", "mode": "rw"}])
    node = make_node(resources=[GPU0, {"name": "serial0", "groups": ["dialout"]}])
    jobs = [
        ConfigJob(s, make_placement(s, node), node, ROOTFS, 5000, 5000, HOSTS) for s in (bad, good)
    ]
    result = build_all(jobs, groups=FakeGroups({"video": 44, "dialout": 20}), devices=HostDevices())
    good_id, bad_id = instance_id(good.id, "default", 0), instance_id(bad.id, "default", 0)
    assert list(result.built) == [good_id]
    assert list(result.errors) == [bad_id]
    assert "unknown group 'render'" in result.errors[bad_id]
    assert result.built[good_id].config["process"]["user"]["additionalGids"] == [20]
    assert_valid(result.built[good_id].config)


def test_system_groups_lookup() -> None:
    groups = SystemGroups()
    assert groups("root") == 0
    assert groups("no-such-group-for-reconciler-tests") is None
    svc = make_service(resources=[{"name": "r"}])
    node = make_node(resources=[{"name": "r", "groups": ["no-such-group-for-reconciler-tests"]}])
    with pytest.raises(OciError, match="unknown group 'no-such-group-for-reconciler-tests'"):
        build(svc, node, groups=groups)


def test_unknown_resource_fails() -> None:
    svc = make_service(resources=[{"name": "gpu9"}])
    with pytest.raises(OciError, match="no resource named 'gpu9'"):
        build(svc, make_node(resources=[GPU0]))


def test_hosts_lines_in_order_without_duplicates() -> None:
    a = {"name": "a", "hosts": [{"hostname": "db", "ip": "10.0.0.5"}]}
    b = {
        "name": "b",
        "hosts": [{"hostname": "db", "ip": "10.0.0.5"}, {"hostname": "cache", "ip": "fd00::7"}],
    }
    svc = make_service(resources=[{"name": "b"}, {"name": "a"}], hostname="nav")
    built = build(svc, make_node(resources=[a, b]))
    assert built.hosts.splitlines() == [
        "127.0.0.1 localhost",
        "127.0.1.1 nav",
        "10.0.0.5 db",
        "fd00::7 cache",
    ]


# ---------------------------------------------------------------- device mapping (pure)


def test_directory_and_glob_map_relative_paths_under_the_container_path() -> None:
    card0 = cdev("/dev/dri/card0", 226, 0)
    card1 = cdev("/dev/dri/card1", 226, 1)
    render = cdev("/dev/dri/renderD128", 226, 128)
    lookup = FakeDevices(
        {
            "/dev/dri": [render, card1, card0],  # any order: the builder sorts
            "/dev/dri/card*": [card0, card1],
            "/dev/gpus": [
                cdev("/dev/dri/card0", 226, 0, found="/dev/gpus/card0"),
                cdev("/dev/dri/card1", 226, 1, found="/dev/gpus/by-id/c1"),
            ],
        }
    )
    cases = {
        "/dev/dri": ["/dev/dri/card0", "/dev/dri/card1", "/dev/dri/renderD128"],
        "/dev/dri:/dev/gpu": ["/dev/gpu/card0", "/dev/gpu/card1", "/dev/gpu/renderD128"],
        "/dev/dri/card*": ["/dev/dri/card0", "/dev/dri/card1"],
        "/dev/dri/card*:/dev": ["/dev/card0", "/dev/card1"],
        "/dev/gpus": ["/dev/gpus/by-id/c1", "/dev/gpus/card0"],
    }
    for spec, paths in cases.items():
        svc = make_service(resources=[{"name": "g"}])
        built = build(svc, make_node(resources=[{"name": "g", "devices": [spec]}]), devices=lookup)
        assert [d["path"] for d in devices_of(built)] == paths, spec
        assert_one_rule_per_device(built)


def test_same_container_path_is_replaced_with_its_rule() -> None:
    res = {"name": "g", "devices": ["/dev/null:/dev/gpu0", "/dev/zero:/dev/gpu0:r"]}
    svc = make_service(resources=[{"name": "g"}])
    built = build(svc, make_node(resources=[res]), devices=HostDevices())
    zero = real_node("/dev/zero")
    assert [(d["path"], d["minor"]) for d in devices_of(built)] == [("/dev/gpu0", zero.minor)]
    assert allow_rules(built)[0]["access"] == "r"
    assert_one_rule_per_device(built)


@pytest.mark.parametrize(
    ("text", "host", "container", "permissions"),
    [
        ("/dev/null", "/dev/null", "/dev/null", "rwm"),
        ("/dev/null:/dev/gpu0", "/dev/null", "/dev/gpu0", "rwm"),
        ("/dev/null::rw", "/dev/null", "/dev/null", "rw"),
        ("/dev/dri/render*", "/dev/dri/render*", "/dev/dri", "rwm"),
        ("/dev/input/*/event?:/dev/in:r", "/dev/input/*/event?", "/dev/in", "r"),
    ],
)
def test_parse_device_string(text: str, host: str, container: str, permissions: str) -> None:
    spec = parse_device_string(text)
    assert (spec.host, spec.container, spec.permissions) == (host, container, permissions)


@pytest.mark.parametrize("text", ["dev/null", "/dev/null:/dev/x:rwx", "/a:/b:r:extra", "/a::rr"])
def test_parse_device_string_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_device_string(text)


# ---------------------------------------------------------------- pool devices


def test_pool_devices_apply_devices_envs_and_ids() -> None:
    pools = [
        {
            "resource": "example.com/gpu",
            "policy": "exclusive",
            "devices": [
                {"id": "g0", "devices": ["/dev/null:/dev/gpu-a"], "envs": ["GPU_VENDOR=example"]},
                {"id": "g1", "devices": ["/dev/zero:/dev/gpu-b:r"], "envs": ["GPU_SLOT=1"]},
                {"id": "g2", "devices": ["/dev/full:/dev/gpu-c"]},
            ],
        }
    ]
    svc = make_service(devices=[{"resource": "example.com/gpu", "count": 2}])
    built = build(
        svc,
        make_node(pools=pools),
        pool_devices=[("example.com/gpu", ["g0", "g1"])],
        devices=HostDevices(),
    )
    env = env_of(built)
    assert env["DEVICES_EXAMPLE_COM_GPU"] == "g0,g1"
    assert (env["GPU_VENDOR"], env["GPU_SLOT"]) == ("example", "1")
    assert [d["path"] for d in devices_of(built)] == ["/dev/gpu-a", "/dev/gpu-b"]
    assert [r["access"] for r in allow_rules(built)] == ["rwm", "r"]  # pool mode is rwm
    assert_one_rule_per_device(built)


def test_devices_env_name() -> None:
    assert devices_env_name("example.com/gpu") == "DEVICES_EXAMPLE_COM_GPU"
    assert devices_env_name("tpu-v2") == "DEVICES_TPU_V2"


def test_vanished_pool_device_fails() -> None:
    pools = [{"resource": "gpu", "policy": "exclusive", "devices": [{"id": "g0"}]}]
    svc = make_service(devices=[{"resource": "gpu", "count": 1}])
    with pytest.raises(OciError, match="has no 'g7'"):
        build(svc, make_node(pools=pools), pool_devices=[("gpu", ["g7"])])


def _mounting_pool(**g1: Any) -> list[dict[str, Any]]:
    return [
        {
            "resource": "example.com/npu",
            "policy": "exclusive",
            "devices": [
                {
                    "id": "n0",
                    "mounts": [
                        {
                            "destination": "/opt/npu/firmware",
                            "source": "/lib/firmware/npu0",
                            "options": ["rbind", "ro"],
                        },
                        {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs"},
                    ],
                    "annotations": {"example.com/npu.slot": "0", "example.com/npu.model": "x1"},
                },
                {"id": "n1", **g1},
            ],
        }
    ]


def test_pool_device_mounts_and_annotations_go_into_the_config() -> None:
    """A device's mounts join the config's (replacing one of the same destination: here the
    /tmp tmpfs of tmpLimit), its annotations the config's, sorted, with the restart policy's;
    a device not allocated gives nothing."""
    svc = make_service(
        devices=[{"resource": "example.com/npu", "count": 1}],
        quotas={"tmpLimit": "1Mi"},
        restartPolicy="never",
    )
    node = make_node(pools=_mounting_pool(mounts=[{"destination": "/n1", "source": "/srv"}]))
    built = build(svc, node, pool_devices=[("example.com/npu", ["n0"])])
    mounts = mounts_of(built)
    assert mounts["/opt/npu/firmware"] == {
        "destination": "/opt/npu/firmware",
        "type": "bind",
        "source": "/lib/firmware/npu0",
        "options": ["rbind", "ro"],
    }
    assert mounts["/tmp"] == {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs"}
    assert "/n1" not in mounts
    assert list(built.config["annotations"].items()) == [
        ("example.com/npu.model", "x1"),
        ("example.com/npu.slot", "0"),
        ("org.reconciler.restartPolicy", "never"),
    ]
    other = build(svc, node, pool_devices=[("example.com/npu", ["n1"])])
    assert mounts_of(other)["/n1"]["source"] == "/srv"
    assert other.config["annotations"] == {"org.reconciler.restartPolicy": "never"}


@pytest.mark.parametrize(
    ("device", "message"),
    [
        (
            {"mounts": [{"destination": "/proc/x", "source": "/srv"}]},
            "device example.com/npu/n1: mount destination '/proc/x' is not allowed",
        ),
        (
            {"annotations": {"org.reconciler.restartPolicy": "always"}},
            "device example.com/npu/n1: annotation 'org.reconciler.restartPolicy' is reserved",
        ),
        (
            {"annotations": {"org.opencontainers.image.ref.name": "x"}},
            "annotation 'org.opencontainers.image.ref.name' is reserved",
        ),
    ],
)
def test_pool_device_mounts_and_annotations_follow_the_policy(
    device: dict[str, Any], message: str
) -> None:
    svc = make_service(devices=[{"resource": "example.com/npu", "count": 1}])
    node = make_node(pools=_mounting_pool(**device))
    with pytest.raises(OciError, match=re.escape(message)):
        build(svc, node, pool_devices=[("example.com/npu", ["n1"])])


# ---------------------------------------------------------------- policy


def _resource_error(res: Mapping[str, Any], devices: Any = None, **kw: Any) -> str:
    svc = make_service(resources=[{"name": res["name"]}])
    with pytest.raises(OciError) as info:
        build(svc, make_node(resources=[res]), devices=devices or HostDevices(), **kw)
    msg = str(info.value)
    assert "\n" not in msg and instance_id(svc.id, svc.subject, 0) in msg
    return msg


@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("/etc/passwd:/dev/passwd", "host device '/etc/passwd' is outside the allowed roots"),
        ("/dev/../etc/x:/dev/x", "is outside the allowed roots"),
        ("/dev/null:dev/gpu0", "container device path 'dev/gpu0' is not absolute"),
        ("/dev/null:/dev/../etc/gpu0", "is not absolute and normalized"),
        ("/dev/null:/etc/gpu0", "container device path '/etc/gpu0' is not under /dev/"),
        ("/dev/null:/dev", "container device path '/dev' is not under /dev/"),
        ("/dev/nonexistent-for-tests", "no such file or directory"),
        ("/dev/null:/dev/x:rwz", "invalid permissions"),
    ],
)
def test_device_policy_violations(device: str, message: str) -> None:
    msg = _resource_error({"name": "r", "devices": [device]})
    assert message.lower() in msg.lower()


def test_builder_rechecks_what_the_lookup_returns() -> None:
    """A lookup that returns a device resolving outside /dev is caught by the builder too."""
    sneaky = FakeDevices({"/dev/gpu": [cdev("/etc/shadow-dev", 1, 3, found="/dev/gpu")]})
    msg = _resource_error({"name": "r", "devices": ["/dev/gpu"]}, devices=sneaky)
    assert "'/etc/shadow-dev' is outside the allowed roots" in msg
    escaping = FakeDevices({"/dev/dri": [cdev("/dev/x", 1, 3, found="/dev/other/x")]})
    msg = _resource_error({"name": "r", "devices": ["/dev/dri"]}, devices=escaping)
    assert "was found outside '/dev/dri'" in msg


@pytest.mark.parametrize(
    ("mount", "message"),
    [
        ({"destination": "/proc", "source": "/x"}, "'/proc' is not allowed"),
        ({"destination": "/sys/kernel", "source": "/x"}, "'/sys/kernel' is not allowed"),
        ({"destination": "/", "source": "/x"}, "mount destination '/' is not allowed"),
        ({"destination": "data", "source": "/x"}, "'data' is not absolute"),
        ({"destination": "/data/../cache", "source": "/x"}, "is not normalized"),
        (
            {"destination": "/data", "source": "/x", "options": ["rbind", "ro,exec"]},
            "mount option 'ro,exec' for /data holds ','",
        ),
        (
            {"destination": "/data", "type": "tmpfs", "source": "t", "options": ["context=x"]},
            "key 'context' is not allowed",
        ),
    ],
)
def test_mount_policy_violations(mount: dict[str, Any], message: str) -> None:
    msg = _resource_error({"name": "r", "mounts": [mount]})
    assert message in msg


def test_known_mount_option_keys_pass() -> None:
    opts = ["nosuid", "size=1m", "mode=0755", "uid=5000", "gid=5000", "nr_inodes=100"]
    mount = {"destination": "/scratch", "type": "tmpfs", "source": "tmpfs", "options": opts}
    svc = make_service(resources=[{"name": "r"}])
    built = build(svc, make_node(resources=[{"name": "r", "mounts": [mount]}]))
    assert mounts_of(built)["/scratch"]["options"] == opts


@pytest.mark.parametrize(
    ("host", "message"),
    [
        ({"hostname": "db", "ip": "10.0.0.300"}, "invalid ip '10.0.0.300'"),
        ({"hostname": "db\n1.2.3.4 evil", "ip": "10.0.0.3"}, "invalid hostname"),
        ({"hostname": "two names", "ip": "10.0.0.3"}, "invalid hostname"),
    ],
)
def test_host_entry_violations(host: dict[str, str], message: str) -> None:
    assert message in _resource_error({"name": "r", "hosts": [host]})


def test_policy_allow_list_is_configurable() -> None:
    policy = DevicePolicy(host_roots=("/dev/dri",))
    msg = _resource_error({"name": "r", "devices": ["/dev/null:/dev/gpu0"]}, policy=policy)
    assert "outside the allowed roots (/dev/dri)" in msg


# ---------------------------------------------------------------- real device trees (mknod)

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="os.mknod of device nodes needs root; device-tree tests skipped"
)


@pytest.fixture
def devtree(tmp_path: Path) -> Iterator[Path]:
    """<tmp>/dev with dri/{card0, card1, sub/renderD128, README, fd -> /proc/self/fd},
    gpus -> dri, loop0 (a block device) and plain (a regular file)."""
    if os.geteuid() != 0:
        pytest.skip("os.mknod of device nodes needs root")
    dev = tmp_path / "dev"
    (dev / "dri" / "sub").mkdir(parents=True)
    os.mknod(dev / "dri" / "card0", stat.S_IFCHR | 0o660, os.makedev(226, 0))
    os.mknod(dev / "dri" / "card1", stat.S_IFCHR | 0o660, os.makedev(226, 1))
    os.mknod(dev / "dri" / "sub" / "renderD128", stat.S_IFCHR | 0o666, os.makedev(226, 128))
    os.mknod(dev / "loop0", stat.S_IFBLK | 0o600, os.makedev(7, 0))
    (dev / "dri" / "README").write_text("not a device")
    (dev / "dri" / "fd").symlink_to("/proc/self/fd")
    (dev / "dri" / "loop").symlink_to(dev / "dri")  # a loop: each directory is walked once
    (dev / "gpus").symlink_to("dri")
    (dev / "plain").write_text("x")
    yield dev


def _tree_build(dev: Path, *device_strings: str, mode: str = "rwm") -> BuiltConfig:
    res = {"name": "gpu", "devices": list(device_strings)}
    svc = make_service(resources=[{"name": "gpu", "mode": mode}])
    return build(
        svc,
        make_node(resources=[res]),
        devices=HostDevices([str(dev)]),
        policy=DevicePolicy(host_roots=(str(dev),)),
    )


def _expected(dev: Path, rel_paths: Sequence[str], container: str) -> list[dict[str, Any]]:
    out = []
    for rel in rel_paths:
        node = real_node(str(dev / "dri" / rel))
        out.append(
            {
                "path": f"{container}/{rel}",
                "type": node.type,
                "major": node.major,
                "minor": node.minor,
                "fileMode": node.file_mode,
                "uid": node.uid,
                "gid": node.gid,
            }
        )
    return out


@needs_root
def test_directory_of_three_devices_expands_to_three_entries(devtree: Path) -> None:
    built = _tree_build(devtree, f"{devtree}/dri:/dev/dri:rw", mode="rw")
    rels = ["card0", "card1", "sub/renderD128"]
    assert devices_of(built) == _expected(devtree, rels, "/dev/dri")
    # the numbers given to mknod in the fixture; README, fd and the loop are not devices
    assert [(d["path"], d["type"], d["major"], d["minor"]) for d in devices_of(built)] == [
        ("/dev/dri/card0", "c", 226, 0),
        ("/dev/dri/card1", "c", 226, 1),
        ("/dev/dri/sub/renderD128", "c", 226, 128),
    ]
    assert allow_rules(built) == [
        {"allow": True, "type": "c", "major": 226, "minor": minor, "access": "rw"}
        for minor in (0, 1, 128)
    ]
    # the same directory with permissions rw and the resource's mode r: access r
    read_only = _tree_build(devtree, f"{devtree}/dri:/dev/dri:rw", mode="r")
    assert [r["access"] for r in allow_rules(read_only)] == ["r", "r", "r"]
    assert_one_rule_per_device(read_only)


@needs_root
def test_symlink_to_directory_is_followed(devtree: Path) -> None:
    built = _tree_build(devtree, f"{devtree}/gpus:/dev/gpu")
    assert devices_of(built) == _expected(devtree, ["card0", "card1", "sub/renderD128"], "/dev/gpu")
    assert [(d["path"], d["major"], d["minor"]) for d in devices_of(built)] == [
        ("/dev/gpu/card0", 226, 0),
        ("/dev/gpu/card1", 226, 1),
        ("/dev/gpu/sub/renderD128", 226, 128),
    ]
    assert_one_rule_per_device(built)
    found = HostDevices([str(devtree)]).expand(f"{devtree}/gpus")
    assert [n.found for n in found] == [f"{devtree}/gpus/{r}" for r in ("card0", "card1")] + [
        f"{devtree}/gpus/sub/renderD128"
    ]
    assert found[0].path == f"{devtree}/dri/card0"  # resolved on the host


@needs_root
def test_directory_symlinks_met_during_a_walk_are_followed(devtree: Path) -> None:
    """A walk follows a symlink to a directory it meets (dri/ext -> ../extra), mapping what it
    finds under the link's name; the dri/loop -> dri loop is walked once."""
    (devtree / "extra").mkdir()
    os.mknod(devtree / "extra" / "card9", stat.S_IFCHR | 0o600, os.makedev(226, 9))
    (devtree / "dri" / "ext").symlink_to("../extra")
    built = _tree_build(devtree, f"{devtree}/dri:/dev/dri")
    assert [(d["path"], d["major"], d["minor"]) for d in devices_of(built)] == [
        ("/dev/dri/card0", 226, 0),
        ("/dev/dri/card1", 226, 1),
        ("/dev/dri/ext/card9", 226, 9),
        ("/dev/dri/sub/renderD128", 226, 128),
    ]
    assert_one_rule_per_device(built)


@needs_root
def test_glob_expands(devtree: Path) -> None:
    built = _tree_build(devtree, f"{devtree}/dri/card*:/dev/dri", f"{devtree}/loop?:/dev/blk")
    entries = devices_of(built)
    assert entries[:2] == _expected(devtree, ["card0", "card1"], "/dev/dri")
    assert [(d["path"], d["type"], d["major"], d["minor"]) for d in entries] == [
        ("/dev/dri/card0", "c", 226, 0),
        ("/dev/dri/card1", "c", 226, 1),
        ("/dev/blk/loop0", "b", 7, 0),  # a block device keeps its type
    ]
    assert [(r["type"], r["major"], r["minor"]) for r in allow_rules(built)] == [
        ("c", 226, 0),
        ("c", 226, 1),
        ("b", 7, 0),
    ]
    assert_one_rule_per_device(built)


@needs_root
def test_glob_matching_nothing_gives_no_devices(devtree: Path) -> None:
    built = _tree_build(devtree, f"{devtree}/dri/nothing*:/dev/x")
    assert devices_of(built) == []
    assert allow_rules(built) == []


@needs_root
def test_host_devices_refuse_paths_resolving_outside(devtree: Path) -> None:
    lookup = HostDevices([str(devtree)])
    (devtree / "escape").symlink_to("/dev/null")
    with pytest.raises(DeviceLookupError, match="outside"):
        lookup.expand(f"{devtree}/escape")
    with pytest.raises(DeviceLookupError, match="neither a device nor a directory"):
        lookup.expand(f"{devtree}/plain")
    with pytest.raises(DeviceLookupError, match="No such file"):
        lookup.expand(f"{devtree}/missing")
    with pytest.raises(DeviceLookupError, match="not an absolute path"):
        lookup.expand("dev/null")
    # and the builder reports it for the instance
    msg = _resource_error(
        {"name": "r", "devices": [f"{devtree}/escape:/dev/e"]},
        devices=lookup,
        policy=DevicePolicy(host_roots=(str(devtree),)),
    )
    assert "outside" in msg


def test_host_devices_on_real_dev() -> None:
    [null] = HostDevices().expand("/dev/null")
    assert null == replace(real_node("/dev/null"), found="/dev/null")
    with pytest.raises(DeviceLookupError, match="outside /dev"):
        HostDevices().expand("/etc/passwd")


# ---------------------------------------------------------------- properties over resources

_NAMES = st.sampled_from(["A", "B", "C", "GPU_NAME"])
_DESTS = st.sampled_from(["/data", "/cache", "/dev/dri", "/tmp", "/etc/hosts"])
_GROUPS = st.sampled_from(["video", "render", "dialout", "audio"])
_DEVICES = st.sampled_from(
    [
        "/dev/null:/dev/gpu0",
        "/dev/zero:/dev/gpu1:r",
        "/dev/full:/dev/gpu0:rw",
        "/dev/null:/dev/serial/s0:m",
    ]
)
_GIDS = {"video": 44, "render": 107, "dialout": 20, "audio": 29}


@st.composite
def resource_entries(draw: st.DrawFn, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "groups": draw(st.lists(_GROUPS, max_size=3)),
        "envs": [f"{k}={v}" for k, v in draw(st.lists(st.tuples(_NAMES, st.integers(0, 9))))],
        "mounts": [
            {"destination": d, "type": "bind", "source": f"/srv{d}", "options": ["rbind"]}
            for d in draw(st.lists(_DESTS, max_size=3))
        ],
        "hosts": [
            {"hostname": f"h{i}", "ip": f"10.0.0.{i}"}
            for i in draw(st.lists(st.integers(1, 5), max_size=3))
        ],
        "devices": draw(st.lists(_DEVICES, max_size=3)),
    }


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    a=resource_entries("a"),
    b=resource_entries("b"),
    modes=st.tuples(st.sampled_from(["r", "rw", "rwm", "m"]), st.sampled_from(["rw", "rwm"])),
    order=st.booleans(),
)
def test_resources_property(
    a: dict[str, Any], b: dict[str, Any], modes: tuple[str, str], order: bool
) -> None:
    requests = [{"name": "a", "mode": modes[0]}, {"name": "b", "mode": modes[1]}]
    if order:
        requests.reverse()
    svc = make_service(resources=requests, quotas={"tmpLimit": "1Mi"}, hostname="h")
    node = make_node(resources=[a, b])
    built = build(svc, node, groups=FakeGroups(_GIDS), devices=HostDevices())  # schema-checked
    again = build(svc, node, groups=FakeGroups(_GIDS), devices=HostDevices())
    assert config_json(built) == config_json(again)

    in_order = [a, b] if requests[0]["name"] == "a" else [b, a]
    # env: last writer wins, each name once
    want_env: dict[str, str] = {}
    for res in in_order:
        for e in res["envs"]:
            k, v = e.split("=", 1)
            want_env[k] = v
    env = env_of(built)
    for k, v in want_env.items():
        assert env[k] == v
    # mounts: one per destination; /etc/hosts is ours whatever a resource says
    mounts = mounts_of(built)
    assert mounts["/etc/hosts"]["source"] == HOSTS
    for res in in_order:
        for m in res["mounts"]:
            if m["destination"] != "/etc/hosts":
                assert m["destination"] in mounts
    # gids: first-seen order, no duplicates
    want_gids: list[int] = []
    for res in in_order:
        for g in res["groups"]:
            if _GIDS[g] not in want_gids:
                want_gids.append(_GIDS[g])
    assert built.config["process"]["user"].get("additionalGids", []) == want_gids
    # devices: one allow rule each; a later string for the same container path wins in place;
    # access = permissions ∩ the resource's mode, and a device with no access is left out
    assert_one_rule_per_device(built)
    mode_of = {r["name"]: r["mode"] for r in requests}
    want_devices: dict[str, tuple[int, str]] = {}
    for res in in_order:
        for text in res["devices"]:
            spec = parse_device_string(text)
            access = intersect_access(spec.permissions, mode_of[res["name"]])
            if access:
                want_devices[spec.container] = (real_node(spec.host).minor, access)
    got = {
        d["path"]: (d["minor"], r["access"])
        for d, r in zip(devices_of(built), allow_rules(built), strict=True)
    }
    assert list(got.items()) == list(want_devices.items())
    # hosts: fixed head, then unique lines
    lines = built.hosts.splitlines()
    assert lines[:2] == ["127.0.0.1 localhost", "127.0.1.1 h"]
    assert len(lines) == len(set(lines))


# ---------------------------------------------------------------- the writer


def _mtimes(state: Path) -> dict[str, int]:
    """The instances' files (not the writer's hidden manifest)."""
    root = state / "out" / "instances"
    return {
        str(p.relative_to(root)): p.stat().st_mtime_ns
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }


def test_writer_writes_configs_and_hosts(tmp_path: Path) -> None:
    built = built_configs(2)
    report = write_instance_outputs(tmp_path, built, sync=False)
    assert len(report.written) == 4 and report.unchanged == () and report.removed == ()
    for iid, b in built.items():
        d = tmp_path / "out" / "instances" / iid
        cfg = d / "config.json"
        assert stat.S_IMODE(cfg.stat().st_mode) == 0o644
        assert stat.S_IMODE((d / "hosts").stat().st_mode) == 0o644
        assert cfg.read_text() == json.dumps(b.config, sort_keys=True, indent=2) + "\n"
        assert (d / "hosts").read_text() == b.hosts
        assert hosts_path(tmp_path, iid) == d / "hosts" and hosts_path(tmp_path, iid).is_absolute()


def test_writer_rewrites_only_changed_files_and_removes_stale(tmp_path: Path) -> None:
    built = built_configs(3)
    write_instance_outputs(tmp_path, built, sync=False)
    before = _mtimes(tmp_path)
    # a coarse clock could hide a rewrite: compare inodes too (a rewrite renames a new file in)
    inodes = {p: (tmp_path / "out/instances" / p).stat().st_ino for p in before}

    report = write_instance_outputs(tmp_path, built, sync=False)
    assert report.written == () and len(report.unchanged) == 6
    assert _mtimes(tmp_path) == before

    ids = sorted(built)
    changed = dict(built)
    changed[ids[1]] = BuiltConfig.of(
        {"ociVersion": "1.0.2", "hostname": "new"}, built[ids[1]].hosts
    )
    del changed[ids[2]]
    report = write_instance_outputs(tmp_path, changed, sync=False)
    assert report.written == (f"instances/{ids[1]}/config.json",)
    assert report.removed == (ids[2],)
    assert report.counts == {"written": 1, "unchanged": 3, "removed": 1}
    after = _mtimes(tmp_path)
    for rel in after:
        if rel != f"{ids[1]}/config.json":
            assert after[rel] == before[rel], rel
            assert (tmp_path / "out/instances" / rel).stat().st_ino == inodes[rel], rel
    assert not (tmp_path / "out" / "instances" / ids[2]).exists()


def test_writer_rewrites_a_file_whose_mode_drifted(tmp_path: Path) -> None:
    built = built_configs(1)
    write_instance_outputs(tmp_path, built, sync=False)
    cfg = instance_dir(tmp_path, next(iter(built))) / "config.json"
    cfg.chmod(0o600)
    report = write_instance_outputs(tmp_path, built, sync=False)
    assert report.written == (f"instances/{next(iter(built))}/config.json",)
    assert stat.S_IMODE(cfg.stat().st_mode) == 0o644


def test_writer_removes_only_instance_directories(tmp_path: Path) -> None:
    root = tmp_path / "out" / "instances"
    root.mkdir(parents=True)
    stale = instance_id("com.example.gone", "default", 0)
    (root / stale).mkdir()
    (root / stale / "config.json").write_text("{}")
    (root / ".hidden").mkdir()
    (root / "not an id!").mkdir()
    file_named_like_id = instance_id("com.example.file", "default", 0)
    (root / file_named_like_id).write_text("a file, not an instance directory")
    report = write_instance_outputs(tmp_path, {}, sync=False)
    assert report.removed == (stale,)
    assert sorted(p.name for p in root.iterdir()) == sorted(
        [".hidden", "not an id!", file_named_like_id]
    )


def test_writer_never_follows_symlinks(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("precious")
    state = tmp_path / "state"
    built = built_configs(1)
    iid = next(iter(built))
    (state / "out" / "instances").mkdir(parents=True)
    (state / "out" / "instances" / iid).symlink_to(elsewhere)  # an instance dir that is a link
    write_instance_outputs(state, built, sync=False)
    d = state / "out" / "instances" / iid
    assert d.is_dir() and not d.is_symlink()
    assert sorted(p.name for p in elsewhere.iterdir()) == ["keep"]

    # a config.json that is a symlink is replaced by a file, its target untouched
    (d / "config.json").unlink()
    (d / "config.json").symlink_to(elsewhere / "keep")
    write_instance_outputs(state, built, sync=False)
    assert not (d / "config.json").is_symlink()
    assert (elsewhere / "keep").read_text() == "precious"

    # out/instances itself a symlink: refused
    other = tmp_path / "other"
    (other / "out").mkdir(parents=True)
    (other / "out" / "instances").symlink_to(elsewhere)
    with pytest.raises(OutputPathError, match="not a directory"):
        write_instance_outputs(other, built, sync=False)
    assert sorted(p.name for p in elsewhere.iterdir()) == ["keep"]


@pytest.mark.parametrize("bad", ["../escape", "/etc", "a/b", ".hidden", ""])
def test_writer_validates_instance_ids_first(tmp_path: Path, bad: str) -> None:
    built = built_configs(1) | {bad: BuiltConfig.of({}, "")}
    with pytest.raises(ValueError, match="invalid instance id"):
        write_instance_outputs(tmp_path, built, sync=False)
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError):
        instance_dir(tmp_path, bad)


def test_built_configs_round_trip_through_the_writer(tmp_path: Path) -> None:
    svc = make_service(resources=[{"name": "gpu0", "mode": "rw"}], hostname="nav")
    node = make_node(resources=[GPU0])
    iid = instance_id(svc.id, svc.subject, 0)
    built = build_config(
        svc,
        make_placement(svc, node),
        node,
        rootfs=ROOTFS,
        uid=5000,
        gid=5000,
        hosts_path=str(hosts_path(tmp_path, iid)),
        groups=FakeGroups(),
        devices=HostDevices(),
    )
    write_instance_outputs(tmp_path, {iid: built}, sync=False)
    on_disk = json.loads((instance_dir(tmp_path, iid) / "config.json").read_text())
    assert_valid(on_disk)
    hosts_mount = next(m for m in on_disk["mounts"] if m["destination"] == "/etc/hosts")
    assert Path(hosts_mount["source"]).read_text() == built.hosts
