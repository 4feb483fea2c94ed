"""Hostile node and service files against the OCI policy (issue 32, items 3, 6 and 11).

Each fault is tested in the form it was found, through ``reconcile`` on a copy of the demo state
(the instance fails with a clear reason and its config.json is never written) or ``validate``
(an error with ``file:line:col``), and the rule underneath through the pure builder or the host
lookup. The dangerous forms were checked against runc 1.1.5 by hand: a bind mount of the host's
``/proc`` at ``//proc``, ``/./proc``, ``/proc/``, ``/proc/../proc`` is accepted by runc and the
container lists the host's processes; ``kernel.core_pattern`` and a NUL in an argument are
refused by runc when the container starts.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.controller.configs import default_config_builder
from reconciler.controller.reconcile import CONFIG_FAILURE, ReconcileOptions, reconcile
from reconciler.model.documents import Service
from reconciler.oci.builder import DeviceLookupError, DevicePolicy, canonical_path
from reconciler.oci.hostdevices import HostDevices
from tests.support.oci import FakeDevices, build, cdev, make_node, make_service, mounts_of
from tests.support.paths import ROOT
from tests.support.runc import ARCH, make_runc_rootfs, run_runc

NAV = "com.example.nav"  # the demo service that uses the named resource gpu0 of edge-1


def _edit_gpu0(state: Path, **fields: Any) -> None:
    """Replace fields of the demo node edge-1's resource gpu0 (resources/edge-1.json)."""
    path = state / "resources" / "edge-1.json"
    entries = json.loads(path.read_text())
    [gpu0] = [e for e in entries if e["name"] == "gpu0"]
    gpu0.update(fields)
    path.write_text(json.dumps(entries, indent=2))


def _nav_failure(state: Path, *, others: bool = True) -> str:
    """Reconcile the state through the real host lookups; the nav instance must fail with a
    config failure and leave no output directory, and every other instance (``others``: the
    state has some) keeps its config."""
    report = reconcile(state, ReconcileOptions(configs=default_config_builder()))
    failures = [f for f in report.computed.result.failures if f.item_id == NAV]
    assert [f.reason for f in failures] == [CONFIG_FAILURE]
    [failure] = failures
    assert not (state / "out" / "instances" / failure.instance_id).exists()
    assert bool(report.computed.result.placements) == others
    for p in report.computed.result.placements:
        assert (state / "out" / "instances" / p.instance_id / "config.json").is_file()
    return failure.summary


# ---------------------------------------------------------------- item 3: mount destinations

# destination -> what it means to the kernel and to runc (Go's filepath.Clean), worked out by
# hand: repeated and leading '/' collapse, '.' goes, '..' goes up, a trailing '/' goes
ESCAPING_DESTINATIONS = {
    "//proc": "/proc",
    "//sys": "/sys",
    "//": "/",
    "//proc/sys": "/proc/sys",
    "/./proc": "/proc",
    "/proc/../proc": "/proc",
    "/proc/": "/proc",
    "///proc": "/proc",
    "/sys/./fs/": "/sys/fs",
    "/data/../../proc": "/proc",
    "/.": "/",
}


def test_canonical_path_is_what_the_kernel_means() -> None:
    for dest, meant in ESCAPING_DESTINATIONS.items():
        assert canonical_path(dest) == meant, dest
    assert canonical_path("/data") == "/data"
    assert canonical_path("//data//x/") == "/data/x"


@pytest.mark.parametrize(
    "dest", ["//proc", "//sys", "//", "//proc/sys", "/./proc", "/proc/../proc", "/proc/"]
)
def test_a_node_resource_mounting_on_proc_in_disguise_fails_the_instance(
    demo_copy: Path, dest: str
) -> None:
    source = "/sys" if "sys" in dest else "/proc"
    mount = {"destination": dest, "type": "bind", "source": source, "options": ["rbind"]}
    _edit_gpu0(demo_copy, mounts=[mount])
    summary = _nav_failure(demo_copy)
    meant = ESCAPING_DESTINATIONS[dest]
    assert f"mount destination {dest!r} is not allowed (it means {meant!r})" in summary
    assert "\n" not in summary


@pytest.mark.parametrize("dest", sorted(ESCAPING_DESTINATIONS))
def test_the_builder_judges_a_destination_by_its_canonical_form(dest: str) -> None:
    meant = ESCAPING_DESTINATIONS[dest]
    res = {"name": "r", "mounts": [{"destination": dest, "source": "/proc"}]}
    svc = make_service(resources=[{"name": "r"}])
    with pytest.raises(ValueError, match="is not allowed") as info:
        build(svc, make_node(resources=[res]))
    top = "/" + meant.split("/")[1]  # /proc or /sys
    reason = "it is the root" if meant == "/" else f"it is at or under {top}"
    assert f"(it means {meant!r}): {reason}" in str(info.value)


@pytest.mark.parametrize("dest", ["/data/", "//data", "/./data", "/x/../data"])
def test_a_harmless_destination_that_is_not_canonical_is_refused_with_its_canonical_form(
    dest: str,
) -> None:
    res = {"name": "r", "mounts": [{"destination": dest, "source": "/srv"}]}
    svc = make_service(resources=[{"name": "r"}])
    with pytest.raises(ValueError, match=r"is not normalized \(write '/data'\)"):
        build(svc, make_node(resources=[res]))


def test_a_canonical_destination_beside_proc_and_sys_is_mounted() -> None:
    """``/procfs`` and ``/system`` share a prefix with /proc and /sys, not a directory."""
    mounts = [
        {"destination": "/procfs", "source": "/srv/a"},
        {"destination": "/system", "source": "/srv/b"},
    ]
    svc = make_service(resources=[{"name": "r"}])
    built = build(svc, make_node(resources=[{"name": "r", "mounts": mounts}]))
    assert {"/procfs", "/system"} <= set(mounts_of(built))
    # the only /proc mount is the default proc filesystem, /sys the default read-only sysfs
    assert mounts_of(built)["/proc"]["type"] == "proc"
    assert mounts_of(built)["/sys"]["type"] == "sysfs"


# ---------------------------------------------------------------- item 6: device paths


def _expand_in_a_child(paths: list[str], stdin: Path) -> dict[str, Any]:
    """HostDevices().expand of each path in a fresh process whose stdin is ``stdin``: the
    answer a controller started that way would get. path -> [[type, major, minor]] or the
    lookup error."""
    code = (
        "import json, sys\n"
        "from reconciler.oci.hostdevices import HostDevices\n"
        "from reconciler.oci.builder import DeviceLookupError\n"
        "out = {}\n"
        "for p in sys.argv[1:]:\n"
        "    try:\n"
        "        out[p] = [[n.type, n.major, n.minor] for n in HostDevices().expand(p)]\n"
        "    except DeviceLookupError as e:\n"
        "        out[p] = str(e)\n"
        "print(json.dumps(out))\n"
    )
    with stdin.open("rb") as fd0:
        ran = subprocess.run(
            [sys.executable, "-c", code, *paths],
            stdin=fd0,
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    answer: dict[str, Any] = json.loads(ran.stdout)
    return answer


def test_device_paths_through_the_controllers_own_fds_are_refused() -> None:
    """Started with /dev/zero as stdin, a controller resolving through the kernel would hand
    out /dev/zero (1:5) for each of these; they name no device of the host's /dev."""
    zero = os.stat("/dev/zero")
    assert (os.major(zero.st_rdev), os.minor(zero.st_rdev)) == (1, 5)
    paths = ["/dev/stdin", "/dev/fd/0", "/proc/self/fd/0", "/dev/stdout", "/dev/stderr"]
    answer = _expand_in_a_child([*paths, "/dev/zero"], Path("/dev/zero"))
    assert answer.pop("/dev/zero") == [["c", 1, 5]]  # the child works: a real device resolves
    assert answer["/dev/stdin"] == (
        "'/dev/stdin' resolves through '/proc/self/fd/0', which is under /proc "
        "(a per-process view, never a device source)"
    )
    assert answer["/dev/fd/0"].startswith("'/dev/fd/0' is under /dev/fd")
    assert answer["/proc/self/fd/0"].startswith("'/proc/self/fd/0' is under /proc")
    for p in ("/dev/stdout", "/dev/stderr"):
        assert "which is under /proc" in answer[p]


@pytest.mark.parametrize(
    ("device", "reason"),
    [
        ("/dev/stdin:/dev/gpu0", "resolves through '/proc/self/fd/0', which is under /proc"),
        ("/dev/fd/0:/dev/gpu0", "'/dev/fd/0' is under /dev/fd"),
        ("/proc/self/fd/0:/dev/gpu0", "host device '/proc/self/fd/0' is outside the allowed"),
    ],
)
def test_a_node_resource_device_through_proc_fails_the_instance(
    demo_copy: Path, device: str, reason: str
) -> None:
    _edit_gpu0(demo_copy, devices=[device])
    summary = _nav_failure(demo_copy)
    assert f"device {device!r}" in summary and reason in summary


@pytest.fixture
def devroot(tmp_path: Path) -> Iterator[Path]:
    """An allowed root standing in for /dev: card0 (a real device made by mknod), links into
    /proc (absolute and relative), a link out of the root to /dev/null, a link loop, and
    dri/ holding card0's link and a link into /proc."""
    if os.geteuid() != 0:
        pytest.skip("os.mknod of device nodes needs root")
    dev = tmp_path / "dev"
    (dev / "dri").mkdir(parents=True)
    os.mknod(dev / "card0", stat.S_IFCHR | 0o660, os.makedev(226, 0))
    (dev / "tty-in").symlink_to("/proc/self/fd/0")
    up = "../" * len(dev.parts)  # from dev/ up to / and into /proc
    (dev / "tty-rel").symlink_to(f"{up}proc/self/fd/0")
    (dev / "fd").symlink_to("/proc/self/fd")
    (dev / "null-outside").symlink_to("/dev/null")
    (dev / "loop-a").symlink_to("loop-b")
    (dev / "loop-b").symlink_to("loop-a")
    (dev / "dri" / "card0").symlink_to("../card0")
    (dev / "dri" / "stdin").symlink_to("/proc/self/fd/0")
    (dev / "via-dri").symlink_to("dri/./../card0")
    yield dev


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("tty-in", "resolves through '/proc/self/fd/0', which is under /proc"),
        ("tty-rel", "which is outside"),  # its first '..' already leaves the root
        ("fd/0", "resolves through '/proc/self/fd', which is under /proc"),
        ("null-outside", "resolves through '/dev/null', which is outside"),
        ("loop-a", "Too many levels of symbolic links"),
    ],
)
def test_a_symlink_in_the_allowed_root_leading_out_is_refused(
    devroot: Path, name: str, reason: str
) -> None:
    with pytest.raises(DeviceLookupError) as info:
        HostDevices([str(devroot)]).expand(f"{devroot}/{name}")
    assert reason in str(info.value)


def test_symlinks_inside_the_allowed_root_still_resolve(devroot: Path) -> None:
    lookup = HostDevices([str(devroot)])
    for name in ("card0", "dri/card0", "via-dri"):
        [node] = lookup.expand(f"{devroot}/{name}")
        assert (node.type, node.major, node.minor) == ("c", 226, 0)
        assert node.path == f"{devroot}/card0"


def test_walks_and_globs_skip_what_leads_into_proc(devroot: Path) -> None:
    lookup = HostDevices([str(devroot)])
    walked = lookup.expand(str(devroot))
    # card0 found three ways (itself, dri/card0, via-dri); nothing through fd, stdin or tty-*
    assert sorted(n.found for n in walked) == sorted(
        f"{devroot}/{n}" for n in ("card0", "dri/card0", "via-dri")
    )
    assert {(n.major, n.minor) for n in walked} == {(226, 0)}
    assert [n.found for n in lookup.expand(f"{devroot}/dri/*")] == [f"{devroot}/dri/card0"]
    assert lookup.expand(f"{devroot}/fd/*") == []
    assert lookup.expand(f"{devroot}/tty-*") == []


def test_an_allow_list_of_everything_still_never_resolves_through_proc() -> None:
    lookup = HostDevices(["/"])
    for path in ("/dev/stdin", "/proc/self/fd/0", "/dev/fd/0"):
        with pytest.raises(DeviceLookupError, match="a per-process view"):
            lookup.expand(path)
    [null] = lookup.expand("/dev/null")
    assert (null.major, null.minor) == (1, 3)


def test_the_builder_refuses_proc_and_dev_fd_whatever_the_allow_list() -> None:
    """The pure policy check, before any lookup: even a lookup that would answer is not asked."""
    answering = FakeDevices({"/proc/self/fd/0": [cdev("/dev/pts/0", 136, 0)]})
    svc = make_service(resources=[{"name": "r"}])
    for device, never in (("/proc/self/fd/0:/dev/x", "/proc"), ("/dev/fd/0:/dev/x", "/dev/fd")):
        node = make_node(resources=[{"name": "r", "devices": [device]}])
        with pytest.raises(ValueError, match=f"is under {never}, never a device source"):
            build(svc, node, devices=answering, policy=DevicePolicy(host_roots=("/",)))


# ---------------------------------------------------------------- item 11: validate, not runc

SVC = "apiVersion: reconciler/v1\nkind: Service\nid: {id}\nversion: 1.0.0\n"
NODE = "apiVersion: reconciler/v1\nkind: Node\nid: n1\ntype: t\nmaxDMIPS: 1000\ntotalRAM: 1Gi\n"

# file -> (content, message fragment, line, columns): SVC is four lines; a column is worked out
# by hand from the content (a `\0` escape in a double-quoted YAML string is a NUL); for a
# sysctl name, the key (col 3) or its value
HOSTILE_SPECS: dict[str, tuple[str, str, int, tuple[int, ...]]] = {
    "desired/core.yaml": (
        SVC.format(id="core")
        + "image: {rootfs: /r, cmd: [sh]}\nsysctl:\n  kernel.core_pattern: x\n",
        "sysctl 'kernel.core_pattern' is not namespaced",
        7,
        (3, 24),
    ),
    "desired/swap.yaml": (
        SVC.format(id="swap") + "image: {rootfs: /r, cmd: [sh]}\nsysctl:\n  vm.swappiness: '1'\n",
        "sysctl 'vm.swappiness' is not namespaced",
        7,
        (3, 18),
    ),
    "desired/host.yaml": (
        SVC.format(id="host") + "image: {rootfs: /r, cmd: [sh]}\nsysctl:\n  kernel.hostname: h\n",
        "set the service's hostname",
        7,
        (3, 20),
    ),
    "desired/cmd.yaml": (
        SVC.format(id="cmd") + 'image:\n  rootfs: /r\n  cmd: [sh, -c, "id\\0"]\n',
        "image.cmd.2: a NUL character",
        7,
        (17,),
    ),
    "desired/entry.yaml": (
        SVC.format(id="entry") + 'image:\n  rootfs: /r\n  entrypoint: ["/bin/s\\0h"]\n',
        "image.entrypoint.0: a NUL character",
        7,
        (16,),
    ),
    "desired/env.yaml": (
        SVC.format(id="env") + 'image:\n  rootfs: /r\n  cmd: [sh]\n  env: ["A=\\0"]\n',
        "image.env.0: a NUL character",
        8,
        (9,),
    ),
    "nodes/n1.yaml": (
        NODE + 'resources:\n  - {name: r, envs: ["A=x\\0"]}\n',
        "resources.0.envs.0: a NUL character",
        8,
        (22,),
    ),
}
GOOD_SYSCTLS = {
    "net.ipv4.ip_forward": "1",
    "net/ipv4/conf/all/forwarding": "1",  # the slash form, as runc also reads it
    "fs.mqueue.msg_max": "10",
    "kernel.msgmax": "8192",
    "kernel.shm_rmid_forced": "0",
    "kernel.domainname": "example",
}


def test_the_spec_corpus_is_what_it_claims() -> None:
    for name in ("cmd", "entry", "env"):
        assert "\\0" in HOSTILE_SPECS[f"desired/{name}.yaml"][0]  # the YAML escape, not a raw NUL
    for rel, (content, _, line, cols) in HOSTILE_SPECS.items():
        text = content.splitlines()[line - 1]
        wanted = {"core": "x", "swap": "'1'", "host": "h"}.get(Path(rel).stem)
        if wanted is not None:  # a sysctl: the key at col 3, its value at the other column
            assert text.rindex(wanted) + 1 == cols[1], rel
        else:  # the column of the opening quote of the string holding the NUL
            assert text[cols[0] - 1] == '"' and "\\0" in text[cols[0] :], rel


def test_specs_runc_would_refuse_are_validate_errors_with_their_position(tmp_path: Path) -> None:
    state = tmp_path / "state"
    for rel, (content, _, _, _) in HOSTILE_SPECS.items():
        (state / rel).parent.mkdir(parents=True, exist_ok=True)
        (state / rel).write_text(content)
    good = SVC.format(id="good") + "image: {rootfs: /r, cmd: [sh]}\nsysctl:\n"
    good += "".join(f"  {k}: {json.dumps(v)}\n" for k, v in GOOD_SYSCTLS.items())
    (state / "desired" / "good.yaml").write_text(good)
    ran = subprocess.run(
        [sys.executable, "-m", "reconciler", "validate", "--state", str(state)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
    )
    assert ran.returncode == 1, ran.stderr
    out = ran.stdout + ran.stderr
    assert "Traceback" not in out
    for rel, (_, fragment, line, cols) in HOSTILE_SPECS.items():
        hits = [x for x in out.splitlines() if x.startswith(f"{state / rel}:{line}:")]
        assert len(hits) == 1, (rel, out)
        col = int(hits[0].split(":")[2])
        assert col in cols and fragment in hits[0], (rel, hits[0])
    assert "good.yaml" not in out  # the namespaced sysctls of good.yaml pass
    assert "valid: 1 services" in out


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("kernel.core_pattern", "is not namespaced"),
        ("kernel.shm_next_id", "is not namespaced"),  # kernel.shm*, but not one runc allows
        ("kernel/core_pattern", "is not namespaced"),  # the slash form of the same
        ("kernel.hostname", "set the service's hostname"),
        ("net.", "invalid sysctl name"),
        ("net..ipv4", "invalid sysctl name"),
        ("net/../kernel/core_pattern", "invalid sysctl name"),
        ("net.ipv4 x", "invalid sysctl name"),
        ("", "invalid sysctl name"),
    ],
)
def test_sysctl_names_outside_the_containers_namespaces_are_refused(
    name: str, fragment: str
) -> None:
    with pytest.raises(ValueError, match=fragment):
        make_service(sysctl={name: "1"})


def test_namespaced_sysctls_reach_the_config_unchanged() -> None:
    built = build(make_service(sysctl=GOOD_SYSCTLS), make_node())
    assert built.config["linux"]["sysctl"] == GOOD_SYSCTLS


@pytest.mark.parametrize(
    "image",
    [
        {"cmd": ["sh", "a\0b"]},
        {"entrypoint": ["/bin/s\0h"], "cmd": ["x"]},
        {"cmd": ["sh"], "env": ["A=\0"]},
        {"cmd": ["sh"], "workingDir": "/a\0"},
        {"rootfs": "rootfs/\0", "cmd": ["sh"]},
    ],
)
def test_a_nul_in_any_string_of_the_image_is_refused(image: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"a NUL character \(\\0\) is not allowed"):
        make_service(image=image)


# ---------------------------------------------------------------- with the real runtime


def _runc_state(tmp: Path, busybox: str, resource: dict[str, Any], service_extra: str = "") -> Path:
    """A state directory: one service (busybox /bin/sh -c, resource r) and one node with r."""
    state = tmp / "state"
    (state / "desired").mkdir(parents=True)
    (state / "nodes").mkdir()
    make_runc_rootfs(state / "rootfs" / "busybox", busybox)
    (state / "desired" / "nav.yaml").write_text(
        SVC.format(id=NAV)
        + "runtimes: [runc]\n"
        + "image: {rootfs: rootfs/busybox, entrypoint: [/bin/sh, -c], cmd: ['cat /proc/1/comm']}\n"
        + "resources: [{name: r}]\n"
        + service_extra
    )
    node = {
        "apiVersion": "reconciler/v1",
        "kind": "Node",
        "id": "edge-1",
        "type": "main",
        "maxDMIPS": 4000,
        "totalRAM": "8Gi",
        "runtimes": [{"id": "runc-1", "type": "runc", "platform": {"architecture": ARCH}}],
        "resources": [{"name": "r", **resource}],
    }
    (state / "nodes" / "edge-1.yaml").write_text(json.dumps(node))
    return state


def _run(runc_root: Path, bundle: Path, config: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    bundle.mkdir(parents=True, exist_ok=True)
    (bundle / "config.json").write_text(json.dumps(config))
    cid = f"hostile-{bundle.name}-{os.getpid()}"
    try:
        return run_runc(runc_root, "run", "--bundle", str(bundle), cid)
    finally:
        run_runc(runc_root, "delete", "--force", cid)


def test_runc_is_never_handed_a_proc_mount_in_disguise(
    runc_env: tuple[Path, str], tmp_path: Path
) -> None:
    """The refused config is the one that escapes: the same mount, added by hand to a config
    we do write, makes runc bind the host's /proc over the container's."""
    runc_root, busybox = runc_env
    escape = {"destination": "//proc", "type": "bind", "source": "/proc", "options": ["rbind"]}
    state = _runc_state(tmp_path / "refused", busybox, {"mounts": [escape]})
    summary = _nav_failure(state, others=False)
    assert "mount destination '//proc' is not allowed (it means '/proc')" in summary
    assert not list(state.glob("out/instances/*/config.json"))

    state = _runc_state(tmp_path / "written", busybox, {"envs": ["R=1"]})
    report = reconcile(state, ReconcileOptions(configs=default_config_builder()))
    [placed] = report.computed.result.placements
    bundle = state / "out" / "instances" / placed.instance_id
    config = json.loads((bundle / "config.json").read_text())
    ours = _run(runc_root, bundle, config)
    assert ours.returncode == 0, ours.stderr
    # its own pid namespace: pid 1 is the container's process (busybox sh execs its last command)
    assert ours.stdout.strip() == "cat"
    config["mounts"].insert(-1, escape)  # before /etc/hosts, as the resource's mount would be
    tampered = _run(runc_root, bundle, config)
    assert tampered.returncode == 0, tampered.stderr
    assert tampered.stdout.strip() not in ("", "cat")  # the host's pid 1


def test_runc_accepts_the_namespaced_sysctls_and_refuses_the_others(
    runc_env: tuple[Path, str], tmp_path: Path
) -> None:
    runc_root, busybox = runc_env
    wanted = "".join(f"  {k}: {json.dumps(v)}\n" for k, v in GOOD_SYSCTLS.items())
    state = _runc_state(tmp_path, busybox, {}, service_extra="sysctl:\n" + wanted)
    report = reconcile(state, ReconcileOptions(configs=default_config_builder()))
    assert report.computed.diagnostics == []
    [placed] = report.computed.result.placements
    bundle = state / "out" / "instances" / placed.instance_id
    config = json.loads((bundle / "config.json").read_text())
    assert config["linux"]["sysctl"] == GOOD_SYSCTLS
    ran = _run(runc_root, bundle, config)
    assert ran.returncode == 0, ran.stderr
    # what validation refuses, runc refuses too (added by hand: no config of ours holds them)
    for name, says in (
        ("kernel.core_pattern", "is not in a separate kernel namespace"),
        ("vm.swappiness", "is not in a separate kernel namespace"),
        ("kernel.hostname", "conflicts with the OCI"),
    ):
        config["linux"]["sysctl"] = {name: "1"}
        refused = _run(runc_root, tmp_path / "bad", {**config})
        assert refused.returncode != 0 and says in refused.stderr, (name, refused.stderr)


def test_the_nul_check_leaves_every_string_constraint_in_the_schema() -> None:
    """The NUL check is a validator on every string; the hostname's pattern must still reach
    the JSON Schema editors validate with (pydantic drops a Field pattern given on top of a
    validated type from the schema, while still checking it)."""
    hostname = Service.model_json_schema()["properties"]["hostname"]
    assert {"type": "string", "pattern": "^[A-Za-z0-9]([A-Za-z0-9.-]{0,62})$"} in hostname["anyOf"]
    with pytest.raises(ValueError, match="should match pattern"):
        make_service(hostname="two words")
