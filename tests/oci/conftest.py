"""Fixtures of the OCI tests that run the real runtime."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.runc import make_runc_rootfs, require_runc_and_busybox, run_runc


@pytest.fixture
def runc_env(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """(runc --root dir, static busybox path) after a probe with a plain `runc spec` config."""
    busybox = require_runc_and_busybox()
    runc_root = tmp_path / "runc-root"
    runc_root.mkdir()
    probe = tmp_path / "probe"
    make_runc_rootfs(probe / "rootfs", busybox)
    spec = subprocess.run(
        ["runc", "spec", "--bundle", str(probe)], capture_output=True, text=True, check=False
    )
    if spec.returncode != 0:
        pytest.skip(f"`runc spec` fails here: {spec.stderr.strip()}")
    config = json.loads((probe / "config.json").read_text())
    config["process"]["terminal"] = False
    config["process"]["args"] = ["/bin/true"]
    (probe / "config.json").write_text(json.dumps(config))
    cid = f"probe-{uuid.uuid4().hex[:12]}"
    try:
        ran = run_runc(runc_root, "run", "--bundle", str(probe), cid)
    finally:
        run_runc(runc_root, "delete", "--force", cid)
    if ran.returncode != 0:
        pytest.skip(f"runc cannot run even a plain `runc spec` container here: {ran.stderr}")
    yield runc_root, busybox
