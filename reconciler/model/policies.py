"""The names of the sharing policies a device pool may name (SPEC §6.3), as the documents see
them: ``DevicePool.policy`` accepts the registered names, and its JSON Schema lists them.

The policies themselves live in :mod:`reconciler.placement.sharing`, which registers each here
(with the rules its pools' devices must follow) when it registers the policy: a new policy is one
module plus one registration there, and the node files, ``validate`` and ``reconciler schema``
know it without an edit here. The registry is read when a document is validated and when a
schema is generated, never copied.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, GetJsonSchemaHandler, Strict
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from reconciler.model.policyregistry import (
    check_devices,
    is_known,
    policy_names,
    register_policy,
    unregister_policy,
)

__all__ = [
    "PolicyName",
    "check_devices",
    "policy_names",
    "register_policy",
    "unregister_policy",
]


def _known(name: str) -> str:
    if not is_known(name):
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
