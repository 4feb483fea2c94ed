"""Loading a state directory: last good versions, isolation, identity rules, the guards."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.io.loader import load_state, mass_deletion_guard
from reconciler.model.documents import Service
from tests.support.state_files import ACTUAL, NODE, SERVICE, UNIT, write


def bump_mtime(p: Path) -> None:
    st = p.stat()
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


class TestLastGoodVersion:
    def test_an_unreadable_object_keeps_its_last_good_version(self, tmp_path: Path) -> None:
        svc = write(tmp_path, "desired/a.yaml", SERVICE.format(id="a", version="1.0.0"))
        view, diags = load_state(tmp_path)
        assert diags == []
        assert view.services[("a", "default")].version == "1.0.0"

        svc.write_text("apiVersion: reconciler/v1\nkind: Service\nid: a\nversion: [oops\n")
        bump_mtime(svc)
        view2, diags2 = load_state(tmp_path, view)
        assert len(diags2) == 1 and diags2[0].path.endswith("desired/a.yaml")
        assert view2.services[("a", "default")].version == "1.0.0"  # not deleted

        svc.write_text(SERVICE.format(id="a", version="2.0.0"))
        bump_mtime(svc)
        view3, diags3 = load_state(tmp_path, view2)
        assert diags3 == []
        assert view3.services[("a", "default")].version == "2.0.0"

    def test_a_first_ever_invalid_file_does_not_exist_yet(self, tmp_path: Path) -> None:
        write(tmp_path, "desired/a.yaml", "kind: Service\n")
        view, diags = load_state(tmp_path)
        assert view.services == {}
        assert diags and diags[0].severity == "error"

    def test_one_bad_file_does_not_affect_another(self, tmp_path: Path) -> None:
        write(tmp_path, "desired/good.yaml", SERVICE.format(id="good", version="1.0.0"))
        write(tmp_path, "desired/bad.yaml", b"\xff\xfe garbage")
        write(tmp_path, "nodes/n1.yaml", NODE.format(id="n1"))
        view, diags = load_state(tmp_path)
        assert set(view.services) == {("good", "default")}
        assert set(view.nodes) == {"n1"}
        assert [d.path.endswith("bad.yaml") for d in diags] == [True]

    def test_a_deleted_file_removes_its_object(self, tmp_path: Path) -> None:
        p = write(tmp_path, "desired/a.yaml", SERVICE.format(id="a", version="1.0.0"))
        view, _ = load_state(tmp_path)
        p.unlink()
        view2, diags = load_state(tmp_path, view)
        assert view2.services == {} and diags == []

    def test_unchanged_files_are_not_parsed_again(self, tmp_path: Path) -> None:
        write(tmp_path, "nodes/n1.yaml", NODE.format(id="n1"))
        view, _ = load_state(tmp_path)
        view2, _ = load_state(tmp_path, view)
        assert view2.nodes["n1"] is view.nodes["n1"]
        assert view2.input_hash == view.input_hash


class TestChangeDetection:
    def test_a_same_size_rewrite_within_one_timestamp_tick_is_seen(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """File timestamps are coarse: on a filesystem with 1 s timestamps a rewrite of the same
        size right after a load keeps the whole stat key. It must still be read again."""
        import reconciler.io.fsio as fsio
        import reconciler.io.loader as loader

        def coarse(st: os.stat_result) -> fsio.StatKey:
            second = 1_000_000_000
            mtime, ctime = st.st_mtime_ns // second * second, st.st_ctime_ns // second * second
            return (st.st_dev, st.st_ino, st.st_size, mtime, ctime)

        monkeypatch.setattr(fsio, "stat_key", coarse)
        monkeypatch.setattr(loader, "stat_key", coarse)
        svc = write(tmp_path, "desired/a.yaml", SERVICE.format(id="a", version="1.0.0"))
        view, _ = load_state(tmp_path)
        svc.write_text(SERVICE.format(id="a", version="2.0.0"))  # same size, same second
        view2, diags = load_state(tmp_path, view)
        assert diags == []
        assert view2.services[("a", "default")].version == "2.0.0"

    def test_a_settled_key_is_trusted_and_a_fresh_one_is_not(self) -> None:
        from reconciler.io.fsio import RACY_WINDOW_NS, settled_key

        now = 10 * RACY_WINDOW_NS
        old = (1, 2, 3, now - RACY_WINDOW_NS - 1, now - RACY_WINDOW_NS - 1)
        assert settled_key(old, now) == old
        assert settled_key((1, 2, 3, now - RACY_WINDOW_NS - 1, now - 5), now) is None  # chmod
        assert settled_key((1, 2, 3, now, now), now) is None


class TestIdentityRules:
    def test_node_file_name_must_equal_its_id(self, tmp_path: Path) -> None:
        write(tmp_path, "nodes/n1.yaml", NODE.format(id="n2"))
        view, diags = load_state(tmp_path)
        assert view.nodes == {}
        assert "must equal the file name" in diags[0].message
        assert (diags[0].line, diags[0].col) == (3, 5)  # the value of `id:`

    def test_actual_state_node_id_must_equal_the_file_name(self, tmp_path: Path) -> None:
        write(
            tmp_path,
            "actual/n1.yaml",
            "apiVersion: reconciler/v1\nkind: ActualState\nnodeId: n2\n",
        )
        view, diags = load_state(tmp_path)
        assert view.actual == {}
        assert [(d.line, d.col) for d in diags] == [(3, 9)]
        assert "'n2' must equal the file name 'n1'" in diags[0].message

    def test_one_partition_per_type(self, tmp_path: Path) -> None:
        """Two partitions typed storages would make placement depend on their order."""
        text = NODE.format(id="n1") + (
            "partitions:\n"
            "  - {name: a, types: [storages], totalSize: 1Gi}\n"
            "  - {name: b, types: [states, storages], totalSize: 1Gi}\n"
        )
        write(tmp_path, "nodes/n1.yaml", text)
        view, diags = load_state(tmp_path)
        assert view.nodes == {}
        assert len(diags) == 1 and (diags[0].line, diags[0].col) == (8, 3)
        assert "'a', 'b'" in diags[0].message and "storages" in diags[0].message

    def test_storages_and_states_may_share_a_partition(self, tmp_path: Path) -> None:
        text = NODE.format(id="n1") + (
            "partitions:\n"
            "  - {name: a, types: [storages, states], totalSize: 1Gi}\n"
            "  - {name: b, types: [logs], totalSize: 1Gi}\n"
        )
        write(tmp_path, "nodes/n1.yaml", text)
        view, diags = load_state(tmp_path)
        assert diags == [] and len(view.nodes["n1"].partitions) == 2

    def test_path_like_ids_are_rejected(self, tmp_path: Path) -> None:
        write(tmp_path, "nodes/evil.yaml", NODE.format(id="../../etc"))
        view, diags = load_state(tmp_path)
        assert view.nodes == {}
        assert (diags[0].line, diags[0].col) == (3, 5)
        assert "../../etc" in diags[0].message

    def test_duplicate_services_keep_the_first_by_path(self, tmp_path: Path) -> None:
        write(tmp_path, "desired/a.yaml", SERVICE.format(id="s", version="1.0.0"))
        write(tmp_path, "desired/z/b.yaml", SERVICE.format(id="s", version="2.0.0"))
        view, diags = load_state(tmp_path)
        assert view.services[("s", "default")].version == "1.0.0"
        assert "already defined" in diags[0].message and diags[0].path.endswith("b.yaml")

    def test_symlinks_are_not_followed(self, tmp_path: Path) -> None:
        outside = write(tmp_path, "outside.yaml", SERVICE.format(id="x", version="1.0.0"))
        (tmp_path / "desired").mkdir()
        (tmp_path / "desired" / "link.yaml").symlink_to(outside)
        view, diags = load_state(tmp_path)
        assert view.services == {}
        assert "symlink" in diags[0].message

    def test_wrong_kind_in_a_directory(self, tmp_path: Path) -> None:
        write(tmp_path, "desired/n.yaml", NODE.format(id="n"))
        view, diags = load_state(tmp_path)
        assert view.services == {}
        assert "expected Service" in diags[0].message
        assert (diags[0].line, diags[0].col) == (2, 7)

    def test_hidden_and_non_yaml_files_are_ignored(self, tmp_path: Path) -> None:
        write(tmp_path, "desired/.a.yaml.swp", b"\x00")
        write(tmp_path, "desired/notes.txt", "hello")
        view, diags = load_state(tmp_path)
        assert view.services == {} and diags == []


class TestMassDeletionGuard:
    ACTUAL = """apiVersion: reconciler/v1
kind: ActualState
nodeId: n1
revision: 4
instances:
  {iid}:
    itemId: a
    subjectId: default
    index: 0
    version: 1.0.0
    runtimeId: runc
    state: active
"""

    def _actual(self, root: Path) -> None:
        from reconciler.model.values import instance_id

        write(root, "actual/n1.yaml", self.ACTUAL.format(iid=instance_id("a", "default", 0)))

    def test_refuses_when_everything_vanished_while_instances_run(self, tmp_path: Path) -> None:
        self._actual(tmp_path)
        write(tmp_path, "desired/a.yaml", "garbage: [")
        view, _ = load_state(tmp_path)
        refusal = mass_deletion_guard(view, allow_empty=False)
        assert refusal is not None and "--allow-empty" in refusal.message
        assert mass_deletion_guard(view, allow_empty=True) is None

    def test_allows_when_nothing_runs_or_something_is_desired(self, tmp_path: Path) -> None:
        view, _ = load_state(tmp_path)
        assert mass_deletion_guard(view, allow_empty=False) is None
        self._actual(tmp_path)
        write(tmp_path, "desired/a.yaml", SERVICE.format(id="a", version="1.0.0"))
        write(tmp_path, "nodes/n1.yaml", NODE.format(id="n1"))
        view, _ = load_state(tmp_path)
        assert isinstance(view.services[("a", "default")], Service)
        assert mass_deletion_guard(view, allow_empty=False) is None


_EDITS = st.lists(
    st.tuples(
        st.sampled_from(["service", "duplicate", "node", "actual", "unit", "broken", "delete"]),
        st.integers(0, 3),
        st.integers(0, 2),
    ),
    min_size=1,
    max_size=12,
)


def test_a_duplicate_service_is_reported_on_every_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import reconciler.io.fsio as fsio

    monkeypatch.setattr(fsio, "RACY_WINDOW_NS", -(10**12))  # trust the stat keys at once
    write(tmp_path, "desired/a.yaml", SERVICE.format(id="a", version="1.0.0"))
    write(tmp_path, "desired/b.yaml", SERVICE.format(id="a", version="2.0.0"))
    view, diags = load_state(tmp_path)
    again, diags_again = load_state(tmp_path, view)  # nothing changed: the same records
    assert all(again.files[r] is view.files[r] for r in view.files)
    assert [d.message for d in diags_again] == [d.message for d in diags]
    assert len(diags) == 1 and "already defined" in diags[0].message
    assert again.services[("a", "default")].version == "1.0.0"


class TestPatchedView:
    """A load with the previous view patches that view's dictionaries for the files that
    changed; the result must be what assembling every file from nothing gives (same objects,
    same dictionary order, same input hash, same diagnostics in the same order)."""

    @given(edits=_EDITS)
    @settings(max_examples=60, deadline=None)
    def test_patched_view_equals_the_assembled_one(self, edits: list[tuple[str, int, int]]) -> None:
        import tempfile

        import reconciler.io.loader as loader

        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            for i in range(3):
                write(root, f"desired/s{i}.yaml", SERVICE.format(id=f"s{i}", version="1.0.0"))
                write(root, f"nodes/n{i}.yaml", NODE.format(id=f"n{i}"))
                write(root, f"actual/n{i}.yaml", ACTUAL.format(id=f"n{i}", rev=0))
            view, _ = load_state(root)
            for what, i, v in edits:
                if what == "service":
                    p = write(
                        root, f"desired/s{i}.yaml", SERVICE.format(id=f"s{i}", version=f"1.{v}.0")
                    )
                elif what == "duplicate":  # a second file defining s{v}
                    p = write(
                        root, f"desired/z{i}.yaml", SERVICE.format(id=f"s{v}", version="9.0.0")
                    )
                elif what == "node":
                    p = write(
                        root,
                        f"nodes/n{i}.yaml",
                        NODE.format(id=f"n{i}").replace("1000", f"{1000 + v}"),
                    )
                elif what == "actual":
                    p = write(root, f"actual/n{i}.yaml", ACTUAL.format(id=f"n{i}", rev=v))
                elif what == "unit":
                    p = write(root, "unit.yaml", UNIT.format(mode=["stable", "fresh", "stable"][v]))
                elif what == "broken":
                    p = write(root, f"desired/s{i}.yaml", "kind: [oops\n")
                else:
                    p = root / f"desired/s{i}.yaml"
                    p.unlink(missing_ok=True)
                if p.exists():
                    bump_mtime(p)
                view, diags = load_state(root, view)
                whole, whole_diags = loader._assembled(root, dict(view.files))
                assert view.unit is whole.unit
                for name in ("services", "nodes", "actual"):
                    got, want = getattr(view, name), getattr(whole, name)
                    assert list(got) == list(want)  # order included
                    assert all(got[k] is want[k] for k in want)
                assert view.input_hash == whole.input_hash
                assert view.hash_lines == whole.hash_lines
                assert view.duplicates == whole.duplicates
                assert diags == whole_diags
