"""reconciler: a declarative reconciliation controller with file-backed state."""

from reconciler.model.policyregistry import add_provider as _add_provider


def _register_sharing_policies() -> None:
    # The sharing policies register their names with the documents (reconciler.model.policies)
    # as they are registered: hooked in here, so that any part of the package validates device
    # pools against every policy; loaded when first needed, not with the package (start-up).
    import reconciler.placement.sharing  # noqa: F401  (registers the policies)


_add_provider(_register_sharing_policies)

__version__ = "0.1.0"
