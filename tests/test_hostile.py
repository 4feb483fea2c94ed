"""A corpus of hostile files, each rejected with a clear message by a process that never dies
by a signal, while the other files of the same directory still load (SPEC §5)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

GOOD_NODE = """apiVersion: reconciler/v1
kind: Node
id: good
type: t
maxDMIPS: 1000
totalRAM: 1Gi
"""
GOOD_SERVICE = """apiVersion: reconciler/v1
kind: Service
id: good
version: 1.0.0
image: {rootfs: /r}
"""
SVC_HEAD = "apiVersion: reconciler/v1\nkind: Service\nid: x\nversion: 1.0.0\nimage: {rootfs: /r}\n"

HOSTILE: dict[str, tuple[bytes, str]] = {
    "desired/laughs.yaml": (
        b'a: &a ["lol","lol","lol"]\nb: &b [*a,*a,*a]\nc: &c [*b,*b,*b]\nd: [*c,*c,*c]\n',
        "anchors and aliases",
    ),
    "desired/deep.yaml": (b"[" * 50_000 + b"]" * 50_000, "nesting deeper than 64"),
    "desired/huge.yaml": (b"a: " + b"x" * (2 * 1024 * 1024) + b"\n", "over the limit"),
    "desired/dupkeys.yaml": (SVC_HEAD.encode() + b"id: y\n", "duplicate key 'id'"),
    "desired/yaml11.yaml": (b"%YAML 1.1\n---\nno: 1\n", "directives"),
    "desired/tag.yaml": (b"a: !!python/object/apply:os.system [echo pwned]\n", "explicit tags"),
    "desired/merge.yaml": (b"base: {a: 1}\nx:\n  <<: {b: 2}\n", "merge keys"),
    "desired/twodocs.yaml": (SVC_HEAD.encode() + b"---\n" + SVC_HEAD.encode(), "more than one"),
    "desired/empty.yaml": (b"", "no document"),
    "desired/utf16.yaml": (SVC_HEAD.encode("utf-16"), "UTF-8"),
    "desired/nul.yaml": (SVC_HEAD.encode() + b"hostname: a\x00b\n", "control character"),
    "nodes/evil.yaml": (GOOD_NODE.replace("id: good", "id: ../../etc").encode(), "invalid value"),
    "nodes/other.yaml": (GOOD_NODE.encode(), "must equal the file name"),
}


def test_hostile_corpus_is_rejected_without_killing_the_process(tmp_path: Path) -> None:
    for rel, (raw, _) in HOSTILE.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(raw)
    (tmp_path / "nodes" / "good.yaml").write_text(GOOD_NODE)
    (tmp_path / "desired" / "good.yaml").write_text(GOOD_SERVICE)
    (tmp_path / "marker").write_text("untouched")

    proc = subprocess.run(
        [sys.executable, "-m", "reconciler", "validate", "--state", str(tmp_path), "--json"],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr.decode()  # invalid, and not killed by a signal
    assert b"Traceback" not in proc.stderr
    report = json.loads(proc.stdout)
    assert report["valid"] is False
    assert report["counts"]["services"] == 1 and report["counts"]["nodes"] == 1
    by_file: dict[str, list[str]] = {}
    for err in report["errors"]:
        rel = str(Path(err["path"]).relative_to(tmp_path))
        by_file.setdefault(rel, []).append(err["message"])
        assert err["line"] >= 1 and err["col"] >= 1
    assert set(by_file) == set(HOSTILE)
    for rel, (_, fragment) in HOSTILE.items():
        assert any(fragment in m for m in by_file[rel]), (rel, by_file[rel])
    assert not (tmp_path / "pwned").exists()
    assert (tmp_path / "marker").read_text() == "untouched"


def test_human_output_names_file_line_and_column(tmp_path: Path) -> None:
    (tmp_path / "desired").mkdir()
    (tmp_path / "desired" / "dup.yaml").write_bytes(SVC_HEAD.encode() + b"id: y\n")
    proc = subprocess.run(
        [sys.executable, "-m", "reconciler", "validate", "--state", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    assert f"{tmp_path}/desired/dup.yaml:6:1: error: duplicate key 'id'" in proc.stdout
