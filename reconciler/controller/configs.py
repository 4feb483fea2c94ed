"""The OCI step of ``reconcile``: build every placed instance's config with the real host
lookups (the system group database, the devices under /dev), or with lookups and a policy
given by the caller (tests that run containers on device nodes made in a temp directory)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from itertools import compress, repeat
from operator import attrgetter, eq, is_, is_not, not_
from pathlib import Path
from typing import Any

from reconciler.accel.build import BuildMemo
from reconciler.controller.reconcile import ConfigBuilder
from reconciler.io.fsio import FileReadError, read_bytes_at
from reconciler.io.loader import StateView
from reconciler.model.changes import ServiceKey
from reconciler.model.documents import Node, Service
from reconciler.model.values import instance_ids, validate_id
from reconciler.oci.builder import (
    BuildResult,
    BuiltConfig,
    ConfigJob,
    DeviceLookup,
    DevicePolicy,
    GroupLookup,
    InstanceAddress,
    same_placement_inputs,
    same_service_inputs,
)
from reconciler.oci.hostdevices import HostDevices, SystemGroups
from reconciler.oci.writer import instances_dir
from reconciler.placement.instances import BalanceResult, Placement
from reconciler.planning.checkpoint import Allocation, Checkpoint
from reconciler.planning.network import instance_addresses

__all__ = ["default_config_builder", "resolve_rootfs"]

_INSTANCE_ID = attrgetter("instance_id")
_KEY = attrgetter("item_id", "subject_id")


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
    rebuilds only the configs whose inputs or host answers changed since its last run, and an
    instance whose service and node are the same objects as in the last run (the loader keeps
    the objects of unchanged files), with the same placement fields and uid/gid, costs a few
    comparisons: its previous job is passed back to :func:`build_all` as is."""
    group_lookup: GroupLookup = groups if groups is not None else SystemGroups()
    device_lookup: DeviceLookup = devices if devices is not None else HostDevices()
    device_policy = policy if policy is not None else DevicePolicy()
    memo = BuildMemo()
    last_base: str | None = None  # the instances directory of the previous run
    # the previous run's result and what it built (for a result that names its changes since)
    last_result: BalanceResult | None = None
    last_built: BuildResult | None = None
    # the previous run's nodes, allocations by instance and services (the mappings themselves)
    last: tuple[Mapping[str, Node], dict[str, Allocation | None], Mapping[Any, Service]] = (
        {},
        {},
        {},
    )
    last_nets: dict[str, InstanceAddress] = {}  # the previous run's (network, address) per id
    last_given: Mapping[str, Allocation] | None = None  # the allocations mapping itself
    last_revision: int | None = None  # the revision of the view the last build was given

    def build(
        state_dir: Path, view: StateView, result: BalanceResult, cp: Checkpoint
    ) -> BuildResult:
        nonlocal last_base, last, last_result, last_built, last_nets, last_given, last_revision
        # the services edited since the last call's view, when the loads counted them from it
        changes = view.changes
        edited = (
            changes.services if changes is not None and changes.counts_from(last_revision) else None
        )
        nodes = view.nodes
        allocations = cp.allocations
        # the ids whose allocation can differ from the last call's, when told of the mapping
        # the last call was given (see Checkpoint.since)
        told = cp.since[1] if cp.since is not None and cp.since[0] is last_given else None
        last_given = allocations
        nets = instance_addresses(cp.network) if cp.network else {}
        was_nets, last_nets = last_nets, nets
        resolved = state_dir.resolve()  # once per run, not per instance
        base = str(instances_dir(resolved))
        # a job of the previous run is passed back as is when its inputs are the same objects
        # (service, node) and values (the placement's fields the build reads, uid, gid): its
        # rootfs and hosts path depend only on the service and the instances directory
        reuse = base == last_base
        last_base = None  # until this run's jobs are built
        rootfs: dict[str, str] = {}  # per run: image rootfs -> resolved path

        def rootfs_of(image_rootfs: str) -> str:
            got = rootfs.get(image_rootfs)
            if got is None:
                got = rootfs[image_rootfs] = resolve_rootfs(resolved, image_rootfs)
            return got

        was, done = last_result, last_built
        last_result = last_built = None
        held = result.held
        if reuse and nodes is last[0] and was is not None and done is not None and not held:
            since = result.changed_since(was)
            if result is was and view.services is not last[2]:
                since = None  # (an edited service's placements are not known: built in full)
            if since is not None:
                if nets or was_nets:  # an address can change while its placement does not
                    moved = {
                        i for i in nets.keys() | was_nets.keys() if nets.get(i) != was_nets.get(i)
                    }
                    since = since | moved
                built = _patched(
                    since, done, view, result, allocations, rootfs_of, base, nets, told, edited
                )
                last_base, last_result, last_built = base, result, built
                last, last_revision = (nodes, dict(allocations), view.services), view.revision
                return built
        services = {s.key: s for s in view.services.values()}
        placements = result.placements
        iids = list(map(_INSTANCE_ID, placements))
        allocs = list(map(allocations.get, iids))
        olds = memo.jobs(iids) if reuse else [None] * len(iids)
        # C-level passes first: a job whose placement and allocation are the very objects of
        # the last run, on the same nodes, of a service that did not change, is taken as is
        same: list[bool] = [False] * len(iids)
        if reuse and nodes is last[0]:
            checks = [
                map(is_, map(getattr, olds, repeat("placement"), repeat(None)), placements),
                map(is_, map(last[1].get, iids), allocs),
                map(is_not, allocs, repeat(None)),
            ]
            if view.services is not last[2]:
                changed = {k for k, s in view.services.items() if last[2].get(k) is not s}
                if changed:
                    checks.append(map(not_, map(changed.__contains__, map(_KEY, placements))))
            if nets or was_nets:
                checks.append(map(eq, map(nets.get, iids), map(was_nets.get, iids)))
            same = list(map(all, zip(*checks, strict=True)))
        jobs: list[ConfigJob | None] = [
            old if ok else None for old, ok in zip(olds, same, strict=True)
        ]
        alike: dict[tuple[int, int], bool] = {}  # (see _job; the services are alive meanwhile)
        for k in compress(range(len(iids)), map(not_, same)):
            p, iid, alloc, old = placements[k], iids[k], allocs[k], olds[k]
            service = services[(p.item_id, p.subject_id)]
            if alloc is None or iid in held or service.type == "component":
                jobs[k] = None  # (a component gets no OCI config: SPEC §18)
                continue
            net = nets.get(iid)
            node = nodes[p.node_id]
            jobs[k] = _job(iid, p, alloc, service, node, old, rootfs_of, base, net, alike)
        built = memo.build_all(
            list(filter(None, jobs)),
            groups=group_lookup,
            devices=device_lookup,
            policy=device_policy,
        )
        if held:
            built = _with_held(built, held, iids, base)
        last_base, last_result, last_built = base, result, built
        last, last_revision = (nodes, dict(allocations), view.services), view.revision
        return built

    def _patched(
        since: frozenset[str],
        done: BuildResult,
        view: StateView,
        result: BalanceResult,
        allocations: Mapping[str, Allocation],
        rootfs_of: Callable[[str], str],
        base: str,
        nets: Mapping[str, InstanceAddress],
        told: frozenset[str] | None,
        edited: frozenset[ServiceKey] | None,
    ) -> BuildResult:
        """The last run's build, with only the instances that can differ built again: those
        ``since`` names (placed, moved or removed since the last result), those of a service
        or with an allocation that is not the last run's object, and those whose build asked
        the host something (its answers are checked again). Every other instance's job would
        be the very one of the last run (same service, node, placement, uid and gid).
        ``told``: the ids at which ``allocations`` may differ from the last call's (else
        compared). ``edited``: a superset of the keys of the services edited since the last
        call's view (else the services are compared)."""
        _nodes, last_allocs, last_services = last
        redo = set(since)
        if view.services is not last_services:
            # an edited service's configs can change while its placements do not (``since``
            # names changed placements only): every instance of one, from its instance counts
            keys = _edited(view.services, last_services) if edited is None else edited
            for key in keys:
                now, then = view.services.get(key), last_services.get(key)
                if now is not None and then is not None and same_service_inputs(then, now):
                    continue  # (the same input to the build: each instance's last job holds)
                count = max(s.instances for s in (now, then) if s is not None)
                redo.update(instance_ids(key[0], key[1], 0, count))
        if told is not None:  # (a superset: those whose allocation is another object)
            redo.update(i for i in told if last_allocs.get(i) is not allocations.get(i))
        else:
            ids = allocations.keys()
            redo.update(compress(ids, map(is_not, map(last_allocs.get, ids), allocations.values())))
            redo.update(last_allocs.keys() - ids)
        redo |= memo.asking()
        by_id = result.by_id
        jobs: list[ConfigJob] = []
        removed: list[str] = []
        alike: dict[tuple[int, int], bool] = {}  # (see _job; the services are alive meanwhile)
        for iid in sorted(redo):
            p, alloc = by_id.get(iid), allocations.get(iid)
            service = view.services[(p.item_id, p.subject_id)] if p is not None else None
            if p is None or alloc is None or service is None or service.type == "component":
                removed.append(iid)
                continue
            node = view.nodes[p.node_id]
            old = memo.job(iid)
            net = nets.get(iid)
            jobs.append(_job(iid, p, alloc, service, node, old, rootfs_of, base, net, alike))
        some = memo.build_all(
            jobs, groups=group_lookup, devices=device_lookup, policy=device_policy, removed=removed
        )
        built, errors = dict(done.built), dict(done.errors)
        for iid in redo:
            built.pop(iid, None)
            errors.pop(iid, None)
        built.update(some.built)
        errors.update(some.errors)
        # (the writer looks at the ids whose config is not the very object it was: a build
        # the memo reused is, and most of an edited service's are)
        was = done.built
        moved = frozenset(i for i in redo if built.get(i) is not was.get(i))
        return BuildResult(built, errors, since=(was, moved))

    return build


def _edited(now: Mapping[Any, Service], then: Mapping[Any, Service]) -> Iterable[Any]:
    """The keys whose service is not the very object it was (edited, added or removed). Two
    mappings with the same keys in the same order (a warm load's: each key keeps its place)
    are compared by position, with C-level passes."""
    if len(now) == len(then) and all(map(eq, now.keys(), then.keys())):
        keys = list(now.keys())
        return compress(keys, map(is_not, now.values(), then.values()))
    keys_ = now.keys() | then.keys()
    return compress(keys_, map(is_not, map(now.get, keys_), map(then.get, keys_)))


def _same_service(a: Service, b: Service, alike: dict[tuple[int, int], bool] | None) -> bool:
    """:func:`same_service_inputs`, asked once per pair of objects in ``alike``."""
    if a is b:
        return True
    if alike is None:
        return same_service_inputs(a, b)
    key = (id(a), id(b))
    got = alike.get(key)
    if got is None:
        got = alike[key] = same_service_inputs(a, b)
    return got


def _with_held(
    built: BuildResult, held: frozenset[str], order: list[str], base: str
) -> BuildResult:
    """``built`` with each held instance's config as it is on disk: a held instance keeps the
    config of its last placement (its spec is not the current one, which places nowhere). One
    whose config is gone (out/ was wiped) cannot be started again until its spec places."""
    configs, errors = dict(built.built), dict(built.errors)
    for iid in sorted(held):
        try:
            data, _ = read_bytes_at(f"{base}/{iid}/config.json", HELD_MAX_BYTES)
            hosts, _ = read_bytes_at(f"{base}/{iid}/hosts", HELD_MAX_BYTES)
            configs[iid] = BuiltConfig(data, hosts.decode())
        except (FileReadError, UnicodeDecodeError) as e:
            errors[iid] = (
                f"held where it runs, but the config of its last placement cannot be read "
                f"(out/instances/{iid}/config.json: {e}); the current spec places nowhere"
            )
    rank = {iid: k for k, iid in enumerate(order)}
    return BuildResult(
        dict(sorted(configs.items(), key=lambda kv: rank.get(kv[0], -1))),
        dict(sorted(errors.items(), key=lambda kv: rank.get(kv[0], -1))),
    )


HELD_MAX_BYTES = 16 * 1024 * 1024
"""The largest config (or hosts file) a held instance's is read back up to."""


def _job(
    iid: str,
    p: Placement,
    alloc: Allocation,
    service: Service,
    node: Node,
    old: ConfigJob | None,
    rootfs_of: Callable[[str], str],
    base: str,
    net: InstanceAddress | None = None,
    alike: dict[tuple[int, int], bool] | None = None,
) -> ConfigJob:
    """The job of one instance: ``old`` (the last run's) when its inputs are the same objects
    and values, else a new one. A service that is another object but the same input to the
    build (:func:`same_service_inputs`: an edit of its instance count or priority) keeps the
    old job too: the build gives the same config. ``alike``: that answer per pair of service
    objects (their ``id``s), for a caller that keeps both alive while it holds the dict."""
    if (
        old is not None
        and old.network == net
        and _same_service(old.service, service, alike)
        and old.node is node
        and old.uid == alloc.uid
        and old.gid == alloc.gid
        and (old.placement is p or same_placement_inputs(old.placement, p))
    ):
        return old
    validate_id(iid, "instance id")
    return ConfigJob(
        service=service,
        placement=p,
        node=node,
        rootfs=rootfs_of(service.image.rootfs),
        uid=alloc.uid,
        gid=alloc.gid,
        hosts_path=f"{base}/{iid}/hosts",  # as oci_writer.hosts_path
        network=net,
    )
