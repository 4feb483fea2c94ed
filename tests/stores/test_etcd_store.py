"""The etcd v3 state store (issue 11, docs/etcd.md) against a real etcd on loopback.

Each test has a key prefix of its own (the ``etcd_url`` fixture), so the session's one server
never lets tests see each other's keys. Expected documents, revisions and counts are worked out
from what each test committed, never read back from the code under test.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.agent.node import AgentError, container_id
from reconciler.agent.runc import ContainerState
from reconciler.cli.commands import main
from reconciler.controller import watch as watch_module
from reconciler.controller.configs import default_config_builder
from reconciler.controller.ha import (
    EventFeed,
    reconcile_via_store,
    run_agent_via_store,
    store_watch_loop,
)
from reconciler.controller.reconcile import (
    ReconcileError,
    ReconcileOptions,
    ReconcileReport,
    reconcile,
)
from reconciler.controller.watch import WatchOptions
from reconciler.stores.base import (
    Change,
    FileStore,
    LeaderGuard,
    Mirror,
    RevisionGuard,
    Snapshot,
    StaleWrite,
    StoreError,
    copy_unit,
    scan_unit,
    split_commit,
    under,
)
from reconciler.stores.etcd import Compacted, EtcdStore, Leadership
from tests.support.etcd import EtcdServer
from tests.support.fake_runc import FakeRunc
from tests.support.paths import ROOT

VEHICLE = ROOT / "examples" / "vehicle"

# examples/vehicle places one instance on the head unit, com.example.hmi #0 (SPEC §4: uuid5 in
# the OID namespace of "<itemId>:<subjectId>:<index>"), computed here independently; the CAN
# bridge goes to the gateway
HMI = str(uuid.uuid5(uuid.NAMESPACE_OID, "com.example.hmi:default:0"))
HEADUNIT = "headunit"
ACTUAL = f"actual/{HEADUNIT}.yaml"
ACTUAL1 = "actual/n1.yaml"


# ---------------------------------------------------------------- helpers


@pytest.fixture
def store(etcd_url: str) -> EtcdStore:
    return EtcdStore(etcd_url)


def documents(snap: Snapshot) -> dict[str, bytes]:
    return {rel: e.data for rel, e in snap.entries.items()}


def files_under(root: Path) -> set[str]:
    """Every regular file under ``root`` (hidden ones included), as relative paths."""
    return {
        (Path(d) / f).relative_to(root).as_posix()
        for d, _, names in os.walk(root)
        for f in names
        if not f.startswith(".lock")
    }


def copy_inputs(source: Path, target: Path) -> Path:
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("out", "checkpoint", ".lock"))
    return target


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.05)


def gather(feed: EventFeed, count: int, timeout: float) -> list[Change]:
    """At least ``count`` changes from ``feed``, or what arrived before ``timeout``."""
    got: list[Change] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        batch = feed.get(deadline - time.monotonic())
        if batch is not None:
            got += batch
    return got


def all_changes(store: EtcdStore, start: int) -> list[Change]:
    return [c for batch in store.watch(start, idle=0.5) for c in batch]


def options() -> ReconcileOptions:
    # one clock for every run: two runs compared file by file write the same status page (it
    # says when it was made, to the second)
    return ReconcileOptions(configs=default_config_builder(), clock=lambda: 1_790_000_000.0)


def actual_doc(node: str, revision: int) -> bytes:
    """Another writer's valid actual document (nothing running)."""
    doc = {
        "apiVersion": "reconciler/v1",
        "kind": "ActualState",
        "nodeId": node,
        "revision": revision,
        "instances": {},
    }
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


# ---------------------------------------------------------------- round trip


class TestRoundTrip:
    def test_a_commit_is_read_back_exactly_at_its_revision(self, store: EtcdStore) -> None:
        puts = {
            "unit.yaml": b"kind: UnitConfig\n",
            "desired/web.yaml": b"id: web\n",
            "desired/apps/deep/db.yaml": b"id: db\n",
            "actual/n1.yaml": b"",  # an empty document stays one
            "out/plan.json": b"{}\n",
            "checkpoint/blob": bytes(range(256)),  # not text: bytes round trip as they are
        }
        rev = store.commit(puts)
        snap = store.snapshot()
        assert snap.revision == rev
        assert documents(snap) == puts
        assert {e.mod_revision for e in snap.entries.values()} == {rev}

        rev2 = store.commit(
            {"desired/web.yaml": b"id: web\nversion: 2\n"},
            deletes=["desired/apps/deep/db.yaml", "out/plan.json"],
        )
        assert rev2 == rev + 1  # one transaction: one revision for all three changes
        snap = store.snapshot()
        assert documents(snap) == {
            "unit.yaml": b"kind: UnitConfig\n",
            "desired/web.yaml": b"id: web\nversion: 2\n",
            "actual/n1.yaml": b"",
            "checkpoint/blob": bytes(range(256)),
        }
        revs = {rel: e.mod_revision for rel, e in snap.entries.items()}
        assert revs == {
            "unit.yaml": rev,
            "desired/web.yaml": rev2,
            "actual/n1.yaml": rev,
            "checkpoint/blob": rev,
        }

    @pytest.mark.parametrize(
        "bad",
        [
            ".leader",
            "out/instances/.manifest.json",
            "desired/.web.yaml.swp",
            "random/file.yaml",
            "notes.txt",
            "desired",
            "desired//web.yaml",
            "/desired/web.yaml",
            "desired/../unit.yaml",
        ],
    )
    def test_a_path_that_is_not_a_document_is_refused_and_nothing_written(
        self, store: EtcdStore, bad: str
    ) -> None:
        with pytest.raises(StoreError, match="is not a path of a unit's document"):
            store.commit({"desired/ok.yaml": b"ok\n", bad: b"x"})
        assert store.snapshot().entries == {}

    @pytest.mark.parametrize("bad", [".leader", "out/instances/.manifest.json", "random/x"])
    def test_a_delete_of_a_path_that_is_not_a_document_is_refused(
        self, store: EtcdStore, bad: str
    ) -> None:
        lead = store.try_lead("ctl-a", 5)
        assert lead is not None
        try:
            if bad != ".leader":
                store.client.put(store.key(bad), "kept")
            store.commit({"desired/ok.yaml": b"ok\n"})
            with pytest.raises(StoreError, match="is not a path of a unit's document"):
                store.commit({"desired/ok.yaml": b"changed\n"}, deletes=[bad])
            assert store.client.get(store.key(bad)) == [b"ctl-a" if bad == ".leader" else b"kept"]
            assert store.leader() == "ctl-a"
            assert documents(store.snapshot()) == {"desired/ok.yaml": b"ok\n"}
        finally:
            lead.resign(store)

    def test_keys_that_are_not_documents_never_appear_in_snapshots_or_exports(
        self, store: EtcdStore, tmp_path: Path
    ) -> None:
        lead = store.try_lead("ctl-a", 5)  # <prefix>/.leader
        assert lead is not None
        try:
            for rel in ("out/instances/.manifest.json", "desired/.web.yaml.swp", "random/x"):
                store.client.put(store.key(rel), "not a document")
            store.commit({"desired/web.yaml": b"id: web\n"})
            assert documents(store.snapshot()) == {"desired/web.yaml": b"id: web\n"}

            exported = tmp_path / "exported"
            assert copy_unit(store, FileStore(exported)) == (1, 0)
            assert files_under(exported) == {"desired/web.yaml"}
        finally:
            lead.resign(store)

    def test_units_under_neighbouring_prefixes_are_separate(self, etcd_server: EtcdServer) -> None:
        base = f"test/{uuid.uuid4().hex}"
        a, ab = EtcdStore(etcd_server.url(f"{base}/a")), EtcdStore(etcd_server.url(f"{base}/ab"))
        a.commit({"desired/x.yaml": b"a\n"})
        ab.commit({"desired/y.yaml": b"ab\n"})
        assert documents(a.snapshot()) == {"desired/x.yaml": b"a\n"}
        assert documents(ab.snapshot()) == {"desired/y.yaml": b"ab\n"}


# ---------------------------------------------------------------- atomicity and guards


class TestGuards:
    def test_a_failed_revision_guard_writes_none_of_the_commit(self, store: EtcdStore) -> None:
        r1 = store.commit({"desired/a.yaml": b"a1\n", "desired/b.yaml": b"b1\n"})
        r2 = store.commit({"desired/a.yaml": b"a2\n"})  # another writer, after our read at r1
        with pytest.raises(StaleWrite) as caught:
            store.commit(
                {"desired/a.yaml": b"a3\n", "desired/c.yaml": b"c\n"},
                deletes=["desired/b.yaml"],
                guards=[RevisionGuard("desired/a.yaml", r1)],
            )
        message = str(caught.value)
        assert "desired/a.yaml changed in the store" in message
        assert f"revision {r1}, now {r2}" in message
        assert "nothing was written" in message
        snap = store.snapshot()
        assert snap.revision == r2
        assert documents(snap) == {"desired/a.yaml": b"a2\n", "desired/b.yaml": b"b1\n"}
        assert snap.entries["desired/b.yaml"].mod_revision == r1

    def test_a_guard_on_a_document_deleted_since_says_so(self, store: EtcdStore) -> None:
        r1 = store.commit({"actual/n1.yaml": b"x\n"})
        store.commit({}, deletes=["actual/n1.yaml"])
        with pytest.raises(StaleWrite, match=rf"actual/n1\.yaml .*revision {r1}, now deleted"):
            store.commit({"actual/n1.yaml": b"y\n"}, guards=[RevisionGuard("actual/n1.yaml", r1)])
        assert store.snapshot().entries == {}

    def test_a_holding_revision_guard_commits(self, store: EtcdStore) -> None:
        r1 = store.commit({"actual/n1.yaml": b"x\n"})
        r2 = store.commit({"actual/n1.yaml": b"y\n"}, guards=[RevisionGuard("actual/n1.yaml", r1)])
        assert r2 == r1 + 1
        assert store.snapshot().entries["actual/n1.yaml"].data == b"y\n"

    def test_revision_zero_means_the_document_must_not_exist(self, store: EtcdStore) -> None:
        must_not_exist = [RevisionGuard("actual/n1.yaml", 0)]
        r1 = store.commit({"actual/n1.yaml": b"first\n"}, guards=must_not_exist)
        with pytest.raises(StaleWrite, match=rf"actual/n1\.yaml .*revision 0, now {r1}"):
            store.commit({"actual/n1.yaml": b"second\n"}, guards=must_not_exist)
        assert documents(store.snapshot()) == {"actual/n1.yaml": b"first\n"}

    def test_a_leader_guard_fences_a_controller_that_does_not_lead(self, store: EtcdStore) -> None:
        with pytest.raises(StaleWrite, match=r"\(ctl-a\) does not lead \(leader: none\)"):
            store.commit({"out/plan.json": b"{}\n"}, guards=[LeaderGuard("ctl-a")])
        lead = store.try_lead("ctl-a", 5)
        assert lead is not None
        try:
            with pytest.raises(StaleWrite, match=r"\(ctl-b\) does not lead \(leader: ctl-a\)"):
                store.commit({"out/plan.json": b"{}\n"}, guards=[LeaderGuard("ctl-b")])
            assert store.snapshot().entries == {}
            store.commit({"out/plan.json": b"{}\n"}, guards=[LeaderGuard("ctl-a")])
            assert documents(store.snapshot()) == {"out/plan.json": b"{}\n"}
        finally:
            lead.resign(store)

    def test_every_guard_must_hold(self, store: EtcdStore) -> None:
        r1 = store.commit({"actual/n1.yaml": b"x\n"})
        store.commit({"actual/n1.yaml": b"y\n"})
        lead = store.try_lead("ctl-a", 5)
        assert lead is not None
        try:
            with pytest.raises(StaleWrite, match=r"actual/n1\.yaml changed") as caught:
                store.commit(
                    {"out/plan.json": b"{}\n"},
                    guards=[LeaderGuard("ctl-a"), RevisionGuard("actual/n1.yaml", r1)],
                )
            assert "does not lead" not in str(caught.value)  # the holding guard is not blamed
            assert "out/plan.json" not in store.snapshot().entries
        finally:
            lead.resign(store)


# ---------------------------------------------------------------- the agent's stale write


class InterferingRunc(FakeRunc):
    """A fake runtime during whose first ``state`` call another writer changes the store."""

    def __init__(self, interfere: Callable[[], None]) -> None:
        super().__init__()
        self.interfere: Callable[[], None] | None = interfere

    def state(self, container_id: str) -> ContainerState | None:
        if self.interfere is not None:
            interfere, self.interfere = self.interfere, None
            interfere()
        return super().state(container_id)


@pytest.fixture
def planned(store: EtcdStore, tmp_path: Path) -> EtcdStore:
    """examples/vehicle in etcd, reconciled: the head unit's plan starts HMI."""
    copy_unit(FileStore(VEHICLE), store)
    report = reconcile_via_store(store, tmp_path / "controller", options(), ttl=2)
    actions = [(a.action, a.node_id, a.instance_id) for a in report.plan.actions]
    assert [a for a in actions if a[1] == HEADUNIT] == [("start", HEADUNIT, HMI)]
    assert ACTUAL not in store.snapshot().entries
    return store


class TestAgentViaStore:
    def test_the_agents_actual_document_lands_in_the_store(
        self, planned: EtcdStore, tmp_path: Path
    ) -> None:
        runc = FakeRunc()
        report = run_agent_via_store(planned, tmp_path / "agent", HEADUNIT, runc)
        assert report.started == (HMI,) and report.written
        assert runc.actions() == [("run", container_id(HEADUNIT, HMI))]
        snap = planned.snapshot()
        entry = snap.entries[ACTUAL]
        doc = json.loads(entry.data)
        assert doc["revision"] == 1  # no document before: revision 0, plus one
        assert doc["nodeId"] == HEADUNIT
        assert {i: r["state"] for i, r in doc["instances"].items()} == {HMI: "active"}
        assert entry.mod_revision == snap.revision  # the last thing written to the store
        assert entry.data == (tmp_path / "agent" / ACTUAL).read_bytes()

    def test_the_agent_gets_the_units_networks_and_loses_them_with_the_store(
        self, planned: EtcdStore, tmp_path: Path
    ) -> None:
        # out/network.json holds the subnets, VLAN ids and DNS table the agent wires (the
        # vehicle example has no network section: the controller's document is stood in for)
        networks = b'{"dns": {}, "networks": {"default": {"subnet": "172.17.0.0/16"}}}\n'
        planned.commit({"out/network.json": networks})
        workdir = tmp_path / "agent"
        run_agent_via_store(planned, workdir, HEADUNIT, FakeRunc())
        assert (workdir / "out" / "network.json").read_bytes() == networks
        # another node's patch is not the agent's business
        assert not (workdir / "out" / "nodes" / "gateway.json").exists()
        planned.commit({}, deletes=["out/network.json"])
        run_agent_via_store(planned, workdir, HEADUNIT, FakeRunc())
        assert not (workdir / "out" / "network.json").exists()

    def test_a_stale_first_write_is_rejected_by_the_transaction(
        self, planned: EtcdStore, tmp_path: Path
    ) -> None:
        theirs = actual_doc(HEADUNIT, 7)

        def other_writer() -> None:
            planned.commit({ACTUAL: theirs})

        runc = InterferingRunc(other_writer)
        with pytest.raises(AgentError, match=rf"{ACTUAL} changed in the store .*revision 0, now"):
            run_agent_via_store(planned, tmp_path / "agent", HEADUNIT, runc)
        assert runc.interfere is None  # the other writer did write in between
        assert planned.snapshot().entries[ACTUAL].data == theirs

        # the next run reads the other writer's version: the plan (from revision 0) is stale
        again = run_agent_via_store(planned, tmp_path / "agent", HEADUNIT, FakeRunc())
        assert again.stale and not again.written
        assert planned.snapshot().entries[ACTUAL].data == theirs

    @staticmethod
    def container_died(planned: EtcdStore, tmp_path: Path) -> FakeRunc:
        """The agent started HMI (actual at revision 1), the controller planned from it, then
        HMI's container stopped: the agent's next run has a change to write."""
        runc = FakeRunc()
        assert run_agent_via_store(planned, tmp_path / "agent", HEADUNIT, runc).written
        reconcile_via_store(planned, tmp_path / "controller", options(), ttl=2)
        runc.containers[container_id(HEADUNIT, HMI)].status = "stopped"
        return runc

    def test_an_update_of_an_existing_document_lands_in_the_store(
        self, planned: EtcdStore, tmp_path: Path
    ) -> None:
        runc = self.container_died(planned, tmp_path)
        read_at = planned.snapshot().entries[ACTUAL].mod_revision
        report = run_agent_via_store(planned, tmp_path / "agent", HEADUNIT, runc)
        assert report.written and report.revision == 2
        snap = planned.snapshot()
        entry = snap.entries[ACTUAL]
        doc = json.loads(entry.data)
        assert doc["revision"] == 2
        # restarted from its bundle, which the working copy holds though no plan adds it now
        assert report.restarted == (HMI,) and doc["instances"][HMI]["state"] == "active"
        assert doc["instances"][HMI]["restartCount"] == 1
        assert read_at < entry.mod_revision == snap.revision

    def test_a_stale_update_of_an_existing_document_is_rejected(
        self, planned: EtcdStore, tmp_path: Path
    ) -> None:
        died = self.container_died(planned, tmp_path)
        read_at = planned.snapshot().entries[ACTUAL].mod_revision
        theirs = actual_doc(HEADUNIT, 9)
        written_at: list[int] = []
        runc = InterferingRunc(lambda: written_at.append(planned.commit({ACTUAL: theirs})))
        runc.containers = died.containers
        with pytest.raises(AgentError, match=rf"{ACTUAL} changed in the store") as caught:
            run_agent_via_store(planned, tmp_path / "agent", HEADUNIT, runc)
        assert f"revision {read_at}, now {written_at[0]}" in str(caught.value)
        entry = planned.snapshot().entries[ACTUAL]
        assert entry.data == theirs and entry.mod_revision == written_at[0]


# ---------------------------------------------------------------- watch and the mirror


class TestWatch:
    def test_events_arrive_in_order_from_the_start_revision(self, store: EtcdStore) -> None:
        r1 = store.commit({"desired/a.yaml": b"1\n"})
        lead = store.try_lead("ctl-a", 5)  # the leader key's events are not documents
        assert lead is not None
        lead.resign(store)
        r2 = store.commit({"desired/a.yaml": b"2\n", "desired/b.yaml": b"1\n"})
        r3 = store.commit({}, deletes=["desired/a.yaml"])
        assert r1 < r2 < r3
        expected = [
            Change("desired/a.yaml", b"1\n", r1),
            Change("desired/a.yaml", b"2\n", r2),
            Change("desired/b.yaml", b"1\n", r2),
            Change("desired/a.yaml", None, r3),
        ]
        assert all_changes(store, r1) == expected
        assert all_changes(store, r1 + 1) == expected[1:]
        assert all_changes(store, r3) == expected[3:]
        assert all_changes(store, r3 + 1) == []

    def test_a_start_revision_older_than_a_compaction_raises_compacted(
        self, store: EtcdStore, etcd_server: EtcdServer
    ) -> None:
        r1 = store.commit({"desired/a.yaml": b"1\n"})
        store.commit({"desired/a.yaml": b"2\n"})
        r3 = store.commit({"desired/a.yaml": b"3\n"})
        etcd_server.compact(r3)
        t0 = time.monotonic()
        with pytest.raises(Compacted, match=f"events from revision {r1} were compacted"):
            list(store.watch(r1, idle=5.0))
        assert time.monotonic() - t0 < 2.5  # told at once, not when the stream goes idle
        assert all_changes(store, r3) == [Change("desired/a.yaml", b"3\n", r3)]

    def test_resync_makes_a_diverged_workdir_equal_to_the_store(
        self, store: EtcdStore, tmp_path: Path
    ) -> None:
        store.commit(
            {
                "unit.yaml": b"unit\n",
                "desired/a.yaml": b"a\n",
                "desired/apps/b.yaml": b"b\n",
                "actual/n1.yaml": b"n1\n",
            }
        )
        work = tmp_path / "work"
        mirror = Mirror(store, work)
        assert mirror.resync() == {"unit.yaml", "desired/a.yaml", "desired/apps/b.yaml", ACTUAL1}
        assert scan_unit(work) == documents(store.snapshot())

        (work / "desired" / "a.yaml").write_bytes(b"edited locally\n")
        (work / "desired" / "apps" / "b.yaml").unlink()
        (work / "desired" / "extra.yaml").write_bytes(b"extra\n")
        (work / "out").mkdir()
        (work / "out" / "stray.json").write_bytes(b"{}\n")
        (work / "desired" / ".a.yaml.swp").write_bytes(b"an editor's\n")  # not a document
        store.commit({ACTUAL1: b"n1 changed\n"})  # the store moved on meanwhile

        changed = mirror.resync()
        assert changed == {
            "desired/a.yaml",
            "desired/apps/b.yaml",
            "desired/extra.yaml",
            "out/stray.json",
            ACTUAL1,
        }
        snap = store.snapshot()
        assert (
            scan_unit(work)
            == documents(snap)
            == {
                "unit.yaml": b"unit\n",
                "desired/a.yaml": b"a\n",
                "desired/apps/b.yaml": b"b\n",
                ACTUAL1: b"n1 changed\n",
            }
        )
        assert not (work / "desired" / "extra.yaml").exists()
        assert (work / "desired" / ".a.yaml.swp").read_bytes() == b"an editor's\n"
        assert mirror.synced == mirror.revision == snap.revision
        assert mirror.resync() == set()

    def test_applying_watch_events_keeps_the_workdir_equal_to_the_store(
        self, store: EtcdStore, tmp_path: Path
    ) -> None:
        store.commit({"unit.yaml": b"unit\n", "desired/a.yaml": b"a\n"})
        whole, one_by_one = Mirror(store, tmp_path / "w1"), Mirror(store, tmp_path / "w2")
        whole.resync()
        one_by_one.resync()
        store.commit({"desired/apps/deep/x.yaml": b"x\n", "nodes/n1.yaml": b"n1\n"})
        store.commit({"desired/a.yaml": b"a2\n"})
        store.commit({"desired/a.yaml": b"a3\n", "nodes/n1.yaml": b"n1\n"})  # n1: same bytes
        store.commit({"out/plan.json": b"{}\n"}, deletes=["desired/apps/deep/x.yaml"])
        last = store.commit({}, deletes=["unit.yaml"])
        expected = {
            "desired/a.yaml": b"a3\n",
            "nodes/n1.yaml": b"n1\n",
            "out/plan.json": b"{}\n",
        }
        assert documents(store.snapshot()) == expected
        events = all_changes(store, whole.synced + 1)
        assert len(events) == 8

        # as one batch: x.yaml came and went, so it never changed in the working directory
        assert whole.apply(events) == {
            "nodes/n1.yaml",
            "desired/a.yaml",
            "out/plan.json",
            "unit.yaml",
        }
        # event by event: each step is written
        changed: set[str] = set()
        for event in events:
            changed |= one_by_one.apply([event])
        assert changed == {
            "desired/apps/deep/x.yaml",
            "nodes/n1.yaml",
            "desired/a.yaml",
            "out/plan.json",
            "unit.yaml",
        }
        for mirror in (whole, one_by_one):
            assert scan_unit(mirror.workdir) == expected
            assert not (mirror.workdir / "desired" / "apps").exists()  # emptied dirs go too
            assert mirror.revision == last
            assert mirror.local_changes(under("desired", "nodes", "out", "unit.yaml")) == ({}, [])

    def test_the_event_feed_outlives_quiet_periods_longer_than_the_watch_idle(
        self, store: EtcdStore
    ) -> None:
        start = store.snapshot().revision + 1
        feed = EventFeed(store, start, idle=1.0)  # its watch ends after 1 s without events
        try:
            r1 = store.commit({"desired/a.yaml": b"1\n"})
            assert gather(feed, 1, 5) == [Change("desired/a.yaml", b"1\n", r1)]
            time.sleep(1.5)
            r2 = store.commit({"desired/b.yaml": b"1\n"})
            time.sleep(1.2)
            r3 = store.commit({}, deletes=["desired/a.yaml"])
            assert gather(feed, 2, 5) == [
                Change("desired/b.yaml", b"1\n", r2),
                Change("desired/a.yaml", None, r3),
            ]
            assert feed.get(0.3) is None  # and nothing twice
        finally:
            feed.close()


# ---------------------------------------------------------------- export and import (CLI)


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _untimed(result: tuple[int, str, str]) -> tuple[int, str, str]:
    """A command's result without its log lines' timestamps (two runs log at two times)."""
    code, out, err = result
    return code, out, re.sub(r"(?m)^\S+Z (?=[A-Z]+ )", "", err)


class TestExportImport:
    def test_import_then_export_gives_the_same_unit(
        self, etcd_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        src = copy_inputs(VEHICLE, tmp_path / "src")
        n_files = len(files_under(src))
        code, out, _ = run_cli(capsys, "import", "--state", str(src), "--store", etcd_url, "--json")
        assert code == 0
        doc = json.loads(out)
        assert (doc["written"], doc["deleted"]) == (n_files, 0)
        assert doc["to"] == EtcdStore(etcd_url).url and doc["from"].startswith("file://")

        exported = tmp_path / "exported"
        code, out, _ = run_cli(
            capsys, "export", "--store", etcd_url, "--state", str(exported), "--json"
        )
        assert code == 0
        assert (json.loads(out)["written"], json.loads(out)["deleted"]) == (n_files, 0)
        assert scan_unit(exported) == scan_unit(src)
        assert files_under(exported) == files_under(src)

        # exporting again changes nothing; a file the store lacks is deleted
        (exported / "desired" / "old.yaml").write_bytes(b"gone from the store\n")
        code, out, _ = run_cli(
            capsys, "export", "--store", etcd_url, "--state", str(exported), "--json"
        )
        assert code == 0
        assert (json.loads(out)["written"], json.loads(out)["deleted"]) == (0, 1)
        assert scan_unit(exported) == scan_unit(src)

    def test_reimport_after_deleting_a_desired_file_deletes_its_key(
        self, etcd_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        src = copy_inputs(VEHICLE, tmp_path / "src")
        assert run_cli(capsys, "import", "--state", str(src), "--store", etcd_url)[0] == 0
        before = EtcdStore(etcd_url).snapshot()
        assert "desired/hmi.yaml" in before.entries
        (src / "desired" / "hmi.yaml").unlink()
        code, out, _ = run_cli(capsys, "import", "--state", str(src), "--store", etcd_url, "--json")
        assert code == 0
        assert (json.loads(out)["written"], json.loads(out)["deleted"]) == (0, 1)
        after = EtcdStore(etcd_url).snapshot()
        assert dict(after.entries) == {
            r: e for r, e in before.entries.items() if r != "desired/hmi.yaml"
        }  # the others untouched: same bytes, same revisions

    def test_import_is_refused_while_a_leader_holds_the_unit_unless_forced(
        self, etcd_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        src = copy_inputs(VEHICLE, tmp_path / "src")
        assert run_cli(capsys, "import", "--state", str(src), "--store", etcd_url)[0] == 0
        store = EtcdStore(etcd_url)
        old = store.snapshot().entries["desired/hmi.yaml"].data
        new = old.replace(b"version: 3.1.0", b"version: 3.2.0")
        assert new != old
        (src / "desired" / "hmi.yaml").write_bytes(new)
        lead = store.try_lead("ctl-a", 5)
        assert lead is not None
        try:
            code, out, err = run_cli(capsys, "import", "--state", str(src), "--store", etcd_url)
            assert code == 1
            assert "ctl-a leads" in err and out == ""
            assert store.snapshot().entries["desired/hmi.yaml"].data == old

            code, out, _ = run_cli(
                capsys, "import", "--state", str(src), "--store", etcd_url, "--force", "--json"
            )
            assert code == 0
            assert (json.loads(out)["written"], json.loads(out)["deleted"]) == (1, 0)
            assert store.snapshot().entries["desired/hmi.yaml"].data == new
            assert store.leader() == "ctl-a"  # the leader key is not a document: kept
        finally:
            lead.resign(store)


class TestReadOnlyCommandsOnAStore:
    """plan, status, explain and validate with --store read one snapshot of the unit: they say
    what they say on an exported copy, write nothing to etcd and leave no copy behind."""

    def test_they_answer_as_on_an_exported_copy(
        self,
        etcd_url: str,
        tmp_path: Path,
        capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        cache = tmp_path / "read-cache"
        monkeypatch.setenv("RECONCILER_CACHE_DIR", str(cache))
        src = copy_inputs(VEHICLE, tmp_path / "src")
        assert run_cli(capsys, "import", "--state", str(src), "--store", etcd_url)[0] == 0
        work = tmp_path / "work"
        assert run_cli(capsys, "reconcile", "--store", etcd_url, "--state", str(work))[0] == 0
        store = EtcdStore(etcd_url)
        store.commit({"desired/odd.yaml": b"odd: [\n"})  # an invalid document: reported by key
        exported = tmp_path / "exported"
        assert run_cli(capsys, "export", "--store", etcd_url, "--state", str(exported))[0] == 0
        scratch = tmp_path / "scratch"
        scratch.mkdir()
        monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # where the snapshots go
        monkeypatch.chdir(exported)  # on the copy, relative paths as the snapshot's messages
        copied: list[set[str]] = []  # per command: the documents copied out of etcd
        real_commit = FileStore.commit

        def recording(self: FileStore, puts: Any, *rest: Any, **kw: Any) -> int:
            copied.append(set(puts))
            return real_commit(self, puts, *rest, **kw)

        monkeypatch.setattr(FileStore, "commit", recording)
        before = store.snapshot()
        for args in (
            ("status", "--json"),
            ("plan", "--json"),
            ("explain", HMI, "--json"),
            ("validate", "--json"),
        ):
            on_copy = _untimed(run_cli(capsys, *args, "--state", "."))
            on_store = _untimed(run_cli(capsys, *args, "--store", etcd_url, "--state", "nowhere"))
            assert on_store == on_copy, args
            assert Path.cwd() == exported.resolve()  # the working directory given back
        # each copies only what it reads: the report; the inputs and checkpoint; the inputs
        status_docs, plan_docs, explain_docs, validate_docs = copied
        assert status_docs == {"out/status.json"}
        assert plan_docs == explain_docs
        assert any(d.startswith("checkpoint/") for d in plan_docs)
        assert not any(d.startswith("out/") for d in plan_docs)
        assert validate_docs == {d for d in plan_docs if not d.startswith("checkpoint/")}
        assert "desired/odd.yaml" in validate_docs
        bad = json.loads(run_cli(capsys, "validate", "--json", "--store", etcd_url)[1])["errors"]
        assert [e["path"] for e in bad] == ["desired/odd.yaml"]  # the key under the prefix
        after = store.snapshot()
        assert after.revision == before.revision  # nothing written to etcd
        assert list(scratch.iterdir()) == []  # every snapshot copy removed
        # explain's read cache: the copy's, none for a snapshot (a new directory each time)
        assert len(list(cache.iterdir())) == 1

    def test_an_unreachable_store_is_an_error(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        code, out, err = run_cli(capsys, "status", "--store", "etcd://127.0.0.1:9/unit")
        assert code == 1 and out == "" and "error" in err


# ---------------------------------------------------------------- leader election


class TestLeaderElection:
    def test_exactly_one_of_several_candidates_wins(self, etcd_url: str) -> None:
        names = [f"ctl-{i}" for i in range(4)]
        stores = {n: EtcdStore(etcd_url) for n in names}
        barrier = threading.Barrier(len(names))
        won: dict[str, Any] = {}

        def candidate(name: str) -> None:
            barrier.wait()
            won[name] = stores[name].try_lead(name, 5)

        threads = [threading.Thread(target=candidate, args=(n,)) for n in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        winners = [n for n in names if won[n] is not None]
        try:
            assert len(winners) == 1
            assert stores[names[0]].leader() == winners[0]
        finally:
            for n in winners:
                won[n].resign(stores[n])

    def test_after_resign_the_other_wins(self, etcd_url: str) -> None:
        a, b = EtcdStore(etcd_url), EtcdStore(etcd_url)
        lead_a = a.try_lead("ctl-a", 5)
        assert lead_a is not None
        assert b.try_lead("ctl-b", 5) is None
        assert b.leader() == "ctl-a"
        lead_a.resign(a)
        assert lead_a.lost.is_set()
        assert b.leader() is None
        lead_b = b.try_lead("ctl-b", 5)
        assert lead_b is not None
        try:
            assert a.leader() == "ctl-b"
        finally:
            lead_b.resign(b)

    def test_a_dead_leader_loses_the_key_and_another_takes_over(self, etcd_url: str) -> None:
        ttl = 2
        a, b = EtcdStore(etcd_url), EtcdStore(etcd_url)
        lead_a = a.try_lead("ctl-a", ttl)
        assert lead_a is not None
        lead_a._stop.set()  # the process dies: no more refreshes, no revoke
        assert lead_a._thread is not None
        lead_a._thread.join(5)
        died = time.monotonic()
        assert b.leader() == "ctl-a"  # held until the lease runs out

        stop = threading.Event()
        timer = threading.Timer(ttl + 3, stop.set)
        timer.start()
        try:
            lead_b = b.campaign("ctl-b", ttl, stop)
        finally:
            timer.cancel()
        took = time.monotonic() - died
        assert lead_b is not None, "campaign did not win within ttl + 3 s"
        try:
            assert 1.0 <= took <= ttl + 3  # not before the lease expired, soon after it
            assert a.leader() == "ctl-b"
            with pytest.raises(StaleWrite, match=r"\(ctl-a\) does not lead \(leader: ctl-b\)"):
                a.commit({"out/plan.json": b"{}\n"}, guards=[LeaderGuard("ctl-a")])
            assert a.snapshot().entries == {}
        finally:
            lead_b.resign(b)

    def test_a_leader_notices_that_its_lease_is_gone(self, store: EtcdStore) -> None:
        lead = store.try_lead("ctl-a", 2)
        assert lead is not None
        try:
            store.client.post(store.client.get_url("/kv/lease/revoke"), json={"ID": lead.lease_id})
            assert lead.lost.wait(3), "the keepalive did not notice the revoked lease"
            assert store.leader() is None
        finally:
            lead.resign(store)

    def test_campaign_gives_up_when_stopped(self, store: EtcdStore) -> None:
        lead = store.try_lead("ctl-a", 5)
        assert lead is not None
        try:
            stop = threading.Event()
            threading.Timer(0.3, stop.set).start()
            assert store.campaign("ctl-b", 5, stop) is None
            assert store.leader() == "ctl-a"
        finally:
            lead.resign(store)


# ---------------------------------------------------------------- reconcile via the store


def without_dir(data: bytes, directory: Path) -> bytes:
    return data.replace(str(directory.resolve()).encode(), b"<state>")


class TestReconcileViaStore:
    @pytest.mark.parametrize("example", ["vehicle", "rack"])
    def test_the_same_outputs_as_a_file_reconcile(
        self, store: EtcdStore, tmp_path: Path, example: str
    ) -> None:
        files = copy_inputs(ROOT / "examples" / example, tmp_path / "files")
        copy_unit(FileStore(files), store)
        work = tmp_path / "work"
        via_store = reconcile_via_store(store, work, options(), ttl=2)
        plain = reconcile(files, options())
        assert via_store.plan.to_json() == plain.plan.to_json()

        ours, theirs = documents(store.snapshot()), scan_unit(files)
        assert set(ours) == set(theirs)
        outputs = {r for r in ours if r.startswith(("out/", "checkpoint/"))}
        assert "out/plan.json" in outputs and "checkpoint/allocations.json" in outputs
        assert any(r.startswith("out/nodes/") for r in outputs)
        assert any(r.endswith("/config.json") for r in outputs)
        for rel in sorted(outputs):
            if rel == "checkpoint/LINEAGE":  # random per state directory
                continue
            if rel == "checkpoint/allocations.json":
                a, b = json.loads(ours[rel]), json.loads(theirs[rel])
                assert (a["data"], a["generation"]) == (b["data"], b["generation"])
                continue
            if rel == "out/plan.basis.json":  # names the checkpoint's bytes and its lineage
                a, b = json.loads(ours[rel]), json.loads(theirs[rel])
                for doc in (a, b):
                    for key in ("checkpoint", "lineage"):
                        doc.pop(key, None)
                mine = without_dir(json.dumps(a).encode(), work)
                assert json.loads(mine) == json.loads(without_dir(json.dumps(b).encode(), files))
                continue
            assert without_dir(ours[rel], work) == without_dir(theirs[rel], files), rel
        assert scan_unit(work) == ours  # the working directory is the store's unit
        assert store.leader() is None  # resigned

    def test_a_second_run_with_nothing_changed_commits_nothing(
        self, store: EtcdStore, tmp_path: Path
    ) -> None:
        copy_unit(FileStore(VEHICLE), store)
        work = tmp_path / "work"
        reconcile_via_store(store, work, options(), ttl=2)
        first = store.snapshot()
        reconcile_via_store(store, work, options(), ttl=2)
        shutil.rmtree(work)  # a restarted controller, same working directory path
        reconcile_via_store(store, work, options(), ttl=2)
        assert store.snapshot().entries == first.entries  # same bytes and mod revisions
        assert all_changes(store, first.revision + 1) == []  # no document event at all

    def test_a_run_while_another_controller_leads_is_refused(
        self, store: EtcdStore, tmp_path: Path
    ) -> None:
        copy_unit(FileStore(VEHICLE), store)
        before = store.snapshot()
        lead = store.try_lead("ctl-other", 5)
        assert lead is not None
        try:
            with pytest.raises(ReconcileError, match="ctl-other leads"):
                reconcile_via_store(store, tmp_path / "work", options(), ttl=2)
            assert store.snapshot().entries == before.entries
            assert store.leader() == "ctl-other"
        finally:
            lead.resign(store)

    def test_a_controller_that_lost_the_key_during_its_run_commits_nothing(
        self, store: EtcdStore, tmp_path: Path
    ) -> None:
        copy_unit(FileStore(VEHICLE), store)
        before = store.snapshot()
        usurper: list[Any] = []

        def on_stage(text: str) -> None:
            if text.startswith("writing") and not usurper:
                store.client.delete(store.leader_key)  # as if the lease had expired
                usurper.append(store.try_lead("ctl-usurper", 5))

        opts = ReconcileOptions(configs=default_config_builder(), on_stage=on_stage)
        try:
            with pytest.raises(ReconcileError, match=r"does not lead \(leader: ctl-usurper\)"):
                reconcile_via_store(store, tmp_path / "work", opts, identity="ctl-a", ttl=2)
            assert usurper[0] is not None
            assert store.snapshot().entries == before.entries
            assert store.leader() == "ctl-usurper"
        finally:
            if usurper and usurper[0] is not None:
                usurper[0].resign(store)


# ---------------------------------------------------------------- watch --store


def plan_versions(store: EtcdStore) -> set[tuple[str, str]]:
    """(item, version) of the plan's actions but the CAN bridge's, which no test edits."""
    entry = store.snapshot().entries.get("out/plan.json")
    if entry is None:
        return set()
    actions = json.loads(entry.data)["actions"]
    return {(a["itemId"], a["version"]) for a in actions} - {("com.example.canbridge", "1.0.0")}


def set_hmi_version(store: EtcdStore, old: str, new: str) -> None:
    hmi = store.snapshot().entries["desired/hmi.yaml"].data
    edited = hmi.replace(f"version: {old}".encode(), f"version: {new}".encode())
    assert edited != hmi
    store.commit({"desired/hmi.yaml": edited})


def leader_key_revision(store: EtcdStore) -> str:
    """The leader key's last change: the same as long as one leadership lasts."""
    found = store.client.get(store.leader_key, metadata=True)
    assert len(found) == 1 and found[0][0] == b"watcher"
    return found[0][1]["mod_revision"]


@contextlib.contextmanager
def watch_loop(
    store: EtcdStore, workdir: Path, runs: list[ReconcileReport | None]
) -> Iterator[None]:
    """``watch --store`` on a thread, stopped (and checked to return) on leaving; its watch
    streams are re-opened after 1 s of silence (so that a compaction reaches them soon)."""
    stop = threading.Event()
    wopts = WatchOptions(debounce=0.1, resync=60, stream_idle=1.0)
    thread = threading.Thread(
        target=store_watch_loop,
        args=(store, workdir, options(), wopts, stop),
        kwargs={"ttl": 2, "identity": "watcher", "on_run": runs.append},
    )
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive(), "store_watch_loop did not return on stop"


class TestStoreWatchLoop:
    def test_the_leader_replans_on_an_edit_in_the_store_and_resigns_on_stop(
        self, store: EtcdStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        copy_unit(FileStore(VEHICLE), store)
        collected: list[bool] = []  # per run: whether it collected every object
        monkeypatch.setattr(watch_module, "collect_idle", lambda *, full: collected.append(full))
        runs: list[ReconcileReport | None] = []
        with watch_loop(store, tmp_path / "work", runs):
            wait_for(lambda: plan_versions(store) == {("com.example.hmi", "3.1.0")}, 10, "a plan")
            assert store.leader() == "watcher"
            set_hmi_version(store, "3.1.0", "3.2.0")
            wait_for(
                lambda: plan_versions(store) == {("com.example.hmi", "3.2.0")}, 10, "a new plan"
            )
            patch = json.loads(store.snapshot().entries["out/nodes/headunit.json"].data)
            assert [op["value"]["version"] for op in patch if op["op"] == "add"] == ["3.2.0"]
            wait_for(lambda: len(runs) >= 2, 5, "the second run's report")
        assert store.leader() is None
        # two runs: on becoming leader and on the edit; its own commits started none
        assert len(runs) == 2 and all(r is not None for r in runs)
        # the first run collects everything, the edit's only what was allocated since
        assert collected == [True, False]

    def test_the_leader_resyncs_after_its_watch_was_compacted_and_follows_on(
        self, store: EtcdStore, etcd_server: EtcdServer, tmp_path: Path
    ) -> None:
        copy_unit(FileStore(VEHICLE), store)
        runs: list[ReconcileReport | None] = []
        with watch_loop(store, tmp_path / "work", runs):
            wait_for(lambda: len(runs) >= 1 and plan_versions(store) != set(), 10, "a plan")
            led_since = leader_key_revision(store)
            # another unit's writes move the revision on; compacting at the last of them
            # leaves this leader's next watch (from its last event + 1) in the compacted past
            other = EtcdStore(etcd_server.url(f"test/{uuid.uuid4().hex}"))
            other.commit({"desired/x.yaml": b"1\n"})
            etcd_server.compact(other.commit({"desired/x.yaml": b"2\n"}))
            wait_for(lambda: len(runs) >= 2, 10, "a run after the resync")
            # still leads, on the same leader key: a lost watch is no reason to stand down
            assert leader_key_revision(store) == led_since
            set_hmi_version(store, "3.1.0", "3.3.0")
            wait_for(
                lambda: plan_versions(store) == {("com.example.hmi", "3.3.0")}, 10, "a new plan"
            )
            wait_for(lambda: len(runs) >= 3, 5, "the third run's report")
        assert len(runs) == 3 and all(r is not None for r in runs)
        assert runs[1] is not None and runs[1].written == ()  # the resync changed nothing


class TestLargeCommits:
    """A run's commit within etcd's request limits: staged documents first, in as many
    transactions as the limits need, then one final transaction with the rest."""

    def test_the_url_carries_the_servers_limits(self, etcd_server: EtcdServer) -> None:
        assert EtcdStore(etcd_server.url("u")).txn_limits == (128, 1536 * 1024)  # etcd's defaults
        url = etcd_server.url("u") + "?max-txn-ops=7&max-request-bytes=4096"
        assert EtcdStore(url).txn_limits == (7, 4096)
        assert EtcdStore(etcd_server.url("u")).timeout == 60.0
        assert EtcdStore(etcd_server.url("u") + "?timeout=3").timeout == 3.0
        for bad in ("?max-txn-ops=0", "?max-txn-ops=x", "?timeout=0", "?bogus=3"):
            with pytest.raises(StoreError):
                EtcdStore(etcd_server.url("u") + bad)

    def test_split_commit_respects_both_limits_and_keeps_every_document(
        self, etcd_server: EtcdServer
    ) -> None:
        store = EtcdStore(etcd_server.url("u") + "?max-txn-ops=3&max-request-bytes=1000")
        puts = {f"out/instances/i{k:02d}/config.json": bytes(100 * k) for k in range(1, 9)}
        chunks = list(split_commit(store, puts))
        assert [r for c in chunks for r in c] == sorted(puts)  # all, in path order, once
        for c in chunks:
            assert len(c) <= 3
            if len(c) > 1:
                assert sum(store.op_size(r, d) for r, d in c.items()) <= 1000
        # a document over the byte limit on its own still gets a commit of its own (etcd then
        # says why it refuses it): 700 and 800 bytes are ~1000 in base64, each alone
        assert [len(c) for c in chunks][-2:] == [1, 1]

    def test_staged_documents_go_first_and_the_rest_in_one_final_transaction(
        self, etcd_server: EtcdServer, tmp_path: Path
    ) -> None:
        url = etcd_server.url(f"t/{uuid.uuid4().hex}") + "?max-txn-ops=2"
        store = EtcdStore(url)
        store.commit(
            {"out/instances/gone/config.json": b"old", "checkpoint/allocations.json": b"1"}
        )
        mirror = Mirror(store, tmp_path / "work")
        mirror.resync()
        start = store.snapshot().revision
        work = tmp_path / "work"
        for k in range(5):
            (work / "out" / "instances" / f"i{k}").mkdir(parents=True)
            (work / "out" / "instances" / f"i{k}" / "config.json").write_bytes(b"cfg%d" % k)
        (work / "checkpoint" / "allocations.json").write_bytes(b"2")
        (work / "out" / "plan.json").write_bytes(b"{}")
        (work / "out" / "instances" / "gone" / "config.json").unlink()
        staged = under("out/instances")
        assert mirror.push(under("out", "checkpoint"), [], staged) == 8

        changes = all_changes(store, start + 1)
        by_revision: dict[int, list[Change]] = {}
        for ch in changes:
            by_revision.setdefault(ch.mod_revision, []).append(ch)
        revisions = sorted(by_revision)
        # five staged configs, two per transaction: three transactions; then the final one
        assert [len(by_revision[r]) for r in revisions] == [2, 2, 1, 3]
        assert all(
            c.rel.startswith("out/instances/i") for r in revisions[:3] for c in by_revision[r]
        )
        final = {(c.rel, c.data) for c in by_revision[revisions[-1]]}
        assert final == {
            ("checkpoint/allocations.json", b"2"),
            ("out/plan.json", b"{}"),
            ("out/instances/gone/config.json", None),  # deletions are in the final one
        }
        assert documents(store.snapshot()) == scan_unit(work)

    def test_a_leader_fenced_after_its_staged_commits_leaves_the_checkpoint_alone(
        self, etcd_server: EtcdServer, tmp_path: Path
    ) -> None:
        url = etcd_server.url(f"t/{uuid.uuid4().hex}") + "?max-txn-ops=1"
        store = EtcdStore(url)
        leadership = store.try_lead("me", 5)
        assert leadership is not None
        lead = leadership
        store.commit({"checkpoint/allocations.json": b"1"})
        mirror = Mirror(store, tmp_path / "work")
        mirror.resync()
        work = tmp_path / "work"
        (work / "out" / "instances" / "a").mkdir(parents=True)
        (work / "out" / "instances" / "a" / "config.json").write_bytes(b"a")
        (work / "out" / "instances" / "b").mkdir(parents=True)
        (work / "out" / "instances" / "b" / "config.json").write_bytes(b"b")
        (work / "checkpoint" / "allocations.json").write_bytes(b"2")

        taken: list[Leadership] = []

        class Fencing:
            """The store, where another controller takes over after the first staged commit."""

            def __init__(self) -> None:
                self.commits = 0

            def __getattr__(self, name: str) -> Any:
                return getattr(store, name)

            def commit(self, puts: Any, deletes: Any = (), guards: Any = ()) -> int:
                self.commits += 1
                if self.commits == 2:
                    lead.resign(store)
                    other = store.try_lead("other", 5)
                    assert other is not None
                    taken.append(other)
                return store.commit(puts, deletes, guards)

        mirror.store = Fencing()
        with pytest.raises(StaleWrite):
            mirror.push(under("out", "checkpoint"), [LeaderGuard("me")], under("out/instances"))
        docs = documents(store.snapshot())
        assert docs["checkpoint/allocations.json"] == b"1"  # the final commit never happened
        assert docs["out/instances/a/config.json"] == b"a"  # staged before the takeover
        assert "out/instances/b/config.json" not in docs  # refused: "other" leads
        taken[0].resign(store)


class TestWatchStreamLines:
    """The watch stream is newline-delimited JSON; one message can be many MiB long."""

    class Chunked:
        def __init__(self, data: bytes, size: int) -> None:
            self.data, self.size = data, size

        def iter_content(self, chunk_size: int) -> Iterator[bytes]:
            for i in range(0, len(self.data), self.size):
                yield self.data[i : i + self.size]

    @pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 1 << 20])
    def test_lines_are_split_exactly_whatever_the_chunks(self, size: int) -> None:
        from reconciler.stores.etcd import _lines

        big = b"x" * 300_000
        data = b'{"a":1}\n\n{"b":2}\n' + big + b"\n" + b'{"c":3}'
        got = list(_lines(self.Chunked(data, size)))  # type: ignore[arg-type]
        assert got == [b'{"a":1}', b'{"b":2}', big, b'{"c":3}']

    def test_a_long_line_costs_linear_time(self) -> None:
        from reconciler.stores.etcd import _lines

        def seconds(n: int) -> float:
            data = b"y" * n + b"\n"
            t0 = time.perf_counter()
            assert [len(x) for x in _lines(self.Chunked(data, 512))] == [n]  # type: ignore[arg-type]
            return time.perf_counter() - t0

        small, large = seconds(1 << 20), seconds(8 << 20)
        # 8x the bytes: linear costs ~8x; the quadratic splitting it replaced cost ~64x
        assert large < 30 * max(small, 1e-3)


class TestLeaseRefreshFailures:
    def test_failing_refreshes_lose_the_lease_after_one_ttl_not_before(
        self, store: EtcdStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        lead = store.try_lead("me", 2)
        assert lead is not None
        real = store._post

        def unreachable(path: str, payload: Any) -> dict[str, Any]:
            if path == "/lease/keepalive":
                raise StoreError("connection refused")
            return real(path, payload)

        t0 = time.monotonic()
        monkeypatch.setattr(store, "_post", unreachable)
        assert lead.lost.wait(10), "refreshes failed for 10 s and the leader did not notice"
        waited = time.monotonic() - t0
        # refreshed every ttl/3 until t0; lost once 2 s passed since the last refresh that
        # worked: within (2 - 2/3, 2 + 2/3] s of t0
        assert 1.3 <= waited <= 2.7 + 0.5, waited
        monkeypatch.setattr(store, "_post", real)
        lead.resign(store)


class TestScopedReads:
    """An agent reads its node's documents only: a unit can be far larger than one node's."""

    def test_a_scoped_snapshot_holds_exactly_the_named_documents_and_directories(
        self, store: EtcdStore
    ) -> None:
        store.commit(
            {
                "out/nodes/a.json": b"A",
                "out/nodes/b.json": b"B",
                "out/instances/i1/config.json": b"1",
                "out/instances/i1/hosts": b"h1",
                "out/instances/i10/config.json": b"10",  # i1/ is not a prefix of i10/
                "desired/x.yaml": b"x",
            }
        )
        snap = store.snapshot(["out/nodes/a.json", "out/instances/i1/", "actual/missing.yaml"])
        assert documents(snap) == {
            "out/instances/i1/config.json": b"1",
            "out/instances/i1/hosts": b"h1",
            "out/nodes/a.json": b"A",
        }
        empty = store.snapshot([])
        assert documents(empty) == {}
        # the revision read is the server's, which any client's write moves on (another test's
        # lease kept alive in the background did, between the two reads: a CI failure)
        assert empty.revision >= snap.revision

    def test_a_snapshot_at_a_revision_reads_that_version(self, store: EtcdStore) -> None:
        first = store.commit({"out/nodes/a.json": b"old"})
        store.commit({"out/nodes/a.json": b"new"})
        assert documents(store.snapshot(["out/nodes/a.json"], revision=first)) == {
            "out/nodes/a.json": b"old"
        }
        assert documents(store.snapshot(["out/nodes/a.json"])) == {"out/nodes/a.json": b"new"}

    def test_the_agent_copies_its_patch_its_actual_and_the_bundles_it_starts_only(
        self, planned: EtcdStore, tmp_path: Path
    ) -> None:
        work = tmp_path / "agent"
        stale = work / "out" / "instances" / "left-over" / "config.json"
        stale.parent.mkdir(parents=True)
        stale.write_text("{}")
        report = run_agent_via_store(planned, work, HEADUNIT, FakeRunc())
        assert report.started == (HMI,)
        in_store = documents(planned.snapshot())
        assert {r for r in in_store if r.startswith("out/nodes/")} == {
            "out/nodes/gateway.json",
            "out/nodes/headunit.json",
        }  # the unit holds another node's plan, and desired/, nodes/, checkpoint/...
        assert sorted(files_under(work)) == sorted(
            [
                f"out/nodes/{HEADUNIT}.json",
                f"out/instances/{HMI}/config.json",
                f"out/instances/{HMI}/hosts",
                ACTUAL,  # written by this run, and committed
                f".agent-{HEADUNIT}.json",  # the agent's own restart state: local only
            ]
        )
        assert not stale.exists()  # a bundle no plan of this node names is removed
        assert f".agent-{HEADUNIT}.json" not in in_store
        for rel in files_under(work) - {f".agent-{HEADUNIT}.json"}:
            assert (work / rel).read_bytes() == in_store[rel]

    def test_the_agents_watch_sees_its_plan_only(self, store: EtcdStore) -> None:
        start = store.commit({"desired/x.yaml": b"x"}) + 1
        feed = EventFeed(store, start, scope="out/nodes/a.json")
        try:
            store.commit({"out/nodes/b.json": b"B", "desired/x.yaml": b"y"})
            store.commit({"out/nodes/a.json": b"A"})
            got = gather(feed, 1, timeout=10)
            assert [(c.rel, c.data) for c in got] == [("out/nodes/a.json", b"A")]
        finally:
            feed.close()

    def test_a_leaders_feed_sees_the_inputs_and_not_its_own_commits(self, store: EtcdStore) -> None:
        from reconciler.controller.ha import INPUT_SCOPES

        start = store.snapshot().revision + 1
        feed = EventFeed(store, start, scopes=INPUT_SCOPES)
        try:
            store.commit({"out/plan.json": b"{}", "checkpoint/allocations.json": b"1"})
            inputs = {
                "actual/n.yaml": b"a",
                "desired/deep/s.yaml": b"d",
                "nodes/n.yaml": b"n",
                "resources/n.json": b"[]",
                "unit.yaml": b"u",
            }
            revision = store.commit(inputs)
            got = gather(feed, 5, timeout=10)
            assert sorted((c.rel, c.data, c.mod_revision) for c in got) == sorted(
                (rel, data, revision) for rel, data in inputs.items()
            )
            assert feed.get(0.5) is None  # the out/ and checkpoint/ commit never came
        finally:
            feed.close()


class TestScanningADirectory:
    def test_only_regular_files_of_unit_paths_are_listed_and_symlinks_never_followed(
        self, tmp_path: Path
    ) -> None:
        root = tmp_path / "unit"
        elsewhere = tmp_path / "elsewhere"
        (elsewhere / "sub").mkdir(parents=True)
        (elsewhere / "x.yaml").write_text("x")
        (elsewhere / "sub" / "y.yaml").write_text("y")
        (root / "desired" / "apps").mkdir(parents=True)
        (root / "desired" / "apps" / "a.yaml").write_text("a")
        (root / "desired" / ".a.yaml.swp").write_text("swap")
        (root / "desired" / "link-dir").symlink_to(elsewhere)
        (root / "desired" / "link.yaml").symlink_to(elsewhere / "x.yaml")
        (root / "nodes").symlink_to(elsewhere)  # a symlinked top-level directory
        (root / "out" / "instances" / "i").mkdir(parents=True)
        (root / "out" / "instances" / "i" / "config.json").write_text("{}")
        (root / "out" / "instances" / ".manifest.json").write_text("{}")
        (root / "unit.yaml").write_text("u")
        (root / "notes.txt").write_text("not a document")
        assert scan_unit(root) == {
            "desired/apps/a.yaml": b"a",
            "out/instances/i/config.json": b"{}",
            "unit.yaml": b"u",
        }


class TestAgentSyncOfABrokenPlan:
    @pytest.mark.parametrize("patch", [b"[1, 2]", b'{"op": "add"}', b"not json", b'[{"op": 3}]'])
    def test_a_broken_patch_is_the_agents_error_not_a_crash_of_the_sync(
        self, store: EtcdStore, tmp_path: Path, patch: bytes
    ) -> None:
        store.commit({f"out/nodes/{HEADUNIT}.json": patch})
        with pytest.raises(AgentError):
            run_agent_via_store(store, tmp_path / "agent", HEADUNIT, FakeRunc())
        assert ACTUAL not in store.snapshot().entries
