"""The OCI step of ``reconcile``: build and write every placed instance's config."""

from __future__ import annotations

from .reconcile import InstanceOutputs

__all__ = ["default_instance_outputs"]


def default_instance_outputs() -> InstanceOutputs | None:
    return None
