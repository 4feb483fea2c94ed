"""reconciler: a declarative reconciliation controller with file-backed state."""

__version__ = "0.1.0"
