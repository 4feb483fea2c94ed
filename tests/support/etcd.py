"""A real etcd server for the tests (Debian's etcd-server; scripts/bootstrap installs it).

One server per test session on free loopback ports, its data directory in a temp dir, with the
request limits docs/etcd.md recommends for large units. Each test gets its
own key prefix, so tests never see each other's keys. Without the ``etcd`` binary the tests
that need it skip, saying why.
"""

from __future__ import annotations

import inspect
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import reconciler.controller.reconcile
from benchmarks.etcdserver import EtcdServer, EtcdUnavailable
from benchmarks.etcdserver import start_etcd as start_server
from reconciler.controller.ha import reconcile_via_store
from reconciler.controller.reconcile import ReconcileOptions, ReconcileReport
from reconciler.io.loader import StateView
from reconciler.io.lock import StateLock
from reconciler.stores.base import FileStore, copy_unit
from reconciler.stores.etcd import EtcdStore

__all__ = [
    "STORE_PARAM",
    "STORE_SCENARIO_MODULES",
    "EtcdServer",
    "etcd_server",
    "etcd_url",
    "runs_reconcile",
    "start_etcd",
    "state_store",
]


def start_etcd(data_dir: Path) -> EtcdServer:
    """The tests' server: the limits docs/etcd.md recommends for large units; skips the test
    (saying why) without the binary."""
    try:
        return start_server(data_dir, max_txn_ops=100000, max_request_bytes=67108864)
    except EtcdUnavailable as e:
        pytest.skip(f"{e}; scripts/bootstrap installs it")


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    with tempfile.TemporaryDirectory(prefix="reconciler-etcd-") as tmp:
        server = start_etcd(Path(tmp))
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture
def etcd_url(etcd_server: EtcdServer) -> str:
    """A store URL with a prefix of this test's own."""
    return etcd_server.url(f"test/{uuid.uuid4().hex}")


# ---------------------------------------------------------------- scenarios against both stores

STORE_PARAM = "store"
"""The parameter that names the store of a scenario test's variant."""

STORE_SCENARIO_MODULES = (
    "tests.planning.test_checkpoint",
    "tests.planning.test_planner",
    "tests.placement.test_rebalance",
    "tests.oci.test_reconcile_oci",
)
"""The placement, checkpoint, plan and OCI scenario modules: each of their tests that runs
``reconcile`` (directly or through the CLI) runs once per store, unchanged."""


def runs_reconcile(function: Callable[..., object]) -> bool:
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        return False
    return "reconcile(" in source or '"reconcile"' in source


def through_etcd(
    url: str, calls: list[Path]
) -> Callable[[Path, ReconcileOptions | None, StateView | None], ReconcileReport]:
    """``reconcile`` as a test calls it, on etcd: the test's state directory (its edits: inputs,
    a corrupted checkpoint...) is imported into the store, the controller reconciles the unit
    in etcd with that directory as its working copy (so the OCI configs name the same paths)
    and commits, and the unit is exported back: the files the test then reads are exactly what
    etcd holds (a document the commit lost would be deleted by the export). The copies take
    the directory's flock, as ``import`` and ``export`` do."""

    def reconcile_on_etcd(
        state_dir: Path,
        opts: ReconcileOptions | None = None,
        previous_view: StateView | None = None,
    ) -> ReconcileReport:
        opts = opts or ReconcileOptions()
        if opts.write_hook is not None:
            pytest.skip("faults injected into the file store's writes (not etcd's commits)")
        if previous_view is not None:
            pytest.skip("an in-memory view of another directory (the file watcher's)")
        calls.append(state_dir)
        store = EtcdStore(url)
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        with StateLock(state_dir, opts.lock_timeout):
            copy_unit(FileStore(state_dir), store)
        try:
            return reconcile_via_store(store, state_dir, opts, wait=30)
        finally:
            with StateLock(state_dir, opts.lock_timeout):
                copy_unit(store, FileStore(state_dir))

    return reconcile_on_etcd


@pytest.fixture(autouse=True)
def state_store(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The store a scenario test runs against, from its ``[file]`` / ``[etcd]`` parameter
    (``pytest_generate_tests`` in conftest.py): ``file``, the test as written; ``etcd``, every
    ``reconcile`` of the test (its module's and the CLI's) goes through a unit in etcd (see
    :func:`through_etcd`). Tests without the parameter run as written."""
    callspec = getattr(request.node, "callspec", None)
    kind = str(callspec.params.get(STORE_PARAM, "file")) if callspec is not None else "file"
    calls: list[Path] = []
    if kind == "etcd":
        server: EtcdServer = request.getfixturevalue("etcd_server")
        url = server.url(f"scenario/{uuid.uuid4().hex}")
        wrapper = through_etcd(url, calls)
        monkeypatch.setattr(request.module, "reconcile", wrapper)
        # the CLI imports reconcile from its module when a command runs (start-up)
        monkeypatch.setattr(reconciler.controller.reconcile, "reconcile", wrapper)
    yield kind
    if kind == "etcd" and not calls:
        pytest.fail("the [etcd] variant ran no reconcile through etcd: nothing was tested")
