"""Loading a state directory (SPEC §2, §5).

:func:`load_state` is a function of (previous view, directory) → (new view, diagnostics):

- each file is read, parsed and validated on its own, so one bad file never affects another;
- a file that cannot be read, parsed or validated is reported as ``file:line:col: message`` and
  the object it held **keeps its last good version** from the previous view (a first-ever
  invalid file means the object does not exist yet);
- a file whose stat key (device, inode, size, mtime, ctime) and, failing that, whose content hash
  is unchanged is not parsed again. A stat key is only trusted when the file had been quiet for a
  couple of seconds when it was read (:func:`~reconciler.io.fsio.settled_key`): a same-size rewrite
  within one timestamp tick would otherwise go unseen.

A view names its documents by a revision and says what changed since the view its load started
from (:class:`~reconciler.model.changes.InputChanges`): the services, nodes and actual states
whose object is not that view's (edited, added, removed), and whether unit.yaml's is. A file
parsed again to an equal document keeps its object, so it is not named; an invalid edit keeps
the last good object, so it is not named either (nothing the later stages read changed).
"""

from __future__ import annotations

import hashlib
import itertools
import operator
import os
import stat
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from reconciler.io.fsio import (
    FileReadError,
    StatKey,
    Unreadable,
    iter_files,
    read_bytes_at,
    settled_key,
    stat_key,
)
from reconciler.io.resources import ResourcesFileError, parse_resources_json
from reconciler.io.yamlsafe import DEFAULT_MAX_BYTES, Parsed, YamlRejected, parse_yaml
from reconciler.model.changes import InputChanges, ServiceKey
from reconciler.model.documents import (
    DEFAULT_UNIT_MAX_INSTANCES,
    ActualState,
    Node,
    Service,
    UnitConfig,
)
from reconciler.model.human import human_bytes
from reconciler.model.suggest import unknown_field_hint
from reconciler.model.values import ID_PATTERN, RESOURCE_NAME_PATTERN

__all__ = [
    "Diagnostic",
    "Doc",
    "Fallback",
    "FileRecord",
    "LoadOptions",
    "ServiceSummary",
    "StateView",
    "adopted",
    "format_validation_error",
    "input_hash_of",
    "instance_limit_guard",
    "load_state",
    "mass_deletion_guard",
    "resources_files",
]

Severity = Literal["error", "warning"]


@dataclass(frozen=True, order=True)
class Diagnostic:
    path: str
    line: int
    col: int
    message: str
    severity: Severity = "error"

    def __str__(self) -> str:
        tag = "warning: " if self.severity == "warning" else ""
        return f"{self.path}:{self.line}:{self.col}: {tag}{self.message}"

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "line": self.line,
            "col": self.col,
            "severity": self.severity,
            "message": self.message,
        }


Doc = UnitConfig | Service | Node | ActualState


@dataclass(frozen=True)
class FileRecord:
    """What the last load saw of one input file."""

    key: StatKey | None
    sha256: str
    deps: tuple[tuple[str, StatKey | None], ...]  # other files read for it (resourcesFile)
    good: Doc | None  # the last good object, possibly from an earlier content
    diagnostics: tuple[Diagnostic, ...]  # problems of the current content
    current: bool = False  # True when ``good`` is the file's current content
    deps_sha256: str = ""  # sha256 of the contents of ``deps`` (what the input hash covers)


Fallback = Callable[[str], "Doc | None"]
"""The last good version of an input file by relative path, kept across processes."""

FallbackUnder = Callable[[str], "Mapping[str, Doc]"]
"""The last good versions of every input file whose relative path starts with a prefix (a
directory's, ending in ``/``), kept across processes."""


@dataclass(frozen=True)
class LoadOptions:
    max_bytes: int = DEFAULT_MAX_BYTES
    fallback: Fallback | None = None  # consulted when a file is invalid and no view has it
    fallback_under: FallbackUnder | None = None
    """Consulted when a directory cannot be read, for its files no view has."""


_REVISIONS = itertools.count(1)
"""The revisions of views: unique in this process."""

_INSTANCES = operator.attrgetter("instances")
_NETWORKED = operator.attrgetter("networked")
_TYPE = operator.attrgetter("type")


@dataclass(frozen=True)
class ServiceSummary:
    """What a run reads of every service of a view, counted once: the services in key order
    and the totals the guards and the later stages ask for. A warm load that replaces some
    services (same keys) patches its previous view's summary by those instead of a pass over
    every service; :meth:`of` is the reference it equals."""

    keys: tuple[ServiceKey, ...]
    """The services' keys, sorted."""
    at: Mapping[ServiceKey, int]
    """Each key's position in :attr:`keys` (shared by the summaries of views with the same
    keys: never mutated)."""
    ordered: tuple[Service, ...]
    """The services in key order."""
    instances: int
    """The instances every service asks for, together."""
    networked: int
    """How many services are ``networked`` (get a network without unit.yaml's)."""
    components: int
    """How many services are of type ``component``."""
    source: Mapping[ServiceKey, Service] = field(compare=False, repr=False)
    """The mapping of services counted (a view's summary is its own only while its
    ``services`` is this very mapping)."""

    @classmethod
    def of(cls, services: Mapping[ServiceKey, Service]) -> ServiceSummary:
        """The summary of ``services``, counted from nothing."""
        keys = tuple(sorted(services))
        ordered = tuple(map(services.__getitem__, keys))
        return cls(
            keys,
            dict(zip(keys, range(len(keys)), strict=True)),
            ordered,
            sum(map(_INSTANCES, ordered)),
            sum(map(_NETWORKED, ordered)),
            operator.countOf(map(_TYPE, ordered), "component"),
            services,
        )

    def replaced(
        self, now: Mapping[ServiceKey, Service], services: Mapping[ServiceKey, Service]
    ) -> ServiceSummary:
        """The summary of ``services``: this summary's with the services of ``now`` put in at
        their keys, each replacing the one of the same key (no key added or removed)."""
        before = self.source
        ordered = list(self.ordered)
        instances, networked, components = self.instances, self.networked, self.components
        at = self.at
        for key, service in now.items():
            old = before[key]
            ordered[at[key]] = service
            instances += service.instances - old.instances
            networked += service.networked - old.networked
            components += (service.type == "component") - (old.type == "component")
        return ServiceSummary(
            self.keys, at, tuple(ordered), instances, networked, components, services
        )


_STEPS = 4
"""How many earlier views' ``files`` a :class:`RecordIndex` remembers (a watcher's run loads
twice: its hinted load, and the stat pass after its writes)."""
_STEP_PATHS = 256
"""The most replaced paths a remembered step lists (past that, a load changed so much that
comparing every record costs little beside it; and the records replaced, which a step keeps
alive through its mapping, stay few)."""


@dataclass(frozen=True)
class RecordIndex:
    """What a warm load reads of every record of a view's ``files``, kept per path: each
    path's position, the paths whose record read other files (a node's resourcesFile) and
    those with diagnostics. Made from ``files`` by C-level passes, or patched from the
    previous view's by the records a load replaced (same paths); :meth:`of` is the reference
    it equals."""

    at: Mapping[str, int]
    """Each path's position in ``files`` (shared by the indexes of views with the same paths:
    never mutated)."""
    deps: frozenset[str]
    """The paths whose record has ``deps``."""
    diagnosed: frozenset[str]
    """The paths whose record has ``diagnostics``."""
    source: Mapping[str, FileRecord] = field(compare=False, repr=False)
    """The records indexed (a view's index is its own only while its ``files`` is this very
    mapping)."""
    steps: tuple[tuple[Mapping[str, FileRecord], frozenset[str]], ...] = field(
        default=(), compare=False, repr=False
    )
    """The ``files`` of the last few views this index was patched from, oldest first, each with
    the paths whose record may have been replaced since (see :meth:`replaced_since`)."""

    def replaced_since(self, files: Mapping[str, FileRecord]) -> frozenset[str] | None:
        """A superset of the paths whose record in :attr:`source` is not the one in ``files``,
        when ``files`` is one of the last few mappings this index was patched from (same
        paths); None when it is not known (compare every record then)."""
        if files is self.source:
            return frozenset()
        for then, paths in self.steps:
            if then is files:
                return paths
        return None

    @classmethod
    def of(cls, files: Mapping[str, FileRecord]) -> RecordIndex:
        """The index of ``files``, made from nothing."""
        rels = list(files)
        records = list(files.values())
        return cls(
            dict(zip(rels, range(len(rels)), strict=True)),
            frozenset(itertools.compress(rels, map(_DEPS, records))),
            frozenset(itertools.compress(rels, map(_DIAGNOSTICS, records))),
            files,
        )

    def replaced(
        self, records: Mapping[str, FileRecord], files: Mapping[str, FileRecord]
    ) -> RecordIndex:
        """The index of ``files``: this one's (of the same paths) with ``records`` put in."""
        deps, diagnosed = set(self.deps), set(self.diagnosed)
        for rel, rec in records.items():
            (deps.add if rec.deps else deps.discard)(rel)
            (diagnosed.add if rec.diagnostics else diagnosed.discard)(rel)
        paths = frozenset(records)
        steps: tuple[tuple[Mapping[str, FileRecord], frozenset[str]], ...] = ()
        if len(paths) <= _STEP_PATHS:  # (past that, comparing every record costs no more)
            earlier = [(then, since | paths) for then, since in self.steps[1 - _STEPS :]]
            steps = (*[s for s in earlier if len(s[1]) <= _STEP_PATHS], (self.source, paths))
        return RecordIndex(self.at, frozenset(deps), frozenset(diagnosed), files, steps)

    def diagnostics(self) -> list[Diagnostic]:
        """Every record's diagnostics, in path order."""
        files = self.source
        out: list[Diagnostic] = []
        for rel in sorted(self.diagnosed, key=self.at.__getitem__):
            out.extend(files[rel].diagnostics)
        return out


_K = TypeVar("_K")


@dataclass(frozen=True)
class StateView:
    """Everything the controller reads, as typed objects."""

    root: Path
    unit: UnitConfig | None = None
    services: Mapping[tuple[str, str], Service] = field(default_factory=dict)
    nodes: Mapping[str, Node] = field(default_factory=dict)
    actual: Mapping[str, ActualState] = field(default_factory=dict)
    files: Mapping[str, FileRecord] = field(default_factory=dict)
    input_hash: str = ""
    hash_lines: tuple[bytes, ...] = field(default=(), repr=False, compare=False)
    """What :attr:`input_hash` covers, one line per file in ``files`` order (kept so the next
    load re-encodes only the files that changed)."""
    duplicates: int = field(default=0, repr=False, compare=False)
    """Service files ignored because an earlier file defines the same service."""
    unreadable: tuple[str, ...] = ()
    """The input directories that could not be read (relative paths ending in ``/``; each
    has a record in ``files`` that carries its error): their files keep their last good
    versions."""
    revision: int = field(default_factory=lambda: next(_REVISIONS), compare=False, repr=False)
    """Names the documents the view hands out (``unit``, ``services``, ``nodes``, ``actual``):
    a load that changes none of them keeps the revision of the view it started from; any other
    gets a new one (unique in this process)."""
    changes: InputChanges | None = field(default=None, compare=False, repr=False)
    """What changed since the view the load started from (its revision is ``changes.since``);
    None for a view no load made (nothing is known of what came before)."""

    summary_memo: ServiceSummary | None = field(default=None, compare=False, repr=False)
    """:meth:`summary` once made (a load that patches a view passes its previous view's on,
    edited); None until asked for."""

    def summary(self) -> ServiceSummary:
        """The services in key order and what a run counts over all of them (made once per
        view; see :class:`ServiceSummary`)."""
        got = self.summary_memo
        if got is None or got.source is not self.services:
            got = ServiceSummary.of(self.services)
            object.__setattr__(self, "summary_memo", got)  # (a cache of the frozen value)
        return got

    records_memo: RecordIndex | None = field(default=None, compare=False, repr=False)
    """:meth:`records` once made (a load that patches a view passes its previous view's on,
    edited); None until asked for."""

    def records(self) -> RecordIndex:
        """The index of :attr:`files` (made once per view; see :class:`RecordIndex`)."""
        got = self.records_memo
        if got is None or got.source is not self.files:
            got = RecordIndex.of(self.files)
            object.__setattr__(self, "records_memo", got)  # (a cache of the frozen value)
        return got

    def services_sorted(self) -> list[Service]:
        return list(self.summary().ordered)


_KIND_OF_DIR: dict[str, tuple[str, type[BaseModel]]] = {
    "unit": ("UnitConfig", UnitConfig),
    "desired": ("Service", Service),
    "nodes": ("Node", Node),
    "actual": ("ActualState", ActualState),
}


def adopted(view: StateView) -> StateView:
    """A view another process made (read back from a cache), renamed into this process's
    revisions: a new revision, and no record of what changed before it (its revision and
    its ``changes`` name views of that process, which memos here must not mistake for theirs).
    """
    return replace(view, revision=next(_REVISIONS), changes=None)


def _data_path(data: Any, loc: tuple[str | int, ...]) -> tuple[str | int, ...]:
    """Keep only the parts of a pydantic location that step through the data."""
    out: list[str | int] = []
    cur = data
    for part in loc:
        in_dict = isinstance(cur, dict) and part in cur
        in_list = isinstance(cur, list) and isinstance(part, int) and 0 <= part < len(cur)
        if in_dict or in_list:
            out.append(part)
            cur = cur[part]
        elif isinstance(cur, dict) and isinstance(part, str) and part not in cur:
            # an unknown or missing key: point at the key when it exists, else the parent
            if any(k == part for k in cur):
                out.append(part)
            break
    return tuple(out)


def format_validation_error(
    display: str, parsed: Parsed, error: ValidationError, model: type[BaseModel] | None = None
) -> list[Diagnostic]:
    """One diagnostic per error, at its place in the file; with ``model`` (the validated
    document's), an unknown field gets the close known ones ("did you mean")."""
    diags: list[Diagnostic] = []
    for err in error.errors(include_url=False):
        loc = tuple(err["loc"])
        path = _data_path(parsed.data, loc)
        if err["type"] == "extra_forbidden":
            path = (*path, loc[-1]) if loc and path and path[-1] != loc[-1] else path
            line, col = parsed.position(path, prefer_key=True)
            msg = f"unknown field {loc[-1]!r}" if loc else "unknown field"
            if model is not None and loc:
                msg += unknown_field_hint(model, loc)
        else:
            line, col = parsed.position(path)
            msg = _friendly(err)
        shown = loc[:-1] if err["type"] == "extra_forbidden" else loc
        where = ".".join(str(p) for p in shown)
        diags.append(Diagnostic(display, line, col, f"{where}: {msg}" if where else msg))
    return sorted(diags, key=lambda d: (d.line, d.col))


_PATTERN_HINTS = {
    ID_PATTERN: "an id uses letters, digits, '.', '_' and '-', starts and ends with a letter or "
    "digit, and has at most 63 characters",
    RESOURCE_NAME_PATTERN: "a resource name is an id, optionally prefixed by a domain and '/' "
    "(example.com/gpu)",
}


def _friendly(err: Any) -> str:
    msg = str(err["msg"])
    if msg.startswith("Value error, "):
        return msg[len("Value error, ") :]
    kind = err["type"]
    got = err.get("input")
    if kind == "string_pattern_mismatch":
        pattern = err.get("ctx", {}).get("pattern", "")
        hint = _PATTERN_HINTS.get(pattern, f"it must match {pattern}")
        return f"invalid value {got!r}: {hint}"
    if kind == "missing":
        return "required field is missing"
    if kind.endswith("_type") or kind.endswith("_parsing") or kind == "literal_error":
        shown = repr(got)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        return f"{msg} (got {shown})"
    return msg


def _validate(display: str, raw: bytes, dir_kind: str, max_bytes: int) -> Doc | list[Diagnostic]:
    try:
        parsed = parse_yaml(raw, max_bytes=max_bytes)
    except YamlRejected as e:
        return [Diagnostic(display, e.line, e.col, e.message)]
    data = parsed.data
    kind, model = _KIND_OF_DIR[dir_kind]
    if not isinstance(data, dict):
        return [Diagnostic(display, 1, 1, "a document must be a mapping of fields")]
    got = data.get("kind")
    if got is not None and got != kind:
        line, col = parsed.position(("kind",))
        where = "unit.yaml" if dir_kind == "unit" else f"{dir_kind}/"
        return [Diagnostic(display, line, col, f"kind: expected {kind} in {where}, got {got!r}")]
    try:
        obj = model.model_validate(data)
    except ValidationError as e:
        return format_validation_error(display, parsed, e, model)
    assert isinstance(obj, UnitConfig | Service | Node | ActualState)
    return obj


def _resolve_resources_file(
    root: Path,
    node: Node,
    display: str,
    position: Callable[[], tuple[int, int]],
    max_bytes: int,
) -> tuple[Node | None, list[Diagnostic], tuple[tuple[str, StatKey | None], ...], str]:
    """Load a node's resourcesFile into ``resources``; None when the file is invalid.
    ``position``: where the node file names it, asked only for a message about it (finding
    it parses the node file again, with the pure-Python parser)."""
    assert node.resourcesFile is not None
    target = Path(node.resourcesFile)
    if not target.is_absolute():
        target = root / target
    try:
        raw, key = read_bytes_at(target, max_bytes)
    except FileReadError as e:
        line, col = position()
        if not target.exists() and not target.is_symlink():
            warn = Diagnostic(
                display, line, col, f"resourcesFile {target} is missing: no resources", "warning"
            )
            missing = ((str(target), None),)
            return node.model_copy(update={"resources": ()}), [warn], missing, "missing"
        return None, [Diagnostic(display, line, col, f"resourcesFile {target}: {e}")], (), ""
    deps = ((str(target), settled_key(key, time.time_ns())),)
    sha = hashlib.sha256(raw).hexdigest()
    if len(raw) > max_bytes:
        diag = Diagnostic(str(target), 1, 1, f"file is over {human_bytes(max_bytes)}")
        return None, [diag], deps, sha
    try:
        entries = parse_resources_json(raw)
    except ResourcesFileError as e:
        msg = f"{e.message} (resources of node {node.id})"
        return None, [Diagnostic(str(target), e.line, e.col, msg)], deps, sha
    return node.model_copy(update={"resources": entries}), [], deps, sha


def _deps_unchanged(deps: tuple[tuple[str, StatKey | None], ...]) -> bool:
    for path, key in deps:
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            if key is not None:
                return False
            continue
        if key is None or stat_key(st) != key:
            return False
    return True


def _load_one(
    root: Path,
    rel: str,
    dir_kind: str,
    key: StatKey | None,
    prev: FileRecord | None,
    opts: LoadOptions,
) -> FileRecord:
    if prev is not None and key is not None and prev.key == key and _deps_unchanged(prev.deps):
        return prev
    display = str(root / rel)

    def keep() -> Doc | None:
        return _last_good(rel, prev, opts)

    if key is None:
        diag = Diagnostic(display, 1, 1, "is a symlink or not a regular file; not read")
        return FileRecord(None, "", (), keep(), (diag,))
    try:
        raw, read_key = read_bytes_at(root / rel, opts.max_bytes)
    except FileReadError as e:
        return FileRecord(None, "", (), keep(), (Diagnostic(display, 1, 1, str(e)),))
    real_key = settled_key(read_key, time.time_ns())
    sha = hashlib.sha256(raw).hexdigest()
    if prev is not None and prev.sha256 == sha and _deps_unchanged(prev.deps):
        return FileRecord(
            real_key, sha, prev.deps, prev.good, prev.diagnostics, prev.current, prev.deps_sha256
        )
    result = _validate(display, raw, dir_kind, opts.max_bytes)
    if isinstance(result, list):
        return FileRecord(real_key, sha, (), keep(), tuple(result))
    diags: list[Diagnostic] = []
    deps: tuple[tuple[str, StatKey | None], ...] = ()
    deps_sha = ""
    obj: Doc = result
    stem = rel.rsplit("/", 1)[-1].removesuffix(".yaml").removesuffix(".yml")
    if isinstance(obj, Node):
        if obj.id != stem:
            msg = f"id: the node id {obj.id!r} must equal the file name {stem!r}"
            line, col = _position_of(raw, "id", opts.max_bytes)
            diag = Diagnostic(display, line, col, msg)
            return FileRecord(real_key, sha, (), keep(), (diag,))
        if obj.resourcesFile is not None:
            node, diags, deps, deps_sha = _resolve_resources_file(
                root,
                obj,
                display,
                lambda: _position_of(raw, "resourcesFile", opts.max_bytes),
                opts.max_bytes,
            )
            if node is None:
                return FileRecord(real_key, sha, deps, keep(), tuple(diags), False, deps_sha)
            obj = node
    if isinstance(obj, ActualState) and obj.nodeId != stem:
        msg = f"nodeId: {obj.nodeId!r} must equal the file name {stem!r}"
        line, col = _position_of(raw, "nodeId", opts.max_bytes)
        return FileRecord(real_key, sha, (), keep(), (Diagnostic(display, line, col, msg),))
    if prev is not None and prev.good is not None and prev.good == obj:
        obj = prev.good  # the same object for the same content: not a change (see _differ)
    return FileRecord(real_key, sha, deps, obj, tuple(diags), True, deps_sha)


def _position_of(raw: bytes, key: str, max_bytes: int) -> tuple[int, int]:
    """Where a top-level field's value sits in a file that already parsed once."""
    return parse_yaml(raw, max_bytes=max_bytes).position((key,))


def _last_good(rel: str, prev: FileRecord | None, opts: LoadOptions) -> Doc | None:
    if prev is not None and prev.good is not None:
        return prev.good
    if opts.fallback is not None:
        return opts.fallback(rel)
    return None


def _regular_key(path: Path) -> StatKey | None:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return stat_key(st) if stat.S_ISREG(st.st_mode) else None


def load_state(
    root: Path,
    previous: StateView | None = None,
    opts: LoadOptions | None = None,
    *,
    changed: Collection[str] | None = None,
) -> tuple[StateView, list[Diagnostic]]:
    """Read every input file of ``root``; see the module docstring for the rules.

    ``changed`` (with a ``previous`` view of the same root) is a hint from a file watcher: the
    paths, relative to ``root``, that may have changed since ``previous`` was loaded. Only those
    are looked at (plus every resourcesFile a node read, which may live outside the watched
    directory); every other file keeps its record without a ``stat``. The result is the full
    pass's whenever the hint is complete. A hint that is not one input file (a directory, a
    symlink, a path the layout does not know) makes it a full pass. A caller that uses hints
    must still run a full pass afterwards to stay level-triggered (``reconcile`` does: SPEC
    §14), since a file watcher can lose events."""
    opts = opts or LoadOptions()
    prev_files = previous.files if previous is not None and previous.root == root else {}
    files: dict[str, FileRecord] | None = None
    replaced: list[str] | None = None  # the paths whose record a hinted load replaced
    if changed is not None and prev_files and previous is not None and not previous.unreadable:
        hinted = _hinted_files(root, prev_files, changed, opts, previous.records())
        if hinted is not None:
            files, replaced = hinted
    if files is None:
        files = _all_files(root, prev_files, opts)
    same = previous is not None and previous.root == root
    if same and replaced is None:  # (a hinted load that kept every path says so)
        same = previous is not None and previous.files.keys() == files.keys()
    patched = _patched(previous, files, replaced) if same and previous is not None else None
    if patched is not None:
        return patched, patched.records().diagnostics()
    return _assembled(
        root, files, previous if previous is not None and previous.root == root else None
    )


def _all_files(
    root: Path, prev_files: Mapping[str, FileRecord], opts: LoadOptions
) -> dict[str, FileRecord]:
    """Every input file's record, each file stat'ed (and read when its stat key changed)."""
    files: dict[str, FileRecord] = {}
    # in sorted order of the relative paths ("actual/" < "desired/" < "nodes/" < "unit.yaml";
    # each directory's files sorted), so ``files`` is sorted as it is built (and sorted again
    # when a directory could not be read)
    for dir_kind, found, unreadable in _input_walk(root):
        for rel, key in found:
            files[rel] = _load_one(root, rel, dir_kind, key, prev_files.get(rel), opts)
        if unreadable:
            _keep_unreadable(root, dir_kind, unreadable, files, prev_files, opts)
    if any(rel.endswith("/") for rel in files):
        files = {rel: files[rel] for rel in sorted(files)}
    return files


_INPUT_DIRS = (("actual", False), ("desired", True), ("nodes", False))
YAML_SUFFIXES = (".yaml", ".yml")
"""Input documents in desired/, nodes/ and actual/ end in either."""


def _input_walk(
    root: Path,
) -> Iterator[tuple[str, list[tuple[str, StatKey | None]], list[Unreadable]]]:
    """The input files of ``root``, in sorted order of their relative paths, per kind of
    directory: (``actual``, ``desired``, ``nodes``, then ``unit`` when unit.yaml exists), its
    files (relative path, stat key: None for a symlink or a file that is not regular) and the
    directories under it that could not be read."""
    for dir_kind, recursive in _INPUT_DIRS:
        unreadable: list[Unreadable] = []
        found = iter_files(
            root / dir_kind, YAML_SUFFIXES, recursive=recursive, unreadable=unreadable
        )
        yield dir_kind, [(f"{dir_kind}/{f.rel}", f.key) for f in found], unreadable
    unit_path = root / "unit.yaml"
    if unit_path.exists() or unit_path.is_symlink():
        yield "unit", [("unit.yaml", _regular_key(unit_path))], []


def _keep_unreadable(
    root: Path,
    dir_kind: str,
    unreadable: list[Unreadable],
    files: dict[str, FileRecord],
    prev_files: Mapping[str, FileRecord],
    opts: LoadOptions,
) -> None:
    """A directory that cannot be read is not a directory whose files were deleted (SPEC §5):
    it gets a record of its own (key ``<dir>/``) that carries the error, and every input file
    the previous view or the last good store knows under it keeps its last good version."""
    for sub, why in unreadable:
        prefix = f"{dir_kind}/{sub}/" if sub else f"{dir_kind}/"
        display = str(root / prefix.rstrip("/"))
        msg = f"cannot read the directory: {why}; its files keep their last good versions"
        files[prefix] = FileRecord(None, "", (), None, (Diagnostic(display, 1, 1, msg),))
        for rel, rec in prev_files.items():
            if rel.startswith(prefix) and rel != prefix and rel not in files:
                files[rel] = rec if not rec.diagnostics else replace(rec, diagnostics=())
        if opts.fallback_under is not None:
            for rel, doc in opts.fallback_under(prefix).items():
                if rel not in files and rel.startswith(prefix):
                    files[rel] = FileRecord(None, "", (), doc, ())


class _FullPass(Exception):
    """A hint only a full pass can resolve."""


def _hinted_record(
    root: Path, rel: str, prev_files: Mapping[str, FileRecord], opts: LoadOptions
) -> tuple[bool, FileRecord | None]:
    """What the full pass would find at the hinted path ``rel``: (False, _) when it loads no
    file there, (True, None) when a file it had loaded is gone, (True, record) for a file it
    loads. Raises :class:`_FullPass` where only a walk can tell (a directory, a symlink)."""
    parts = rel.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise _FullPass(rel)
    if any(part.startswith(".") for part in parts):
        return False, None  # hidden files and directories are never inputs
    try:
        st: os.stat_result | None = os.lstat(root / rel)
    except FileNotFoundError:
        st = None
    except OSError:
        raise _FullPass(rel) from None
    if st is None:
        prefix = rel + "/"
        if any(known.startswith(prefix) for known in prev_files):
            raise _FullPass(rel)  # a directory of inputs went away
        return (True, None) if rel in prev_files else (False, None)
    if stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode):
        raise _FullPass(rel)
    kind = _input_kind(root, parts)
    if kind is None:
        return False, None
    if not stat.S_ISREG(st.st_mode):
        raise _FullPass(rel)
    return True, _load_one(root, rel, kind, stat_key(st), prev_files.get(rel), opts)


def _input_kind(root: Path, parts: list[str]) -> str | None:
    """The kind of input the full pass loads at ``parts`` ("unit" for unit.yaml), or None.
    Raises :class:`_FullPass` when a directory on the way is not a plain directory."""
    if parts == ["unit.yaml"]:
        return "unit"
    recursive = next((r for kind, r in _INPUT_DIRS if kind == parts[0]), None)
    if recursive is None or len(parts) < 2 or not parts[-1].endswith(YAML_SUFFIXES):
        return None
    if len(parts) > 2 and not recursive:
        return None
    for n in range(1, len(parts)):  # the walk neither follows symlinks nor leaves the tree
        try:
            st = os.lstat(root.joinpath(*parts[:n]))
        except OSError:
            raise _FullPass("/".join(parts)) from None
        if not stat.S_ISDIR(st.st_mode):
            raise _FullPass("/".join(parts))
    return parts[0]


def _hinted_files(
    root: Path,
    prev_files: Mapping[str, FileRecord],
    changed: Collection[str],
    opts: LoadOptions,
    index: RecordIndex,
) -> tuple[dict[str, FileRecord], list[str] | None] | None:
    """The records of a full pass, computed from ``prev_files`` (``index``: theirs) by looking
    only at the hinted paths and at the resourcesFiles nodes read, and, when they are the
    same paths, those whose record was looked at again (else None); None when a hint needs
    the full pass."""
    updates: dict[str, FileRecord | None] = {}
    try:
        for rel in sorted(set(changed)):
            loads, rec = _hinted_record(root, rel, prev_files, opts)
            if loads:
                updates[rel] = rec
    except _FullPass:
        return None
    for rel in index.deps:  # (few records have deps)
        old = prev_files[rel]
        if rel not in updates and not _deps_unchanged(old.deps):
            kind = "unit" if rel == "unit.yaml" else rel.split("/", 1)[0]
            updates[rel] = _load_one(root, rel, kind, _regular_key(root / rel), old, opts)
    files = dict(prev_files)
    for rel, rec in updates.items():
        if rec is None:
            files.pop(rel, None)
        else:
            files[rel] = rec
    if all(rel in prev_files and rec is not None for rel, rec in updates.items()):
        return files, list(updates)  # the same paths: the order of ``prev_files`` holds
    if all(rel in prev_files for rel in updates):
        return files, None  # (paths removed: the order of the others holds)
    return {rel: files[rel] for rel in sorted(files)}, None  # the full pass's: sorted paths


_DEPS = operator.attrgetter("deps")
_DIAGNOSTICS = operator.attrgetter("diagnostics")


def _hash_line(rel: str, rec: FileRecord) -> bytes:
    return _content_line(rel, rec.sha256, rec.deps_sha256)


def _content_line(rel: str, sha256: str, deps_sha256: str) -> bytes:
    """What the input hash covers of one file: contents only (SPEC §10), never a path or a
    stat key, which differ between copies and over time for the same bytes."""
    return f"{rel}\0{sha256}\0{deps_sha256}\0".encode()


def resources_files(view: StateView) -> dict[str, list[str]]:
    """Per input file that read another (a node's ``resourcesFile``), the paths it read: what
    :func:`input_hash_of` needs to give the view's :attr:`StateView.input_hash` again."""
    return {rel: [path for path, _key in rec.deps] for rel, rec in view.files.items() if rec.deps}


def input_hash_of(
    root: Path, deps: Mapping[str, Sequence[str]], max_bytes: int = DEFAULT_MAX_BYTES
) -> str | None:
    """The :attr:`StateView.input_hash` a load of ``root`` gives now, from the files' bytes
    alone (nothing parsed), when every input file is a readable regular file within
    ``max_bytes``; None when one is not (only a load can tell what its record holds then).

    ``deps`` is :func:`resources_files` of an earlier view: a file whose bytes are the same as
    then read the same other files; a file whose bytes changed changes the hash whatever its
    dependencies are, so the answer is exact either way."""
    lines: list[bytes] = []

    def line(rel: str, path: Path) -> bytes | None:
        try:
            raw, _key = read_bytes_at(path, max_bytes)
        except FileReadError:
            return None
        if len(raw) > max_bytes:
            return None
        deps_sha = ""
        for dep in deps.get(rel, ()):
            try:
                dep_raw, _dep_key = read_bytes_at(dep, max_bytes)
            except FileReadError:
                return None
            deps_sha = hashlib.sha256(dep_raw).hexdigest()
        return _content_line(rel, hashlib.sha256(raw).hexdigest(), deps_sha)

    for _kind, found, unreadable in _input_walk(root):
        if unreadable:
            return None
        for rel, key in found:
            got = None if key is None else line(rel, root / rel)
            if got is None:
                return None
            lines.append(got)
    return hashlib.sha256(b"".join(lines)).hexdigest()


def _assembled(
    root: Path, files: dict[str, FileRecord], previous: StateView | None = None
) -> tuple[StateView, list[Diagnostic]]:
    """The view of ``files`` (sorted by path), built from nothing, and every file's
    diagnostics in path order; a service defined twice is taken from the first file and the
    second is reported. ``previous`` (a view of the same root): what the view's changes
    count from (else they are unknown)."""
    diagnostics: list[Diagnostic] = []
    duplicates = 0
    unit: UnitConfig | None = None
    services: dict[tuple[str, str], Service] = {}
    service_file: dict[tuple[str, str], str] = {}
    nodes: dict[str, Node] = {}
    actual: dict[str, ActualState] = {}
    for rel, rec in files.items():
        diagnostics.extend(rec.diagnostics)
        obj = rec.good
        if isinstance(obj, UnitConfig):
            unit = obj
        elif isinstance(obj, Service):
            if obj.key in services:
                diagnostics.append(
                    Diagnostic(
                        str(root / rel),
                        1,
                        1,
                        f"service {obj.id} (subject {obj.subject}) is already defined in "
                        f"{root / service_file[obj.key]}; this file is ignored",
                    )
                )
                duplicates += 1
                continue
            services[obj.key] = obj
            service_file[obj.key] = rel
        elif isinstance(obj, Node):
            nodes[obj.id] = obj
        elif isinstance(obj, ActualState):
            actual[obj.nodeId] = obj
    lines = tuple(_hash_line(rel, rec) for rel, rec in files.items())
    digest = hashlib.sha256(b"".join(lines)).hexdigest()
    unreadable = tuple(rel for rel in files if rel.endswith("/"))
    if previous is None:
        revision = next(_REVISIONS)
        changes = InputChanges.unknown(revision)
    else:
        revision, changes = _counted(
            previous,
            unit is not previous.unit,
            _differ(services, previous.services),
            _differ(nodes, previous.nodes),
            _differ(actual, previous.actual),
        )
    view = StateView(
        root,
        unit,
        services,
        nodes,
        actual,
        files,
        digest,
        lines,
        duplicates,
        unreadable,
        revision,
        changes,
    )
    return view, diagnostics


def _differ(now: Mapping[_K, object], before: Mapping[_K, object]) -> frozenset[_K]:
    """The keys whose object is not the one ``before`` held (the loader hands out the same
    object for a file whose content did not change, and the object a file last held while it
    is invalid): edited, added or removed, and some rewritten with the same meaning."""
    get = before.get
    differ = {k for k, v in now.items() if get(k) is not v}
    differ.update(k for k in before if k not in now)
    return frozenset(differ)


def _counted(
    previous: StateView,
    unit: bool,
    services: frozenset[ServiceKey],
    nodes: frozenset[str],
    actual: frozenset[str],
) -> tuple[int, InputChanges]:
    """The revision of a view loaded from ``previous`` with these changes (``previous``'s
    when nothing changed), and the changes counted from ``previous``."""
    changed = unit or services or nodes or actual
    revision = next(_REVISIONS) if changed else previous.revision
    return revision, InputChanges(previous.revision, revision, unit, services, nodes, actual)


def _patched(
    previous: StateView, files: dict[str, FileRecord], replaced: Collection[str] | None = None
) -> StateView | None:
    """The view of ``files`` made from ``previous`` (same root, same paths) by replacing the
    objects of the files whose record changed, when each changed file defined the same object
    (same kind and key) before and after; else None (build it from nothing). The result equals
    :func:`_assembled`'s, dictionary order included: every key keeps its place. ``replaced``:
    a superset of the paths whose record is not ``previous``'s object (else compared)."""
    old_files = previous.files
    index = previous.records_memo
    if index is not None and index.source is not old_files:
        index = None
    if replaced is not None and index is not None:
        found = sorted((index.at[rel], rel) for rel in replaced if files[rel] is not old_files[rel])
        changed = [(n, rel, files[rel]) for n, rel in found]
    else:
        # (C-level passes: positions of the records that are not the previous view's objects)
        moved = map(operator.is_not, files.values(), map(old_files.__getitem__, files))
        at = list(itertools.compress(itertools.count(), moved))
        if at:
            rels, recs = list(files), list(files.values())
            changed = [(n, rels[n], recs[n]) for n in at]
        else:
            changed = []
    lines = list(previous.hash_lines)
    if len(lines) != len(files) or previous.duplicates:
        return None  # a service defined twice: the full assembly reports it
    if index is not None:
        index = index.replaced({rel: rec for _n, rel, rec in changed}, files)
    if not changed:
        same = previous.revision
        return replace(previous, files=files, changes=InputChanges(same, same), records_memo=index)
    unit = previous.unit
    services: dict[tuple[str, str], Service] = {}
    nodes: dict[str, Node] = {}
    actual: dict[str, ActualState] = {}
    for n, rel, rec in changed:
        old, new = old_files[rel].good, rec.good
        lines[n] = _hash_line(rel, rec)
        if new is old:
            continue
        if isinstance(new, Service) and isinstance(old, Service) and new.key == old.key:
            services[new.key] = new
        elif isinstance(new, Node) and isinstance(old, Node) and new.id == old.id:
            nodes[new.id] = new
        elif isinstance(new, ActualState) and isinstance(old, ActualState):
            if new.nodeId != old.nodeId:
                return None
            actual[new.nodeId] = new
        elif isinstance(new, UnitConfig) and isinstance(old, UnitConfig):
            unit = new
        else:
            return None
    digest = hashlib.sha256(b"".join(lines)).hexdigest()
    # (each file holds one object, and the same object before and after: what changed is the
    # objects put in above)
    revision, changes = _counted(
        previous,
        unit is not previous.unit,
        frozenset(services),
        frozenset(nodes),
        frozenset(actual),
    )
    summary = previous.summary_memo
    now = {**previous.services, **services} if services else previous.services
    if summary is not None and summary.source is previous.services and services:
        summary = summary.replaced(services, now)
    return StateView(
        previous.root,
        unit,
        now,
        {**previous.nodes, **nodes} if nodes else previous.nodes,
        {**previous.actual, **actual} if actual else previous.actual,
        files,
        digest,
        tuple(lines),
        unreadable=previous.unreadable,  # the same paths: the same directories
        revision=revision,
        changes=changes,
        summary_memo=summary,
        records_memo=index,
    )


def mass_deletion_guard(
    view: StateView, *, allow_empty: bool, allocated: int = 0
) -> Diagnostic | None:
    """SPEC §5: refuse to stop everything when every desired file, or every node file,
    vanished or broke at once while instances run (``actual/``) or are allocated
    (``allocated``: the checkpoint's), unless ``allow_empty``."""
    if allow_empty or (view.services and view.nodes):
        return None  # (the common case: nothing to count)
    running = sum(len(a.instances) for a in view.actual.values())
    if not view.services:
        if running == 0:
            return None
        return Diagnostic(
            str(view.root / "desired"),
            1,
            1,
            f"no valid desired service left while {running} instance(s) run; refusing to stop "
            "them all (pass --allow-empty if that is what you want)",
        )
    if running == 0 and allocated == 0:
        return None
    what = f"{running} instance(s) run" if running else f"{allocated} instance(s) are allocated"
    return Diagnostic(
        str(view.root / "nodes"),
        1,
        1,
        f"no valid node left while {what}; refusing to stop them all and drop their "
        "allocations (pass --allow-empty if that is what you want)",
    )


def instance_limit_guard(view: StateView) -> Diagnostic | None:
    """Refuse a unit whose services together ask for more instances than unit.yaml's
    ``maxInstances`` allows (each service is bounded by its model): nothing is placed and
    nothing stopped, so a typo cannot make a run grow without bound, nor stop what runs. The
    error points at the ``instances`` of the service that asks for the most."""
    limit = view.unit.maxInstances if view.unit is not None else DEFAULT_UNIT_MAX_INSTANCES
    total = view.summary().instances
    if total <= limit:
        return None
    largest = max(view.services.values(), key=lambda s: (s.instances, s.key))
    rel = next((r for r, rec in view.files.items() if rec.good is largest), None)
    line, col = 1, 1
    if rel is not None:
        try:
            raw, _key = read_bytes_at(view.root / rel, DEFAULT_MAX_BYTES)
            line, col = _position_of(raw, "instances", DEFAULT_MAX_BYTES)
        except (FileReadError, YamlRejected):
            pass  # changed since it was loaded: the file's start
    where = "unit.yaml's maxInstances" if view.unit is not None else "the default maxInstances"
    return Diagnostic(
        str(view.root / (rel or "desired")),
        line,
        col,
        f"instances: the services ask for {total} instances in all, over {where} of {limit} "
        f"(this one asks for {largest.instances}); nothing is placed or stopped until the "
        "total is within the limit (raise maxInstances in unit.yaml if that is meant)",
    )
