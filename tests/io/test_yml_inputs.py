"""Input documents ending in ``.yml`` are read like ``.yaml`` ones."""

from __future__ import annotations

from pathlib import Path

from reconciler.io.loader import load_state

SERVICE = """apiVersion: reconciler/v1
kind: Service
id: web
version: 1.0.0
image: {rootfs: /srv/web, cmd: [/bin/web]}
"""

NODE = """apiVersion: reconciler/v1
kind: Node
id: n1
type: server
maxDMIPS: 1000
totalRAM: 1Gi
"""

ACTUAL = """apiVersion: reconciler/v1
kind: ActualState
nodeId: n1
revision: 3
instances: {}
"""


def test_yml_files_are_inputs_in_every_directory(tmp_path: Path) -> None:
    (tmp_path / "desired" / "apps").mkdir(parents=True)
    (tmp_path / "nodes").mkdir()
    (tmp_path / "actual").mkdir()
    (tmp_path / "desired" / "apps" / "web.yml").write_text(SERVICE)
    (tmp_path / "nodes" / "n1.yml").write_text(NODE)  # the file name without .yml is the id
    (tmp_path / "actual" / "n1.yml").write_text(ACTUAL)
    (tmp_path / "desired" / "notes.txt").write_text("not an input")
    view, diags = load_state(tmp_path)
    assert diags == []
    assert list(view.services) == [("web", "default")]
    assert list(view.nodes) == ["n1"]
    assert view.actual["n1"].revision == 3
    assert sorted(view.files) == ["actual/n1.yml", "desired/apps/web.yml", "nodes/n1.yml"]


def test_a_broken_yml_file_is_reported_not_ignored(tmp_path: Path) -> None:
    (tmp_path / "desired").mkdir()
    (tmp_path / "desired" / "web.yml").write_text("apiVersion: reconciler/v1\nkind: [\n")
    _view, diags = load_state(tmp_path)
    assert [d.path for d in diags] == [str(tmp_path / "desired" / "web.yml")]


def test_a_watch_hint_for_a_yml_file_loads_it(tmp_path: Path) -> None:
    (tmp_path / "desired").mkdir()
    (tmp_path / "nodes").mkdir()
    (tmp_path / "nodes" / "n1.yaml").write_text(NODE)
    first, _ = load_state(tmp_path)
    (tmp_path / "desired" / "web.yml").write_text(SERVICE)
    view, diags = load_state(tmp_path, first, changed={"desired/web.yml"})
    assert diags == [] and list(view.services) == [("web", "default")]
    assert list(view.files) == ["desired/web.yml", "nodes/n1.yaml"]
