"""Sharing policies (SPEC §6.2, §6.3): one interface, in the shape of Volcano's ``Devices``.

A policy decides how a node's pool of something shareable is handed to instances: named host
resources are the ``shared-count`` policy (N concurrent users), device pools are ``exclusive``
(whole devices by count) or ``fractional`` (one device, a slice of its memory). Every policy
answers the same questions over an immutable pool state:

- :meth:`SharingPolicy.filter` — can this request be served on this node now? A :class:`Status`
  with a closed set of codes (Success, Error, Unschedulable, UnschedulableAndUnresolvable) and
  a reason;
- :meth:`SharingPolicy.allocate` — the new state and the ids given;
- :meth:`SharingPolicy.release` — the state with those ids given back;
- :meth:`SharingPolicy.status` — counts for ``reconciler status``.

A new policy is one new module defining a subclass plus one :func:`register` call (below, or
in the code that adds it): registering it also makes its name a valid ``policy`` of device pools
in node files, their validation and ``reconciler schema`` (:mod:`reconciler.model.policies`),
and ``status`` reports its pools through its :meth:`SharingPolicy.status`.

Verdicts (:class:`Status`) say whether a preemption could help: ``Unschedulable`` (the pool is
taken) versus ``UnschedulableAndUnresolvable`` and ``Error`` (never on this node), as
:attr:`Status.preemption_may_help` and :attr:`Status.unresolvable`.
"""

from __future__ import annotations

from reconciler.model.policies import register_policy, unregister_policy
from reconciler.placement.sharing.base import (
    PoolStatus,
    ShareRequest,
    SharingPolicy,
    Status,
    StatusCode,
)
from reconciler.placement.sharing.exclusive import ExclusivePolicy
from reconciler.placement.sharing.fractional import FractionalPolicy
from reconciler.placement.sharing.shared_count import SharedCountPolicy

__all__ = [
    "REGISTRY",
    "ExclusivePolicy",
    "FractionalPolicy",
    "PoolStatus",
    "ShareRequest",
    "SharedCountPolicy",
    "SharingPolicy",
    "Status",
    "StatusCode",
    "policy",
    "register",
    "unregister",
]

REGISTRY: dict[str, SharingPolicy] = {}
"""Every sharing policy by its stable name; device pools name theirs in ``policy:``."""


def register(p: SharingPolicy) -> None:
    """Add a policy (replacing one of the same name); a device-pool policy's name becomes a
    valid ``policy`` of device pools, checked with its :meth:`SharingPolicy.check_devices`."""
    REGISTRY[p.name] = p
    if p.device_pool:
        register_policy(p.name, p.check_devices)


def unregister(name: str) -> None:
    """Remove a policy registered with :func:`register` (node files naming it become invalid)."""
    REGISTRY.pop(name, None)
    unregister_policy(name)


register(SharedCountPolicy())
register(ExclusivePolicy())
register(FractionalPolicy())


def policy(name: str) -> SharingPolicy:
    try:
        return REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(REGISTRY))
        raise KeyError(f"unknown sharing policy {name!r} (known: {known})") from None
