"""Atomic writes, single and batched (SPEC §9: old or new, never torn)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from reconciler.io import fsio
from reconciler.io.fsio import FileReadError, atomic_write, atomic_write_many, read_bytes_at


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


# ------------------------------------------------------------------------------ write_groups


def _groups(tmp_path: Path) -> tuple[list[fsio.DirWrite], dict[Path, bytes]]:
    """Three directories: one made by the batch, one with old files, one with none yet; the
    old content of every target (absent: not there)."""
    existing = tmp_path / "old"
    existing.mkdir()
    (existing / "hosts").write_bytes(b"old hosts")
    (existing / "config.json").write_bytes(b"old config")
    (tmp_path / "empty").mkdir()
    groups = [
        fsio.DirWrite(
            str(d),
            [("hosts", b"new hosts " + d.name.encode(), 0o644), ("config.json", b"new cfg", 0o644)],
            create,
        )
        for d, create in ((tmp_path / "made", True), (existing, False), (tmp_path / "empty", False))
    ]
    old = {
        Path(g.directory) / name: (Path(g.directory) / name).read_bytes()
        for g in groups
        for name, _d, _m in g.files
        if (Path(g.directory) / name).exists()
    }
    return groups, old


def _check_groups(groups: list[fsio.DirWrite], old: dict[Path, bytes]) -> None:
    for g in groups:
        d = Path(g.directory)
        state = {}
        for name, data, _mode in g.files:
            p = d / name
            got = p.read_bytes() if p.exists() else None
            assert got in (old.get(p), data), p
            state[name] = got == data
        # hosts is renamed before config.json: a new config never names an old hosts file
        assert not state["config.json"] or state["hosts"], d
        if d.is_dir():
            assert not [p for p in d.iterdir() if ".tmp-" in p.name]


@pytest.mark.parametrize("step", ["open", "write", "fsync", "rename", "fsync-dir"])
def test_groups_interrupted_at_each_step_leave_old_or_new(tmp_path: Path, step: str) -> None:
    groups, old = _groups(tmp_path)

    def hook(name: str) -> None:
        if name == step:
            raise Boom(name)

    with pytest.raises(Boom):
        fsio.write_groups(groups, hook=hook)
    _check_groups(groups, old)
    news = [
        (Path(g.directory) / n).exists() and (Path(g.directory) / n).read_bytes() == data
        for g in groups
        for n, data, _ in g.files
    ]
    assert all(news) if step == "fsync-dir" else not any(news)


class _FailAt:
    """The ``n``-th call of what it wraps fails."""

    def __init__(self, n: int) -> None:
        self.n, self.calls = n, 0

    def wrap(self, real: Any) -> Any:
        def call(*args: Any, **kw: Any) -> Any:
            self.calls += 1
            if self.calls == self.n:
                raise OSError(28, "No space left on device")
            return real(*args, **kw)

        return call


@pytest.mark.parametrize("fail", ["replace", "syncfs", "write"])
def test_groups_failing_at_each_call_leave_old_or_new(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail: str
) -> None:
    k = 0
    while True:
        k += 1
        base = tmp_path / f"k{k}"
        base.mkdir()
        groups, old = _groups(base)
        failing = _FailAt(k)
        target = {"replace": (os, "replace"), "write": (os, "write")}.get(
            fail, (fsio, "_sync_filesystem_of")
        )
        monkeypatch.setattr(*target, failing.wrap(getattr(*target)))
        try:
            fsio.write_groups(groups)
        except OSError:
            pass
        else:
            break
        finally:
            monkeypatch.undo()
        _check_groups(groups, old)
    assert k > 2


def test_group_stats_are_what_lstat_reads_after_the_rename(tmp_path: Path) -> None:
    groups, _old = _groups(tmp_path)
    old_umask = os.umask(0o077)  # the service's UMask: the modes are still exactly as asked
    try:
        stats = fsio.write_groups(groups)
    finally:
        os.umask(old_umask)
    for g, got in zip(groups, stats, strict=True):
        for (name, data, mode), s in zip(g.files, got, strict=True):
            st = os.lstat(Path(g.directory) / name)
            assert s == fsio.FileStat(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode)
            assert stat.S_IMODE(st.st_mode) == mode and st.st_size == len(data)


def test_groups_never_write_through_a_planted_temp_name(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    secret = tmp_path / "secret"
    secret.write_bytes(b"precious")
    pid = os.getpid()
    (d / f".config.json.tmp-{pid}").symlink_to(secret)  # or a killed writer's leftover
    (d / f".hosts.tmp-{pid}").write_bytes(b"stale")
    fsio.write_groups(
        [fsio.DirWrite(str(d), [("hosts", b"h", 0o600), ("config.json", b"c", 0o600)])]
    )
    assert secret.read_bytes() == b"precious"
    assert (d / "hosts").read_bytes() == b"h" and (d / "config.json").read_bytes() == b"c"
    assert sorted(p.name for p in d.iterdir()) == ["config.json", "hosts"]


@pytest.fixture
def fsyncs_without_syncfs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A system without syncfs; the descriptors fsync'ed, in order."""
    synced: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(fsio, "_SYNCFS", None)
    monkeypatch.setattr(os, "fsync", fsync)
    return synced


def test_groups_without_syncfs_fsync_files_and_directories(
    tmp_path: Path, fsyncs_without_syncfs: list[int]
) -> None:
    synced = fsyncs_without_syncfs
    groups, _old = _groups(tmp_path)
    fsio.write_groups(groups)
    # six files, the three directories and the parent of the one made
    assert len(synced) == 6 + 3 + 1
    _check_groups(groups, {})


def _tree() -> list[fsio.DirWrite]:
    return [
        fsio.DirWrite(name, [("hosts", f"h {name}".encode(), 0o644), ("config.json", b"{}", 0o600)])
        for name in ("i-1", "i-2", "i-3")
    ]


def _tree_files(top: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(top)): (p.read_bytes(), stat.S_IMODE(p.lstat().st_mode))
        for p in sorted(top.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("step", ["open", "write", "fsync", "rename", "fsync-dir"])
def test_a_new_tree_interrupted_at_each_step_is_absent_or_whole(tmp_path: Path, step: str) -> None:
    def hook(name: str) -> None:
        if name == step:
            raise Boom(name)

    with pytest.raises(Boom):
        fsio.write_new_tree(str(tmp_path), "top", _tree(), hook=hook)
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []
    if step == "fsync-dir":  # the hook runs before the step: the rename is done
        assert len(_tree_files(tmp_path / "top")) == 6
    else:
        assert not (tmp_path / "top").exists()


def test_a_new_tree_has_its_modes_and_stats_and_never_replaces_a_directory(
    tmp_path: Path,
) -> None:
    old_umask = os.umask(0o077)
    try:
        stats = fsio.write_new_tree(str(tmp_path), "top", _tree())
    finally:
        os.umask(old_umask)
    want = {f"{g.directory}/{name}": (data, mode) for g in _tree() for name, data, mode in g.files}
    assert _tree_files(tmp_path / "top") == want
    for g, got in zip(_tree(), stats, strict=True):
        for (name, _data, _mode), s in zip(g.files, got, strict=True):
            st = os.lstat(tmp_path / "top" / g.directory / name)
            assert s == fsio.FileStat(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode)
    # the target appeared meanwhile (an empty directory would be replaced by a plain rename)
    (tmp_path / "other").mkdir()
    with pytest.raises(FileExistsError):
        fsio.write_new_tree(str(tmp_path), "other", _tree())
    assert list((tmp_path / "other").iterdir()) == []
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


def test_a_new_tree_without_syncfs_fsyncs_every_file_and_directory(
    tmp_path: Path, fsyncs_without_syncfs: list[int]
) -> None:
    fsio.write_new_tree(str(tmp_path), "top", _tree())
    # six files, the three directories, the temp tree, then the parent after the rename
    assert len(fsyncs_without_syncfs) == 6 + 3 + 1 + 1


# ------------------------------------------------------------------------------ Commit


def _commit_steps(commit: fsio.Commit, top: Path) -> list[tuple[str, bytes | None]]:
    """Queue one of each step in ``top`` (files ``a``..``c`` hold ``old``, ``gone/`` a tree,
    ``victim`` a file); what each target holds once its step is applied (None: absent)."""
    for name in ("a", "b", "victim"):
        (top / name).write_bytes(b"old " + name.encode())
    (top / "gone").mkdir()
    (top / "gone" / "x").write_bytes(b"x")
    commit.replace(top / "a", b"new a")
    commit.link(top / "b", top / "b.previous")
    commit.replace(top / "b", b"new b")
    commit.new_tree(str(top), "tree", [fsio.DirWrite("i", [("f", b"in tree", 0o600)])])
    commit.unlink(top / "victim")
    commit.remove_tree(top / "gone")
    return [
        ("a", b"new a"),
        ("b.previous", b"old b"),
        ("b", b"new b"),
        ("tree/i/f", b"in tree"),
        ("victim", None),
        ("gone/x", None),
    ]


def _holds(path: Path) -> bytes | None:
    return path.read_bytes() if path.exists() else None


def test_a_commit_shows_nothing_before_its_flush_then_every_step(tmp_path: Path) -> None:
    commit = fsio.Commit()
    steps = _commit_steps(commit, tmp_path)
    assert commit.pending
    assert [_holds(tmp_path / rel) for rel, _ in steps] == [
        b"old a",
        None,
        b"old b",
        None,
        b"old victim",
        b"x",
    ]
    commit.flush()
    assert [_holds(tmp_path / rel) for rel, _ in steps] == [want for _, want in steps]
    assert not commit.pending
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "b.previous", "tree"]
    assert not os.path.samefile(tmp_path / "b.previous", tmp_path / "b")


@pytest.mark.parametrize("k", range(1, 7))
def test_a_commit_failing_at_a_step_has_applied_exactly_the_steps_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, k: int
) -> None:
    """The steps are applied in the order queued: a failure at the k-th leaves the k-1 before
    it done, the others not, no temp behind, and the commit spent."""
    commit = fsio.Commit()
    steps = _commit_steps(commit, tmp_path)
    olds = [b"old a", None, b"old b", None, b"old victim", b"x"]
    failing = _FailAt(k)
    monkeypatch.setattr(fsio, "_apply", failing.wrap(fsio._apply))
    with pytest.raises(OSError):
        commit.flush()
    got = [_holds(tmp_path / rel) for rel, _ in steps]
    assert got == [want for _, want in steps[: k - 1]] + olds[k - 1 :]
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []
    with pytest.raises(RuntimeError, match="start another"):
        commit.replace(tmp_path / "a", b"again")


def test_a_commit_flushes_each_filesystem_twice_per_flush_and_stays_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if fsio._SYNCFS is None:
        pytest.skip("no syncfs on this system: a commit fsyncs each file and directory instead")
    synced: list[Path] = []
    monkeypatch.setattr(fsio, "_sync_filesystem_of", synced.append)
    (tmp_path / "d").mkdir()
    with fsio.Commit() as commit:
        for i in range(50):
            commit.replace(tmp_path / "d" / f"f{i}", b"x")
        commit.groups([fsio.DirWrite(str(tmp_path / "e"), [("g", b"y", 0o600)], True)])
        commit.flush()
        assert len(synced) == 2
        commit.flush()  # nothing queued: no flush
        assert len(synced) == 2
        commit.replace(tmp_path / "d" / "f0", b"z")
    assert len(synced) == 4  # the context's exit flushes what is left
    assert (tmp_path / "d" / "f0").read_bytes() == b"z"
    assert (tmp_path / "e" / "g").read_bytes() == b"y"


def test_a_target_written_twice_before_a_flush_holds_the_last_bytes(tmp_path: Path) -> None:
    with fsio.Commit() as commit:
        commit.replace(tmp_path / "f", b"first")
        commit.replace(tmp_path / "g", b"g")
        commit.replace(tmp_path / "f", b"second")
    assert (tmp_path / "f").read_bytes() == b"second"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f", "g"]


def test_an_exception_inside_a_commit_leaves_every_target_as_it_was(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"old")
    with pytest.raises(Boom), fsio.Commit() as commit:
        commit.replace(tmp_path / "f", b"new")
        commit.new_tree(str(tmp_path), "tree", [fsio.DirWrite("i", [("f", b"t", 0o600)])])
        raise Boom("the caller failed before its flush")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]
    assert (tmp_path / "f").read_bytes() == b"old"


def test_a_commit_without_syncfs_fsyncs_files_then_directories(
    tmp_path: Path, fsyncs_without_syncfs: list[int]
) -> None:
    synced = fsyncs_without_syncfs
    (tmp_path / "d").mkdir()
    with fsio.Commit() as commit:
        commit.replace(tmp_path / "d" / "f", b"x")
        commit.new_tree(str(tmp_path), "tree", [fsio.DirWrite("i", [("f", b"t", 0o600)])])
        files = len(synced)
    # each file as it was written; at the flush the tree's two directories (before its
    # rename), then d and the tree's parent (after the steps)
    assert files == 2
    assert len(synced) == 2 + 2 + 2
    assert (tmp_path / "tree" / "i" / "f").read_bytes() == b"t"


def test_a_file_freed_later_keeps_its_blocks_until_the_next_flush(tmp_path: Path) -> None:
    """The step that replaces it only drops a name: its inode (and blocks) lives on under a
    second name until the commit's next flush, or its end."""
    target = tmp_path / "prev"
    target.write_bytes(b"old generation")
    old_inode = target.stat().st_ino
    with fsio.Commit() as commit:
        commit.free_later(target)
        commit.replace(target, b"new generation")
        commit.flush()
        assert target.read_bytes() == b"new generation"
        (second,) = [p for p in tmp_path.iterdir() if p.name != "prev"]
        assert second.name.startswith(".prev.free.tmp-")
        assert second.stat().st_ino == old_inode and second.stat().st_nlink == 1
        commit.replace(tmp_path / "other", b"x")
        commit.flush()  # the next flush frees it
        assert not second.exists()
        commit.free_later(target)  # freed when the commit ends
        commit.unlink(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other"]


def test_a_second_name_left_by_a_crash_is_swept_as_a_temp(tmp_path: Path) -> None:
    (tmp_path / "prev").write_bytes(b"x")
    commit = fsio.Commit()
    commit.free_later(tmp_path / "prev")  # and the process dies here
    assert len(list(tmp_path.iterdir())) == 2
    assert fsio.remove_stale_temp_files(tmp_path.parent, tmp_path.name) == 1
    assert [p.name for p in tmp_path.iterdir()] == ["prev"]


def test_freeing_later_a_missing_file_does_nothing(tmp_path: Path) -> None:
    with fsio.Commit() as commit:
        commit.free_later(tmp_path / "absent")
        commit.replace(tmp_path / "absent", b"new")
    assert [p.name for p in tmp_path.iterdir()] == ["absent"]
