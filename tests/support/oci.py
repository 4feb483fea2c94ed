"""OCI config helpers shared by the OCI, agent and end-to-end tests: the runtime-spec schema
validator (:func:`assert_valid`), fake host lookups (groups, device nodes) and a builder with test
defaults (:func:`build`) whose every config is schema-validated."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft4Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT4

from reconciler.model.documents import Node, Service
from reconciler.model.values import instance_id
from reconciler.oci.builder import (
    BuiltConfig,
    DeviceLookupError,
    DeviceNode,
    DevicePolicy,
    build_config,
    config_json,
)
from reconciler.placement.instances import Placement, Requested
from tests.support.paths import OCI_SCHEMA_DIR, ROOT

# the schemas, copied into the repository (see its README); the project's shared copy, to check
# the copy against when it is there
SCHEMA_DIR = OCI_SCHEMA_DIR

SHARED_SCHEMA_DIR = ROOT.parent / "shared" / "oci-runtime-spec-v1.0.2" / "schema"


def _make_validator() -> Draft4Validator | None:
    if not (SCHEMA_DIR / "config-schema.json").is_file():
        return None
    resources = [
        (p.name, Resource.from_contents(json.loads(p.read_text()), default_specification=DRAFT4))
        for p in sorted(SCHEMA_DIR.glob("*.json"))
    ]
    registry: Registry[Any] = Registry().with_resources(resources)
    schema = json.loads((SCHEMA_DIR / "config-schema.json").read_text())
    Draft4Validator.check_schema(schema)
    return Draft4Validator(schema, registry=registry)


VALIDATOR = _make_validator()


def schema_errors(config: Mapping[str, Any]) -> list[str]:
    if VALIDATOR is None:
        return []
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATOR.iter_errors(config)
    ]


def assert_valid(config: Mapping[str, Any]) -> None:
    errors = schema_errors(config)
    assert not errors, errors


@dataclass
class FakeGroups:
    gids: Mapping[str, int] = field(default_factory=lambda: {"video": 44, "render": 107})

    def __call__(self, name: str, /) -> int | None:
        return self.gids.get(name)


@dataclass
class FakeDevices:
    """host path → device nodes; a path it does not know is a lookup error."""

    table: Mapping[str, Sequence[DeviceNode]]

    def expand(self, host_path: str, /) -> list[DeviceNode]:
        if host_path not in self.table:
            raise DeviceLookupError(f"{host_path!r}: no such device")
        return list(self.table[host_path])


def cdev(path: str, major: int, minor: int, *, found: str = "", mode: int = 0o660) -> DeviceNode:
    return DeviceNode(path, "c", major, minor, mode, 0, 44, found)


NO_DEVICES = FakeDevices({})

ROOTFS = "/var/lib/rootfs/busybox"

HOSTS = "/state/out/instances/x/hosts"

GPU0: dict[str, Any] = {
    "name": "gpu0",
    "sharedCount": 2,
    "groups": ["video", "render"],
    "mounts": [
        {
            "destination": "/dev/dri",
            "type": "bind",
            "source": "/dev/dri",
            "options": ["rbind", "rw"],
        }
    ],
    "envs": ["GPU_NAME=gpu0"],
    "hosts": [{"hostname": "gpu-server", "ip": "10.0.0.100"}],
    "devices": ["/dev/null:/dev/gpu0", "/dev/zero:/dev/gpu0-ctl:rw"],
}


def make_service(**over: Any) -> Service:
    doc: dict[str, Any] = {
        "apiVersion": "reconciler/v1",
        "kind": "Service",
        "id": "com.example.nav",
        "version": "1.2.0",
        "image": {"rootfs": "rootfs/busybox", "cmd": ["sleep", "3600"]},
    }
    image = over.pop("image", None)
    if image is not None:
        doc["image"] = {"rootfs": "rootfs/busybox", **image}
    doc.update(over)
    return Service.model_validate(doc)


def make_node(
    *,
    resources: Sequence[Mapping[str, Any]] = (),
    pools: Sequence[Mapping[str, Any]] = (),
    dmips: int = 4000,
    cores: int = 4,
) -> Node:
    return Node.model_validate(
        {
            "apiVersion": "reconciler/v1",
            "kind": "Node",
            "id": "edge-1",
            "type": "main",
            "maxDMIPS": dmips,
            "totalRAM": "8Gi",
            "numCores": cores,
            "resources": [dict(r) for r in resources],
            "devicePools": [dict(p) for p in pools],
        }
    )


def make_placement(
    svc: Service, node: Node, index: int = 0, devices: Sequence[tuple[str, Sequence[str]]] = ()
) -> Placement:
    return Placement(
        instance_id=instance_id(svc.id, svc.subject, index),
        item_id=svc.id,
        subject_id=svc.subject,
        index=index,
        version=svc.version,
        priority=svc.priority,
        node_id=node.id,
        runtime_id="runc-1",
        requested=Requested(),
        resources=tuple(r.name for r in svc.resources),
        devices=tuple((r, tuple(ids)) for r, ids in devices),
    )


def build(
    svc: Service,
    node: Node,
    *,
    index: int = 0,
    pool_devices: Sequence[tuple[str, Sequence[str]]] = (),
    groups: Any = None,
    devices: Any = NO_DEVICES,
    policy: DevicePolicy | None = None,
    uid: int = 5000,
    gid: int = 5000,
) -> BuiltConfig:
    """build_config with test defaults; every config it returns is schema-validated."""
    built = build_config(
        svc,
        make_placement(svc, node, index, pool_devices),
        node,
        rootfs=ROOTFS,
        uid=uid,
        gid=gid,
        hosts_path=HOSTS,
        groups=groups if groups is not None else FakeGroups(),
        devices=devices,
        policy=policy or DevicePolicy(),
    )
    assert_valid(built.config)
    return built


def mounts_of(built: BuiltConfig) -> dict[str, dict[str, Any]]:
    mounts: list[dict[str, Any]] = built.config["mounts"]
    dests = [m["destination"] for m in mounts]
    assert len(dests) == len(set(dests)), f"duplicate mount destinations: {dests}"
    return {m["destination"]: m for m in mounts}


def built_configs(n: int, tag: str = "") -> dict[str, BuiltConfig]:
    out = {}
    for i in range(n):
        iid = instance_id("com.example.w", "default", i)
        out[iid] = BuiltConfig.of({"ociVersion": "1.0.2", "hostname": f"h{i}{tag}"}, f"hosts {i}\n")
    return out


def expected_files(built: dict[str, BuiltConfig]) -> dict[str, bytes]:
    out = {}
    for iid, b in built.items():
        out[f"{iid}/hosts"] = b.hosts.encode()
        out[f"{iid}/config.json"] = config_json(b)
    return dict(sorted(out.items()))
