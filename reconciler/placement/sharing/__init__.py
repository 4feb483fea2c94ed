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

A new policy is one new module defining a subclass plus one line in :data:`REGISTRY`.
"""

from __future__ import annotations

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
]

REGISTRY: dict[str, SharingPolicy] = {
    p.name: p for p in (SharedCountPolicy(), ExclusivePolicy(), FractionalPolicy())
}
"""Every sharing policy by its stable name; device pools name theirs in ``policy:``."""


def policy(name: str) -> SharingPolicy:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown sharing policy {name!r}; known: {sorted(REGISTRY)}") from None
