"""``verify`` (issue 9's warm path): a watcher's event-triggered run trusts that the outputs
whose content did not change are what it wrote; a verifying run (its first, every resync)
repairs an output edited behind its back, and a changed output is written either way."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from reconciler.controller import reconcile as rec
from reconciler.controller import watch
from reconciler.controller.configs import default_config_builder
from reconciler.controller.reconcile import ReconcileCache, ReconcileOptions, reconcile
from reconciler.io.checkpoint_files import load_checkpoint
from reconciler.planning.checkpoint import encode_checkpoint
from tests.support.agent_sim import apply_all


def test_trusted_between_resyncs_repaired_on_a_verifying_run(demo_copy: Path) -> None:
    opts = ReconcileOptions(configs=default_config_builder(), cache=ReconcileCache())
    report = reconcile(demo_copy, opts)
    patch = sorted((demo_copy / "out" / "nodes").glob("*.json"))[0]
    config = sorted((demo_copy / "out" / "instances").glob("*/config.json"))[0]
    good_patch, good_config = patch.read_bytes(), config.read_bytes()
    patch.write_text("[]\n")
    config.write_text("{}\n")
    trusting = dataclasses.replace(opts, verify=False)
    report = reconcile(demo_copy, trusting, report.computed.view)
    assert patch.read_text() == "[]\n" and config.read_text() == "{}\n"
    assert report.written == ()
    # a changed output is written even when trusting
    svc = demo_copy / "desired" / "apps" / "logger.yaml"
    svc.write_text(svc.read_text().replace("instances: 3", "instances: 2"))
    report = reconcile(demo_copy, trusting, report.computed.view)
    assert "out/plan.json" in report.written
    svc.write_text(svc.read_text().replace("instances: 2", "instances: 3"))
    report = reconcile(demo_copy, trusting, report.computed.view)
    # the resync repairs what was edited by hand
    report = reconcile(demo_copy, opts, report.computed.view)
    assert patch.read_bytes() == good_patch
    assert config.read_bytes() == good_config


def test_a_trusting_run_publishes_node_patches_as_a_verifying_run_does(demo_copy: Path) -> None:
    """Node patches on trusting runs: an unchanged patch is not looked at, a node that went
    away loses its patch file and a new node gets one, as a run from nothing would leave."""
    opts = ReconcileOptions(cache=ReconcileCache())
    trusting = dataclasses.replace(opts, verify=False)
    report = reconcile(demo_copy, opts)
    nodes_dir = demo_copy / "out" / "nodes"
    before = {p.name: p.read_bytes() for p in nodes_dir.glob("*.json")}
    assert "edge-3.json" in before
    spare = (demo_copy / "nodes" / "edge-3.yaml").read_text()
    (demo_copy / "nodes" / "edge-3.yaml").unlink()
    report = reconcile(demo_copy, trusting, report.computed.view)
    assert "out/nodes/edge-3.json" in report.written
    assert not (nodes_dir / "edge-3.json").exists()
    assert not any(w.startswith("out/nodes/edge-1") for w in report.written)
    (demo_copy / "nodes" / "edge-3.yaml").write_text(spare)
    report = reconcile(demo_copy, trusting, report.computed.view)
    assert (nodes_dir / "edge-3.json").exists()
    fresh = demo_copy.parent / "fresh"
    shutil.copytree(demo_copy, fresh, ignore=shutil.ignore_patterns("out", "checkpoint"))
    reconcile(fresh, ReconcileOptions())
    want = {p.name: p.read_bytes() for p in (fresh / "out" / "nodes").glob("*.json")}
    got = {p.name: p.read_bytes() for p in nodes_dir.glob("*.json")}
    assert got.keys() == want.keys() == before.keys()


def _published(state: Path) -> dict[str, bytes]:
    out = state / "out"
    return {
        p.relative_to(out).as_posix(): p.read_bytes()
        for p in [out / "plan.json", *sorted((out / "nodes").glob("*.json"))]
    }


@pytest.mark.parametrize("digest_over", [rec.DIGEST_OVER, 64])
def test_trusting_runs_across_edits_publish_what_a_run_without_cache_does(
    demo_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, digest_over: int
) -> None:
    """A watcher's trusting runs (the node patches made from the last ones, only the nodes the
    planner looked at written): after service edits, agents applying the plans, a node going
    away and coming back, the plan and the node patch files are the ones a run without any
    cache leaves in a copy of the directory. (With a tiny ``DIGEST_OVER``, every output is
    remembered by its digest, as status.json is at scale.)"""
    monkeypatch.setattr(rec, "DIGEST_OVER", digest_over)
    cache = ReconcileCache()
    opts = ReconcileOptions(cache=cache)
    trusting = dataclasses.replace(opts, verify=False)
    view = reconcile(demo_copy, opts).computed.view
    svc = demo_copy / "desired" / "apps" / "logger.yaml"
    node = demo_copy / "nodes" / "edge-3.yaml"
    spare = node.read_text()

    def failed_run() -> None:
        """A run that plans, then fails before writing anything (its plan is not published)."""

        def hook(step: str) -> None:
            raise OSError("injected")

        with pytest.raises(OSError, match="injected"):
            reconcile(demo_copy, dataclasses.replace(trusting, write_hook=hook), view)

    def edit(old: str, new: str, *, then_fail: bool = False) -> None:
        svc.write_text(svc.read_text().replace(old, new))
        if then_fail:
            failed_run()

    def agents(*, then_fail: bool = False) -> None:
        apply_all(demo_copy)
        if then_fail:
            failed_run()  # new revisions planned, not published

    def gone() -> None:
        """A node the last run's planner did not look at goes away, with its actual state."""
        since = cache.plan.patched_from
        assert since is not None  # (the last run made its patches from the one before's)
        node_id = min({"edge-1", "edge-2", "edge-3"} - set(since[1]))
        for path in demo_copy.glob(f"*/{node_id}.yaml"):
            path.unlink()

    steps: list[Callable[[], object]] = [
        lambda: edit("instances: 3", "instances: 2"),
        lambda: agents(then_fail=True),
        lambda: edit("instances: 2", "instances: 4"),  # starts published
        lambda: edit("instances: 4", "instances: 2", then_fail=True),  # no starts, not published
        agents,
        node.unlink,
        lambda: node.write_text(spare),
        agents,
        lambda: edit("instances: 2", "instances: 3"),
        lambda: edit("instances: 3", "instances: 4"),  # one start: the delta path
        gone,
    ]
    for k, step in enumerate(steps):
        step()
        view = reconcile(demo_copy, trusting, view).computed.view
        fresh = tmp_path / f"fresh-{k}"
        shutil.copytree(demo_copy, fresh)
        reconcile(fresh, ReconcileOptions())
        assert _published(demo_copy) == _published(fresh), f"step {k}"


@pytest.mark.parametrize("digest_over", [rec.DIGEST_OVER, 64])
def test_a_big_output_is_remembered_by_its_digest_and_still_kept_right(
    demo_copy: Path, monkeypatch: pytest.MonkeyPatch, digest_over: int
) -> None:
    """A long-running caller remembers an out/ file of ``DIGEST_OVER`` bytes or more by its
    sha256, not its bytes (status.json: 15 MB at 20,000 instances); it is still written only
    when its content changes, and a verifying run still repairs it."""
    monkeypatch.setattr(rec, "DIGEST_OVER", digest_over)
    opts = ReconcileOptions(cache=ReconcileCache())
    assert opts.cache is not None
    view = reconcile(demo_copy, opts).computed.view
    status = demo_copy / "out" / "status.json"
    good = status.read_bytes()
    remembered = opts.cache.outputs[status][0]
    if len(good) >= digest_over:
        assert remembered == ("sha256", hashlib.sha256(good).digest())
    else:
        assert remembered == good
    report = reconcile(demo_copy, opts, view)  # unchanged: not written again
    assert "out/status.json" not in report.written
    status.write_bytes(good[:-3] + b"!}\n")  # edited behind its back, the same size
    report = reconcile(demo_copy, opts, report.computed.view)
    assert "out/status.json" in report.written and status.read_bytes() == good
    svc = demo_copy / "desired" / "apps" / "logger.yaml"
    svc.write_text(svc.read_text().replace("instances: 3", "instances: 2"))
    trusting = dataclasses.replace(opts, verify=False)
    report = reconcile(demo_copy, trusting, report.computed.view)
    assert "out/status.json" in report.written and status.read_bytes() != good
    fresh = demo_copy.parent / "fresh"
    shutil.copytree(demo_copy, fresh, ignore=shutil.ignore_patterns("out", "checkpoint"))
    shutil.copytree(demo_copy / "checkpoint", fresh / "checkpoint")
    reconcile(fresh, ReconcileOptions())
    assert status.read_bytes() == (fresh / "out" / "status.json").read_bytes()


def test_a_killed_writers_temp_files_are_removed_by_a_verifying_run(demo_copy: Path) -> None:
    opts = ReconcileOptions(cache=ReconcileCache())
    report = reconcile(demo_copy, opts)
    temps = [
        demo_copy / "out" / "nodes" / ".edge-1.json.tmp-99999",
        demo_copy / "out" / ".plan.json.tmp-99999",
        demo_copy / "checkpoint" / ".allocations.json.tmp-99999",
        demo_copy / "checkpoint" / "last-good" / ".shard-0a.json.tmp-99999",
    ]
    for t in temps:
        t.write_text("torn")
    trusting = dataclasses.replace(opts, verify=False)
    report = reconcile(demo_copy, trusting, report.computed.view)
    assert all(t.exists() for t in temps)  # an event run does not list out/nodes
    reconcile(demo_copy, opts, report.computed.view)
    assert not any(t.exists() for t in temps)
    # a oneshot (no cache) always removes them
    temps[0].write_text("torn")
    reconcile(demo_copy, ReconcileOptions(verify=False))
    assert not temps[0].exists()


def _event(reason: str) -> bool:
    """A run for a change the watcher saw as an event (not one found while it started)."""
    return reason.startswith("changed") and "while the watcher started" not in reason


def test_watch_verifies_on_start_and_resync_and_trusts_on_events(
    demo_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, bool]] = []
    collected: list[tuple[str, bool]] = []  # per run: whether it collected every object
    real = watch.run_logged

    def recording(state: Path, opts: ReconcileOptions, *rest: Any, **kw: Any) -> Any:
        seen.append((rest[1], opts.verify))
        collected.append((rest[1], kw.get("full_collect", True)))
        return real(state, opts, *rest, **kw)

    monkeypatch.setattr(watch, "run_logged", recording)
    stop = threading.Event()
    wopts = watch.WatchOptions(debounce=0.05, resync=1.0)
    runner = threading.Thread(
        target=watch.watch_loop, args=(demo_copy, ReconcileOptions(), wopts, stop)
    )
    runner.start()
    try:
        deadline = time.monotonic() + 60
        while not seen and time.monotonic() < deadline:
            time.sleep(0.05)
        svc = demo_copy / "desired" / "apps" / "logger.yaml"
        # (an edit the watcher sees before it watches is run as "changed while the watcher
        # started", verified like the start: edit again until an event's run is seen)
        k = 0
        while time.monotonic() < deadline and not (
            any(_event(r) for r, _ in seen) and any(r == "periodic resync" for r, _ in seen)
        ):
            if not any(_event(r) for r, _ in seen) and k % 40 == 0:
                text = svc.read_text()
                svc.write_text(
                    text.replace("instances: 3", "instances: 2")
                    if "instances: 3" in text
                    else text.replace("instances: 2", "instances: 3")
                )
            k += 1
            time.sleep(0.05)
    finally:
        stop.set()
        runner.join(20)
    assert seen[0] == ("start", True)
    assert all(not v for r, v in seen if _event(r)), seen
    assert any(_event(r) for r, _ in seen), seen
    assert all(v for r, v in seen if r == "periodic resync") and ("periodic resync", True) in seen
    # the runs that verify everything also collect every object; an event's run only what
    # was allocated since (gcpause.collect_idle)
    assert collected == seen


def _outputs(state: Path) -> dict[str, bytes]:
    """out/ and the checkpoint as files, the state directory's path in them as ``STATE`` (the
    status page's time aside); the checkpoint as it loads, encoded whole (a watcher writes
    deltas, a one-shot run the whole generation: the files differ, not what they hold)."""
    here = str(state).encode()
    files = {
        p.relative_to(state).as_posix(): p.read_bytes().replace(here, b"STATE")
        for top in ("out", "checkpoint")
        for p in sorted((state / top).rglob("*"))
        if p.is_file()
        and p.name not in ("status.html", ".manifest.json")
        and not p.name.startswith("allocations.")
    }
    if "out/plan.basis.json" in files:
        basis = json.loads(files["out/plan.basis.json"])
        basis.pop("checkpoint", None)  # the digest of those files
        files["out/plan.basis.json"] = json.dumps(basis, sort_keys=True).encode()
    loaded = load_checkpoint(state / "checkpoint", {}, quarantine=False)
    assert not loaded.problems
    files["checkpoint (loaded)"] = encode_checkpoint(loaded.checkpoint)
    return files


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_a_run_whose_commit_failed_leaves_nothing_for_the_next_trusting_run_to_trust(
    demo_copy: Path, monkeypatch: pytest.MonkeyPatch, k: int
) -> None:
    """A run's writes fail at the k-th filesystem flush of its commit (before or after some
    renames): what the cache recorded of the files it meant to write is checked against the
    files (the configs' manifest, the last-good manifest, the checkpoint's bytes) before it is
    trusted, so the watcher's next run, which trusts the cache, leaves exactly what an
    uninterrupted run leaves (not the configs the failed run only put in temp files)."""
    from reconciler.io import fsio

    if fsio._SYNCFS is None:
        pytest.skip("no syncfs on this system: the commit fsyncs each file instead")
    opts = ReconcileOptions(configs=default_config_builder(), cache=ReconcileCache())
    report = reconcile(demo_copy, opts)
    svc = demo_copy / "desired" / "apps" / "logger.yaml"
    # every logger config changes and one instance goes: configs, patches, plan, checkpoint
    text = svc.read_text().replace("instances: 3", "instances: 2")
    svc.write_text(text.replace("pidsLimit: 16", "pidsLimit: 17"))
    reference = demo_copy.parent / "reference"
    shutil.copytree(demo_copy, reference)
    reconcile(reference, ReconcileOptions(configs=default_config_builder()))
    calls = [0]
    real = fsio._sync_filesystem_of

    def failing(directory: Path) -> None:
        calls[0] += 1
        if calls[0] == k:
            raise OSError(5, "Input/output error")
        real(directory)

    monkeypatch.setattr(fsio, "_sync_filesystem_of", failing)
    with pytest.raises(OSError, match="Input/output"):
        reconcile(demo_copy, opts, report.computed.view)
    monkeypatch.undo()
    trusting = dataclasses.replace(opts, verify=False)
    after = reconcile(demo_copy, trusting, report.computed.view)
    if k == 1:  # nothing of the failed run was renamed into place: the configs come now
        assert any(w.endswith("/config.json") for w in after.written)
    assert _outputs(demo_copy) == _outputs(reference)
    # the manifest (inode numbers: not compared) describes what is there: nothing to rewrite
    assert reconcile(demo_copy, opts, after.computed.view).written == ()
