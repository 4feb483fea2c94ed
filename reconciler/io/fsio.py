"""The only module that opens files under the state directory (SPEC §4, §9).

Reads never follow symlinks (``O_NOFOLLOW`` relative to a directory descriptor) and refuse
anything but regular files. Writes go through :func:`atomic_write`: a temp file in the same
directory, write, fsync, rename over the target, fsync the directory; a failed fsync ends the run
(it is never retried) and leaves the old file in place. Many files at once go through a
:class:`Commit` (or :func:`write_groups`, :func:`atomic_write_many`, one commit each): the same
steps for the whole batch, with one ``syncfs`` before the renames and one after instead of an
fsync per file and per directory, and the fewest system calls per file (exclusive create, write,
fstat, close; fchmod only when the umask took mode bits away). ``reconcile`` writes its whole
run through one commit.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, cast

__all__ = [
    "Commit",
    "DirWrite",
    "FileReadError",
    "FileStat",
    "StatKey",
    "Unreadable",
    "WriteHook",
    "atomic_write",
    "atomic_write_many",
    "ensure_dir",
    "fsync_dir",
    "iter_files",
    "read_bytes_at",
    "remove_stale_temp_files",
    "remove_stale_temp_trees",
    "settled_key",
    "stat_key",
    "write_groups",
    "write_if_changed",
    "write_new_tree",
]

StatKey = tuple[int, int, int, int, int]
"""(device, inode, size, mtime_ns, ctime_ns): unchanged key means unchanged file."""

WriteHook = Callable[[str], None]
"""Called with the name of each step of a write (tests inject faults through it)."""


class FileReadError(Exception):
    pass


def stat_key(st: os.stat_result) -> StatKey:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


RACY_WINDOW_NS = 2_000_000_000
"""File timestamps are coarse (a kernel tick; a second or two on some filesystems), so a file
rewritten with the same size within one tick of being read keeps its stat key. A key is only
trusted when the file had been quiet for this long when it was read (git's "racily clean"
rule); otherwise the next load reads it again and compares its content hash."""


def settled_key(key: StatKey, read_at_ns: int) -> StatKey | None:
    """``key`` if the file was older than :data:`RACY_WINDOW_NS` when read, else ``None``."""
    newest = max(key[3], key[4])
    return key if newest < read_at_ns - RACY_WINDOW_NS else None


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_SYMLINK = "is a symlink; symlinks are not followed"


class FoundFile(NamedTuple):  # a tuple: made once per input file per run
    rel: str  # path relative to the walked root, with '/' separators
    dir_fd_path: str  # directory holding it, relative to the walked root ('' for the root)
    name: str
    key: StatKey | None  # None: not a regular file (reported on read)


Unreadable = tuple[str, str]
"""A directory a walk could not read: its path relative to the walked root ('' for the root
itself) and why."""


def iter_files(
    root: Path,
    suffix: str | tuple[str, ...],
    *,
    recursive: bool,
    unreadable: list[Unreadable] | None = None,
) -> Iterator[FoundFile]:
    """Regular files ending in ``suffix`` (or one of them) below ``root``, sorted, hidden
    names skipped.

    Directory symlinks are never descended into; a file symlink is yielded with ``key=None``
    so that the caller reports it instead of silently ignoring it. A missing ``root`` has no
    files. A directory that cannot be read (``root`` itself, or with ``recursive`` a
    subdirectory) is appended to ``unreadable``: one that is a symlink, ``root`` when it is not
    a directory, and one that cannot be opened or listed (EACCES); the walk goes on with the
    others, so the caller can tell "no files" from "files it could not see".
    """
    problems: list[Unreadable] = [] if unreadable is None else unreadable
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return
    except OSError as e:
        problems.append(("", e.strerror or str(e)))
        return
    if stat.S_ISLNK(st.st_mode):
        problems.append(("", _SYMLINK))
        return
    if not stat.S_ISDIR(st.st_mode):
        problems.append(("", "is not a directory"))
        return

    found: list[FoundFile] = []
    try:
        fd = os.open(root, _DIR_FLAGS)
    except OSError as e:
        problems.append(("", e.strerror or str(e)))
        return
    try:
        _walk(fd, "", suffix, recursive, found, problems)
    finally:
        os.close(fd)
    yield from sorted(found, key=lambda f: f.rel)


def _walk(
    fd: int,
    rel_dir: str,
    suffix: str | tuple[str, ...],
    recursive: bool,
    found: list[FoundFile],
    problems: list[Unreadable],
) -> None:
    """:func:`iter_files` in the directory open as ``fd`` (``rel_dir`` below the root)."""
    try:
        with os.scandir(fd) as it:
            entries = list(it)
    except OSError as e:
        problems.append((rel_dir, e.strerror or str(e)))
        return
    subdirs: list[str] = []
    for entry in entries:
        name = entry.name
        if name.startswith("."):
            continue
        rel = f"{rel_dir}/{name}" if rel_dir else name
        try:
            if entry.is_dir(follow_symlinks=False):
                if recursive:
                    subdirs.append(name)
                continue
            if (
                recursive
                and entry.is_symlink()
                and not name.endswith(suffix)
                and entry.is_dir()  # (followed: where a directory of inputs may have been)
            ):
                problems.append((rel, _SYMLINK))
                continue
            if not name.endswith(suffix):
                continue
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        key = stat_key(st) if stat.S_ISREG(st.st_mode) else None
        found.append(FoundFile(rel, rel_dir, name, key))
    for name in subdirs:
        rel = f"{rel_dir}/{name}" if rel_dir else name
        try:
            child = os.open(name, _DIR_FLAGS, dir_fd=fd)
        except OSError as e:
            why = _SYMLINK if e.errno == errno.ELOOP else (e.strerror or str(e))
            problems.append((rel, why))
            continue
        try:
            _walk(child, rel, suffix, recursive, found, problems)
        finally:
            os.close(child)


def read_bytes_at(path: Path | str, max_bytes: int) -> tuple[bytes, StatKey]:
    """Read a regular file without following a symlink at its last component.

    Returns at most ``max_bytes + 1`` bytes, so the caller can tell that the cap was exceeded
    without reading a huge file into memory.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise FileReadError("is a symlink; symlinks are not followed") from None
        raise FileReadError(e.strerror or str(e)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileReadError("is not a regular file")
        chunks: list[bytes] = []
        remaining = max_bytes + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks), stat_key(st)
    finally:
        os.close(fd)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(
    path: Path,
    data: bytes,
    *,
    mode: int = 0o600,
    hook: WriteHook | None = None,
    sync: bool = True,
) -> None:
    """Replace ``path`` by ``data`` so that a crash at any point leaves old or new, never torn.

    The steps are reported to ``hook`` as ``open``, ``write``, ``fsync``, ``rename`` and
    ``fsync-dir`` just before each happens; an exception from the hook aborts the write there.
    """
    directory = path.parent
    tmp = directory / f".{path.name}.tmp-{os.getpid()}"
    step = hook or (lambda _name: None)
    step("open")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        try:
            os.fchmod(fd, mode)
            step("write")
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            if sync:
                step("fsync")
                os.fsync(fd)
        finally:
            os.close(fd)
        step("rename")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if sync:
        step("fsync-dir")
        fsync_dir(directory)


def write_if_changed(
    path: Path, data: bytes, *, mode: int = 0o600, hook: WriteHook | None = None
) -> bool:
    """:func:`atomic_write` unless the file already holds exactly ``data``; True if written."""
    try:
        current, _ = read_bytes_at(path, len(data))
    except FileReadError:
        current = None
    if current == data:
        return False
    atomic_write(path, data, mode=mode, hook=hook)
    return True


def ensure_dir(path: Path, mode: int = 0o700) -> None:
    """Create ``path`` (and parents) with ``mode``; refuse a symlink in its place."""
    if path.is_symlink():
        raise FileReadError(f"{path} is a symlink; refusing to use it")
    path.mkdir(mode=mode, parents=True, exist_ok=True)


def _is_temp(entry: os.DirEntry[str]) -> bool:
    """A writer's temp file: ``.<name>.tmp-<pid>`` (the manifest's: ``..manifest.json.tmp-``)."""
    name = entry.name
    return name.startswith(".") and ".tmp-" in name and not entry.is_dir(follow_symlinks=False)


def remove_stale_temp_files(root: Path, rel: str, *, subdirs: bool = False) -> int:
    """Remove the temp files a killed writer left in ``root/rel`` (with ``subdirs``, in each
    of its subdirectories too, one level down); call only while holding the lock. No symlink
    on the way below ``root`` is followed, and a directory that is missing, a symlink, not a
    directory or unreadable is left alone (nothing of ours can be in it). Returns the number
    of files removed."""
    fd = _open_dir_below(root, rel)
    if fd is None:
        return 0
    try:
        return _sweep(fd, subdirs)
    finally:
        os.close(fd)


def _open_dir_below(root: Path, rel: str) -> int | None:
    """A descriptor of ``root/rel`` opened one component at a time without following a
    symlink, or None."""
    try:
        fd = os.open(root, _DIR_FLAGS & ~os.O_NOFOLLOW)
    except OSError:
        return None
    for part in rel.split("/"):
        try:
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
        except OSError:
            child = None
        os.close(fd)
        if child is None:
            return None
        fd = child
    return fd


def _sweep(fd: int, subdirs: bool) -> int:
    with os.scandir(fd) as it:
        entries = list(it)
    removed = 0
    for e in entries:
        if _is_temp(e):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(e.name, dir_fd=fd)
                removed += 1
    if not subdirs:
        return removed
    for e in entries:
        if e.is_dir(follow_symlinks=False) and not e.name.startswith("."):
            try:
                child = os.open(e.name, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                continue
            try:
                removed += _sweep(child, False)
            finally:
                os.close(child)
    return removed


def _syncfs_function() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return cast(Callable[[int], int], fn)


_SYNCFS = _syncfs_function()


def _sync_filesystem_of(directory: Path) -> None:
    """Flush the whole filesystem holding ``directory`` (one syscall for any number of files)."""
    assert _SYNCFS is not None
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if _SYNCFS(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs failed: {os.strerror(err)}")
    finally:
        os.close(fd)


class FileStat(NamedTuple):
    """A file as ``lstat`` sees it once written: what a writer fingerprints it by."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    mode: int  # st_mode, the file type bits included


@dataclass(frozen=True, slots=True)
class DirWrite:
    """Files to replace in one directory, renamed in this order (put a file that names another
    after it: a crash between the renames leaves the named one, never the one that names it)."""

    directory: str  # an absolute path, or one relative to the working directory
    files: Sequence[tuple[str, bytes, int]]  # (name, data, mode)
    create: bool = False
    """The directory does not exist yet: it is made (``mkdir``, mode 0755 less the umask) before
    its files are written, and nothing in it is read or compared."""


_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _write_temp(path: str, data: bytes, mode: int, fsync: bool) -> FileStat:
    """Create ``path`` (it must be new: ``O_EXCL``, never through a symlink), write ``data``,
    give it exactly ``mode``; its stat as it will read once renamed."""
    try:
        fd = os.open(path, _TEMP_FLAGS, mode)
    except FileExistsError:
        os.unlink(path)  # left by a killed writer that had this pid (writers hold the lock)
        fd = os.open(path, _TEMP_FLAGS, mode)
    try:
        written = os.write(fd, data) if data else 0
        if written < len(data):
            view = memoryview(data)
            while written < len(data):
                written += os.write(fd, view[written:])
        st = os.fstat(fd)
        st_mode = st.st_mode
        if stat.S_IMODE(st_mode) != mode:  # the umask (or a default ACL) took bits away
            os.fchmod(fd, mode)
            st_mode = stat.S_IFMT(st_mode) | mode
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return FileStat(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st_mode)


class Commit:
    """Writes made durable together and visible in order: the form of every batched write
    here (:func:`write_groups`, :func:`write_new_tree`, :func:`atomic_write_many`), and what
    ``reconcile`` writes a run through (its last-good copies, checkpoint, configs, network and
    component files and plan with two flushes, where each had two of its own).

    Each write puts its bytes in a temp file beside its target now (``.<name>.tmp-<pid>``,
    exclusive create, no symlink followed; a new directory tree under a temp name) and queues
    the step that makes it visible (a rename); unlinks and removals of directories are queued as
    steps too. :meth:`flush` makes every step queued so far durable, in order: the filesystems
    are flushed once (``syncfs``; an ``fsync`` per file as it is written, and per directory,
    where there is no syncfs), the steps are applied in the order queued, and the filesystems
    are flushed once more. A crash before the steps leaves every target as it was (the temps
    are swept by the next run); in the middle of them, the steps queued first (the journal of
    ext4, xfs or btrfs commits a directory operation after those before it): put a file that
    names another after it. Every file is old or new, never torn.

    A failure while writing a temp, in a sync or in a step spends the commit: the temps of the
    steps not applied are removed (:meth:`abort`; as a context manager, on an exception) and
    the commit refuses further use; a failed sync is never retried. The hook sees ``open``
    before the first write after a flush, then ``write``, ``fsync``, ``rename`` and
    ``fsync-dir`` at each flush, each before it happens; ``sync=False`` skips the flushes (the
    steps are still reported)."""

    __slots__ = (
        "_devices",
        "_dirs",
        "_due",
        "_hook",
        "_index",
        "_later",
        "_made",
        "_opened",
        "_pending",
        "_pid",
        "_spent",
        "_sync",
    )

    def __init__(self, *, hook: WriteHook | None = None, sync: bool = True) -> None:
        self._hook = hook
        self._sync = sync
        self._pid = os.getpid()
        self._pending: list[tuple[str, str, str] | None] = []  # (kind, source, target)
        self._index: dict[str, int] = {}  # a renamed target's place in _pending
        self._devices: dict[int, str] = {}  # a directory per filesystem written to
        self._dirs: set[str] = set()  # (no syncfs) the directories whose entries the steps change
        self._made: set[str] = set()  # (no syncfs) the directories of a tree, before its rename
        self._later: list[str] = []  # second names of files to free after the next flush
        self._due: list[str] = []  # ... and those whose flush is done: freed at the next one
        self._opened = False
        self._spent = False

    def __enter__(self) -> Commit:
        return self

    def __exit__(self, kind: object, _value: object, _tb: object) -> None:
        try:
            if kind is None:
                self.flush()
            else:
                self.abort()
        finally:
            self._free(self._due)
            self._free(self._later)

    @property
    def _per_file_fsync(self) -> bool:
        return self._sync and _SYNCFS is None

    def _step(self, name: str) -> None:
        if self._hook is not None:
            self._hook(name)

    def _begin(self) -> None:
        if self._spent:
            raise RuntimeError("this commit failed or was aborted; start another")
        if not self._opened:
            self._opened = True
            self._step("open")

    def _temp(self, directory: str, name: str) -> str:
        return f"{directory}/.{name}.tmp-{self._pid}"

    def _noted(self, dev: int, directory: str) -> None:
        if dev not in self._devices:
            self._devices[dev] = directory
        if _SYNCFS is None:
            self._dirs.add(directory)

    def _queue(self, kind: str, source: str, target: str) -> None:
        if kind == "rename":
            # a target written again before the flush: its last write, at its last place (the
            # two share their temp name)
            earlier = self._index.get(target)
            if earlier is not None:
                self._pending[earlier] = None
            self._index[target] = len(self._pending)
        self._pending.append((kind, source, target))

    def replace(self, path: str | Path, data: bytes, mode: int = 0o600) -> FileStat:
        """Write ``data`` for ``path`` (with exactly ``mode``), renamed over it at the next
        flush; its stat as ``lstat`` will read it then."""
        return self.groups(
            [DirWrite(os.path.dirname(path) or ".", ((os.path.basename(path), data, mode),))]
        )[0][0]

    def groups(self, groups: Sequence[DirWrite]) -> list[list[FileStat]]:
        """Each group's files written beside their targets (a ``create`` group's directory
        made now, mode 0755 less the umask), renamed at the next flush group after group, each
        group's files in their order; per group, its files' stats as ``lstat`` will read them
        once renamed."""
        self._begin()
        stats: list[list[FileStat]] = []
        try:
            for g in groups:
                d = g.directory
                if g.create:
                    os.mkdir(d, 0o755)
                    if _SYNCFS is None:
                        self._dirs.add(os.path.dirname(d) or ".")
                out: list[FileStat] = []
                stats.append(out)
                for name, data, mode in g.files:
                    temp = self._temp(d, name)
                    self._queue("rename", temp, f"{d}/{name}")  # (before: abort removes it)
                    out.append(_write_temp(temp, data, mode, self._per_file_fsync))
                if out:
                    self._noted(out[0].dev, d)
                elif g.create:
                    self._noted(os.stat(d).st_dev, d)
        except BaseException:
            self.abort()
            raise
        return stats

    def new_tree(self, parent: str, name: str, groups: Sequence[DirWrite]) -> list[list[FileStat]]:
        """The directory ``parent/name``, which must not exist then, holding ``groups`` (each
        ``directory`` a name relative to it, made, with its files), renamed into place at the
        next flush (``FileExistsError`` there if something took its name): the whole tree is
        written now under a temp name with the files' final names. A reader sees no directory
        or the whole tree; a crash before the rename leaves only the temp tree, which
        :func:`remove_stale_temp_trees` removes. Per group, its files' stats (a rename keeps
        them)."""
        self._begin()
        temp = self._temp(parent, name)
        _remove_temp_tree(temp)  # a killed writer's that had this pid
        stats: list[list[FileStat]] = []
        try:
            os.mkdir(temp, 0o755)
            self._queue("tree", temp, f"{parent}/{name}")
            fsync = self._per_file_fsync
            for g in groups:
                d = f"{temp}/{g.directory}"
                os.mkdir(d, 0o755)
                stats.append(
                    [_write_temp(f"{d}/{n}", data, mode, fsync) for n, data, mode in g.files]
                )
                if _SYNCFS is None:
                    self._made.add(d)
            if _SYNCFS is None:
                self._made.add(temp)
                self._dirs.add(parent)
            self._noted(os.stat(temp).st_dev, parent)
        except BaseException:
            self.abort()
            raise
        return stats

    def link(self, source: str | Path, path: str | Path) -> None:
        """``path`` becomes another name of ``source``'s inode (a hard link, made now under a
        temp name and renamed over ``path`` at the next flush); ``OSError`` when the
        filesystem has no hard links (nothing is queued then)."""
        self._begin()
        directory, name = os.path.split(os.fspath(path))
        temp = self._temp(directory or ".", name)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        os.link(source, temp, follow_symlinks=False)
        self._queue("rename", temp, os.fspath(path))
        self._noted(os.lstat(temp).st_dev, directory or ".")

    def unlink(self, path: str | Path) -> None:
        """Remove the file ``path`` at the next flush (gone already: nothing to do)."""
        self._begin()
        directory = os.path.dirname(os.fspath(path)) or "."
        self._queue("unlink", "", os.fspath(path))
        self._noted(os.stat(directory).st_dev, directory)

    def remove_tree(self, path: str | Path) -> None:
        """Remove the directory ``path`` and everything below it at the next flush (nothing
        below it is followed)."""
        self._begin()
        directory = os.path.dirname(os.fspath(path)) or "."
        self._queue("rmtree", "", os.fspath(path))
        self._noted(os.stat(directory).st_dev, directory)

    def free_later(self, path: str | Path) -> None:
        """``path``, an existing file that a step of this commit replaces or removes, is
        freed only after the flush of that step, at the next flush (or when the commit ends):
        it gets a second name now (a hard link, ``.<name>.free.tmp-<pid>``), so the step only
        drops a name; freeing a big file's blocks (10 ms for 5.5 MB on ext4) then happens off
        the path to that flush. Nothing happens where ``path`` is missing or the filesystem
        has no hard links. A crash leaves the second name to the sweep of temp files."""
        directory, name = os.path.split(os.fspath(path))
        second = f"{directory or '.'}/.{name}.free.tmp-{self._pid}"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(second)
        try:
            os.link(path, second, follow_symlinks=False)
        except OSError:
            return
        self._later.append(second)

    @staticmethod
    def _free(paths: list[str]) -> None:
        for path in paths:
            with contextlib.suppress(OSError):
                os.unlink(path)
        paths.clear()

    @property
    def pending(self) -> bool:
        """Whether a step waits for the next flush."""
        return bool(self._pending)

    def flush(self) -> None:
        """Make every step queued so far durable, in order (see the class); the commit stays
        open for more."""
        if self._spent:
            raise RuntimeError("this commit failed or was aborted; start another")
        self._free(self._due)  # (a flush later than theirs: off its path)
        if not self._pending:
            return
        step = self._step
        applied = 0
        try:
            step("write")
            step("fsync")
            if self._sync:
                self._flush_filesystems(self._made)
            step("rename")
            for op in self._pending:
                if op is not None:
                    _apply(*op)
                applied += 1
            step("fsync-dir")
            if self._sync:
                self._flush_filesystems(self._dirs)
        except BaseException:
            del self._pending[:applied]
            self.abort()
            raise
        self._pending.clear()
        self._index.clear()
        self._due, self._later = self._later, self._due
        self._devices.clear()
        self._dirs.clear()
        self._made.clear()
        self._opened = False

    def _flush_filesystems(self, directories: set[str]) -> None:
        """syncfs once per filesystem written to; without syncfs, the files were fsynced as
        they were written, and each of ``directories`` is fsynced."""
        if _SYNCFS is None:
            for directory in sorted(directories):
                fsync_dir(Path(directory))
            return
        for directory in sorted(self._devices.values()):
            _sync_filesystem_of(Path(directory))

    def abort(self) -> None:
        """Remove the temps of every step not applied; the commit is spent."""
        self._spent = True
        for op in self._pending:
            if op is None:
                continue
            kind, source, _target = op
            if kind == "rename":
                with contextlib.suppress(OSError):
                    os.unlink(source)
            elif kind == "tree":
                _remove_temp_tree(source)
        self._pending.clear()
        self._index.clear()


def _apply(kind: str, source: str, target: str) -> None:
    if kind == "rename":
        os.replace(source, target)
    elif kind == "tree":
        if os.path.lexists(target):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), target)
        os.rename(source, target)
    elif kind == "unlink":
        with contextlib.suppress(FileNotFoundError):
            os.unlink(target)
    else:  # rmtree
        st = os.lstat(target) if os.path.lexists(target) else None
        if st is not None and stat.S_ISDIR(st.st_mode):
            shutil.rmtree(target)
        elif st is not None:
            os.unlink(target)


def write_groups(
    groups: Sequence[DirWrite], *, hook: WriteHook | None = None, sync: bool = True
) -> list[list[FileStat]]:
    """Replace many files durably, each old or new after a crash, never torn (the batch form
    of :func:`atomic_write`): one :class:`Commit` of the groups, renamed group after group,
    each group's files in their order. Returns, per group, its files' stats as ``lstat`` reads
    them once renamed."""
    with Commit(hook=hook, sync=sync) as commit:
        return commit.groups(groups)


def write_new_tree(
    parent: str,
    name: str,
    groups: Sequence[DirWrite],
    *,
    hook: WriteHook | None = None,
    sync: bool = True,
) -> list[list[FileStat]]:
    """Make the directory ``parent/name``, which must not exist, holding ``groups`` (each
    ``directory`` a name relative to it, made, with its files), all at once: one
    :class:`Commit` of :meth:`Commit.new_tree`. One rename for the tree instead of one per
    file: what a first run that writes tens of thousands of new files costs beyond creating
    them."""
    with Commit(hook=hook, sync=sync) as commit:
        return commit.new_tree(parent, name, groups)


def remove_stale_temp_trees(parent: str, name: str) -> int:
    """Remove the temp trees killed writers left for ``parent/name`` (``.<name>.tmp-<pid>``,
    see :meth:`Commit.new_tree`), each only if it is a real directory (a symlink or a file in
    its place is left alone; nothing below it is followed). Call only while holding the lock.
    Returns how many were removed."""
    try:
        with os.scandir(parent) as it:
            names = sorted(e.name for e in it if e.name.startswith(f".{name}.tmp-"))
    except OSError:
        return 0
    return sum(_remove_temp_tree(f"{parent}/{n}") for n in names)


def _remove_temp_tree(path: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        return False
    shutil.rmtree(path, ignore_errors=True)
    return not os.path.lexists(path)


def atomic_write_many(
    items: Sequence[tuple[Path, bytes, int]],
    *,
    hook: WriteHook | None = None,
    commit: Commit | None = None,
) -> None:
    """:func:`atomic_write` for many files with batched syncs: one :class:`Commit`, the files
    renamed in the order given. With ``commit``, the files join it (made visible at its next
    flush) instead."""
    if not items:
        return
    groups = [DirWrite(str(path.parent), ((path.name, data, mode),)) for path, data, mode in items]
    if commit is not None:
        commit.groups(groups)
        return
    if _SYNCFS is None:  # no syncfs: one fsync per file
        for path, data, mode in items:
            atomic_write(path, data, mode=mode, hook=hook)
        return
    write_groups(groups, hook=hook)
