"""reconciler: a declarative reconciliation controller with file-backed state."""

# The sharing policies register their names with the documents (reconciler.model.policies) as
# they are registered: import them with the package, so that any part of it validates device
# pools against every policy.
import reconciler.placement.sharing as _sharing  # noqa: F401  (registers the policies)

__version__ = "0.1.0"
