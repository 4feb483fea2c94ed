"""The names of the sharing policies a device pool may name (SPEC §6.3), as the documents see
them: ``DevicePool.policy`` accepts the registered names, and its JSON Schema lists them.

The policies themselves live in :mod:`reconciler.placement.sharing`, which registers each here
(with the rules its pools' devices must follow) when it registers the policy: a new policy is one
module plus one registration there, and the node files, ``validate`` and ``reconciler schema``
know it without an edit here. The registry is read when a document is validated and when a
schema is generated, never copied.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from pydantic import AfterValidator, GetJsonSchemaHandler, Strict
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

__all__ = [
    "PolicyName",
    "check_devices",
    "policy_names",
    "register_policy",
    "unregister_policy",
]

DevicesCheck = Callable[[tuple[Any, ...]], None]
"""Checks a pool's devices (``Device`` documents) for a policy; raises ValueError."""

_POLICIES: dict[str, DevicesCheck | None] = {}


def register_policy(name: str, check: DevicesCheck | None = None) -> None:
    """Make ``name`` a valid ``policy`` of device pools; ``check`` is called with a pool's
    devices and raises ValueError for devices the policy cannot serve (e.g. without memory)."""
    _POLICIES[name] = check


def unregister_policy(name: str) -> None:
    _POLICIES.pop(name, None)


def policy_names() -> tuple[str, ...]:
    """Every registered name, sorted."""
    return tuple(sorted(_POLICIES))


def check_devices(name: str, devices: tuple[Any, ...]) -> None:
    """The registered rules of policy ``name`` on a pool's devices (raises ValueError)."""
    check = _POLICIES.get(name)
    if check is not None:
        check(devices)


def _known(name: str) -> str:
    if name not in _POLICIES:
        known = ", ".join(policy_names()) or "none registered"
        raise ValueError(f"unknown sharing policy {name!r} (known: {known})")
    return name


class _Enum:
    """The JSON Schema of a policy name: a string, one of the names registered when the schema
    is generated."""

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        out = handler(schema)
        out["enum"] = list(policy_names())
        return out


PolicyName = Annotated[str, Strict(), AfterValidator(_known), _Enum]
