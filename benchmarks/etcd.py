"""The etcd store at scale (issue 11, docs/etcd.md): what a unit costs in etcd.

.venv/bin/python -m benchmarks.etcd [--nodes 500] [--instances 2000] [--max-request-mib 64]

Starts its own etcd (Debian's etcd-server) on free loopback ports with a data dir in a temp
dir, ``--max-request-bytes`` as given and ``--max-txn-ops=20000`` (the URL tells the client
the same limits, by which it splits the staged documents), and prints:

- import of the synthetic inputs (``copy_unit`` from a state directory);
- cold ``reconcile --store``: leader key, snapshot into an empty working directory,
  ``reconcile``, the commit (staged transactions, then the final one), resign;
- the same with nothing changed (a fresh process's run on the same working directory);
- the same after one desired file is edited in etcd;
- ``watch --store``: a leader's first run, then one desired edit committed to etcd until the
  leader has committed its new outputs (three times);
- the unit's size in etcd: documents and bytes;
- beside each, the file store's ``reconcile`` of the same inputs, measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import platform
import queue
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from reconciler.controller.configs import default_config_builder
from reconciler.controller.ha import reconcile_via_store, store_watch_loop
from reconciler.controller.reconcile import ReconcileOptions, reconcile
from reconciler.controller.watch import WatchOptions
from reconciler.stores.base import FileStore, copy_unit
from reconciler.stores.etcd import EtcdStore

from .etcdserver import EtcdUnavailable, start_etcd
from .statedir import bump_instances, write_state_dir


def _timed(label: str, fn: Callable[[], object], floor: float | None = None) -> float:
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    extra = f"   (file store: {floor:6.2f} s)" if floor is not None else ""
    print(f"{label:<44} {dt:8.2f} s{extra}", flush=True)
    return dt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--instances", type=int, default=2000)
    parser.add_argument("--max-request-mib", type=int, default=64)
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {platform.python_implementation()} "
        f"{platform.python_version()}, {len(os.sched_getaffinity(0))} cores"
    )
    print(f"unit: {args.nodes} nodes x {args.instances} instances")
    with tempfile.TemporaryDirectory(prefix="bench-etcd-") as tmp_name:
        tmp = Path(tmp_name)
        source = tmp / "source"
        write_state_dir(source, args.nodes, args.instances)
        plain = tmp / "plain"
        shutil.copytree(source, plain)
        opts = ReconcileOptions(configs=default_config_builder())

        t0 = time.perf_counter()
        reconcile(plain, opts)
        file_cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        reconcile(plain, ReconcileOptions(configs=default_config_builder()))
        file_idle = time.perf_counter() - t0

        (tmp / "etcd").mkdir()
        limit = args.max_request_mib << 20
        try:
            server = start_etcd(
                tmp / "etcd",
                max_txn_ops=20000,
                max_request_bytes=limit,
                extra=["--quota-backend-bytes=8589934592"],
            )
        except EtcdUnavailable as e:
            raise SystemExit(str(e)) from None
        try:
            url = (
                server.url(f"bench/{uuid.uuid4().hex[:8]}")
                + f"?max-txn-ops=20000&max-request-bytes={limit}"
            )
            store = EtcdStore(url)
            work = tmp / "work"
            _timed("import (copy_unit into etcd)", lambda: copy_unit(FileStore(source), store))
            _timed(
                "cold reconcile --store",
                lambda: reconcile_via_store(store, work, opts),
                file_cold,
            )
            _timed(
                "reconcile --store, nothing changed",
                lambda: reconcile_via_store(
                    store, work, ReconcileOptions(configs=default_config_builder())
                ),
                file_idle,
            )
            edited = bump_instances(source, _first_service(source))
            rel = edited.relative_to(source).as_posix()
            store.commit({rel: edited.read_bytes()})
            _timed(
                "reconcile --store after one desired edit",
                lambda: reconcile_via_store(
                    store, work, ReconcileOptions(configs=default_config_builder())
                ),
            )
            _watch_edit(store, source, tmp / "leader", args)
            snap = store.snapshot()
            size = sum(len(e.data) for e in snap.entries.values())
            print(f"unit in etcd: {len(snap.entries)} documents, {size / 2**20:.1f} MiB")
        finally:
            server.stop()


def _watch_edit(store: EtcdStore, source: Path, workdir: Path, args: argparse.Namespace) -> None:
    """``watch --store``: a leader in a thread; one desired edit committed to etcd -> the
    leader's next commit (debounce 0 excluded: the edit is one event)."""
    runs: queue.Queue[float] = queue.Queue()
    stop = threading.Event()
    opts = ReconcileOptions(configs=default_config_builder())
    thread = threading.Thread(
        target=store_watch_loop,
        args=(store, workdir, opts, WatchOptions(debounce=0.0, resync=3600), stop),
        kwargs={"ttl": 10, "on_run": lambda _r: runs.put(time.perf_counter())},
        daemon=True,
    )
    t0 = time.perf_counter()
    thread.start()
    print(f"{'watch --store: became leader, first run':<44} {runs.get() - t0:8.2f} s", flush=True)
    for k in range(3):
        edited = bump_instances(source, _first_service(source), 1 if k % 2 == 0 else -1)
        t0 = time.perf_counter()
        store.commit({edited.relative_to(source).as_posix(): edited.read_bytes()})
        done = runs.get()
        print(
            f"{'watch --store: one desired edit -> committed':<44} {done - t0:8.2f} s", flush=True
        )
    stop.set()
    thread.join()


def _first_service(root: Path) -> str:
    first = sorted((root / "desired").glob("*.yaml"))[0]
    return first.stem


if __name__ == "__main__":
    main()
