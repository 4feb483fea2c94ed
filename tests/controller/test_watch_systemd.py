"""The long-running watcher and the systemd units (SPEC §14)."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from reconciler.controller import reconcile as reconcile_module
from reconciler.controller.reconcile import ReconcileOptions, ReconcileReport, reconcile
from reconciler.controller.watch import WatchOptions, input_filter, watch_loop
from reconciler.io.lock import StateLock
from tests.support.observability import without_made_time
from tests.support.paths import ROOT

UNITS = [
    "reconciler.path",
    "reconciler.service",
    "reconciler.timer",
    "reconciler-watch.service",
    "reconciler-etcd@.service",  # a replica of a unit kept in etcd (docs/etcd.md)
]


def _wait_for(predicate: object, timeout: float = 15.0) -> bool:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _logger_starts(state: Path) -> list[str] | None:
    """The versions of the logger instances out/plan.json starts (None: no readable plan)."""
    try:
        plan = json.loads((state / "out" / "plan.json").read_text())
    except (OSError, ValueError):
        return None
    return sorted(
        a["version"]
        for a in plan["actions"]
        if a["itemId"] == "com.example.logger" and a["action"] == "start"
    )


@dataclass
class Watcher:
    proc: subprocess.Popen[str]
    stderr: str = ""  # its logs, once stopped


@contextlib.contextmanager
def watching(state: Path, *extra: str) -> Iterator[Watcher]:
    """`reconciler watch` in a subprocess, stopped with SIGTERM; checks its clean exit."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "reconciler", "watch", "--state", str(state), *extra],
        stderr=subprocess.PIPE,
        text=True,
    )
    w = Watcher(proc)
    try:
        yield w
    finally:
        proc.send_signal(signal.SIGTERM)
        _, w.stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, w.stderr
    assert "Traceback" not in w.stderr


def _started(state: Path) -> bool:
    """The first run wrote its plan; give the watcher a moment to set up its inotify watches."""
    if not _wait_for(lambda: _logger_starts(state) == ["1.0.0"] * 3, timeout=60):
        return False
    time.sleep(1.0)
    return True


def _set_logger(svc: Path, text: str, *, instances: int, version: str = "1.0.0") -> str:
    new = text.replace("instances: 3", f"instances: {instances}")
    return new.replace("version: 1.0.0", f"version: {version}")


def _planned_instances(state: Path) -> int:
    try:
        plan = json.loads((state / "out" / "plan.json").read_text())
    except (OSError, ValueError):
        return -1
    return sum(1 for a in plan["actions"] if a["itemId"] == "com.example.logger")


class TestWatch:
    def test_reconciles_on_change_and_stops_on_sigterm(self, demo_copy: Path) -> None:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "reconciler",
                "watch",
                "--state",
                str(demo_copy),
                "--debounce",
                "100ms",
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert _wait_for(lambda: _planned_instances(demo_copy) == 3)
            svc = demo_copy / "desired" / "apps" / "logger.yaml"
            svc.write_text(svc.read_text().replace("instances: 3", "instances: 1"))
            assert _wait_for(lambda: _planned_instances(demo_copy) == 1)
            time.sleep(0.5)  # the watch is surely running now: this edit arrives as an event
            svc.write_text(svc.read_text().replace("instances: 1", "instances: 2"))
            assert _wait_for(lambda: _planned_instances(demo_copy) == 2)
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
        assert "changed: logger.yaml" in err and "stopped" in err
        assert "Traceback" not in err

    def test_edits_show_in_the_plan_within_two_seconds(self, demo_copy: Path) -> None:
        """Issue 6: an edit of a desired file, and one made the way editors save (write a
        temp file, rename it over the original), are in out/plan.json within 2 s."""
        svc = demo_copy / "desired" / "apps" / "logger.yaml"
        text = svc.read_text()
        with watching(demo_copy) as w:  # the default 200 ms debounce
            assert _started(demo_copy)
            # an in-place edit
            t0 = time.monotonic()
            svc.write_text(_set_logger(svc, text, instances=1))
            assert _wait_for(lambda: _logger_starts(demo_copy) == ["1.0.0"], timeout=10)
            assert time.monotonic() - t0 < 2.0
            time.sleep(0.5)
            # an editor's atomic save: a new inode under the same name
            t0 = time.monotonic()
            tmp = svc.parent / ".logger.yaml.swp"
            tmp.write_text(_set_logger(svc, text, instances=2))
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, svc)
            assert _wait_for(lambda: _logger_starts(demo_copy) == ["1.0.0"] * 2, timeout=10)
            assert time.monotonic() - t0 < 2.0
            time.sleep(0.5)
            # and the watch survives the rename: the next atomic save is seen as well
            t0 = time.monotonic()
            tmp.write_text(_set_logger(svc, text, instances=1, version="1.1.0"))
            os.replace(tmp, svc)
            assert _wait_for(lambda: _logger_starts(demo_copy) == ["1.1.0"], timeout=10)
            assert time.monotonic() - t0 < 2.0
        assert "changed: logger.yaml" in w.stderr

    def test_a_burst_of_50_edits_ends_in_a_plan_of_the_last(self, demo_copy: Path) -> None:
        svc = demo_copy / "desired" / "apps" / "logger.yaml"
        text = svc.read_text()
        with watching(demo_copy) as w:
            assert _started(demo_copy)
            for i in range(50):  # as fast as the disk takes them: 1.0.0 ... 1.0.49
                svc.write_text(_set_logger(svc, text, instances=1 + i % 3, version=f"1.0.{i}"))
            # the last edit: 49 % 3 == 1, so two instances of 1.0.49
            last = ["1.0.49", "1.0.49"]
            assert _wait_for(lambda: _logger_starts(demo_copy) == last, timeout=15)
            time.sleep(1.5)  # no late run of an older version overwrites it
            assert _logger_starts(demo_copy) == last
        runs = w.stderr.count("changed: logger.yaml")
        assert 1 <= runs <= 10, w.stderr  # debounced: a handful of runs, not fifty

    def test_own_outputs_do_not_wake_the_watcher(self, demo_copy: Path) -> None:
        accept = input_filter(demo_copy)
        from watchfiles import Change

        assert accept(Change.modified, str(demo_copy / "desired" / "a.yaml"))
        assert accept(Change.added, str(demo_copy / "nodes" / "n.yaml"))
        assert not accept(Change.modified, str(demo_copy / "out" / "plan.json"))
        assert not accept(Change.modified, str(demo_copy / "checkpoint" / "allocations.json"))
        assert not accept(Change.modified, str(demo_copy / ".lock"))
        assert not accept(Change.added, str(demo_copy / "desired" / ".a.yaml.swp"))

    def test_periodic_resync_without_events(self, demo_copy: Path) -> None:
        runs: list[ReconcileReport | None] = []
        stop = threading.Event()

        def on_run(report: ReconcileReport | None) -> None:
            runs.append(report)
            if len(runs) >= 3:
                stop.set()

        t = threading.Thread(
            target=watch_loop,
            args=(demo_copy, ReconcileOptions(), WatchOptions(debounce=0.05, resync=0.2)),
            kwargs={"stop": stop, "on_run": on_run},
        )
        t.start()
        t.join(timeout=30)
        assert not t.is_alive()
        assert len(runs) >= 3 and all(r is not None for r in runs)
        assert all(r is not None and r.written == () for r in runs[1:])  # nothing changed


class TestWatcherStarts:
    def test_an_edit_made_while_the_watcher_starts_is_not_lost(
        self, demo_copy: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
    ) -> None:
        """An edit after the first run read the inputs and before the watcher's inotify
        watches exist produces no event: the loop checks the inputs once the watcher runs."""
        import watchfiles

        real = watchfiles.watch
        svc = demo_copy / "desired" / "apps" / "logger.yaml"
        edited_at: list[float] = []

        def late(*args: Any, **kwargs: Any) -> Iterator[set[tuple[watchfiles.Change, str]]]:
            if not edited_at:  # in the gap, before the watcher exists
                svc.write_text(svc.read_text().replace("instances: 3", "instances: 1"))
                edited_at.append(time.monotonic())
            return real(*args, **kwargs)

        monkeypatch.setattr(watchfiles, "watch", late)
        stop = threading.Event()
        t = threading.Thread(
            target=watch_loop,
            args=(demo_copy, ReconcileOptions(), WatchOptions(resync=60)),
            kwargs={"stop": stop},
        )
        caplog.set_level("INFO", logger="reconciler.watch")
        t.start()
        try:
            assert _wait_for(lambda: _logger_starts(demo_copy) == ["1.0.0"], timeout=10)
            assert time.monotonic() - edited_at[0] < 2.0
        finally:
            stop.set()
            t.join(timeout=30)
        assert not t.is_alive()
        assert "changed while the watcher started" in caplog.text

    def test_a_failed_watcher_is_followed_by_a_resync_and_a_new_watcher(
        self, demo_copy: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
    ) -> None:
        import watchfiles

        real = watchfiles.watch
        calls = 0

        def flaky(*args: Any, **kwargs: Any) -> Iterator[set[tuple[watchfiles.Change, str]]]:
            nonlocal calls
            calls += 1
            if calls == 1:

                def broken() -> Iterator[set[tuple[watchfiles.Change, str]]]:
                    raise RuntimeError("error in underlying watcher: event queue overflow")
                    yield set()  # pragma: no cover

                return broken()
            return real(*args, **kwargs)

        monkeypatch.setattr(watchfiles, "watch", flaky)
        svc = demo_copy / "desired" / "apps" / "logger.yaml"
        runs: list[ReconcileReport | None] = []
        stop = threading.Event()
        t = threading.Thread(
            target=watch_loop,
            args=(demo_copy, ReconcileOptions(), WatchOptions(debounce=0.05, resync=60)),
            kwargs={"stop": stop, "on_run": runs.append},
        )
        caplog.set_level("INFO", logger="reconciler.watch")
        t.start()
        try:
            assert _wait_for(lambda: len(runs) >= 2)  # the start, then the resync at once
            assert _wait_for(lambda: calls >= 2)
            time.sleep(1.0)
            svc.write_text(svc.read_text().replace("instances: 3", "instances: 1"))
            assert _wait_for(lambda: _logger_starts(demo_copy) == ["1.0.0"])  # the new watcher
        finally:
            stop.set()
            t.join(timeout=30)
        assert not t.is_alive() and all(r is not None for r in runs)
        text = caplog.text
        assert "the file watcher failed" in text and "resync after a watcher error" in text
        assert "changed: logger.yaml" in text


class TestReconcileBesideWatch:
    """`reconcile` in a loop beside `watch` on the same state directory: every write to out/
    and checkpoint/ is made by the thread that holds the flock on DIR/.lock at that moment, so
    the two never interleave, and the final outputs are those of a single clean run."""

    def test_writes_never_interleave_and_the_result_is_a_clean_runs(
        self, demo_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        guarded = (str(demo_copy / "out"), str(demo_copy / "checkpoint"))
        state_lock = threading.Lock()
        holder: list[int | None] = [None]
        intervals: list[tuple[int, float, float]] = []
        writes: dict[int, int] = {}
        violations: list[str] = []

        class RecordingLock(StateLock):
            def __enter__(self) -> RecordingLock:
                super().__enter__()
                with state_lock:
                    if holder[0] is not None:
                        violations.append(f"{threading.get_ident()} and {holder[0]} hold the lock")
                    holder[0] = threading.get_ident()
                self._since = time.monotonic()
                return self

            def __exit__(self, *exc: Any) -> None:
                with state_lock:
                    if holder[0] == threading.get_ident():
                        holder[0] = None
                    intervals.append((threading.get_ident(), self._since, time.monotonic()))
                super().__exit__(*exc)

        def check(op: str, path: Any) -> None:
            if not str(path).startswith(guarded):
                return
            me = threading.get_ident()
            with state_lock:
                writes[me] = writes.get(me, 0) + 1
                if holder[0] != me:
                    violations.append(f"{op} {path} by {me} while {holder[0]} held the lock")

        real_replace, real_unlink, real_open = os.replace, os.unlink, os.open

        def replace(src: Any, dst: Any, **kw: Any) -> None:
            check("rename", dst)
            real_replace(src, dst, **kw)

        def unlink(path: Any, **kw: Any) -> None:
            check("unlink", path)
            real_unlink(path, **kw)

        def open_(path: Any, flags: int, *args: Any, **kw: Any) -> int:
            if flags & os.O_CREAT and not str(path).endswith(".lock"):
                check("create", path)
            return real_open(path, flags, *args, **kw)

        monkeypatch.setattr(reconcile_module, "StateLock", RecordingLock)
        monkeypatch.setattr(os, "replace", replace)
        monkeypatch.setattr(os, "unlink", unlink)
        monkeypatch.setattr(os, "open", open_)

        svc = demo_copy / "desired" / "apps" / "logger.yaml"
        text = svc.read_text()
        stop = threading.Event()
        watch_runs: list[ReconcileReport | None] = []
        watcher = threading.Thread(
            target=watch_loop,
            args=(demo_copy, ReconcileOptions(), WatchOptions(debounce=0.05, resync=0.5)),
            kwargs={"stop": stop, "on_run": watch_runs.append},
        )
        watcher.start()
        try:
            # the watcher's first run reads every input before the edits start: a first-ever
            # read of logger.yaml in the middle of a rewrite would find it invalid, and a unit
            # that never had the item gives the gids out in another order (history, not a bug)
            started = time.monotonic()
            while not watch_runs and time.monotonic() - started < 20:
                time.sleep(0.01)
            assert watch_runs, "the watcher's first run did not finish"
            loop_runs = 0
            deadline = time.monotonic() + 4.0
            i = 0
            while time.monotonic() < deadline or loop_runs < 10:
                i += 1
                svc.write_text(_set_logger(svc, text, instances=1 + i % 3, version=f"1.0.{i}"))
                reconcile(demo_copy)
                loop_runs += 1
            final = _set_logger(svc, text, instances=2, version="2.0.0")
            svc.write_text(final)
            reconcile(demo_copy)
            time.sleep(1.0)  # let the watcher see the last edit and the resync timer fire
        finally:
            stop.set()
            watcher.join(timeout=30)
        assert not watcher.is_alive()
        assert violations == []
        assert all(r is not None for r in watch_runs)  # never a failed run (no lock timeout)
        # both writers really wrote, and really took turns
        watch_thread = watcher.ident
        assert watch_thread is not None
        assert writes.get(watch_thread, 0) > 0 and writes.get(threading.get_ident(), 0) > 0
        ordered = sorted(intervals, key=lambda t: t[1])
        for (_, _, end), (_, start, _) in itertools.pairwise(ordered):
            assert end <= start  # lock intervals never overlap
        monkeypatch.undo()

        # converged: one more run writes nothing ...
        assert reconcile(demo_copy).written == ()
        # ... and out/ is what a single clean run of the same inputs writes
        clean = tmp_path / "clean"
        shutil.copytree(
            demo_copy, clean, ignore=shutil.ignore_patterns("out", "checkpoint", ".lock")
        )
        first = reconcile(clean)
        assert first.computed.checkpoint.generation == 1
        assert _outputs(demo_copy) == _outputs(clean)
        assert _logger_starts(demo_copy) == ["2.0.0", "2.0.0"]


def _outputs(state: Path) -> dict[str, Any]:
    """out/, with the plan's fingerprint left out: it covers the checkpoint generation, which
    counts the runs that changed the allocations (SPEC §10), so it differs by history."""
    out: dict[str, Any] = {}
    for p in sorted((state / "out").rglob("*")):
        if p.is_file():
            rel = str(p.relative_to(state / "out"))
            out[rel] = json.loads(p.read_bytes()) if p.suffix == ".json" else p.read_bytes()
    del out["plan.json"]["inputs"]["fingerprint"]
    out["status.html"] = without_made_time(out["status.html"])  # made at another time
    return out


def _analyze() -> str:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    return analyze


def _binary() -> str:
    binary = shutil.which("reconciler") or str(Path(sys.executable).parent / "reconciler")
    assert Path(binary).exists()
    return binary


def _installed_units(directory: Path) -> Path:
    """The units with ExecStart pointing at this checkout's binary (verify checks that
    ExecStart exists)."""
    for name in UNITS:
        text = (ROOT / "systemd" / name).read_text()
        (directory / name).write_text(text.replace("/usr/local/bin/reconciler", _binary()))
    return directory


def _settings(unit: str) -> dict[str, list[str]]:
    """KEY -> values, in order, of a unit file (comments and sections dropped)."""
    out: dict[str, list[str]] = {}
    for line in (ROOT / "systemd" / unit).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        out.setdefault(key.strip(), []).append(value.strip())
    return out


def _state_dir_of(unit: str) -> str:
    argv = shlex.split(_settings(unit)["ExecStart"][0])
    return argv[argv.index("--state") + 1]


class TestSystemdUnits:
    def test_units_verify_cleanly(self, tmp_path: Path) -> None:
        analyze = _analyze()
        _installed_units(tmp_path)
        proc = subprocess.run(
            [analyze, "verify", *UNITS], cwd=tmp_path, capture_output=True, text=True, check=False
        )
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr

    @pytest.mark.parametrize(
        "unit", ["reconciler.service", "reconciler-watch.service", "reconciler-etcd@.service"]
    )
    def test_security_exposure_is_at_most_2(self, tmp_path: Path, unit: str) -> None:
        analyze = _analyze()
        _installed_units(tmp_path)
        # --threshold is on the 0-100 scale of the internal score: 20 is an exposure of 2.0,
        # above which systemd-analyze exits non-zero
        proc = subprocess.run(
            [analyze, "security", "--offline=true", "--threshold=20", str(tmp_path / unit)],
            capture_output=True,
            text=True,
            check=False,
        )
        named = unit.replace("@.", "@i.")  # a template is analyzed as its instance "i"
        found = re.search(
            rf"Overall exposure level for {re.escape(named)}: (\d+\.\d+)", proc.stdout
        )
        assert found, proc.stdout + proc.stderr
        exposure = float(found.group(1))
        assert exposure <= 2.0, proc.stdout
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr

    @pytest.mark.parametrize(
        "unit", ["reconciler.service", "reconciler-watch.service", "reconciler-etcd@.service"]
    )
    def test_the_state_directory_is_writable_under_the_sandbox(self, unit: str) -> None:
        """ProtectSystem=strict makes everything read-only but what ReadWritePaths= (or
        StateDirectory=) names: the --state directory of ExecStart must lie below one."""
        settings = _settings(unit)
        assert settings["ProtectSystem"] == ["strict"]
        state = _state_dir_of(unit)
        writable = [p for v in settings.get("ReadWritePaths", []) for p in v.split()]
        writable += ["/var/lib/" + d for v in settings.get("StateDirectory", []) for d in v.split()]
        writable = [w.lstrip("-") for w in writable]
        assert any(state == w or state.startswith(w.rstrip("/") + "/") for w in writable), (
            state,
            writable,
        )

    def test_reconcile_runs_and_writes_in_an_emulated_sandbox(self, demo_copy: Path) -> None:
        """reconciler.service's ExecStart, as root without any capability
        (CapabilityBoundingSet=), with no_new_privs, UMask=0077 and its Environment=, in a
        mount namespace where every mount is read-only except the state directory (what
        ProtectSystem=strict with ReadWritePaths= leaves): it writes out/ and the checkpoint,
        and nothing else can be written."""
        if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("setpriv")):
            pytest.skip("needs root, unshare and setpriv (util-linux)")
        settings = _settings("reconciler.service")
        assert settings["CapabilityBoundingSet"] == [""]
        assert settings["NoNewPrivileges"] == ["yes"] and settings["UMask"] == ["0077"]
        argv = shlex.split(settings["ExecStart"][0])
        argv[0] = _binary()
        argv[argv.index("--state") + 1] = str(demo_copy)
        env = dict(os.environ)
        for assignment in settings.get("Environment", []):
            key, _, value = assignment.partition("=")
            env[key] = value
        script = r"""
set -e
state=$1; shift
mount --make-rprivate /
mount --bind "$state" "$state"
for m in $(awk '{print $5}' /proc/self/mountinfo | sort -u); do
    case $m in /proc|/proc/*|/sys|/sys/*|/dev|/dev/*) continue;; esac
    [ "$m" = "$state" ] && continue
    mount -o remount,bind,ro "$m" 2>/dev/null || true
done
mount -o remount,bind,rw "$state"
if touch "$state/../outside-the-state-dir" 2>/dev/null; then echo "not read-only"; exit 97; fi
umask 077
exec setpriv --no-new-privs --bounding-set=-all --inh-caps=-all -- "$@"
"""
        proc = subprocess.run(
            ["unshare", "--mount", "sh", "-c", script, "sh", str(demo_copy), *argv],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        if proc.returncode != 0 and "unshare failed" in proc.stderr:
            pytest.skip(f"no mount namespaces here: {proc.stderr.strip()}")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "Plan: 10 to start, 0 to stop; 0 unplaceable." in proc.stdout
        assert not (demo_copy.parent / "outside-the-state-dir").exists()
        plan = demo_copy / "out" / "plan.json"
        assert json.loads(plan.read_text())["changesPresent"] is True
        assert (demo_copy / "checkpoint" / "allocations.json").is_file()
        assert plan.stat().st_mode & 0o777 == 0o600

    @pytest.mark.parametrize("unit", ["reconciler.service", "reconciler-watch.service"])
    def test_every_system_call_of_a_run_passes_the_units_filter(
        self, demo_copy: Path, tmp_path: Path, unit: str
    ) -> None:
        """SystemCallFilter= kills the service with SIGSYS on any other system call: trace a
        real run (for the watcher: start, an edit, SIGTERM) and check each call against the
        sets systemd-analyze expands the unit's filter lines to."""
        analyze = _analyze()
        strace = shutil.which("strace")
        if strace is None:
            pytest.skip("strace is not installed")
        allowed = _syscall_filter(analyze, _settings(unit)["SystemCallFilter"])
        trace = tmp_path / "trace"
        argv = shlex.split(_settings(unit)["ExecStart"][0])
        argv[0] = _binary()
        argv[argv.index("--state") + 1] = str(demo_copy)
        if "--metrics-file" in argv:  # written too, as node-exporter's textfile
            argv[argv.index("--metrics-file") + 1] = str(tmp_path / "reconciler.prom")
        cmd = [strace, "-f", "-qq", "-c", "-o", str(trace), *argv]
        if "watch" in argv:
            proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
            try:
                assert _wait_for(lambda: _logger_starts(demo_copy) == ["1.0.0"] * 3, 60)
                time.sleep(1.0)
                svc = demo_copy / "desired" / "apps" / "logger.yaml"
                svc.write_text(svc.read_text().replace("instances: 3", "instances: 1"))
                assert _wait_for(lambda: _logger_starts(demo_copy) == ["1.0.0"], 30)
            finally:
                children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
                for child in children:
                    os.kill(int(child), signal.SIGTERM)
                _, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
        else:
            run = subprocess.run(cmd, capture_output=True, text=True, check=False)
            assert run.returncode == 0, run.stderr
            if "--metrics-file" in argv:
                assert (tmp_path / "reconciler.prom").is_file(), run.stderr
        used = set()
        for line in trace.read_text().splitlines():
            fields = line.split()
            if (
                fields
                and fields[-1] not in ("syscall", "total")
                and not line.startswith(("%", "-"))
            ):
                used.add(fields[-1])
        assert {"openat", "rename", "fsync"} & used  # the trace is real
        assert sorted(used - allowed) == []


def _syscall_filter(analyze: str, lines: list[str]) -> set[str]:
    """The system calls a unit's SystemCallFilter= lines allow (allow-list minus ~deny-lists)."""
    cache: dict[str, set[str]] = {}

    def expand(name: str) -> set[str]:
        if not name.startswith("@"):
            return {name}
        if name not in cache:
            out = subprocess.run(
                [analyze, "syscall-filter", name], capture_output=True, text=True, check=True
            ).stdout
            calls: set[str] = set()
            for raw in out.splitlines()[1:]:
                item = raw.strip()
                if item and not item.startswith("#"):
                    calls |= expand(item)
            cache[name] = calls
        return cache[name]

    allow: set[str] = set()
    deny: set[str] = set()
    for line in lines:
        if line.startswith("~"):
            for name in line[1:].split():
                deny |= expand(name)
        else:
            for name in line.split():
                allow |= expand(name)
    assert allow, "the unit has no allow-list"
    return allow - deny

    def test_service_is_hardened(self) -> None:
        text = (ROOT / "systemd" / "reconciler.service").read_text()
        for line in (
            "Type=oneshot",
            "NoNewPrivileges=yes",
            "ProtectSystem=strict",
            "ReadWritePaths=/var/lib/reconciler",
            "PrivateTmp=yes",
            "ProtectHome=yes",
            "UMask=0077",
        ):
            assert line in text.splitlines()
        path = (ROOT / "systemd" / "reconciler.path").read_text()
        assert "TriggerLimitBurst=10000" in path.splitlines()
        for d in ("desired", "nodes", "actual"):
            assert f"PathChanged=/var/lib/reconciler/state/{d}" in path.splitlines()
