"""What an instance asks of a node: its requested amounts on a node's ratios (SPEC §7.2) and
the :class:`Ask` every filter reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from reconciler.model.documents import DeviceRequest, ResourceRatios, Service
from reconciler.placement.instances import (
    Cause,
    DeviceIds,
    Instance,
    Requested,
    new_requested,
)
from reconciler.placement.nodestate import NodeSlot, RequestKey
from reconciler.placement.sharing import ShareRequest

__all__ = [
    "Ask",
    "AskKey",
    "Platform",
    "RequestInputs",
    "ask_for",
    "ask_key",
    "request_inputs",
    "requested",
    "requested_amounts",
]


def _amount(asked: int | None, limit: int | None, ratio: int) -> int:
    """SPEC §7.2 for one resource: the request capped at the quota, else the quota's share at
    the node's ratio (limit * ratio / 100, rounded half up), else 0."""
    if asked is not None:
        return asked if limit is None or asked <= limit else limit
    if limit is not None:
        return (2 * limit * ratio + 100) // 200
    return 0


RequestInputs = tuple[
    bool,
    int | None,
    int | None,
    int | None,
    int | None,
    int | None,
    int | None,
    int | None,
    int | None,
]
"""What SPEC §7.2 reads of a service: ``skipResourceLimits``, then the request and the quota of
cpu, ram, storage and state."""


def request_inputs(service: Service) -> RequestInputs:
    req, quotas = service.requestedResources, service.quotas
    if service.type == "component":  # SPEC §18: a component consumes no CPU or RAM
        skip = service.skipResourceLimits
        return (
            skip,
            None,
            None,
            None,
            None,
            req.storage,
            quotas.storageLimit,
            req.state,
            quotas.stateLimit,
        )
    return (
        service.skipResourceLimits,
        req.cpu,
        quotas.cpuDMIPSLimit,
        req.ram,
        quotas.ramLimit,
        req.storage,
        quotas.storageLimit,
        req.state,
        quotas.stateLimit,
    )


def requested_amounts(
    service: Service,
    ratios: ResourceRatios,
    measured: tuple[int, int] | None = None,
) -> Requested:
    """SPEC §7.2 for one candidate node's ratios; ``measured`` (cpu, ram) raises cpu and ram
    on an overloaded node during a rebalance."""
    key = (ratios.cpu, ratios.ram, ratios.storage, ratios.state, measured is not None)
    return requested(request_inputs(service), key, measured)


def requested(
    inputs: RequestInputs, key: RequestKey, measured: tuple[int, int] | None
) -> Requested:
    """SPEC §7.2 on a node whose request key (its ratios, first) is ``key``."""
    skip, cpu, cpu_quota, ram, ram_quota, storage, storage_quota, state, state_quota = inputs
    if skip:
        return Requested()
    cpu = _amount(cpu, cpu_quota, key[0])
    ram = _amount(ram, ram_quota, key[1])
    if measured is not None:
        cpu = max(cpu, measured[0])
        ram = max(ram, measured[1])
    return new_requested(
        cpu,
        ram,
        _amount(storage, storage_quota, key[2]),
        _amount(state, state_quota, key[3]),
    )


# ----------------------------------------------------------------------------- what is asked


class Platform(NamedTuple):
    """The image platform a service asks for (``ImagePlatform``'s fields, as plain values)."""

    architecture: str
    os: str | None
    variant: str | None
    osVersion: str | None
    osFeatures: tuple[str, ...]


@dataclass(slots=True)
class Ask:
    """What one instance asks of a candidate node (the same for every instance of a service,
    except what pass 1 keeps)."""

    instance: Instance
    labels: frozenset[str]
    runtimes: frozenset[str]
    node_id: str | None
    platform: Platform | None
    resources: tuple[ShareRequest, ...]
    devices: tuple[ShareRequest, ...]
    amounts: RequestInputs  # what its requested amounts are made from (SPEC §7.2)
    keep_runtime: str | None = None
    keep_devices: DeviceIds = ()  # device ids kept, per resource (pass 1)
    usage: tuple[int, int] | None = None  # measured (cpu, ram) of this instance
    cause: Cause | None = None  # recorded with the reservation
    _cache: dict[RequestKey, Requested] = field(default_factory=dict)

    def requested(self, slot: NodeSlot) -> Requested:
        """SPEC §7.2 on ``slot`` (cached per ratios and overload)."""
        return self.requested_on(slot.request_key)

    def requested_on(self, key: RequestKey) -> Requested:
        """SPEC §7.2 on a node whose request key is ``key``."""
        got = self._cache.get(key)
        if got is None:
            measured = self.usage if key[4] else None
            got = self._cache[key] = requested(self.amounts, key, measured)
        return got


def _device_order(d: DeviceRequest) -> str:
    return d.resource


AskKey = tuple[
    tuple[str, ...],
    tuple[str, ...],
    str | None,
    Platform | None,
    tuple[str, ...],
    tuple[tuple[str, int, int | None], ...],
    RequestInputs,
]
"""Everything :func:`ask_for` reads of a service, as plain values (``ask_key``): labels,
runtime types, node id, platform, named resources, device requests (by resource) and the
inputs of the requested amounts. The asks of services with equal keys differ only in their
instance (and what the caller sets after: usage, cause, what pass 1 keeps)."""


def ask_key(service: Service) -> AskKey:
    """The :data:`AskKey` of ``service`` (what :func:`ask_for` builds its ask from)."""
    s = service
    resources, devices, p = s.resources, s.devices, s.image.platform
    return (
        s.labels,
        s.runtimes,
        s.nodeId,
        # (tuple.__new__: as Platform(...) without its Python-level __new__)
        None
        if p is None
        else tuple.__new__(Platform, (p.architecture, p.os, p.variant, p.osVersion, p.osFeatures)),
        tuple([r.name for r in resources]) if resources else (),
        tuple([(d.resource, d.count or 1, d.memory) for d in sorted(devices, key=_device_order)])
        if devices
        else (),
        request_inputs(s),
    )


def ask_for(instance: Instance, usage: tuple[int, int] | None, key: AskKey | None = None) -> Ask:
    """What ``instance`` asks (``usage``: its measured cpu and ram, where known); ``key``: its
    service's :func:`ask_key`, when the caller has it."""
    labels, runtimes, node_id, platform, resources, devices, amounts = (
        key if key is not None else ask_key(instance.service)
    )
    return Ask(
        instance,
        frozenset(labels),
        frozenset(runtimes),
        node_id,
        platform,
        tuple([ShareRequest(r) for r in resources]) if resources else (),
        tuple([ShareRequest(*d) for d in devices]) if devices else (),
        amounts,
        usage=usage,
    )
