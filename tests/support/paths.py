"""Paths of the repository the tests read: its root, the bundled demo state and the examples."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository's root (this file is tests/support/paths.py)."""

DEMO = ROOT / "state"
"""The bundled demo state directory."""

EXAMPLES = sorted(p for p in (ROOT / "examples").iterdir() if (p / "unit.yaml").exists())
"""Every bundled example unit (a directory with a unit.yaml)."""

OCI_SCHEMA_DIR = Path(__file__).resolve().parents[1] / "oci-runtime-spec-v1.0.2" / "schema"
"""The OCI runtime-spec v1.0.2 JSON Schemas bundled with the tests."""
