"""Atomic writes, single and batched (SPEC §9: old or new, never torn)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reconciler import fsio
from reconciler.fsio import FileReadError, atomic_write, atomic_write_many, read_bytes_at


class Boom(Exception):
    pass


def _files(tmp_path: Path, n: int = 5) -> list[Path]:
    (tmp_path / "a").mkdir()
    paths = [tmp_path / "a" / f"f{i}.json" for i in range(n)]
    for p in paths:
        p.write_bytes(b"old " + p.name.encode())
    return paths


@pytest.mark.parametrize("step", ["open", "write", "fsync", "rename", "fsync-dir"])
def test_batch_interrupted_at_each_step_leaves_old_or_new(tmp_path: Path, step: str) -> None:
    paths = _files(tmp_path)
    items = [(p, b"new " + p.name.encode(), 0o644) for p in paths]

    def hook(name: str) -> None:
        if name == step:
            raise Boom(name)

    with pytest.raises(Boom):
        atomic_write_many(items, hook=hook)
    for p in paths:
        assert p.read_bytes() in (b"old " + p.name.encode(), b"new " + p.name.encode())
    assert not [p for p in (tmp_path / "a").iterdir() if ".tmp-" in p.name]
    if step in ("open", "write", "fsync", "rename"):  # the hook runs before the step
        assert all(p.read_bytes().startswith(b"old") for p in paths)
    else:
        assert all(p.read_bytes().startswith(b"new") for p in paths)


def test_a_failed_sync_renames_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if fsio._SYNCFS is None:
        pytest.skip("no syncfs on this system: batches fall back to one fsync per file")
    paths = _files(tmp_path)

    def broken(directory: Path) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(fsio, "_sync_filesystem_of", broken)
    with pytest.raises(OSError):
        atomic_write_many([(p, b"new", 0o600) for p in paths])
    assert all(p.read_bytes().startswith(b"old") for p in paths)
    assert not [p for p in (tmp_path / "a").iterdir() if ".tmp-" in p.name]


def test_batch_writes_modes_and_contents(tmp_path: Path) -> None:
    paths = _files(tmp_path)
    atomic_write_many([(p, b"x" * 100_000, 0o644) for p in paths])
    for p in paths:
        assert p.read_bytes() == b"x" * 100_000
        assert p.stat().st_mode & 0o777 == 0o644


def test_single_write_failing_fsync_keeps_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "f"
    target.write_bytes(b"old")

    def broken(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(OSError):
        atomic_write(target, b"new")
    assert target.read_bytes() == b"old"


def test_reads_never_follow_symlinks(tmp_path: Path) -> None:
    (tmp_path / "real").write_text("secret")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(FileReadError, match="symlink"):
        read_bytes_at(tmp_path / "link", 100)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(FileReadError, match="regular file"):
        read_bytes_at(tmp_path / "fifo", 100)
