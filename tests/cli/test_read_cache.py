"""``reconciler explain`` keeps what it computed in the read cache (reconciler.io.readcache):
the next explain of the same inputs reads no file again and balances nothing, and whatever
changed, a cached explain says exactly what an uncached one says. ``plan`` and ``validate``
start their loads from the cached inputs too, with the same guarantee."""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reconciler.accel
from benchmarks.statedir import write_state_dir
from benchmarks.synth import SHAPES
from reconciler.cli.commands import main
from reconciler.controller.configs import default_config_builder
from reconciler.controller.reconcile import ReconcileOptions
from reconciler.controller.watch import WatchOptions, watch_loop
from reconciler.io import fsio, loader, readcache
from reconciler.placement import balancer
from reconciler.placement.instances import expand_instances

SETTINGS = settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Exit code, standard output and standard error (its log lines without their time)."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, re.sub(r"^\d{4}-\d\d-\d\dT[\d:.]+Z ", "", err, flags=re.M)


class Counts:
    """The balances and the parsed files of the commands under test."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.balances = 0
        self.parsed = 0
        real_balance, real_validate = reconciler.accel.balance, loader._validate

        def balance(*args: Any, **kwargs: Any) -> Any:
            self.balances += 1
            return real_balance(*args, **kwargs)

        def validate(*args: Any, **kwargs: Any) -> Any:
            self.parsed += 1
            return real_validate(*args, **kwargs)

        monkeypatch.setattr(reconciler.accel, "balance", balance)
        monkeypatch.setattr(loader, "_validate", validate)

    def reset(self) -> None:
        self.balances = self.parsed = 0


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> Counts:
    return Counts(monkeypatch)


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "cache"
    monkeypatch.setenv(readcache.CACHE_ENV, str(path))
    return path


def _unit(root: Path, capsys: pytest.CaptureFixture[str], shape: str = "homogeneous") -> Path:
    """A small unit of ``shape``, reconciled with the cache off (what these tests see is what
    the read-only commands keep themselves)."""
    write_state_dir(root, 12, 40, seed=3, shape=shape)
    with readcache.disabled():
        assert run(capsys, "reconcile", "--state", str(root))[0] == 0
    return root


@pytest.fixture
def unit(tmp_path: Path, capsys: pytest.CaptureFixture[str], cache_dir: Path) -> Path:
    return _unit(tmp_path / "unit", capsys)


def _uncached(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: str
) -> tuple[int, str, str]:
    with monkeypatch.context() as m:
        m.setenv(readcache.CACHE_ENV, "")  # off
        return run(capsys, *args)


@contextlib.contextmanager
def _replays(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[object]]:
    """The node states replayed in the block: per replay, the nodes it reserved on (a set),
    or None for every node."""
    replayed: list[object] = []
    real = balancer.replay

    def replay(*args: Any, **kwargs: Any) -> Any:
        replayed.append(kwargs.get("only"))
        return real(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(balancer, "replay", replay)
        yield replayed


def _first_label(root: Path) -> str:
    first = sorted((root / "desired").glob("*.yaml"))[0]
    return f"{first.stem}:0"


class TestTheNextExplainStartsWarm:
    @pytest.mark.parametrize("shape", ["homogeneous", "unplaceable-15", "devices", "preemption"])
    @pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
    def test_it_parses_and_balances_nothing_and_says_the_same(
        self,
        tmp_path: Path,
        capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch,
        cache_dir: Path,
        counts: Counts,
        shape: str,
        as_json: bool,
    ) -> None:
        root = _unit(tmp_path / shape, capsys, shape)
        args = (
            "explain",
            _first_label(root),
            "--state",
            str(root),
            *(("--json",) if as_json else ()),
        )
        counts.reset()
        first = run(capsys, *args)
        assert (counts.balances, counts.parsed) == (1, len(list(_inputs(root))))
        counts.reset()
        second = run(capsys, *args)
        assert (counts.balances, counts.parsed) == (0, 0)
        assert first == second == _uncached(capsys, monkeypatch, *args)

    def test_another_instance_of_the_same_inputs_is_not_balanced_again(
        self, unit: Path, capsys: pytest.CaptureFixture[str], counts: Counts
    ) -> None:
        services = sorted((unit / "desired").glob("*.yaml"))
        run(capsys, "explain", f"{services[0].stem}:0", "--state", str(unit))
        counts.reset()
        code, out, _err = run(capsys, "explain", f"{services[1].stem}:0", "--state", str(unit))
        assert code == 0 and services[1].stem in out
        assert (counts.balances, counts.parsed) == (0, 0)

    @pytest.mark.parametrize("shape", ["homogeneous", "unplaceable-15", "devices", "preemption"])
    def test_another_instance_reserves_again_on_its_own_node_only_and_says_the_same(
        self,
        tmp_path: Path,
        capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch,
        cache_dir: Path,
        shape: str,
    ) -> None:
        """The first explain leaves what the balance holds on each node in the cache; the
        next one, of another instance, replays only its own node and the first one's, and
        prints what an uncached explain prints."""
        root = _unit(tmp_path / shape, capsys, shape)
        services = sorted((root / "desired").glob("*.yaml"))
        run(capsys, "explain", f"{services[0].stem}:0", "--state", str(root))
        assert len(list(cache_dir.glob("*/occupancy.pickle"))) == 1
        for service in services[1:4]:
            for extra in ((), ("--json",)):
                args = ("explain", f"{service.stem}:0", "--state", str(root), *extra)
                with _replays(monkeypatch) as replayed:
                    cached = run(capsys, *args)
                assert cached[0] == 0
                # one replay, of at most two nodes (this instance's and the first one's)
                assert len(replayed) == 1 and isinstance(replayed[0], set), args
                assert len(replayed[0]) <= 2
                assert cached == _uncached(capsys, monkeypatch, *args), args

    def test_an_instance_id_is_found_in_the_cached_balance(
        self,
        unit: Path,
        capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch,
        counts: Counts,
    ) -> None:
        """By its id or its label, the same explanation; by id on a warm cache, without
        computing every instance's id."""
        label = _first_label(unit)
        by_label = run(capsys, "explain", label, "--state", str(unit), "--json")
        iid = json.loads(by_label[1])["instanceId"]
        expansions: list[int] = []
        real = expand_instances

        def expand(services: Any) -> Any:
            expansions.append(1)
            return real(services)

        monkeypatch.setattr("reconciler.cli.explainview.expand_instances", expand)
        counts.reset()
        assert run(capsys, "explain", iid, "--state", str(unit), "--json") == by_label
        assert (counts.balances, counts.parsed, expansions) == (0, 0, [])
        with monkeypatch.context() as m:
            m.setenv(readcache.CACHE_ENV, "")
            assert run(capsys, "explain", iid, "--state", str(unit), "--json") == by_label

    def test_an_item_is_explained_from_the_same_balance(
        self, unit: Path, capsys: pytest.CaptureFixture[str], counts: Counts
    ) -> None:
        item = sorted((unit / "desired").glob("*.yaml"))[2].stem
        run(capsys, "explain", _first_label(unit), "--state", str(unit))
        counts.reset()
        code, out, _err = run(capsys, "explain", item, "--state", str(unit))
        assert code == 0 and f"{item}:default:0" in out
        assert (counts.balances, counts.parsed) == (0, 0)

    def test_settled_files_are_only_stat_ed(
        self,
        unit: Path,
        capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch,
        counts: Counts,
    ) -> None:
        """With every file quiet long enough (the racy window shrunk to nothing), the second
        load trusts the stat keys: no file is even read."""
        monkeypatch.setattr(fsio, "RACY_WINDOW_NS", 0)
        args = ("explain", _first_label(unit), "--state", str(unit))
        run(capsys, *args)
        reads: list[object] = []
        real = fsio.read_bytes_at

        def reading(*a: Any, **kw: Any) -> Any:
            reads.append(a[0])
            return real(*a, **kw)

        monkeypatch.setattr(loader, "read_bytes_at", reading)
        run(capsys, *args)
        assert reads == []


class TestTheControllerLeavesItsRunThere:
    """``reconcile`` and ``watch`` leave what they loaded and balanced in the read cache
    (reconciler.controller.explaincache): the first explain after them parses and balances
    nothing, and says exactly what an uncached explain says."""

    @pytest.mark.parametrize("shape", SHAPES)
    def test_the_first_explain_after_a_reconcile_starts_warm(
        self,
        tmp_path: Path,
        capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch,
        cache_dir: Path,
        counts: Counts,
        shape: str,
    ) -> None:
        root = _unit(tmp_path / shape, capsys, shape)
        assert run(capsys, "validate", "--state", str(root))[0] == 0  # (its cache made)
        services = sorted((root / "desired").glob("*.yaml"))
        count = yaml.safe_load(services[0].read_text())["instances"]
        _edit_yaml(services[0], _set(("instances",), count + 1))  # (and a new checkpoint)
        assert run(capsys, "reconcile", "--state", str(root))[0] == 0
        assert len(list(cache_dir.glob("*/occupancy.pickle"))) == 1
        for target in (_first_label(root), f"{services[-1].stem}:0", services[1].stem):
            for extra in ((), ("--json",)):
                args = ("explain", target, "--state", str(root), *extra)
                counts.reset()
                with _replays(monkeypatch) as replayed:
                    cached = run(capsys, *args)
                assert (counts.balances, counts.parsed) == (0, 0), (target, extra)
                # an instance: reserved again on its own node only (an item: no matrix)
                assert all(isinstance(o, set) and len(o) <= 1 for o in replayed), replayed
                assert cached == _uncached(capsys, monkeypatch, *args), (target, extra)

    def test_a_state_directory_no_command_read_gets_no_cache(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], cache_dir: Path
    ) -> None:
        """A unit no one explains does not pay for pickling its inputs on every run."""
        root = tmp_path / "unit"
        write_state_dir(root, 12, 40, seed=3)
        assert run(capsys, "reconcile", "--state", str(root))[0] == 0
        assert not cache_dir.exists() or list(cache_dir.iterdir()) == []
        assert run(capsys, "validate", "--state", str(root))[0] == 0
        assert len(list(cache_dir.glob("*/view.pickle"))) == 1
        assert not list(cache_dir.glob("*/balance.pickle"))
        _edit_yaml(sorted((root / "desired").glob("*.yaml"))[0], _set(("instances",), 5))
        assert run(capsys, "reconcile", "--state", str(root))[0] == 0
        assert list(cache_dir.glob("*/balance.pickle"))  # from then on, each run kept there

    def test_a_rebalance_leaves_the_inputs_only(
        self,
        tmp_path: Path,
        capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch,
        cache_dir: Path,
        counts: Counts,
    ) -> None:
        """A rebalance balanced in a mode explain cannot ask for: its result is not the
        balance explain computes."""
        root = _unit(tmp_path / "unit", capsys, "preemption")
        assert run(capsys, "validate", "--state", str(root))[0] == 0  # (its cache made)
        assert run(capsys, "rebalance", "--state", str(root))[0] == 0
        args = ("explain", _first_label(root), "--state", str(root), "--json")
        counts.reset()
        cached = run(capsys, *args)
        assert (counts.balances, counts.parsed) == (1, 0)
        assert cached == _uncached(capsys, monkeypatch, *args)

    def test_a_placement_taken_out_after_the_balance_leaves_the_inputs_only(
        self,
        demo_copy: Path,
        capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch,
        cache_dir: Path,
        counts: Counts,
    ) -> None:
        """A config that cannot be built takes its instance out after the balance: the
        checkpoint does not hold that placement, so the run's result is not what explain
        computes from it (here the instance is placed again, and fails again)."""
        res = demo_copy / "resources" / "edge-1.json"
        res.write_text(res.read_text().replace('"groups": ["video"]', '"groups": ["no-group-x"]'))
        assert run(capsys, "validate", "--state", str(demo_copy))[0] == 0  # (its cache made)
        assert run(capsys, "reconcile", "--state", str(demo_copy))[0] == 0
        balances = []
        for target in ("com.example.nav:0", "com.example.logger:1"):
            args = ("explain", target, "--state", str(demo_copy), "--json")
            counts.reset()
            cached = run(capsys, *args)
            balances.append(counts.balances)
            assert cached == _uncached(capsys, monkeypatch, *args), target
        assert balances == [1, 0]  # (the first explain balanced, and kept it)

    def test_the_watcher_leaves_its_run_once_the_unit_is_quiet(
        self,
        demo_copy: Path,
        capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch,
        cache_dir: Path,
        counts: Counts,
    ) -> None:
        def kept() -> bool:
            return any(cache_dir.glob("*/balance.pickle"))

        def watch(idle: float, wait: float) -> bool:
            """Whether a watcher kept its first run within ``wait`` seconds of its plan."""
            stop = threading.Event()
            opts = ReconcileOptions(configs=default_config_builder())
            wopts = WatchOptions(debounce=0.05, resync=3600.0, explain_idle=idle)
            thread = threading.Thread(target=watch_loop, args=(demo_copy, opts, wopts, stop))
            thread.start()
            try:
                plan = demo_copy / "out" / "plan.json"
                deadline = time.monotonic() + 20
                while not plan.exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert plan.exists()
                deadline = time.monotonic() + wait
                while not kept() and time.monotonic() < deadline:
                    time.sleep(0.05)
                return kept()
            finally:
                stop.set()
                thread.join(20)

        assert run(capsys, "validate", "--state", str(demo_copy))[0] == 0  # (its cache made)
        # its idle ticks come every 0.5 s: after 1.5 s, not before the quiet time has passed
        assert not watch(3600.0, 1.5)
        assert watch(0.0, 20)
        args = ("explain", "com.example.logger:2", "--state", str(demo_copy), "--json")
        counts.reset()
        cached = run(capsys, *args)
        assert counts.balances == 0
        assert cached == _uncached(capsys, monkeypatch, *args)


def _inputs(root: Path) -> list[Path]:
    files = [p for d in ("desired", "nodes", "actual") for p in (root / d).rglob("*.yaml")]
    return [*files, root / "unit.yaml"]


def _edit_yaml(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Change a document; one made invalid earlier stays as it is."""
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        return
    change(doc)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def _set(path: tuple[str, ...], value: object) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        at = doc
        for key in path[:-1]:
            at = at.setdefault(key, {})
        at[path[-1]] = value

    return change


def _edit(
    root: Path, capsys: pytest.CaptureFixture[str], kind: str, which: int, value: int
) -> None:
    """One edit of the random sequences: a service's CPU quota or instance count, a node's
    DMIPS, a service removed or made invalid, or a reconcile (a new checkpoint)."""
    services = sorted((root / "desired").glob("*.yaml"))
    nodes = sorted((root / "nodes").glob("*.yaml"))
    service = services[which % len(services)] if services else None
    if kind == "cpu" and service is not None:
        _edit_yaml(service, _set(("quotas", "cpuDMIPSLimit"), 700 * value))
    elif kind == "instances" and service is not None:
        _edit_yaml(service, _set(("instances",), value))
    elif kind == "node":
        _edit_yaml(nodes[which % len(nodes)], _set(("maxDMIPS",), 1000 * value))
    elif kind == "remove" and service is not None:
        service.unlink()
    elif kind == "invalid" and service is not None:
        service.write_text("kind: Service\nid: [\n")
    elif kind == "reconcile":
        run(capsys, "reconcile", "--state", str(root))  # a new checkpoint


class TestWhateverChangedItSaysWhatAnUncachedExplainSays:
    @SETTINGS
    @given(
        edits=st.lists(
            st.tuples(
                st.sampled_from(
                    ["cpu", "instances", "node", "remove", "invalid", "reconcile", "fresh"]
                ),
                st.integers(0, 11),
                st.integers(1, 4),
            ),
            min_size=1,
            max_size=5,
        ),
        as_json=st.booleans(),
    )
    def test_along_random_edits(
        self,
        tmp_path_factory: pytest.TempPathFactory,
        capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch,
        edits: list[tuple[str, int, int]],
        as_json: bool,
    ) -> None:
        base = tmp_path_factory.mktemp("edits")
        monkeypatch.setenv(readcache.CACHE_ENV, str(base / "cache"))
        root = _unit(base / "unit", capsys, "unplaceable-15")
        label = _first_label(root)
        extra = ("--json",) if as_json else ()
        for kind, which, value in edits:
            _edit(root, capsys, kind, which, value)
            services = sorted((root / "desired").glob("*.yaml"))
            mode = ("--mode", "fresh") if kind == "fresh" else ()
            for target in (label, services[-1].stem if services else label):
                args = ("explain", target, "--state", str(root), *mode, *extra)
                cached = run(capsys, *args)
                assert cached == _uncached(capsys, monkeypatch, *args), (kind, target)


class TestTheBalanceKey:
    def test_a_node_going_stale_is_a_new_balance(
        self,
        unit: Path,
        capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch,
        counts: Counts,
    ) -> None:
        """Time enters explain through the stale marks: the same files, an hour later, are
        explained against a node that has gone stale (and say why)."""
        node = sorted((unit / "nodes").glob("*.yaml"))[0]
        reported = datetime(2026, 1, 1, tzinfo=UTC)
        _edit_yaml(node, _set(("reportedAt",), reported.isoformat()))
        args = ("explain", _first_label(unit), "--state", str(unit), "--json")
        monkeypatch.setattr("time.time", lambda: reported.timestamp() + 1)
        fresh = run(capsys, *args)
        counts.reset()
        monkeypatch.setattr("time.time", lambda: reported.timestamp() + 3600)
        later = run(capsys, *args)
        assert counts.balances == 1
        assert later == _uncached(capsys, monkeypatch, *args)
        rows = {r["nodeId"]: r for r in json.loads(later[1])["nodes"]}
        assert rows[node.stem]["filters"]["NodeState"]["pass"] is False
        assert fresh != later

    def test_the_mode_is_part_of_it(
        self, unit: Path, capsys: pytest.CaptureFixture[str], counts: Counts
    ) -> None:
        args = ("explain", _first_label(unit), "--state", str(unit))
        run(capsys, *args)
        counts.reset()
        run(capsys, *args, "--mode", "fresh")
        assert counts.balances == 1

    def test_a_new_checkpoint_is_a_new_balance(
        self,
        unit: Path,
        capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch,
        counts: Counts,
    ) -> None:
        """The previous allocations come from the checkpoint: another checkpoint (here the
        current generation gone, so the previous one is read) is another balance."""
        args = ("explain", _first_label(unit), "--state", str(unit))
        run(capsys, *args)
        (unit / "checkpoint" / "allocations.json").unlink()
        counts.reset()
        after = run(capsys, *args)
        assert (counts.balances, counts.parsed) == (1, 0)
        assert after == _uncached(capsys, monkeypatch, *args)


def _computed_again(
    unit: Path,
    capsys: pytest.CaptureFixture[str],
    counts: Counts,
    spoil: Callable[[], None],
    *,
    parsed: bool = True,
) -> None:
    """An explain, ``spoil`` (the cache), and the same explain again: the same output,
    balanced again (and every input parsed again when ``parsed``)."""
    args = ("explain", _first_label(unit), "--state", str(unit))
    first = run(capsys, *args)
    spoil()
    counts.reset()
    assert run(capsys, *args) == first
    assert counts.balances == 1
    if parsed:
        assert counts.parsed == len(_inputs(unit))


class TestNothingInTheCacheIsNeeded:
    def test_a_torn_or_altered_file_is_computed_again(
        self, unit: Path, capsys: pytest.CaptureFixture[str], cache_dir: Path, counts: Counts
    ) -> None:
        def alter() -> None:
            for kind in ("view", "balance"):
                (path,) = cache_dir.glob(f"*/{kind}.pickle")
                data = bytearray(path.read_bytes())
                data[-10] ^= 0xFF
                path.write_bytes(bytes(data))

        _computed_again(unit, capsys, counts, alter)

    def test_another_version_of_the_code_is_not_read(
        self,
        unit: Path,
        capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch,
        counts: Counts,
    ) -> None:
        def upgrade() -> None:
            monkeypatch.setattr(readcache, "code_version", lambda: "another version")

        _computed_again(unit, capsys, counts, upgrade)

    def test_a_cache_others_can_write_is_not_used(
        self, unit: Path, capsys: pytest.CaptureFixture[str], cache_dir: Path, counts: Counts
    ) -> None:
        def open_up() -> None:
            (entry,) = cache_dir.iterdir()
            entry.chmod(0o777)

        _computed_again(unit, capsys, counts, open_up)
        assert readcache.open_cache(unit) is None

    @pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")
    def test_a_file_of_another_user_is_not_read(
        self, unit: Path, capsys: pytest.CaptureFixture[str], cache_dir: Path, counts: Counts
    ) -> None:
        def give_away() -> None:
            for path in cache_dir.glob("*/*.pickle"):
                os.chown(path, 65534, 65534)

        _computed_again(unit, capsys, counts, give_away)

    def test_an_empty_setting_turns_it_off(
        self,
        unit: Path,
        capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path,
        counts: Counts,
    ) -> None:
        monkeypatch.setenv(readcache.CACHE_ENV, "")
        args = ("explain", _first_label(unit), "--state", str(unit))
        run(capsys, *args)
        counts.reset()
        run(capsys, *args)
        assert counts.balances == 1
        assert readcache.open_cache(unit) is None

    def test_an_invalid_file_is_not_kept_from_the_cache(
        self, unit: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A load from the cached view would keep the cached version of a file that is invalid
        now; an uncached load does not have it: the cached explain says what the uncached one
        says (the service is gone and named in the error)."""
        services = sorted((unit / "desired").glob("*.yaml"))
        args = ("explain", f"{services[1].stem}:0", "--state", str(unit))
        run(capsys, *args)
        services[1].write_text("kind: Service\nid: [\n")
        cached = run(capsys, *args)
        assert cached == _uncached(capsys, monkeypatch, *args)
        assert cached[0] == 1 and services[1].name in cached[2]


class TestWhereItLives:
    def test_the_default_is_the_users_cache_directory(self, tmp_path: Path) -> None:
        got = readcache.open_cache(tmp_path, {"HOME": str(tmp_path / "home")})
        assert got is not None and got.directory.parent == tmp_path / "home/.cache/reconciler"
        got = readcache.open_cache(tmp_path, {"XDG_CACHE_HOME": str(tmp_path / "xdg")})
        assert got is not None and got.directory.parent == tmp_path / "xdg/reconciler"
        assert readcache.open_cache(tmp_path, {}) is None  # no home: no cache
        assert oct(got.directory.stat().st_mode & 0o777) == oct(0o700)

    def test_only_the_most_recently_used_state_directories_are_kept(self, tmp_path: Path) -> None:
        env = {readcache.CACHE_ENV: str(tmp_path / "cache")}
        made = []
        for k in range(readcache.KEEP + 3):
            cache = readcache.open_cache(tmp_path / f"state{k}", env)
            assert cache is not None
            os.utime(cache.directory, ns=(k * 10**9, k * 10**9))
            made.append(cache)
        made[0].put("view", "k", {"some": "value"})  # used last
        left = {p.name for p in (tmp_path / "cache").iterdir()}
        assert len(left) == readcache.KEEP
        assert made[0].directory.name in left
        assert not {c.directory.name for c in made[1:4]} & left  # the three oldest
        assert made[0].get("view", "k") == {"some": "value"}
        assert made[0].get("view", "another key") is None


class TestPlanAndValidateStartFromTheCachedInputs:
    @pytest.mark.parametrize("command", [("plan", "--recompute"), ("validate",)])
    def test_the_second_one_parses_nothing_and_says_the_same(
        self,
        unit: Path,
        capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch,
        counts: Counts,
        command: tuple[str, ...],
    ) -> None:
        args = (*command, "--state", str(unit), "--json")
        first = run(capsys, *args)
        counts.reset()
        second = run(capsys, *args)
        assert counts.parsed == 0
        assert first == second == _uncached(capsys, monkeypatch, *args)

    def test_an_invalid_file_keeps_the_controllers_last_good_version_not_the_cached_one(
        self,
        unit: Path,
        capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """The cache saw an edit the controller never reconciled; then the file breaks. With
        --allow-invalid the plan keeps the version the controller last saw, as uncached."""
        service = sorted((unit / "desired").glob("*.yaml"))[0]
        reconciled = yaml.safe_load(service.read_text())["instances"]
        _edit_yaml(service, _set(("instances",), reconciled + 2))
        run(capsys, "plan", "--state", str(unit), "--json")  # (caches the edited version)
        service.write_text("kind: Service\nid: [\n")
        args = ("plan", "--state", str(unit), "--json", "--allow-invalid")
        cached = run(capsys, *args)
        assert cached == _uncached(capsys, monkeypatch, *args)
        starts = [a for a in json.loads(cached[1])["actions"] if a["itemId"] == service.stem]
        assert len(starts) == reconciled  # (no agent ran: the reconciled version's starts)

    def test_validate_then_explain_reads_no_file_again(
        self, unit: Path, capsys: pytest.CaptureFixture[str], counts: Counts
    ) -> None:
        run(capsys, "validate", "--state", str(unit))
        counts.reset()
        run(capsys, "explain", _first_label(unit), "--state", str(unit))
        assert counts.parsed == 0

    @SETTINGS
    @given(
        edits=st.lists(
            st.tuples(
                st.sampled_from(["cpu", "instances", "node", "remove", "invalid", "reconcile"]),
                st.integers(0, 11),
                st.integers(1, 4),
            ),
            min_size=1,
            max_size=5,
        ),
        as_json=st.booleans(),
        allow_invalid=st.booleans(),
    )
    def test_along_random_edits_plan_and_validate_say_what_uncached_ones_say(
        self,
        tmp_path_factory: pytest.TempPathFactory,
        capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch,
        edits: list[tuple[str, int, int]],
        as_json: bool,
        allow_invalid: bool,
    ) -> None:
        """An invalid file keeps its last good version from the checkpoint with
        --allow-invalid, never the cached one."""
        base = tmp_path_factory.mktemp("plan-edits")
        monkeypatch.setenv(readcache.CACHE_ENV, str(base / "cache"))
        root = _unit(base / "unit", capsys, "unplaceable-15")
        extra = (
            *(("--json",) if as_json else ()),
            *(("--allow-invalid",) if allow_invalid else ()),
        )
        for kind, which, value in edits:
            _edit(root, capsys, kind, which, value)
            for args in (
                ("plan", "--state", str(root), *extra),
                ("validate", "--state", str(root), *(("--json",) if as_json else ())),
            ):
                cached = run(capsys, *args)
                assert cached == _uncached(capsys, monkeypatch, *args), (kind, args)
