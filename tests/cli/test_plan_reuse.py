"""``reconciler plan`` shows the controller's own plan when nothing it depends on has changed
(out/plan.basis.json), and computes it whenever anything has: the same bytes either way."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from benchmarks.statedir import bump_instances, write_state_dir
from benchmarks.synth import SHAPES
from reconciler.cli.commands import main
from reconciler.controller import reconcile as reconcile_module
from reconciler.controller.planbasis import BASIS_FILE
from reconciler.io.checkpoint_files import DELTA, CheckpointFiles
from reconciler.io.loader import input_hash_of, load_state, resources_files


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(list(args))
    out, _err = capsys.readouterr()
    return code, out


class Computations:
    """Counts the plans computed (``compute_once`` calls) by the command under test."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = reconcile_module.compute_once

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(reconcile_module, "compute_once", counted)


@pytest.fixture
def computations(monkeypatch: pytest.MonkeyPatch) -> Computations:
    return Computations(monkeypatch)


def _unit(root: Path, capsys: pytest.CaptureFixture[str], shape: str = "homogeneous") -> Path:
    write_state_dir(root, 40, 160, seed=2, shape=shape)
    assert run(capsys, "reconcile", "--state", str(root))[0] == 0
    return root


@pytest.fixture
def unit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """40 nodes, 160 instances (more than the placements table shows), reconciled."""
    return _unit(tmp_path / "unit", capsys)


def _basis(root: Path) -> dict[str, Any]:
    got: dict[str, Any] = json.loads((root / "out" / BASIS_FILE).read_text())
    return got


def _both(
    capsys: pytest.CaptureFixture[str], computations: Computations, root: Path, *args: str
) -> tuple[tuple[int, str], tuple[int, str], int]:
    """The command without and with --recompute, and how many plans the first computed."""
    before = computations.count
    shown = run(capsys, "plan", "--state", str(root), *args)
    computed_by_first = computations.count - before
    computed = run(capsys, "plan", "--state", str(root), "--recompute", *args)
    assert computations.count == before + computed_by_first + 1  # --recompute computes
    return shown, computed, computed_by_first


class TestShownAsItIs:
    @pytest.mark.parametrize("shape", SHAPES)
    @pytest.mark.parametrize("as_json", [True, False], ids=["json", "text"])
    def test_after_a_reconcile_every_shape_is_shown_without_computing_and_equals_a_computation(
        self,
        tmp_path: Path,
        capsys: pytest.CaptureFixture[str],
        computations: Computations,
        shape: str,
        as_json: bool,
    ) -> None:
        root = _unit(tmp_path / shape, capsys, shape)
        assert _basis(root)["reusable"] is True
        args = ("--json",) if as_json else ()
        shown, computed, n = _both(capsys, computations, root, *args)
        assert n == 0
        assert shown == computed
        if as_json:
            assert shown[1].encode() == (root / "out" / "plan.json").read_bytes()

    def test_the_exit_code_says_changes_and_unplaceable_as_a_computation_does(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], computations: Computations
    ) -> None:
        root = _unit(tmp_path / "u", capsys, "unplaceable-15")
        shown, computed, n = _both(capsys, computations, root)
        assert n == 0 and shown[0] == computed[0] == 3
        assert "Unplaceable" in shown[1]

    def test_a_file_touched_but_not_changed_is_still_the_same_input(
        self, unit: Path, capsys: pytest.CaptureFixture[str], computations: Computations
    ) -> None:
        some = next((unit / "desired").rglob("*.yaml"))
        os.utime(some, (1, 1))
        assert _both(capsys, computations, unit)[2] == 0


class TestComputedWhenAnythingChanged:
    def test_an_edited_input_file(
        self, unit: Path, capsys: pytest.CaptureFixture[str], computations: Computations
    ) -> None:
        service = sorted((unit / "desired").rglob("*.yaml"))[0]
        text = service.read_text()
        assert "instances: " in text
        service.write_text(text.replace("instances: ", "instances: 1\n#", 1))
        shown, computed, n = _both(capsys, computations, unit)
        assert n == 1 and shown == computed

    def test_an_added_and_a_removed_input_file(
        self, unit: Path, capsys: pytest.CaptureFixture[str], computations: Computations
    ) -> None:
        node = sorted((unit / "nodes").glob("*.yaml"))[-1]
        shutil.copy(node, unit / "nodes" / "zz-extra.yaml.bak")  # not an input: still shown
        assert _both(capsys, computations, unit)[2] == 0
        node.unlink()
        shown, computed, n = _both(capsys, computations, unit)
        assert n == 1 and shown == computed

    def test_another_checkpoint_or_lineage_or_plan_file(
        self, unit: Path, capsys: pytest.CaptureFixture[str], computations: Computations
    ) -> None:
        cp = unit / "checkpoint" / "allocations.json"
        good = cp.read_bytes()
        cp.write_bytes(good.replace(b'"generation":', b'"generation": ', 1))
        assert _both(capsys, computations, unit)[2] == 1
        cp.write_bytes(good)
        assert _both(capsys, computations, unit)[2] == 0
        lineage = unit / "checkpoint" / "LINEAGE"
        lineage.write_text("someone-else\n")
        assert _both(capsys, computations, unit)[2] == 1
        lineage.unlink()  # no lineage file: the checkpoint's own is accepted
        assert _both(capsys, computations, unit)[2] == 0
        plan = unit / "out" / "plan.json"
        plan.write_bytes(plan.read_bytes() + b" ")
        assert _both(capsys, computations, unit)[2] == 1

    def test_another_mode_or_recompute(
        self, unit: Path, capsys: pytest.CaptureFixture[str], computations: Computations
    ) -> None:
        shown, computed, n = _both(capsys, computations, unit, "--mode", "stable")
        assert n == 1 and shown == computed

    def test_a_resources_file_that_changed(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], computations: Computations
    ) -> None:
        root = _unit(tmp_path / "u", capsys)
        node = sorted((root / "nodes").glob("*.yaml"))[0]
        (root / "res.json").write_text('[{"name": "camera", "sharedCount": 2}]')
        inline = re.compile(r"^resources:\n(?:[- ] .*\n)*", re.M)  # the node's own list
        text, n = inline.subn("resourcesFile: res.json\n", node.read_text())
        assert n == 1
        node.write_text(text)
        assert run(capsys, "reconcile", "--state", str(root))[0] == 0
        assert _basis(root)["resourcesFiles"] == {f"nodes/{node.name}": [str(root / "res.json")]}
        assert _both(capsys, computations, root)[2] == 0
        (root / "res.json").write_text('[{"name": "camera", "sharedCount": 3}]')
        assert _both(capsys, computations, root)[2] == 1

    def test_after_the_youngest_bound_of_the_reports(
        self,
        unit: Path,
        capsys: pytest.CaptureFixture[str],
        computations: Computations,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        basis = _basis(unit)
        basis["validUntil"] = 1000.0  # (as a run whose oldest report was 940 s after 1970)
        (unit / "out" / BASIS_FILE).write_text(json.dumps(basis))
        monkeypatch.setattr("time.time", lambda: 1000.0)
        assert _both(capsys, computations, unit)[2] == 0
        monkeypatch.setattr("time.time", lambda: 1000.5)
        assert _both(capsys, computations, unit)[2] == 1


class TestTheRecord:
    def test_the_oldest_report_bounds_it(self, tmp_path: Path) -> None:
        from reconciler.controller.planbasis import basis_bytes
        from reconciler.controller.reconcile import ReconcileOptions, compute_once

        root = tmp_path / "u"
        write_state_dir(root, 6, 12, seed=2)
        stamps = ["2026-11-26T10:00:00Z", "2026-11-26T10:00:30Z"]
        for node, at in zip(sorted((root / "nodes").glob("*.yaml"))[:2], stamps, strict=True):
            node.write_text(node.read_text() + f"reportedAt: '{at}'\n")
        oldest = datetime(2026, 11, 26, 10, 0, 0, tzinfo=UTC).timestamp()
        now = oldest + 10.0  # every report young enough
        c = compute_once(root, ReconcileOptions(clock=lambda: now), read_only=True)
        # (the configs were not built, which alone makes it not reusable: a stand-in)
        doc = json.loads(
            basis_bytes(dataclasses.replace(c, built={}), None, CheckpointFiles(b"cp"), "sha256:x")
        )
        assert doc["reusable"] is True
        assert doc["validUntil"] == oldest + 60.0  # the oldest report + unit.yaml's nodeTimeout

    @pytest.mark.parametrize(
        ("change", "reason"),
        [
            ("invalid", "input files have problems"),
            ("stale", "a node's report is too old"),
            ("host", "a node declares host groups or devices"),
            ("alert", "alert timers are running"),
        ],
    )
    def test_what_makes_a_plan_always_computed(
        self,
        tmp_path: Path,
        capsys: pytest.CaptureFixture[str],
        computations: Computations,
        change: str,
        reason: str,
    ) -> None:
        root = tmp_path / "u"
        write_state_dir(root, 6, 12, seed=2)
        node = sorted((root / "nodes").glob("*.yaml"))[0]
        service = sorted((root / "desired").rglob("*.yaml"))[0]
        if change == "invalid":
            service.write_text(service.read_text() + "bogus: [\n")
        elif change == "stale":
            node.write_text(node.read_text() + "reportedAt: '2001-01-01T00:00:00Z'\n")
        elif change == "host":
            text = node.read_text()
            assert "- name: can0\n" in text
            node.write_text(
                text.replace("- name: can0\n", "- devices: ['/dev/null']\n  name: can0\n")
            )
        else:  # usage above the rule's maxThreshold: a timer runs until it raises the alert
            unit_yaml = root / "unit.yaml"
            text = unit_yaml.read_text()
            assert "- nodeType: edge\n" in text
            unit_yaml.write_text(
                text.replace(
                    "- nodeType: edge\n",
                    "- nodeType: edge\n  alertRules:\n"
                    "    cpu: {minThreshold: 0, maxThreshold: 1, minTimeout: 3600}\n",
                )
            )
        main(["reconcile", "--state", str(root)])
        capsys.readouterr()
        basis = _basis(root)
        assert basis["reusable"] is False and basis["reason"].startswith(reason), basis
        before = computations.count
        main(["plan", "--state", str(root), "--allow-invalid"])
        assert computations.count == before + 1


class TestInputHash:
    """The loader's input hash, recomputed from the files' bytes alone."""

    def test_it_equals_the_loaders_on_every_bundled_unit(self) -> None:
        repo = Path(__file__).resolve().parents[2]
        roots = [repo / "state", *sorted(p.parent for p in (repo / "examples").glob("*/unit.yaml"))]
        assert len(roots) >= 3
        for root in roots:
            view, _ = load_state(root)
            assert input_hash_of(root, resources_files(view)) == view.input_hash, root

    def test_it_follows_every_change_a_load_sees(self, tmp_path: Path) -> None:
        root = tmp_path / "u"
        write_state_dir(root, 5, 10, seed=4)
        (root / "desired" / "deeper").mkdir(parents=True)
        hashes = set()
        edits: list[Callable[[], object]] = [
            lambda: None,
            lambda: (root / "desired" / "deeper" / "x.yml").write_text("a: 1\n"),
            lambda: (root / "desired" / "deeper" / "x.yml").write_text("a: 2\n"),
            lambda: (root / "desired" / "deeper" / "x.yml").unlink(),
            lambda: (root / "unit.yaml").write_text((root / "unit.yaml").read_text() + "\n"),
        ]
        for edit in edits:
            edit()
            view, _ = load_state(root)
            got = input_hash_of(root, resources_files(view))
            assert got == view.input_hash
            hashes.add(got)
        assert len(hashes) == 4  # the removal gives the first hash again

    def test_a_symlink_or_an_unreadable_directory_has_no_hash(self, tmp_path: Path) -> None:
        root = tmp_path / "u"
        write_state_dir(root, 3, 3, seed=4)
        target = sorted((root / "nodes").glob("*.yaml"))[0]
        (root / "nodes" / "link.yaml").symlink_to(target)
        assert input_hash_of(root, {}) is None
        (root / "nodes" / "link.yaml").unlink()
        assert input_hash_of(root, {}) is not None
        (root / "actual").mkdir(exist_ok=True)
        shutil.rmtree(root / "actual")
        (root / "actual").write_text("not a directory")
        assert input_hash_of(root, {}) is None


def test_a_watchers_runs_leave_a_record_that_follows_each_edit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], computations: Computations
) -> None:
    """A long-running caller's runs (its caches, trusting what it wrote) write the record as a
    oneshot does: after each edit, the plan shown equals the plan computed."""
    from reconciler.controller.configs import default_config_builder
    from reconciler.controller.reconcile import ReconcileCache, ReconcileOptions, reconcile

    root = tmp_path / "u"
    write_state_dir(root, 30, 120, seed=5, shape="unplaceable-15")
    opts = ReconcileOptions(
        configs=default_config_builder(), cache=ReconcileCache(), verify=False, recheck=False
    )
    view = reconcile(root, opts).computed.view
    services = sorted((root / "desired").rglob("*.yaml"))
    for k, service in enumerate(services[:4]):
        text = service.read_text()
        service.write_text(text.replace("priority: ", f"priority: {k}\n#", 1))
        view = reconcile(root, opts, view).computed.view
        shown, computed, n = _both(capsys, computations, root, "--json")
        assert n == 0 and shown == computed
    # an instance more: the watcher writes its checkpoint as a delta, which the record's
    # checkpoint digest covers (another delta, another plan)
    placed = reconcile(root, opts, view).computed.checkpoint.allocations
    bump_instances(root, min(a.item_id for a in placed.values()), +1)
    view = reconcile(root, opts, view).computed.view
    delta = root / "checkpoint" / DELTA
    assert delta.exists()
    shown, computed, n = _both(capsys, computations, root, "--json")
    assert n == 0 and shown == computed
    delta.write_bytes(delta.read_bytes().replace(b'"generation":', b'"generation": ', 1))
    assert _both(capsys, computations, root, "--json")[2] == 1


def test_the_placements_table_is_always_computed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], computations: Computations
) -> None:
    """The table needs the placements, which plan.json does not hold: with --placements, or
    on a unit of at most 100 instances, the text is computed; its --json is still shown."""
    big = _unit(tmp_path / "big", capsys)
    shown, computed, n = _both(capsys, computations, big, "--placements")
    assert n == 1 and shown == computed and "Placements" in shown[1]
    small = tmp_path / "small"
    write_state_dir(small, 10, 40, seed=2)
    assert run(capsys, "reconcile", "--state", str(small))[0] == 0
    assert _basis(small)["reusable"] is True
    assert _both(capsys, computations, small)[2] == 1
    assert _both(capsys, computations, small, "--json")[2] == 0
