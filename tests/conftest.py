from __future__ import annotations

import atexit
import gc
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.etcd import (  # fixtures shared by the suite
    STORE_PARAM,
    STORE_SCENARIO_MODULES,
    etcd_server,  # noqa: F401
    etcd_url,  # noqa: F401
    runs_reconcile,
    state_store,  # noqa: F401
)
from tests.support.paths import DEMO

# The read cache of explain (reconciler.io.readcache) goes to a directory of the test run's
# own, never the user's ~/.cache; the commands the tests start in other processes inherit it.
_READ_CACHE = tempfile.mkdtemp(prefix="reconciler-test-cache-")
os.environ["RECONCILER_CACHE_DIR"] = _READ_CACHE
atexit.register(shutil.rmtree, _READ_CACHE, ignore_errors=True)


@pytest.fixture(autouse=True)
def _nothing_left_frozen() -> Iterator[None]:
    """A test that ran a watcher leaves what its runs froze (``gcpause.collect_idle``) to the
    collector again: no test depends on objects an earlier one froze."""
    yield
    gc.unfreeze()


@pytest.fixture
def demo_copy(tmp_path: Path) -> Path:
    """A private copy of the bundled demo state directory (inputs only)."""
    dst = tmp_path / "state"
    shutil.copytree(DEMO, dst, ignore=shutil.ignore_patterns("out", "checkpoint", ".lock"))
    return dst


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """The placement, checkpoint and plan scenarios that run ``reconcile`` run against both
    stores, unchanged: ``[file]`` as written, ``[etcd]`` through a unit in etcd (issue 11)."""
    if metafunc.module.__name__ in STORE_SCENARIO_MODULES and runs_reconcile(metafunc.function):
        metafunc.fixturenames.append(STORE_PARAM)  # a plain parameter, read by state_store
        metafunc.parametrize(STORE_PARAM, ["file", "etcd"])
