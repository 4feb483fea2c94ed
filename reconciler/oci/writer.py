"""Writes the built OCI configs under ``out/instances/<id>/`` (SPEC §2, §11).

Each placed instance gets ``config.json`` and ``hosts`` (both 0644: the runtime reads them, and
``hosts`` is bind-mounted into the container). A file is rewritten only when its bytes or its mode
differ; the directories of instances that are no longer built are removed. Instance ids are
validated before any path is formed, and no symlink is ever followed: ``out`` or
``out/instances`` being a symlink is an error, an instance entry that is not a real directory is
replaced, and files are compared through ``O_NOFOLLOW`` and replaced by rename.

All the files to write go out in one durable batch (:func:`reconciler.io.fsio.write_groups`); the
directory of a new instance is made by that batch and its files are not compared with anything
(a cold ``out/instances`` costs a listing, a ``mkdir`` and two new files per instance, not an
lstat and a read per file), and what the manifest records of each file written comes from the
writer's own ``fstat``, not another ``lstat``. A first run, with no ``out/instances`` at all,
writes the whole directory under a temp name with the files' final names and renames it into
place once (:func:`reconciler.io.fsio.write_new_tree`): the files created, two flushes and one
rename, where the batch pays two renames per instance.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import json
import operator
import os
import shutil
import stat
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from reconciler.io.fsio import (
    Commit,
    DirWrite,
    FileReadError,
    FileStat,
    StatKey,
    atomic_write_many,
    read_bytes_at,
    remove_stale_temp_files,
    remove_stale_temp_trees,
    stat_key,
)
from reconciler.model.jsonbytes import fragment, join_object, member, pretty_json
from reconciler.model.values import validate_id
from reconciler.oci.builder import BuiltConfig, config_json, content_digest

__all__ = [
    "CONFIG_MODE",
    "WRITING",
    "OutputPathError",
    "PendingManifest",
    "WriteMemo",
    "WriteReport",
    "hosts_path",
    "instance_dir",
    "instances_dir",
    "sweep_instance_temps",
    "write_instance_outputs",
]

CONFIG_MODE = 0o644
_DIR_MODE = 0o755


class OutputPathError(OSError):
    """A path under ``out/`` is not what the controller left there (a symlink, a file)."""


@dataclass(frozen=True, slots=True)
class WriteReport:
    written: tuple[str, ...]  # files rewritten, relative to out/ ("instances/<id>/config.json")
    kept: tuple[str, ...]
    """What was left as it was, in order: an instance id stands for both of its files, a path
    (with a '/') for one file (see :attr:`unchanged`). Paths are spelled out only when asked
    for: a warm run leaves 40,000 files alone at 20,000 instances."""
    removed: tuple[str, ...]  # instance ids whose directories were removed
    manifest: PendingManifest | None = None
    """With ``defer_manifest``: the manifest the caller is to write (None: unchanged)."""

    @property
    def unchanged(self) -> tuple[str, ...]:
        """The files left as they were, relative to out/ like :attr:`written`, by instance id
        (an instance's hosts before its config.json)."""
        out: list[str] = []
        for item in sorted(self.kept, key=_instance_of_item):
            if "/" in item:
                out.append(item)
            else:
                out += (f"instances/{item}/hosts", f"instances/{item}/config.json")
        return tuple(out)

    @property
    def counts(self) -> dict[str, int]:
        n_unchanged = sum(1 if "/" in item else len(_FILES) for item in self.kept)
        return {
            "written": len(self.written),
            "unchanged": n_unchanged,
            "removed": len(self.removed),
        }


@dataclass(frozen=True, slots=True)
class PendingManifest:
    """A manifest :func:`write_instance_outputs` left to its caller (``defer_manifest``): the
    configs it describes are already in place, so it may be written later, in the caller's
    own batch. Until it is, the manifest on disk is the older one, which a writer without a
    memo reads as "compare these instances' files" (their fingerprints differ): never wrong,
    only slower."""

    path: Path
    make: Callable[[], bytes]
    memo: WriteMemo | None

    def data(self) -> bytes:
        return self.make()

    def written(self) -> None:
        """The caller wrote :meth:`data` to :attr:`path`: the memo describes the directory."""
        memo = self.memo
        if memo is not None and memo._root == str(self.path.parent) and memo._manifest is None:
            memo._manifest = _manifest_key(self.path.parent)


def _instance_of_item(item: str) -> str:
    return item.split("/", 2)[1] if "/" in item else item


def instances_dir(state_dir: Path) -> Path:
    return Path(os.path.abspath(state_dir)) / "out" / "instances"


def instance_dir(state_dir: Path, instance_id: str) -> Path:
    """``<state>/out/instances/<id>`` as an absolute path; the id is validated first."""
    validate_id(instance_id, "instance id")
    return instances_dir(state_dir) / instance_id


def hosts_path(state_dir: Path, instance_id: str) -> Path:
    """The absolute path of an instance's hosts file (what the builder mounts at /etc/hosts)."""
    return instance_dir(state_dir, instance_id) / "hosts"


def _ensure_dir(path: Path) -> None:
    """Make ``path`` a real directory; an existing symlink or file is refused."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        os.mkdir(path, _DIR_MODE)
        return
    if not stat.S_ISDIR(st.st_mode):
        raise OutputPathError(f"{path} is not a directory (a symlink or a file); refusing")


def _list_dir(directory: str) -> dict[str, bool]:
    """The names in ``directory``, each with whether it is a real directory."""
    with os.scandir(directory) as it:
        return {e.name: e.is_dir(follow_symlinks=False) for e in it}


def _instance_dir_exists(directory: str, listing: Mapping[str, bool] | None) -> bool:
    """Whether ``directory`` is a real directory (``listing``: its parent's, if taken);
    anything else in its place (a symlink, a file) is removed, never followed. False: the batch
    makes it."""
    if listing is not None:
        is_dir = listing.get(os.path.basename(directory))
        if is_dir is None:
            return False
        if is_dir:
            return True
    else:
        try:
            st = os.lstat(directory)
        except FileNotFoundError:
            return False
        if stat.S_ISDIR(st.st_mode):
            return True
    os.unlink(directory)
    return False


def _unchanged(path: str, data: bytes) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode) or stat.S_IMODE(st.st_mode) != CONFIG_MODE:
        return False
    if st.st_size != len(data):
        return False
    try:
        current, _key = read_bytes_at(path, len(data))
    except FileReadError:
        return False
    return current == data


WRITING = ".writing"
"""out/instances/.writing: present while a batch of instance files is being written (created
before the first temp file, removed once every one is renamed). Left behind, it says a writer
died mid-batch: the next verifying run sweeps every instance directory's temp files
(:func:`sweep_instance_temps`); otherwise it need not open 20,000 directories to find none."""

MANIFEST = ".manifest.json"
"""out/instances/.manifest.json: per instance, the digest of the hosts and config.json this
writer wrote last, so that an unchanged instance costs no read (outputs are the controller's)."""


_FILES = ("hosts", "config.json")


def _read_manifest(root: Path) -> dict[str, Any]:
    try:
        raw, _ = read_bytes_at(root / MANIFEST, 64 * 1024 * 1024)
        data = json.loads(raw)
    except (FileReadError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _fingerprints(
    directory: str, written: Mapping[str, FileStat] | None = None
) -> dict[str, list[int]] | None:
    """(inode, size, mtime_ns, mode) of each file, as lstat sees them; None if one is not a
    regular file. ``written``: files just written, by name, with their stats as they will be
    once renamed (their renames may wait for a commit's flush)."""
    out: dict[str, list[int]] = {}
    for name in _FILES:
        made = written.get(name) if written is not None else None
        if made is not None:
            out[name] = [made.ino, made.size, made.mtime_ns, made.mode]
            continue
        try:
            st = os.lstat(f"{directory}/{name}")
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        out[name] = [st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode]
    return out


def _from_stats(stats: list[FileStat]) -> dict[str, list[int]]:
    """:func:`_fingerprints` of the two files, from their stats as the writer made them (an
    inode keeps its number, size, mtime and mode through the rename)."""
    return {
        name: [s.ino, s.size, s.mtime_ns, s.mode] for name, s in zip(_FILES, stats, strict=True)
    }


_PACKED = struct.Struct("<QQqQQQqQ")  # _fingerprints, hosts then config.json, in 64 bytes


def _pack(files: dict[str, list[int]] | None) -> bytes | None:
    """:func:`_fingerprints` in the compact form a :class:`WriteMemo` keeps (None: nothing a
    memo can trust, such as a manifest entry edited by hand)."""
    if files is None:
        return None
    try:
        return _PACKED.pack(*files["hosts"], *files["config.json"])
    except (struct.error, KeyError, TypeError):
        return None


def _unpack(packed: bytes | None) -> dict[str, list[int]] | None:
    if packed is None:
        return None
    values = _PACKED.unpack(packed)
    return {"hosts": list(values[:4]), "config.json": list(values[4:])}


def _untouched(directory: str, recorded: object) -> bool:
    """The files are exactly those this writer recorded (a replaced, edited or planted file has
    another inode, size, mtime or mode)."""
    return recorded is not None and _fingerprints(directory) == recorded


def _manifest_key(root: Path) -> StatKey | None:
    try:
        return stat_key(os.lstat(root / MANIFEST))
    except OSError:
        return None


@dataclass(slots=True)
class _Written:
    """An instance's files as the writer left them: the config they hold, their fingerprints
    (the manifest's ``files``, packed; None: not regular files) and, once needed, the
    instance's manifest entry as it appears in the manifest's bytes."""

    built: BuiltConfig
    files: bytes | None
    fragment: bytes | None = None


def _member(iid: str, w: _Written) -> bytes:
    """An entry of the manifest as :func:`pretty_json` writes it (a :func:`jsonio.member`)."""
    if w.fragment is None:
        entry = {"digest": content_digest(w.built), "files": _unpack(w.files)}
        w.fragment = member(iid, fragment(entry, 1), 0)
    return w.fragment


def _manifest_bytes(entries: Mapping[str, _Written]) -> bytes:
    """The bytes of ``pretty_json(manifest)``, from cached per-instance pieces."""
    return join_object([_member(i, entries[i]) for i in sorted(entries)], 0) + b"\n"


class WriteMemo:
    """What the last :func:`write_instance_outputs` call given this memo left under one
    ``out/instances``: per instance, the :class:`BuiltConfig` its files hold and their
    fingerprints (the manifest's content, kept in memory).

    The next call uses it only if the manifest file is still the one that call left (any writer
    rewrites the manifest when it changes a file or removes an instance, so another process's
    run is noticed and the call falls back to the manifest on disk); a call that fails leaves
    the memo empty. With the memo, an instance given the same :class:`BuiltConfig` object (or
    one with the same content) is known unchanged: with ``verify=True`` after an lstat of its
    two files, as without a memo; with ``verify=False`` without any system call.

    It holds about 0.5 kB per instance: the packed fingerprints and, from the first call that
    rewrites the manifest with it, each instance's entry as it appears in the manifest's bytes
    (so that a call that changes a few instances joins the others' entries instead of
    serializing them again)."""

    def __init__(self) -> None:
        self._root: str | None = None  # the out/instances directory it describes
        self._manifest: StatKey | None = None  # the manifest file as the last call left it
        self._entries: dict[str, _Written] = {}
        self._order: list[str] = []  # the keys of ``_entries``, sorted
        self._built: Mapping[str, BuiltConfig] = {}  # the ``built`` the entries were made of
        self._irregular: set[str] = set()  # entries whose files were not regular files
        self.trusted = 0  # in the last call: instances known unchanged without a system call
        self.verified = 0  # in the last call: instances known unchanged by their files' lstat
        self.compared = 0  # in the last call: instances whose files were compared or written

    def __len__(self) -> int:
        return len(self._entries)

    def _take(self, root: str, manifest: StatKey | None) -> dict[str, _Written] | None:
        """The entries if they describe ``root`` as it is; the memo is left empty."""
        entries, valid = self._entries, self._root == root and self._manifest == manifest
        self._root, self._manifest, self._entries = None, None, {}
        self._order, self._built, self._irregular = [], {}, set()
        return entries if valid else None


def _mark(path: str) -> None:
    """Create the marker file (empty; a symlink in its place is refused, not followed). An
    error is raised as the writes' own are (OSError)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    os.close(os.open(path, flags, 0o600))


def sweep_instance_temps(state_dir: Path) -> int:
    """Remove the temp files a killed writer left under ``out/instances``: those of the
    directory itself (the manifest's) always, and those of every instance directory when a
    writer died mid-batch (:data:`WRITING` left behind), then the marker; and the temp tree of
    a first run killed before its rename (``out/.instances.tmp-<pid>``). Call under the lock,
    in a verifying run. Returns the number of files (and temp trees) removed."""
    removed = remove_stale_temp_files(state_dir, "out/instances")
    out = instances_dir(state_dir).parent
    if not out.is_symlink():  # a first run's whole tree (write_new_tree)
        removed += remove_stale_temp_trees(str(out), "instances")
    marker = instances_dir(state_dir) / WRITING
    if marker.is_file() and not marker.is_symlink():
        removed += remove_stale_temp_files(state_dir, "out/instances", subdirs=True)
        marker.unlink()
    return removed


def write_instance_outputs(
    state_dir: Path,
    built: Mapping[str, BuiltConfig],
    *,
    sync: bool = True,
    memo: WriteMemo | None = None,
    verify: bool = True,
    defer_manifest: bool = False,
    since: tuple[Mapping[str, BuiltConfig], frozenset[str]] | None = None,
    commit: Commit | None = None,
) -> WriteReport:
    """Write ``config.json`` and ``hosts`` for every built instance; remove stale instances.

    ``memo`` (carried by a long-running caller, see :class:`WriteMemo`) replaces reading the
    manifest. ``verify=True`` (the default) checks the files of every instance whose content
    did not change (an lstat each: a file replaced, edited or removed behind the controller's
    back is rewritten) and lists ``out/instances`` for stale directories. ``verify=False``, with
    a memo that describes the directory, trusts it instead: an unchanged instance costs no
    system call and the stale instances are those the memo knows that are no longer built (a
    change made by hand under ``out/instances`` waits for the next call with ``verify=True``).
    Without a usable memo, ``verify`` has no effect. The files written are the same whatever
    the memo and ``verify``. ``defer_manifest`` leaves the manifest to the caller
    (:attr:`WriteReport.manifest`): ``reconcile`` writes it with the status report, after the
    plan is out. ``since`` (see :attr:`BuildResult.since`): ``built`` is the mapping given to
    the memo's last call but at these ids; a trusting call then looks at these only.
    ``commit``: the files, and the removal of the stale instances, join it (made visible at its
    next flush, the caller's) instead of a commit of their own."""
    out = Path(os.path.abspath(state_dir)) / "out"
    root = out / "instances"
    root_str = str(root)
    validated = memo._entries if memo is not None and memo._root == root_str else {}
    last_built = memo._built if memo is not None else {}
    irregular = memo._irregular if memo is not None else set()
    # the ids that can differ from the memo's last call (None: any)
    named = since[1] if since is not None and validated and since[0] is last_built else None
    gone: list[str] = []  # (when named) the ids the memo's last call wrote and that are gone
    if memo is not None and named is not None:
        added = sorted(i for i in named if i in built and i not in validated)
        gone = sorted(i for i in named if i not in built and i in validated)
        ids = memo._order
        if added or gone:
            ids = list(ids)
            for iid in gone:
                del ids[bisect.bisect_left(ids, iid)]
            for iid in added:
                validate_id(iid, "instance id")
                bisect.insort(ids, iid)
    else:
        # the memo's id order, when it names the same instances (no sort of 20,000 ids)
        same_ids = memo is not None and bool(validated) and built.keys() == validated.keys()
        order = memo._order if memo is not None and same_ids else None
        ids = order if order is not None else sorted(built)
        for iid in itertools.filterfalse(validated.__contains__, ids):
            validate_id(iid, "instance id")
    _ensure_dir(out)
    # a first run: out/instances is made whole, at once (see below)
    fresh = not os.path.lexists(root_str)
    if not fresh:
        _ensure_dir(root)

    written: list[str] = []
    unchanged: list[str] = []
    groups: list[DirWrite] = []  # the files to write, per instance directory
    group_ids: list[str] = []  # the instance of each group
    # what was written before: the memo's entries (prev) if it describes the directory as it
    # is, else the manifest on disk
    prev = memo._take(root_str, _manifest_key(root)) if memo is not None else None
    manifest = _read_manifest(root) if prev is None else {}
    new_manifest: dict[str, Any] = {}  # when prev is None
    # when memo is not None; made here at its full size, before this call's short-lived objects
    # (a table allocated among them, and kept, can keep the C heap from shrinking after them);
    # a trusting call told which instances can differ copies the last call's instead
    patching = prev is not None and not verify and named is not None
    entries = cast(
        dict[str, _Written], dict.fromkeys(ids) if memo is not None and not patching else {}
    )
    compared: list[str] = []  # instances whose files were compared (and written if different)
    kept = 0  # instances known unchanged without reading their files
    # without a manifest every instance is compared: one listing of the directory, not an
    # lstat per instance (None: look at each instance's directory)
    listing: dict[str, bool] | None = None
    if fresh:
        listing = {}
    elif prev is None and not manifest:
        listing = _list_dir(root_str)
    todo = ids
    if patching:
        assert prev is not None and named is not None
        # trusted, and told which instances can differ: the others are the last call's
        looked = {i for i in named if i in built}
        looked.update(irregular & built.keys())
        todo = sorted(looked)
        entries = dict(prev)  # (the ids in todo are set below, the gone ones dropped)
        for iid in gone:
            del entries[iid]
        trusted = list(ids)  # (sorted: the few looked at taken out by bisection)
        for iid in todo:
            at = bisect.bisect_left(trusted, iid)
            if at < len(trusted) and trusted[at] == iid:
                del trusted[at]
        unchanged += trusted  # both files of each
        kept += len(trusted)
    elif prev is not None and not verify:
        # trusted: an instance given the very BuiltConfig of the last call, with regular files
        # then, is unchanged; only the others are looked at (C-level passes over the ids)
        same = list(map(operator.is_, map(last_built.get, ids), map(built.get, ids)))
        todo = list(itertools.compress(ids, map(operator.not_, same)))
        if irregular:
            todo = sorted(set(todo) | (irregular & built.keys()))
            same = list(map(operator.not_, map(set(todo).__contains__, ids)))
        trusted = list(itertools.compress(ids, same))
        entries.update(zip(trusted, map(prev.__getitem__, trusted), strict=True))
        unchanged += trusted  # both files of each
        kept += len(trusted)
    for iid in todo:
        config = built[iid]
        if prev is not None:
            w = prev.get(iid)
            if (
                w is not None
                and (w.built is config or content_digest(w.built) == content_digest(config))
                and w.files is not None
                and (not verify or _pack(_fingerprints(f"{root_str}/{iid}")) == w.files)
            ):
                entries[iid] = w if w.built is config else _Written(config, w.files, w.fragment)
                unchanged.append(iid)  # both files
                kept += 1
                continue
        else:
            digest = content_digest(config)
            known = manifest.get(iid)
            if (
                isinstance(known, dict)
                and known.get("digest") == digest
                and _untouched(f"{root_str}/{iid}", known.get("files"))
            ):
                # written by this writer with this content and not touched since: no read needed
                new_manifest[iid] = known
                if memo is not None:
                    entries[iid] = _Written(config, _pack(known["files"]))
                unchanged.append(iid)  # both files
                kept += 1
                continue
        # hosts first: a config never points at a hosts file that is not there yet
        files = (("hosts", config.hosts.encode()), ("config.json", config_json(config)))
        directory = f"{root_str}/{iid}"
        compared.append(iid)
        if not _instance_dir_exists(directory, listing):
            # a new directory (made by the batch): nothing in it to compare
            groups.append(DirWrite(directory, [(n, d, CONFIG_MODE) for n, d in files], True))
            group_ids.append(iid)
            written += (f"instances/{iid}/hosts", f"instances/{iid}/config.json")
            continue
        changed_files: list[tuple[str, bytes, int]] = []
        for name, data in files:
            rel = f"instances/{iid}/{name}"
            target = f"{directory}/{name}"
            if _unchanged(target, data):
                unchanged.append(rel)
                continue
            if _is_real_dir(target):
                shutil.rmtree(target)
            changed_files.append((name, data, CONFIG_MODE))
            written.append(rel)
        if changed_files:
            groups.append(DirWrite(directory, changed_files))
            group_ids.append(iid)
    # one batch: every temp written (the new directories made first), one filesystem flush,
    # every rename, one more flush; an instance's hosts file is renamed before its config, so a
    # config never names a missing hosts file; the manifest comes after
    # a first run writes the whole directory under a temp name with the files' final names and
    # renames it into place: one rename, not two per instance (a reader sees no out/instances
    # or all of it; a killed writer's temp tree is swept like its temp files)
    own = Commit(sync=sync) if commit is None else None
    batch = commit if commit is not None else own
    assert batch is not None
    try:
        if fresh and groups:
            tree = [DirWrite(iid, g.files, True) for iid, g in zip(group_ids, groups, strict=True)]
            stats = batch.new_tree(str(out), "instances", tree)
        else:
            if fresh:
                _ensure_dir(root)
            marker = f"{root_str}/{WRITING}"
            if groups:
                _mark(marker)
            stats = batch.groups(groups)
            if groups:
                batch.unlink(marker)  # once every file of the batch is renamed
        if own is not None:
            own.flush()
    except BaseException:
        batch.abort()
        raise
    both: dict[str, list[FileStat]] = {}  # instances whose two files were both written
    some: dict[str, dict[str, FileStat]] = {}  # those with one (the other unchanged)
    for iid, group, group_stats in zip(group_ids, groups, stats, strict=True):
        if len(group.files) == len(_FILES):
            both[iid] = group_stats
        else:
            some[iid] = {
                name: st for (name, _d, _m), st in zip(group.files, group_stats, strict=True)
            }
    changed = False  # whether the manifest's content changes (when prev is not None)
    for iid in compared:
        made = both.get(iid)
        fingerprints = (
            _fingerprints(f"{root_str}/{iid}", some.get(iid)) if made is None else _from_stats(made)
        )
        fragment: bytes | None = None
        if prev is None:
            new_manifest[iid] = {"digest": content_digest(built[iid]), "files": fingerprints}
        else:
            old = prev.get(iid)
            if (
                old is not None
                and old.files == _pack(fingerprints)
                and content_digest(old.built) == content_digest(built[iid])
            ):
                fragment = old.fragment  # the same manifest entry
            else:
                changed = True
        if memo is not None:
            entries[iid] = _Written(built[iid], _pack(fingerprints), fragment)
    make: Callable[[], bytes] | None = None
    if prev is None:
        if new_manifest != manifest:
            make = functools.partial(pretty_json, new_manifest)
    elif changed or len(entries) != len(prev):
        make = functools.partial(_manifest_bytes, entries)
    pending: PendingManifest | None = None
    if make is not None:
        if defer_manifest:
            pending = PendingManifest(root / MANIFEST, make, memo)
        else:
            atomic_write_many([(root / MANIFEST, make(), 0o600)], commit=commit)

    removed: list[str] = []
    keep = built.keys()
    if prev is not None and not verify:
        # the instances the memo knows are on disk
        stale = gone if named is not None else sorted(prev.keys() - keep)
        stale = [name for name in stale if _is_real_dir(f"{root_str}/{name}")]
    else:
        if listing is None:  # (taken before the batch, which only made built instances)
            listing = _list_dir(root_str)
        stale = sorted(
            name for name, is_dir in listing.items() if is_dir and name not in keep and _is_id(name)
        )
    for name in stale:
        if commit is not None:
            commit.remove_tree(root / name)
        else:
            shutil.rmtree(root / name)
        removed.append(name)
    if memo is not None:
        # a manifest still to write: the memo describes the directory once it is written
        key = None if pending is not None else _manifest_key(root)
        memo._root, memo._manifest, memo._entries = root_str, key, entries
        memo._order, memo._built = ids, built
        if prev is None:
            memo._irregular = {iid for iid, w in entries.items() if w.files is None}
        else:  # only the compared ones can have become or stopped being irregular
            maybe = {iid for iid in irregular if iid in entries}.union(compared)
            memo._irregular = {iid for iid in maybe if entries[iid].files is None}
        verified = kept if verify or prev is None else 0
        memo.trusted, memo.verified = kept - verified, verified
        memo.compared = len(compared)
    return WriteReport(tuple(written), tuple(unchanged), tuple(removed), pending)


def _is_real_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _is_id(name: str) -> bool:
    try:
        validate_id(name)
    except ValueError:
        return False
    return True
