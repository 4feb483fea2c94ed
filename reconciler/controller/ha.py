"""The controller and the agent on a remote store (issue 11, docs/etcd.md).

The controller's core runs unchanged in a local working directory (``--state``) that a
:class:`~reconciler.stores.base.Mirror` keeps equal to the store:

- :func:`reconcile_via_store` (``reconcile --store``): take the unit's leader key, resync the
  working directory from a snapshot, run :func:`~reconciler.controller.reconcile.reconcile`, publish
  ``out/`` and ``checkpoint/`` guarded by the leader key
  (:meth:`~reconciler.stores.base.Mirror.push`:
  the checkpoint with its plans in one final transaction), resign.
- :func:`store_watch_loop` (``watch --store``): any number of replicas campaign for the leader
  key; the leader resyncs, reconciles, then follows watch events (debounced) and reconciles on
  every input change, resyncing from a snapshot after a compaction, a dropped watch or every
  ``resync`` seconds. A leader that loses its lease stops at once (and its late commit, if any,
  is refused by the guard); a replica whose leader died takes over once the lease expires.
- :func:`run_agent_via_store` / :func:`agent_watch_store`: the agent reads its plan from the
  store and publishes ``actual/<node>.yaml`` guarded by the revision it read, so a stale write
  (another writer changed it meanwhile) is refused by the transaction.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import queue
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from reconciler.agent.node import (
    AGENT_RUN_ERRORS,
    AgentError,
    AgentReport,
    instances_added,
    instances_listed,
    run_agent_logged,
    run_agent_once,
)
from reconciler.agent.runc import ContainerRuntime
from reconciler.controller.network_files import NETWORK_FILE
from reconciler.controller.reconcile import (
    ReconcileCache,
    ReconcileError,
    ReconcileOptions,
    ReconcileReport,
    reconcile,
)
from reconciler.controller.watch import WatchOptions, run_logged, summary
from reconciler.io.loader import StateView
from reconciler.io.signals import stop_on_signals
from reconciler.model.values import validate_id
from reconciler.stores.base import (
    CONTROLLER_OWNED,
    Change,
    LeaderGuard,
    Mirror,
    RevisionGuard,
    Snapshot,
    StaleWrite,
    StoreError,
    is_input_path,
    under,
)
from reconciler.stores.etcd import EtcdStore, Leadership

__all__ = [
    "EventFeed",
    "agent_watch_store",
    "default_identity",
    "reconcile_via_store",
    "run_agent_via_store",
    "store_watch_loop",
]

log = logging.getLogger("reconciler.ha")

controller_owned = under(*CONTROLLER_OWNED)
controller_staged = under("out/instances", "checkpoint/last-good")
"""What may reach the store before the final commit of a run: the OCI configs (no plan names a
new one before the final commit) and the last good inputs (recorded first, as the file store
does: SPEC §5). The checkpoint, the node patches, status and plan, and every deletion, are one
transaction."""


def default_identity() -> str:
    """host/pid/random: unique per process, readable in ``etcdctl get <prefix>/.leader``."""
    return f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"


WATCH_IDLE = WatchOptions.stream_idle
"""Seconds a watch stream may stay silent before it is opened again from the last revision
seen. Long on purpose: etcd may need a while to send the first byte of a large replay (a
watch that starts behind a leader's own commits of a big unit), and a stream re-opened from
the same revision before that would replay it again, forever. A closed connection ends the
stream at once; the feed's thread is a daemon, so a silent stream delays nothing."""


INPUT_SCOPES = ("actual/", "desired/", "nodes/", "resources/", "unit.yaml")
"""What a leader watches: the inputs. Its own commits (out/, checkpoint/: only the leader writes
them, fenced) would come back as events as large as the commits themselves."""


class EventFeed:
    """Watch events of a store on threads (one per scope: the whole unit, a document, or a
    directory ending in ``/``), handed over through one queue: the consumer waits with its own
    timeout (the debounce), and a dropped stream is re-watched from the last revision it saw.
    A compaction or store error is handed over as the exception, and ends the feed. Events of
    one document keep their order (each document is in one scope)."""

    def __init__(
        self,
        store: EtcdStore,
        start_revision: int,
        scope: str | None = None,
        idle: float = WATCH_IDLE,
        *,
        scopes: tuple[str, ...] | None = None,
    ) -> None:
        self._queue: queue.Queue[list[Change] | StoreError] = queue.Queue()
        self._closed = threading.Event()
        for one in scopes if scopes is not None else (scope,):
            threading.Thread(
                target=self._run,
                args=(store, start_revision, one, idle),
                name="reconciler-watch",
                daemon=True,
            ).start()

    def _run(self, store: EtcdStore, revision: int, scope: str | None, idle: float) -> None:
        while not self._closed.is_set():
            try:
                for batch in store.watch(revision, idle=idle, scope=scope):
                    self._queue.put(batch)
                    revision = max(revision, max(c.mod_revision for c in batch) + 1)
                    if self._closed.is_set():
                        return
            except StoreError as e:
                self._queue.put(e)
                return

    def get(self, timeout: float) -> list[Change] | None:
        """The next batch, or None after ``timeout`` seconds; raises what the watch raised."""
        try:
            item = self._queue.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None
        if isinstance(item, StoreError):
            raise item
        return item

    def close(self) -> None:
        self._closed.set()


def _lead_or_fail(store: EtcdStore, identity: str, ttl: int, wait: float | None) -> Leadership:
    stop = threading.Event()
    if wait is None:
        lead = store.try_lead(identity, ttl)
    else:
        timer = threading.Timer(wait, stop.set)
        timer.start()
        try:
            lead = store.campaign(identity, ttl, stop)
        finally:
            timer.cancel()
    if lead is None:
        holder = store.leader() or "another controller"
        raise ReconcileError(f"{holder} leads {store.url}; not reconciling (a single writer)")
    return lead


def reconcile_via_store(
    store: EtcdStore,
    workdir: Path,
    opts: ReconcileOptions | None = None,
    *,
    identity: str | None = None,
    ttl: int = 10,
    wait: float | None = None,
) -> ReconcileReport:
    """One reconcile of the unit in ``store`` (see the module docstring). ``wait``: how long
    to wait for a running leader to go (None: fail at once). Raises
    :class:`~reconciler.controller.reconcile.ReconcileError` or
    :class:`~reconciler.stores.base.StoreError`."""
    identity = identity or default_identity()
    lead = _lead_or_fail(store, identity, ttl, wait)
    try:
        mirror = Mirror(store, workdir)
        mirror.resync()
        report = reconcile(workdir, opts)
        if lead.lost.is_set():
            raise ReconcileError(
                f"lost the leader lease of {store.url} during the run; nothing committed"
            )
        try:
            committed = mirror.push(controller_owned, [LeaderGuard(identity)], controller_staged)
        except StaleWrite as e:
            raise ReconcileError(str(e)) from None
        log.info("committed %d document(s) to %s", committed, store.url)
        return report
    finally:
        lead.resign(store)


def store_watch_loop(
    store: EtcdStore,
    workdir: Path,
    opts: ReconcileOptions,
    wopts: WatchOptions | None = None,
    stop: threading.Event | None = None,
    *,
    ttl: int = 10,
    identity: str | None = None,
    on_run: Callable[[ReconcileReport | None], None] | None = None,
) -> int:
    """``watch --store``: campaign, lead, stand by again after losing the lease; until ``stop``
    is set (SIGTERM and SIGINT set it when run from the main thread)."""
    wopts = wopts or WatchOptions()
    stop = stop or threading.Event()
    stop_on_signals(stop, log)
    identity = identity or default_identity()
    log.info("controller %s campaigning for %s (lease %d s)", identity, store.url, ttl)
    while not stop.is_set():
        lead = store.campaign(identity, ttl, stop)
        if lead is None:
            break
        log.info("controller %s leads %s", identity, store.url)
        try:
            # each leadership starts afresh: another leader may have written meanwhile
            fresh = dataclasses.replace(opts, cache=ReconcileCache())
            _lead(store, Mirror(store, workdir), fresh, wopts, stop, lead, on_run)
        except (StoreError, OSError) as e:  # etcd unreachable, the working directory unwritable
            log.error("leading %s failed: %s; campaigning again", store.url, e)
            stop.wait(1.0)
        finally:
            lead.resign(store)
        if not stop.is_set():
            log.info("controller %s stands by", identity)
    log.info("stopped")
    return 0


def _lead(
    store: EtcdStore,
    mirror: Mirror,
    opts: ReconcileOptions,
    wopts: WatchOptions,
    stop: threading.Event,
    lead: Leadership,
    on_run: Callable[[ReconcileReport | None], None] | None,
) -> None:
    guard = [LeaderGuard(lead.identity)]
    last_view: list[StateView] = []

    def run(reason: str, *, full_collect: bool = True) -> None:
        """``full_collect``: see :func:`watch.run_logged` (False for an event's run)."""
        t0 = time.monotonic()
        report = run_logged(
            mirror.workdir, opts, last_view, reason, on_run, full_collect=full_collect
        )
        if report is None:
            return
        if lead.lost.is_set():
            return  # not committed: the next leader recomputes it from the store
        try:
            committed = mirror.push(controller_owned, guard, controller_staged)
        except StaleWrite as e:
            log.error("%s", e)
            lead.lost.set()
            return
        for d in report.computed.diagnostics:
            log.warning("%s", d)
        log.info(
            "%s; %d document(s) committed (%s)",
            summary(report, time.monotonic() - t0),
            committed,
            reason,
        )
        if on_run is not None:
            on_run(report)

    mirror.resync()
    # the inputs, from the snapshot on: what changes while the first run computes is not missed
    feed = EventFeed(store, mirror.synced + 1, idle=wopts.stream_idle, scopes=INPUT_SCOPES)
    run("became leader")
    last = time.monotonic()
    try:
        while not stop.is_set() and not lead.lost.is_set():
            changed: set[str] = set()
            first = 0.0
            reason = ""
            try:
                # gather events until DEBOUNCE of quiet (at most MAX_BATCH in all)
                while not stop.is_set() and not lead.lost.is_set():
                    wait = wopts.debounce if changed else min(1.0, wopts.resync)
                    batch = feed.get(wait)
                    if batch is None:
                        break
                    now = {r for r in mirror.apply(batch) if is_input_path(r)}
                    if now and not changed:
                        first = time.monotonic()
                    changed |= now
                    if changed and time.monotonic() - first >= wopts.max_batch:
                        break
            except StoreError as e:
                log.warning("%s; resyncing from a snapshot", e)
                feed.close()
                changed = {r for r in mirror.resync() if is_input_path(r)} or {"(resync)"}
                reason = "resync after a lost watch"
                feed = EventFeed(
                    store, mirror.synced + 1, idle=wopts.stream_idle, scopes=INPUT_SCOPES
                )
            if stop.is_set() or lead.lost.is_set():
                break
            if changed:
                names = sorted({Path(r).name for r in changed})
                more = f" and {len(names) - 5} more" if len(names) > 5 else ""
                # an event's run collects what it allocated; a resync's, everything
                run(reason or f"changed: {', '.join(names[:5])}{more}", full_collect=bool(reason))
                last = time.monotonic()
            elif time.monotonic() - last >= wopts.resync:
                mirror.resync()
                run("periodic resync")
                last = time.monotonic()
    finally:
        feed.close()
    if lead.lost.is_set():
        log.error("lost the leadership of %s", store.url)


# ---------------------------------------------------------------- the agent


def run_agent_via_store(
    store: EtcdStore,
    workdir: Path,
    node_id: str,
    runc: ContainerRuntime,
    *,
    stop_timeout: float = 10.0,
    log_dir: Path | None = None,
    mirror: Mirror | None = None,
    uplink: str | None = None,
) -> AgentReport:
    """The agent once, on a unit in a store: resync, apply the node's plan, publish
    ``actual/<node>.yaml`` only if nobody changed it since it was read. Raises
    :class:`~reconciler.agent.node.AgentError` (a refused stale write included)."""
    validate_id(node_id, "node id")
    rel = f"actual/{node_id}.yaml"
    mirror = mirror or Mirror(store, workdir)
    _sync_node(store, mirror, node_id)
    seen = mirror.known[rel].mod_revision if rel in mirror.known else 0
    report = run_agent_once(
        workdir, node_id, runc, stop_timeout=stop_timeout, log_dir=log_dir, uplink=uplink
    )
    if report.written:
        try:
            mirror.push(under(rel), [RevisionGuard(rel, seen)])
        except StaleWrite as e:
            raise AgentError(f"{e} (the next run reads the new version)") from None
    return report


NETWORK_REL = f"out/{NETWORK_FILE}"  # the unit's networks, which every agent reads


def _sync_node(store: EtcdStore, mirror: Mirror, node_id: str) -> None:
    """Bring into the agent's working directory what its run reads, and nothing else: the
    node's patch, its actual document, the unit's networks (``out/network.json``: subnets,
    VLAN ids, the DNS table the agent wires) and the bundles of the instances the patch adds
    or the document lists (a restart needs them), all read at one revision (the rest of the
    unit may be large, and is other nodes' business)."""
    patch_rel, actual_rel = f"out/nodes/{node_id}.json", f"actual/{node_id}.yaml"
    first = store.snapshot([patch_rel, actual_rel, NETWORK_REL])
    wanted: set[str] = set()
    if patch_rel in first.entries:
        with contextlib.suppress(AgentError):  # the agent's run refuses it and says why
            wanted.update(instances_added(first.entries[patch_rel].data, patch_rel))
    if actual_rel in first.entries:  # what runs there may need a restart from its bundle
        with contextlib.suppress(AgentError):
            wanted.update(instances_listed(first.entries[actual_rel].data, actual_rel))
    bundles = store.snapshot(
        [f"out/instances/{i}/" for i in sorted(wanted)], revision=first.revision
    )
    snap = Snapshot(first.revision, {**first.entries, **bundles.entries})
    mirror.resync(snap, managed=under(patch_rel, actual_rel, NETWORK_REL, "out/instances"))


def agent_watch_store(
    store: EtcdStore,
    workdir: Path,
    node_id: str,
    runc: ContainerRuntime,
    stop: threading.Event,
    resync: float = 30.0,
    *,
    stop_timeout: float = 10.0,
    log_dir: Path | None = None,
    on_run: Callable[[AgentReport | None], None] | None = None,
    uplink: str | None = None,
) -> None:
    """``agent --watch --store``: run now, on every change of the node's plan in the store and
    every ``resync`` seconds, until ``stop`` is set."""
    validate_id(node_id, "node id")
    stop_on_signals(stop, log)
    plan_rel = f"out/nodes/{node_id}.json"
    mirror = Mirror(store, workdir)

    def once() -> AgentReport:
        return run_agent_via_store(
            store,
            workdir,
            node_id,
            runc,
            stop_timeout=stop_timeout,
            log_dir=log_dir,
            mirror=mirror,
            uplink=uplink,
        )

    def run(reason: str) -> None:
        run_agent_logged(node_id, reason, once, on_run, (*AGENT_RUN_ERRORS, StoreError))

    log.info("%s: agent watching %s (resync every %.0f s)", node_id, store.url, resync)
    run("start")
    last = time.monotonic()
    # the node's plan only (not every commit of the unit); events since the run's snapshot
    feed = EventFeed(store, mirror.synced + 1, scope=plan_rel)
    try:
        while not stop.is_set():
            try:
                batch = feed.get(min(1.0, resync))
            except StoreError as e:
                log.warning("%s: %s; resyncing", node_id, e)
                run("resync after a lost watch")
                feed = EventFeed(store, mirror.synced + 1, scope=plan_rel)
                last = time.monotonic()
                continue
            if batch is not None and any(c.rel == plan_rel for c in batch):
                run("plan changed")
                last = time.monotonic()
            elif time.monotonic() - last >= resync:
                run("periodic resync")
                last = time.monotonic()
    finally:
        feed.close()
    log.info("%s: agent stopped", node_id)
