from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.etcd_support import etcd_server, etcd_url  # noqa: F401 - fixtures shared by the suite

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "state"
EXAMPLES = sorted(p for p in (ROOT / "examples").iterdir() if (p / "unit.yaml").exists())


@pytest.fixture
def demo_copy(tmp_path: Path) -> Path:
    """A private copy of the bundled demo state directory (inputs only)."""
    dst = tmp_path / "state"
    shutil.copytree(DEMO, dst, ignore=shutil.ignore_patterns("out", "checkpoint", ".lock"))
    return dst
