"""The OCI step of ``reconcile``: build every placed instance's config with the real host
lookups (the system group database, the devices under /dev), or with lookups and a policy
given by the caller (tests that run containers on device nodes made in a temp directory)."""

from __future__ import annotations

import os
from pathlib import Path

from .checkpoint import Checkpoint
from .hostdevices import HostDevices, SystemGroups
from .loader import StateView
from .oci import (
    BuildMemo,
    BuildResult,
    ConfigJob,
    DeviceLookup,
    DevicePolicy,
    GroupLookup,
    build_all,
)
from .oci_writer import instances_dir
from .placement import BalanceResult
from .reconcile import ConfigBuilder
from .values import validate_id

__all__ = ["default_config_builder", "resolve_rootfs"]


def resolve_rootfs(state_dir: Path, rootfs: str) -> str:
    """An image rootfs relative to the state directory, or absolute (SPEC §3.2)."""
    path = Path(rootfs)
    return os.path.normpath(path if path.is_absolute() else state_dir.resolve() / path)


def default_config_builder(
    *,
    groups: GroupLookup | None = None,
    devices: DeviceLookup | None = None,
    policy: DevicePolicy | None = None,
) -> ConfigBuilder:
    """The builder ``reconcile`` runs: by default the system group database, the devices under
    ``/dev`` and the default policy (host devices under ``/dev``).

    The builder keeps a :class:`BuildMemo`: a long-running caller (``watch``) that runs it again
    rebuilds only the configs whose inputs or host answers changed since its last run."""
    group_lookup: GroupLookup = groups if groups is not None else SystemGroups()
    device_lookup: DeviceLookup = devices if devices is not None else HostDevices()
    device_policy = policy if policy is not None else DevicePolicy()
    memo = BuildMemo()

    def build(
        state_dir: Path, view: StateView, result: BalanceResult, cp: Checkpoint
    ) -> BuildResult:
        services = {s.key: s for s in view.services.values()}
        resolved = state_dir.resolve()  # once per run, not per instance
        base = str(instances_dir(resolved))
        rootfs: dict[str, str] = {}  # per run: image rootfs -> resolved path
        jobs = []
        for p in result.placements:
            alloc = cp.allocations.get(p.instance_id)
            if alloc is None:
                continue
            service = services[(p.item_id, p.subject_id)]
            image_rootfs = service.image.rootfs
            if image_rootfs not in rootfs:
                rootfs[image_rootfs] = resolve_rootfs(resolved, image_rootfs)
            validate_id(p.instance_id, "instance id")
            jobs.append(
                ConfigJob(
                    service=service,
                    placement=p,
                    node=view.nodes[p.node_id],
                    rootfs=rootfs[image_rootfs],
                    uid=alloc.uid,
                    gid=alloc.gid,
                    hosts_path=f"{base}/{p.instance_id}/hosts",  # as oci_writer.hosts_path
                )
            )
        return build_all(
            jobs, groups=group_lookup, devices=device_lookup, policy=device_policy, memo=memo
        )

    return build
