"""A generated config.json run by the real runtime (SPEC §11: "accepted and run by runc").

A state directory (a service with a named resource, a pool device and a tmpfs quota; a node with
device nodes made by mknod) goes through ``reconcile`` (placement, checkpoint, the OCI step and
the writer), and the instance's ``out/instances/<id>/`` is then the bundle of ``runc run``.
Only the two host lookups are the test's: the groups (``video`` and ``render`` as on a GPU host)
and the device allow-list (``/dev`` plus the temp directory holding the mknod'ed nodes). Inside,
busybox reports the supplementary groups (``id -G``), the env, ``/etc/hosts``, each device's type,
major and minor, that the device cgroup grants exactly the intersected access, the ``/tmp``
tmpfs and a read-only bind mount.

Skips, saying why, only when runc cannot run here at all: not root, no runc, no static busybox,
or runc failing a plain ``runc spec`` container. A config of ours that runc rejects fails.
"""

from __future__ import annotations

import json
import os
import stat
import uuid
from pathlib import Path

from reconciler.controller.configs import default_config_builder
from reconciler.controller.reconcile import ReconcileOptions, reconcile
from reconciler.model.values import instance_id
from reconciler.oci.builder import DevicePolicy
from reconciler.oci.hostdevices import HostDevices
from reconciler.oci.writer import instance_dir
from tests.support.oci import assert_valid
from tests.support.runc import ARCH, make_runc_rootfs, run_runc

GIDS = {"video": 44, "render": 4242}


class Groups:
    """video and render as on a GPU host, whether or not this machine has them."""

    def __call__(self, name: str, /) -> int | None:
        return GIDS.get(name)


def _mknod(path: Path, major: int, minor: int, mode: int = 0o666) -> None:
    os.mknod(path, stat.S_IFCHR | mode, os.makedev(major, minor))
    os.chmod(path, mode)  # mknod's mode is filtered by the umask


SCRIPT = r"""
echo "ids=$(id -u) $(id -G)"
echo "env=$INSTANCE_ID $ITEM_ID $INSTANCE_INDEX $GPU_NAME $MAP_REGION"
echo "pool=$DEVICES_EXAMPLE_COM_GPU $GPU_VENDOR"
echo "hostname=$(hostname)"
echo "--hosts"; cat /etc/hosts; echo "--end"
for d in /dev/gpu0 /dev/gpu0-null /dev/dri/card0 /dev/dri/sub/card1 /dev/gpu-pool; do
  stat -c "dev=%n %F %t:%T" "$d"
done
cat /dev/gpu0 2>&1 | head -n 1
(echo x > /dev/gpu0) 2>&1
grep " /tmp " /proc/mounts
echo hi > /tmp/f && echo "tmp-write=ok"
echo "data=$(cat /data/hello)"
(echo x > /data/x) 2>/dev/null || echo "data-write=refused"
"""


def test_runc_runs_a_generated_config(runc_env: tuple[Path, str], tmp_path: Path) -> None:
    runc_root, busybox = runc_env
    hostdev = tmp_path / "hostdev"
    (hostdev / "dri" / "sub").mkdir(parents=True)
    _mknod(hostdev / "probe", 1, 12)  # mem minor 12: no driver, so an allowed open is ENXIO
    _mknod(hostdev / "dri" / "card0", 226, 0)
    _mknod(hostdev / "dri" / "sub" / "card1", 226, 1)
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "hello").write_text("from-the-host")
    shared.chmod(0o755)
    (shared / "hello").chmod(0o644)

    state = tmp_path / "state"
    (state / "desired").mkdir(parents=True)
    (state / "nodes").mkdir()
    make_runc_rootfs(state / "rootfs" / "busybox", busybox)
    (state / "desired" / "nav.yaml").write_text(
        f"""apiVersion: reconciler/v1
kind: Service
id: com.example.nav
version: 1.0.0
runtimes: [runc]
image:
  rootfs: rootfs/busybox
  entrypoint: [/bin/sh, -c]
  cmd: [{json.dumps(SCRIPT)}]
  env: [MAP_REGION=eu]
quotas: {{cpuDMIPSLimit: 500, ramLimit: 64Mi, pidsLimit: 32, noFileLimit: 256, tmpLimit: 2Mi}}
resources:
  - {{name: gpu0, mode: r}}
devices:
  - {{resource: example.com/gpu, count: 1}}
hostname: nav
"""
    )
    resource = {
        "name": "gpu0",
        "groups": ["video", "render"],
        "mounts": [
            {
                "destination": "/data",
                "type": "bind",
                "source": str(shared),
                "options": ["rbind", "ro"],
            }
        ],
        "envs": ["GPU_NAME=gpu0"],
        "hosts": [{"hostname": "gpu-server", "ip": "10.0.0.100"}],
        "devices": [
            f"{hostdev}/probe:/dev/gpu0:rw",  # rw ∩ mode r = r
            "/dev/null:/dev/gpu0-null:w",  # w ∩ r is empty: not exposed, so runc's default
            f"{hostdev}/dri:/dev/dri",
        ],
    }
    node = {
        "apiVersion": "reconciler/v1",
        "kind": "Node",
        "id": "edge-1",
        "type": "main",
        "maxDMIPS": 4000,
        "totalRAM": "8Gi",
        "numCores": 2,
        "runtimes": [{"id": "runc-1", "type": "runc", "platform": {"architecture": ARCH}}],
        "resources": [resource],
        "devicePools": [
            {
                "resource": "example.com/gpu",
                "policy": "exclusive",
                "devices": [
                    {"id": "g0", "devices": ["/dev/zero:/dev/gpu-pool"], "envs": ["GPU_VENDOR=x"]}
                ],
            }
        ],
    }
    (state / "nodes" / "edge-1.yaml").write_text(json.dumps(node))  # JSON is YAML 1.2

    roots = ("/dev", str(hostdev))
    configs = default_config_builder(
        groups=Groups(), devices=HostDevices(roots), policy=DevicePolicy(host_roots=roots)
    )
    report = reconcile(state, ReconcileOptions(configs=configs))
    assert report.computed.diagnostics == []
    assert not report.plan.failures, [f.summary for f in report.plan.failures]
    iid = instance_id("com.example.nav", "default", 0)
    assert [(a.action, a.instance_id, a.node_id) for a in report.plan.actions] == [
        ("start", iid, "edge-1")
    ]
    # the first (and only) identity and item of a fresh state: uid 5000, gid 5000 (SPEC §9)
    alloc = report.computed.checkpoint.allocations[iid]
    assert (alloc.uid, alloc.gid) == (5000, 5000)
    bundle = instance_dir(state, iid)
    config = json.loads((bundle / "config.json").read_text())
    assert_valid(config)
    assert config["root"]["path"] == str((state / "rootfs" / "busybox").resolve())
    hosts_mount = config["mounts"][-1]
    assert hosts_mount["destination"] == "/etc/hosts"
    assert Path(hosts_mount["source"]) == (bundle / "hosts").resolve()

    cid = f"reconciler-test-{uuid.uuid4().hex[:12]}"
    try:
        ran = run_runc(runc_root, "run", "--bundle", str(bundle), cid)
    finally:
        run_runc(runc_root, "delete", "--force", cid)
    out = ran.stdout
    assert ran.returncode == 0, f"runc rejected or failed the config:\n{ran.stderr}\n{out}"

    lines = out.splitlines()
    assert "ids=5000 5000 44 4242" in lines
    assert f"env={iid} com.example.nav 0 gpu0 eu" in lines
    assert "pool=g0 x" in lines
    assert "hostname=nav" in lines
    hosts = out.split("--hosts\n", 1)[1].split("--end\n", 1)[0]
    assert hosts == "127.0.0.1 localhost\n127.0.1.1 nav\n10.0.0.100 gpu-server\n"

    # busybox `stat -c %t:%T` prints major:minor in hex; the numbers are the mknod calls above
    # and /dev/zero's fixed 1:5
    expected_devices = {
        "/dev/gpu0": "1:c",  # 1, 12
        "/dev/dri/card0": "e2:0",  # 226, 0
        "/dev/dri/sub/card1": "e2:1",  # 226, 1
        "/dev/gpu-pool": "1:5",  # /dev/zero
    }
    for path, majmin in expected_devices.items():
        assert f"dev={path} character special file {majmin}" in lines, out
    # /dev/gpu0-null was left out (no common access): stat fails, so no dev= line for it
    assert not any(line.startswith("dev=/dev/gpu0-null") for line in lines)
    # the allow rule grants exactly r: read reaches the (absent) driver, write is refused
    assert "cat: can't open '/dev/gpu0': No such device or address" in lines
    assert "/bin/sh: can't create /dev/gpu0: Operation not permitted" in lines
    tmp = next(line for line in lines if " /tmp " in line)
    assert tmp.startswith("tmpfs /tmp tmpfs") and "size=2048k" in tmp
    assert "tmp-write=ok" in lines
    assert "data=from-the-host" in lines
    assert "data-write=refused" in lines
    assert not (shared / "x").exists()


DEVICE_SCRIPT = r"""
echo "pool=$DEVICES_EXAMPLE_COM_NPU"
echo "fw=$(cat /opt/npu/firmware/blob)"
(echo x > /opt/npu/firmware/new) 2>/dev/null || echo "fw-write=refused"
"""


def test_runc_runs_a_config_with_a_pool_devices_mounts(
    runc_env: tuple[Path, str], tmp_path: Path
) -> None:
    """A pool device's mounts (as the kubelet's ContainerAllocateResponse gives them) are in
    the config.json of the instance holding the device, with its annotations, and runc runs
    it: the device's firmware directory is there, read-only."""
    runc_root, busybox = runc_env
    firmware = tmp_path / "firmware"
    firmware.mkdir()
    (firmware / "blob").write_text("npu-fw-1")
    firmware.chmod(0o755)
    (firmware / "blob").chmod(0o644)
    state = tmp_path / "state"
    (state / "desired").mkdir(parents=True)
    (state / "nodes").mkdir()
    make_runc_rootfs(state / "rootfs" / "busybox", busybox)
    (state / "desired" / "infer.yaml").write_text(
        f"""apiVersion: reconciler/v1
kind: Service
id: com.example.infer
version: 1.0.0
runtimes: [runc]
image:
  rootfs: rootfs/busybox
  entrypoint: [/bin/sh, -c]
  cmd: [{json.dumps(DEVICE_SCRIPT)}]
devices:
  - {{resource: example.com/npu, count: 1}}
"""
    )
    fw_mount = {
        "destination": "/opt/npu/firmware",
        "type": "bind",
        "source": str(firmware),
        "options": ["rbind", "ro"],
    }
    node = {
        "apiVersion": "reconciler/v1",
        "kind": "Node",
        "id": "edge-1",
        "type": "main",
        "maxDMIPS": 4000,
        "totalRAM": "8Gi",
        "runtimes": [{"id": "runc-1", "type": "runc", "platform": {"architecture": ARCH}}],
        "devicePools": [
            {
                "resource": "example.com/npu",
                "policy": "exclusive",
                "devices": [
                    {
                        "id": "npu0",
                        "mounts": [fw_mount],
                        "annotations": {"example.com/npu.firmware": "1"},
                    }
                ],
            }
        ],
    }
    (state / "nodes" / "edge-1.yaml").write_text(json.dumps(node))

    report = reconcile(state, ReconcileOptions(configs=default_config_builder(groups=Groups())))
    assert report.computed.diagnostics == []
    assert not report.plan.failures, [f.summary for f in report.plan.failures]
    iid = instance_id("com.example.infer", "default", 0)
    bundle = instance_dir(state, iid)
    config = json.loads((bundle / "config.json").read_text())
    assert_valid(config)
    assert fw_mount in config["mounts"]
    assert config["annotations"] == {"example.com/npu.firmware": "1"}

    cid = f"reconciler-test-{uuid.uuid4().hex[:12]}"
    try:
        ran = run_runc(runc_root, "run", "--bundle", str(bundle), cid)
    finally:
        run_runc(runc_root, "delete", "--force", cid)
    assert ran.returncode == 0, f"runc rejected or failed the config:\n{ran.stderr}\n{ran.stdout}"
    lines = ran.stdout.splitlines()
    assert "pool=npu0" in lines
    assert "fw=npu-fw-1" in lines
    assert "fw-write=refused" in lines
    assert not (firmware / "new").exists()
