"""A private cache of what the read-only commands computed, so that the next one on the same
inputs starts warm (``reconciler explain``; docs/placement.md, "The read cache").

Reading and checking the inputs of a large unit takes seconds (9,155 files at 5,000 nodes x
20,000 instances: ~1.4 s), and ``explain`` balances the whole unit before it shows one
instance. Someone explaining one instance usually explains a second one next, on the very same
files. So the command keeps, per state directory, what it computed in a cache directory of the
user's own:

- **the loaded view** (:class:`~reconciler.io.loader.StateView`): the next load starts from it
  as a watcher's next run starts from its previous view, so each input file is ``stat``-ed and
  only a file whose stat key changed is read again (and parsed again only when its bytes
  changed). That is the loader's own rule for a warm load (a stat key is trusted only when the
  file had been quiet for a couple of seconds when it was read), so the view is the one a load
  from nothing gives. Only a view without a single diagnostic is kept: a file that is invalid
  now would keep a last good version from the cache that a load from nothing does not have.
- **computed values** under a key that names everything they depend on (``explain``'s
  balance: the input hash, the checkpoint files' bytes, the mode and the stale nodes).

Safety: the files are Python pickles, which are code to the reader, so they are read only from
a directory owned by this user that no one else can write to (created ``0700``), from files
owned by this user; each file carries the version of the code that wrote it (the package's
version and the size and mtime of each of its modules) and the SHA-256 of its payload, and
anything that does not match (another version, a torn or altered file) is ignored and
replaced. Nothing in the cache is ever needed: a miss computes the value as before.

Where: ``$RECONCILER_CACHE_DIR``, else ``$XDG_CACHE_HOME/reconciler``, else
``~/.cache/reconciler``; ``RECONCILER_CACHE_DIR=`` (empty) turns it off. Each state directory
has a subdirectory named by a digest of its path; the 16 most recently used are kept.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import io
import logging
import os
import pickle
import re
import shutil
import stat
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from reconciler import __version__
from reconciler.io import checkpoint_files
from reconciler.io.fsio import atomic_write
from reconciler.io.loader import Diagnostic, LoadOptions, StateView, adopted, load_state
from reconciler.model.documents import ActualState, Node, Service, UnitConfig
from reconciler.model.policyregistry import policy_names
from reconciler.placement.instances import Placement, Requested, new_placement

__all__ = [
    "CACHE_ENV",
    "KEEP",
    "ReadCache",
    "balance_key",
    "cached_view",
    "code_version",
    "disabled",
    "exact",
    "keep_view",
    "load_state_cached",
    "open_cache",
    "same",
]

log = logging.getLogger(__name__)

CACHE_ENV = "RECONCILER_CACHE_DIR"
KEEP = 16
"""State directories kept in the cache, the most recently used."""

_MAGIC = b"reconciler read cache 1\n"
_VIEW = "view"
_off: contextvars.ContextVar[bool] = contextvars.ContextVar("readcache_off", default=False)


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """No cache inside the block (a ``--store`` snapshot: a new temporary directory each time,
    which no later command reads again)."""
    token = _off.set(True)
    try:
        yield
    finally:
        _off.reset(token)


@cache
def code_version() -> str:
    """What names the code that wrote a cache file: the package's version, Python's, and each
    module's path, size and mtime (a change to any module invalidates the cache)."""
    package = Path(__file__).resolve().parent.parent
    h = hashlib.sha256(f"{__version__}\0{sys.version}\0".encode())
    for path in sorted(package.rglob("*.py")):
        st = path.stat()
        h.update(f"{path.relative_to(package)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()


def _private_dir(path: Path) -> bool:
    """A directory of this user's that no one else can write to (nor replace: not a symlink)."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (
        stat.S_ISDIR(st.st_mode)
        and st.st_uid == os.geteuid()
        and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def _cache_root(environ: Mapping[str, str]) -> Path | None:
    if CACHE_ENV in environ:
        value = environ[CACHE_ENV]
        return Path(value) if value else None
    xdg = environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg) / "reconciler"
    home = environ.get("HOME")
    return Path(home) / ".cache" / "reconciler" if home else None


def open_cache(
    state_dir: Path, environ: Mapping[str, str] | None = None, *, create: bool = True
) -> ReadCache | None:
    """The cache of ``state_dir`` (created when missing, unless not ``create``), or None:
    turned off, inside :func:`disabled`, missing and not to be created, or no private directory
    can be had (the commands then run uncached)."""
    if _off.get():
        return None
    root = _cache_root(os.environ if environ is None else environ)
    if root is None:
        return None
    # the path as given and as resolved: the view's paths are the given ones
    name = hashlib.sha256(f"{os.path.realpath(state_dir)}\0{state_dir}".encode()).hexdigest()
    directory = root / name[:32]
    if not create and not directory.is_dir():
        return None
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        directory.mkdir(mode=0o700, exist_ok=True)
    except OSError as e:
        log.debug("read cache off: %s", e)
        return None
    if not (_private_dir(root) and _private_dir(directory)):
        log.debug("read cache off: %s is not a private directory of this user", directory)
        return None
    return ReadCache(directory)


@dataclass(frozen=True)
class ReadCache:
    """One state directory's cache directory (see the module docstring)."""

    directory: Path

    def get(self, kind: str, key: str) -> object | None:
        """The value :meth:`put` stored as ``kind`` under ``key`` by this version of the code,
        or None."""
        path = self.directory / f"{kind}.pickle"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                return None
            head = _header(key)
            if f.read(len(head)) != head:
                return None
            digest, payload = f.read(32), f.read()
        if hashlib.sha256(payload).digest() != digest:
            log.debug("read cache: %s is torn or altered; ignored", path)
            return None
        try:
            value: object = pickle.loads(payload)
        except Exception as e:  # (a file of a version that slipped through)
            log.debug("read cache: %s cannot be read back (%s); ignored", path, e)
            return None
        with contextlib.suppress(OSError):
            os.utime(self.directory)  # recently used (see _prune)
        return value

    def put(self, kind: str, key: str, value: object) -> None:
        """Store ``value`` as ``kind`` under ``key`` (replacing what was there), then keep the
        :data:`KEEP` most recently used state directories. Never fails: a cache that cannot
        be written is a cache that misses."""
        try:
            buffer = io.BytesIO()
            _SharingPickler(buffer).dump(value)
            payload = buffer.getvalue()
            data = _header(key) + hashlib.sha256(payload).digest() + payload
            # not synced: a file torn by a crash fails its digest and is computed again
            atomic_write(self.directory / f"{kind}.pickle", data, sync=False)
            os.utime(self.directory)
            _sweep_orphans(self.directory)
            _prune(self.directory.parent)
        except (OSError, pickle.PicklingError, RecursionError) as e:
            log.debug("read cache: %s not written: %s", kind, e)


_TEMP = re.compile(r"\.[a-z]+\.pickle\.tmp-(\d+)")
"""A write's temp file (``atomic_write``'s name for it): ``.<kind>.pickle.tmp-<pid>``."""


def _sweep_orphans(directory: Path) -> None:
    """Remove the temp files of writers that died before their rename (a process killed in
    the middle of a write; any other end removes its own): those whose process is gone."""
    with os.scandir(directory) as it:
        for entry in it:
            found = _TEMP.fullmatch(entry.name)
            if found is None or _alive(int(found.group(1))):
                continue
            with contextlib.suppress(OSError):
                os.unlink(entry.path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # (another user's: alive)
        return True
    return True


def same(value: object) -> object:
    """The object itself: how a pickle refers to a part equal to one it already holds."""
    return value


_DOCUMENTS = (Service, Node, ActualState, UnitConfig)
_PLACEMENT_FIELDS = tuple(f.name for f in dataclasses.fields(Placement))


class _SharingPickler(pickle.Pickler):
    """Pickles each set of equal parts of the documents once: 20,000 services hold a few
    distinct images, platforms and quotas, each its own object as loaded, and rebuilding a
    pydantic model costs a Python call. Equal means equal to pydantic (type, fields and
    private attributes) with the same fields set explicitly (which a few checks read); the
    documents themselves are never merged, only their parts (frozen values)."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._seen: dict[tuple[BaseModel, frozenset[str]], BaseModel] = {}
        self._requested: dict[Requested, Requested] = {}

    def reducer_override(self, obj: Any) -> Any:
        kind = type(obj)
        if kind is Placement:  # (20,000 of them: a constructor call, not a __setstate__)
            return (new_placement, tuple(getattr(obj, f) for f in _PLACEMENT_FIELDS))
        if kind is Requested:  # (as few distinct ones as the services ask)
            first_req = self._requested.setdefault(obj, obj)
            if first_req is not obj:
                return (same, (first_req,))
            return (Requested, (obj.cpu, obj.ram, obj.storage, obj.state))
        if not isinstance(obj, BaseModel) or isinstance(obj, _DOCUMENTS):
            return NotImplemented
        try:
            first = self._seen.setdefault((obj, frozenset(obj.model_fields_set)), obj)
        except TypeError:  # (a part holding a list or a dict: not hashable)
            return NotImplemented
        return NotImplemented if first is obj else (same, (first,))


def _header(key: str) -> bytes:
    return _MAGIC + f"{code_version()}\0{key}\n".encode()


def _prune(root: Path) -> None:
    """Remove all but the :data:`KEEP` most recently used state directories' caches."""
    entries: list[tuple[int, str]] = []
    with os.scandir(root) as it:
        for entry in it:
            if entry.is_dir(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    entries.append((entry.stat(follow_symlinks=False).st_mtime_ns, entry.name))
    entries.sort(reverse=True)
    for _mtime, name in entries[KEEP:]:
        shutil.rmtree(root / name, ignore_errors=True)


def _view_key(state_dir: Path) -> str:
    """The state directory as given, and the sharing policies registered in this process
    (which decide whether a node file naming one is valid)."""
    return f"{state_dir}\0{','.join(policy_names())}"


def cached_view(state_dir: Path, cache: ReadCache | None) -> StateView | None:
    """The view of ``state_dir`` the cache holds, to start a load from (see
    :func:`load_state_cached`); None when it holds none."""
    if cache is None:
        return None
    got = cache.get(_VIEW, _view_key(state_dir))
    return adopted(got) if isinstance(got, StateView) and got.root == state_dir else None


def exact(view: StateView) -> bool:
    """Whether a load that started from a cached view gave what a load from nothing gives:
    always, unless a file has a problem (its object would keep the cached view's version,
    which a load from nothing does not have: load again from nothing, a rare slow path)."""
    return not view.unreadable and not view.duplicates and not view.records().diagnostics()


def keep_view(
    state_dir: Path, cache: ReadCache | None, view: StateView, started: StateView | None
) -> None:
    """Cache ``view`` (loaded from ``started``, the cached view, or from nothing) for the next
    command, unless it has a problem or is the cached one already."""
    if cache is None or not exact(view):
        return
    if started is None or not _same_records(started, view):
        cache.put(_VIEW, _view_key(state_dir), view)


def _same_records(before: StateView, after: StateView) -> bool:
    old = before.files
    return old.keys() == after.files.keys() and all(
        rec is old[rel] for rel, rec in after.files.items()
    )


def load_state_cached(
    state_dir: Path, cache: ReadCache | None, opts: LoadOptions | None = None
) -> tuple[StateView, list[Diagnostic]]:
    """:func:`~reconciler.io.loader.load_state` of ``state_dir``, starting from the cached view
    when there is one; a view without diagnostics is cached for the next command (when it is
    not the cached one already)."""
    previous = cached_view(state_dir, cache)
    view, diags = load_state(state_dir, previous, opts)
    if previous is not None and (diags or not exact(view)):
        return load_state(state_dir, None, opts)
    if not diags:
        keep_view(state_dir, cache, view, previous)
    return view, diags


def balance_key(
    view: StateView, checkpoint_dir: Path, mode: str | None, nodes: Iterable[Node]
) -> str:
    """What a balance of ``view`` depends on besides the code: the inputs' contents, the
    checkpoint files' bytes (the previous allocations), the mode, and which nodes are marked
    stale, with the reason each says (``nodes`` as the command marked them)."""
    stale = sorted((n.id, n.no_report) for n in nodes if n.no_report is not None)
    parts = (
        view.input_hash,
        checkpoint_files.fingerprint(checkpoint_dir),
        mode or "",
        stale,
        policy_names(),  # (the sharing policies' code is the package's: a name suffices)
    )
    return hashlib.sha256(repr(parts).encode()).hexdigest()
