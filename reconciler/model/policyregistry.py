"""The registry behind :mod:`reconciler.model.policies`: the names of the sharing policies a
device pool may name, with the rules their devices must follow. Plain Python (no pydantic), so
that the package can hook the built-in policies in without loading the documents.

The built-in policies are registered by :mod:`reconciler.placement.sharing` when it is imported;
the package (``reconciler/__init__.py``) hands that import over as a *provider*, run once before
the registry is first read (a document validated, a schema generated). A command that never
validates a document (``reconciler --help``) never loads them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = [
    "add_provider",
    "check_devices",
    "is_known",
    "policy_names",
    "register_policy",
    "unregister_policy",
]

DevicesCheck = Callable[[tuple[Any, ...]], None]
"""Checks a pool's devices (``Device`` documents) for a policy; raises ValueError."""

_POLICIES: dict[str, DevicesCheck | None] = {}
_PROVIDERS: list[Callable[[], None]] = []
_LOCK = threading.RLock()


def add_provider(provide: Callable[[], None]) -> None:
    """Run ``provide`` (which registers policies) once, before the registry is next read."""
    with _LOCK:
        _PROVIDERS.append(provide)


def _provided() -> dict[str, DevicesCheck | None]:
    if _PROVIDERS:
        with _LOCK:
            while _PROVIDERS:
                _PROVIDERS.pop(0)()
    return _POLICIES


def register_policy(name: str, check: DevicesCheck | None = None) -> None:
    """Make ``name`` a valid ``policy`` of device pools; ``check`` is called with a pool's
    devices and raises ValueError for devices the policy cannot serve (e.g. without memory)."""
    _POLICIES[name] = check


def unregister_policy(name: str) -> None:
    _provided().pop(name, None)


def policy_names() -> tuple[str, ...]:
    """Every registered name, sorted."""
    return tuple(sorted(_provided()))


def is_known(name: str) -> bool:
    return name in _provided()


def check_devices(name: str, devices: tuple[Any, ...]) -> None:
    """The registered rules of policy ``name`` on a pool's devices (raises ValueError)."""
    check = _provided().get(name)
    if check is not None:
        check(devices)
