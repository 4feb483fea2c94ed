"""``reconcile``: the imperative shell around the pure core (SPEC §9, §10, §12, §14).

One run, under the state directory's flock: load every input (level-triggered), recover the
checkpoint, balance, assign uids and gids, plan, write ``out/`` and the checkpoint; then read the
inputs again and run once more if they changed meanwhile (an edit made while a path-activated
oneshot runs would otherwise wait for the next trigger). Every file is written atomically and only
when its content changed, so a second run with unchanged inputs rewrites nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import stat
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reconciler.accel import BalanceMemo, FinalStates, balance, balance_with_states
from reconciler.accel.checkpoint import CheckpointCache
from reconciler.accel.ids import IdsMemo
from reconciler.accel.network import NetworkMemo
from reconciler.accel.plans import PlanMemo
from reconciler.controller.component_files import write_component_files
from reconciler.controller.network_files import NetworkFilesMemo, write_network_files
from reconciler.controller.planbasis import BASIS_FILE, basis_bytes, digest
from reconciler.controller.reports import StaleMarks
from reconciler.controller.status import (
    AllocationIds,
    NodeStatusCache,
    cached_status,
    status_bytes,
)
from reconciler.controller.statuspage import PageMemo, page_source, render_status_page
from reconciler.io.checkpoint_files import (
    CheckpointFiles,
    LoadReport,
    load_checkpoint,
    save_checkpoint,
)
from reconciler.io.fsio import (
    Commit,
    FileReadError,
    StatKey,
    WriteHook,
    atomic_write_many,
    ensure_dir,
    read_bytes_at,
    remove_stale_temp_files,
    settled_key,
    stat_key,
)
from reconciler.io.lastgood import LastGoodMemo, LastGoodStore
from reconciler.io.loader import (
    Diagnostic,
    LoadOptions,
    StateView,
    instance_limit_guard,
    load_state,
    mass_deletion_guard,
)
from reconciler.io.lock import StateLock
from reconciler.model.changes import InputChanges
from reconciler.model.documents import Node
from reconciler.model.gcpause import collector_paused
from reconciler.model.jsonbytes import pretty_json
from reconciler.model.values import validate_id
from reconciler.oci.builder import BuildResult, BuiltConfig
from reconciler.oci.writer import (
    PendingManifest,
    WriteMemo,
    sweep_instance_temps,
    write_instance_outputs,
)
from reconciler.placement.alerts import AlertUpdate, observe
from reconciler.placement.instances import BalanceResult, Mode
from reconciler.placement.nodestate import NodeSlot
from reconciler.planning.checkpoint import IDS_FAILURE, Checkpoint, assign_ids, id_failures
from reconciler.planning.network import NETWORK_FAILURE, NetworkResult, assign_networks
from reconciler.planning.plans import Plan, make_plan, plan_bytes

__all__ = [
    "CONFIG_FAILURE",
    "ConfigBuilder",
    "ReconcileCache",
    "ReconcileError",
    "ReconcileOptions",
    "ReconcileReport",
    "compute_once",
    "fingerprint",
    "reconcile",
]

log = logging.getLogger("reconciler.reconcile")

ConfigBuilder = Callable[[Path, StateView, BalanceResult, Checkpoint], BuildResult]
"""Builds the OCI config of every placement (reads the host's groups and devices)."""

LAST_GOOD = "last-good"

CONFIG_FAILURE = "Config"
"""The failure code of an instance whose OCI config cannot be built (SPEC §11)."""


class ReconcileError(RuntimeError):
    pass


@dataclass
class ReconcileCache:
    """What a long-running caller (``watch``) carries from one run to the next, besides the
    previous view: the last checkpoint file decoded or written (by its exact bytes), each node's
    status entry with the inputs it came from, and the content of out/'s JSON files by stat
    key. Each only saves work; nothing in it is used without checking that its inputs are
    equal. (The OCI configs are memoized by the builder of
    :func:`reconciler.controller.configs.default_config_builder` itself.)"""

    checkpoint: CheckpointCache = field(default_factory=CheckpointCache)
    balance: BalanceMemo = field(default_factory=BalanceMemo)
    """The last balance: a run whose inputs differ only in some services re-places those."""
    network: NetworkMemo = field(default_factory=NetworkMemo)
    """The last network phase: a run whose networked placements and inputs are the last
    run's gets its answer again."""
    last_good: LastGoodMemo = field(default_factory=LastGoodMemo)
    """checkpoint/last-good as the last sync left it: unchanged inputs cost an identity check."""
    ids: IdsMemo = field(default_factory=IdsMemo)
    """The last uids per node: a node whose placements did not change keeps its allocations."""
    plan: PlanMemo = field(default_factory=PlanMemo)
    """The last plan: nodes whose inputs are the same objects reuse their diff and patch."""
    status: NodeStatusCache = field(default_factory=NodeStatusCache)
    page: PageMemo = field(default_factory=PageMemo)
    """out/status.html's node rows, by the status entries and records they were made from."""
    configs: WriteMemo = field(default_factory=WriteMemo)
    """out/instances as the last run left it (the manifest, in memory)."""
    network_files: NetworkFilesMemo = field(default_factory=NetworkFilesMemo)
    """The network files of out/instances and out/network.json as the last run left them."""
    encoded: dict[str, tuple[Path, object, bytes]] = field(default_factory=dict)
    """Per node, its patch file, the patch (the planner's tuple, by identity) and its bytes."""
    encoded_for: Mapping[str, object] | None = None
    """The plan's patch map (by identity) whose every file a run left as ``encoded`` says."""
    outputs: dict[Path, tuple[ContentKey, StatKey | None]] = field(default_factory=dict)
    stale: StaleMarks = field(default_factory=StaleMarks)
    """The nodes whose reports are too old, as the balancer last saw them."""
    """out/ files (node patches, status, plan) with the content found in them (a big one by its
    digest: :func:`content_key`) and their settled stat keys: an unchanged output costs an
    lstat, not a read."""


@dataclass(frozen=True)
class ReconcileOptions:
    mode: Mode | None = None
    allow_empty: bool = False
    max_passes: int = 5
    verify: bool = True
    """Check that every output whose content did not change is still what this process wrote
    (an lstat per file), and remove the temp files a killed writer left in out/ and
    checkpoint/ (a listing of out/nodes). With a ``cache``, ``False`` trusts the cache for
    those: ``watch`` verifies on its first run and on each periodic resync, and trusts in
    between (a file edited behind the controller's back in out/ is repaired, and a killed
    writer's temp file removed, by the next resync)."""
    recheck: bool = True
    """After writing, stat the inputs again and run once more if one changed during the run (a
    path-activated oneshot would otherwise wait for the next trigger). ``watch`` turns it off:
    its file watcher sees an edit made during a run and runs again itself."""
    changed: frozenset[str] | None = None
    """A file watcher's hint: the input paths (relative to the state directory) that may have
    changed since ``previous_view``. The first pass loads only those, so the plan is out
    sooner; after writing, the run stats every input anyway (as ``recheck`` does, whatever
    ``recheck`` says) and runs again if any other file changed, so a lost event costs a second
    pass, never an edit (SPEC §14). Ignored without a ``previous_view``."""
    clock: Callable[[], float] | None = None  # seconds since the epoch; default time.time
    write_hook: WriteHook | None = None
    configs: ConfigBuilder | None = None
    on_stage: Callable[[str], None] | None = None  # progress: told each stage as it starts
    lock_timeout: float | None = None
    cache: ReconcileCache | None = None  # carried between runs by a long-running caller


@dataclass(frozen=True)
class Computed:
    view: StateView
    diagnostics: list[Diagnostic]
    loaded: LoadReport
    result: BalanceResult
    checkpoint: Checkpoint  # what the checkpoint should hold after this run
    plan: Plan
    id_errors: list[str]
    built: Mapping[str, BuiltConfig] | None = None  # None: configs were not built
    alerts: AlertUpdate | None = None
    mode: Mode = "stable"  # the mode the placement ran in
    requested: Mode = "stable"  # the mode asked for (a rebalance is triggered, not asked for)
    built_since: tuple[Mapping[str, BuiltConfig], frozenset[str]] | None = field(
        default=None, repr=False, compare=False
    )  # see BuildResult.since
    network: NetworkResult | None = None  # the network phase (SPEC §17)
    nodes: Sequence[Node] | None = None
    """The nodes as the balancer saw them (a stale report's node marked disconnected), for the
    status report; None: the view's."""
    final: tuple[BalanceResult, FinalStates] | None = field(default=None, repr=False, compare=False)
    """The balance's result and its final node states: the status report reads them (instead
    of replaying ``result``) while ``result`` is still that result."""
    balanced: BalanceResult | None = field(default=None, repr=False, compare=False)
    """The balancer's own result, before the network phase and the configs took any placement
    out (``result`` is this very object when they took none)."""

    def final_states(self) -> dict[str, NodeSlot] | None:
        """Every node's state with ``result`` reserved, if the balance's own are at hand (the
        first call only: the states are let go once read)."""
        final = self.final
        return final[1]() if final is not None and final[0] is self.result else None

    def plan_inputs(self) -> dict[str, Any]:
        """``out/plan.json``'s ``inputs``: the fingerprint, and the mode asked for (so that
        ``apply`` reproduces it, and an alert-triggered rebalance's plan is rewritten by the next
        run only if the placements change)."""
        return {"fingerprint": self.plan.fingerprint, "mode": self.requested}

    def plan_document(self) -> dict[str, Any]:
        """``out/plan.json``: the plan, with :meth:`plan_inputs` as its ``inputs``."""
        return dict(self.plan.to_json(), inputs=self.plan_inputs())


@dataclass(frozen=True)
class ReconcileReport:
    passes: int
    computed: Computed
    written: tuple[str, ...] = ()
    checkpoint_written: bool = False
    problems: tuple[str, ...] = field(default=())
    status_of: Callable[[], Mapping[str, Any]] | None = field(
        default=None, repr=False, compare=False
    )
    elapsed: float | None = field(default=None, compare=False)
    """Seconds the run took, from the lock on."""
    """The status report the run wrote (out/status.json's value), made when first asked for
    (ask before the next run: it is made of the cache that run changes)."""

    def status(self) -> Mapping[str, Any] | None:
        return self.status_of() if self.status_of is not None else None

    @property
    def plan(self) -> Plan:
        return self.computed.plan


def compute_once(
    state_dir: Path,
    opts: ReconcileOptions,
    previous_view: StateView | None = None,
    *,
    read_only: bool = False,
    changed: frozenset[str] | None = None,
    carried: InputChanges | None = None,
) -> Computed:
    """Load, recover, balance, assign ids and plan; writes nothing except, when not
    ``read_only``, moving a corrupt checkpoint to quarantine. ``changed``: see
    :attr:`ReconcileOptions.changed` (the caller runs the full pass after). ``carried``: what
    changed from the view of the last balance to ``previous_view`` (a recheck's load)."""
    stage = opts.on_stage or (lambda _text: None)
    stage("loading inputs")
    last_good = LastGoodStore(state_dir / "checkpoint" / LAST_GOOD)
    view, diags = load_state(
        state_dir,
        previous_view,
        LoadOptions(fallback=last_good.get, fallback_under=last_good.under),
        changed=changed,
    )
    stage("recovering the checkpoint")
    loaded = load_checkpoint(
        state_dir / "checkpoint",
        view.actual,
        quarantine=not read_only,
        cache=opts.cache.checkpoint if opts.cache is not None else None,
    )
    cp = loaded.checkpoint
    refused = mass_deletion_guard(
        view, allow_empty=opts.allow_empty, allocated=len(cp.allocations)
    ) or instance_limit_guard(view)
    if refused is not None:
        raise ReconcileError(str(refused))
    now = opts.clock() if opts.clock is not None else time.time()
    alerts = observe(cp.alerts, view.unit, list(view.nodes.values()), now)
    requested: Mode = opts.mode or (view.unit.placement if view.unit is not None else "stable")
    mode = requested
    if alerts.rebalance and mode != "fresh":
        mode = "rebalance"  # SPEC §8: a raise, and each minTimeout while raised
    overload = alerts.overload if mode == "rebalance" else None
    summary = view.summary()  # (counted once per view)
    n_instances = summary.instances
    stage(f"placing {n_instances} instances on {len(view.nodes)} nodes")
    previous = cp.previous()
    marks = opts.cache.stale if opts.cache is not None else StaleMarks()
    nodes = marks.apply(view.unit, view.nodes, now)  # a too old report fails NodeState
    services = view.services_sorted()
    final: FinalStates | None = None  # (read-only: no status report to make them for)
    if opts.cache is None and read_only:
        result = balance(view.unit, nodes, services, previous, mode, overload)
    elif opts.cache is None:
        result, final = balance_with_states(view.unit, nodes, services, previous, mode, overload)
    else:
        result = opts.cache.balance.balance(
            view.unit,
            nodes,
            services,
            previous,
            mode,
            overload,
            # (the checkpoint memo's: this mapping is the last one it handed out but at these ids)
            previous_since=cp.memo.previous_since if cp.memo is not None else None,
            # what changed since the last balance: the loader's, and the nodes marked stale or not
            inputs=_inputs(carried, view.changes, marks.changed),
        )
        final = opts.cache.balance.final_states(result)
    balanced = result
    memo = opts.cache.balance if opts.cache is not None else None
    # the network phase after placement (SPEC §17): failures leave the placements
    phase = opts.cache.network if opts.cache is not None else None
    network = (phase.assign if phase is not None else assign_networks)(
        view.unit, view.services, result, cp.network, networked=summary.networked > 0
    )
    taken: set[str] = set()  # what the phases after the balance take out of its result
    if network.failures:
        taken.update(network.failures)
        by_id = result.by_id
        result = _without(
            result,
            {i: f"{by_id[i].label}: {m}" for i, m in network.failures.items()},
            NETWORK_FAILURE,
            memo,
        )
    ids = opts.cache.ids if opts.cache is not None else None
    if ids is not None:
        allocations, gids, id_errors = ids.assign(
            result, cp.allocations, cp.gids, old_is_last=ids.given_last(cp)
        )
    else:
        allocations, gids, id_errors = assign_ids(result, cp.allocations, cp.gids)
    if len(allocations) != len(result.placements):  # no free uid or gid: they fail
        errors = id_failures(result.placements, allocations, gids)
        taken.update(errors)
        result = _without(result, errors, IDS_FAILURE, memo)
    net_state = network.state
    since = ids.since_for(allocations) if ids is not None else None  # (for the configs)
    new_cp = Checkpoint(
        cp.lineage, cp.generation, allocations, gids, alerts.timelines, net_state, since=since
    )
    built: dict[str, BuiltConfig] | None = None
    built_since = None
    if opts.configs is not None:
        stage(f"building {len(result.placements)} OCI configs")
        configs = opts.configs(state_dir, view, result, new_cp)
        built, built_since = configs.built, configs.since
        if configs.errors:
            taken.update(configs.errors)
            result = _without(result, configs.errors, CONFIG_FAILURE, memo)
            allocations = {i: a for i, a in allocations.items() if i not in configs.errors}
            new_cp = Checkpoint(
                cp.lineage, cp.generation, allocations, gids, alerts.timelines, net_state
            )
    if loaded.source != "current" or not new_cp.same_data(cp):
        # (since: what changed from the allocations of the last run, for the encoder)
        since = ids.since_for(allocations) if ids is not None else None
        new_cp = Checkpoint(
            cp.lineage,
            cp.generation + 1,
            allocations,
            gids,
            alerts.timelines,
            net_state,
            since=since,
        )
    if phase is not None:
        phase.counted_from(result, taken)
    stage("planning")
    plan = (opts.cache.plan.make_plan if opts.cache is not None else make_plan)(
        result,
        view.actual,
        set(view.nodes),
        fingerprint=fingerprint(view, new_cp.generation),
        addresses={iid: n.ip for iid, n in network.instances.items()},
    )
    return Computed(
        view,
        diags,
        loaded,
        result,
        new_cp,
        plan,
        id_errors,
        built,
        alerts,
        mode,
        requested,
        built_since,
        network if network.state else None,
        nodes,
        None if final is None else (balanced, final),
        balanced,
    )


def _without(
    result: BalanceResult,
    errors: Mapping[str, str],
    reason: str,
    memo: BalanceMemo | None,
) -> BalanceResult:
    """The result with the instances whose network, ids or config failed turned into
    failures; told to the balance memo, if any (so that its next answer starts from this
    one)."""
    return result.failed(errors, reason) if memo is None else memo.dropped(result, errors, reason)


def fingerprint(view: StateView, generation: int) -> str:
    """SPEC §10: a sha256 over the input files' contents and the checkpoint generation.

    The generation is the one the plan leaves behind (the current one when the allocations do
    not change), so a second reconcile of unchanged inputs writes the same plan bytes."""
    digest = hashlib.sha256(f"{view.input_hash}\0{generation}".encode()).hexdigest()
    return f"sha256:{digest}"


ContentKey = bytes | tuple[str, bytes]
"""What a long-running caller remembers of an out/ file's content: the bytes themselves, or
for a big file (``status.json``: 15 MB at 20,000 instances) their sha256."""

DIGEST_OVER = 1 << 20


def content_key(data: bytes) -> ContentKey:
    """``data`` itself below :data:`DIGEST_OVER` bytes (small files are compared, and a node
    patch recognised by identity), else ``("sha256", digest)``: a watcher does not hold a
    15 MB report, and the one before it while writing the next, only to compare them."""
    return data if len(data) < DIGEST_OVER else ("sha256", hashlib.sha256(data).digest())


def _changed(
    path: Path,
    data: bytes,
    known: dict[Path, tuple[ContentKey, StatKey | None]] | None,
    verify: bool,
    ident: ContentKey | None,
) -> bool:
    """Whether ``path`` does not hold ``data``. ``known``: per path, content this process
    found or wrote there (its :func:`content_key`; ``ident`` is ``data``'s, given with
    ``known``) with the file's settled stat key (see :func:`fsio.settled_key`; None: not
    settled); while the key is unchanged the file is not read again, and without ``verify``
    the content is trusted without a look at the file."""
    if known is not None:
        assert ident is not None
        got = known.get(path)
        if got is not None and got[0] == ident:
            if not verify:
                return False
            try:
                st = os.lstat(path)
            except OSError:
                pass
            else:
                if stat.S_ISREG(st.st_mode) and stat_key(st) == got[1]:
                    return False
    now = time.time_ns()
    try:
        current, key = read_bytes_at(path, len(data))
    except FileReadError:
        current, key = b"", None
    if known is not None:
        settled = settled_key(key, now) if key is not None and current == data else None
        if settled is not None:
            assert ident is not None
            known[path] = (ident, settled)
        else:
            known.pop(path, None)
    return current != data


def _write_outputs(
    state_dir: Path,
    c: Computed,
    opts: ReconcileOptions,
    checkpoint: CheckpointFiles | None,
    commit: Commit,
) -> tuple[list[str], Callable[[], dict[str, Any]]]:
    """Write out/ in dependency order through ``commit`` (SPEC §2, §10, §11, §12): instance
    configs first (a patch never names a config that is not there), then the node patches
    with the plan, made visible with what the commit holds before them (the last-good copies,
    the checkpoint); then the status report and what the plan was computed from
    (``out/plan.basis.json``; ``checkpoint``: the checkpoint files' bytes after the run), made
    visible at a second flush."""
    out = state_dir / "out"
    ensure_dir(out)
    ensure_dir(out / "nodes")
    written: list[str] = []
    manifest: PendingManifest | None = None
    if c.built is not None:
        report = write_instance_outputs(
            state_dir,
            c.built,
            memo=opts.cache.configs if opts.cache is not None else None,
            verify=opts.verify,
            defer_manifest=True,  # written with the status report, after the plan
            since=c.built_since,
            commit=commit,
        )
        written += [f"out/{f}" for f in report.written]
        written += [f"out/instances/{i}" for i in report.removed]
        manifest = report.manifest
        # the network files (SPEC §17) beside the configs, before any plan names them
        written += write_network_files(
            state_dir,
            c.network,
            c.built,
            commit,
            memo=opts.cache.network_files if opts.cache is not None else None,
            verify=opts.verify,
        )
    # the components' files (SPEC §18): what their agents install, before the plan
    written += write_component_files(
        state_dir,
        c.view.services,
        c.view.nodes,
        c.result,
        components=c.view.summary().components,
        commit=commit,
    )

    batch: list[tuple[Path, bytes, int]] = []

    known = opts.cache.outputs if opts.cache is not None else None
    encoded = opts.cache.encoded if opts.cache is not None else None

    idents: dict[Path, ContentKey] = {}

    def put(path: Path, data: bytes, mode: int = 0o600, ident: ContentKey | None = None) -> None:
        if ident is None and known is not None:
            ident = content_key(data)
        if _changed(path, data, known, opts.verify, ident):
            batch.append((path, data, mode))
            written.append(str(path.relative_to(state_dir)))
            if ident is not None:
                idents[path] = ident

    def flush() -> None:
        atomic_write_many(batch, commit=commit)
        commit.flush()
        if known is not None:
            for path, data, _mode in batch:  # what this process just wrote there
                ident = idents.pop(path, None)  # (None: put in the batch without put())
                known[path] = (content_key(data) if ident is None else ident, None)
        batch.clear()

    nodes_dir = out / "nodes"
    encoded_now: dict[str, tuple[Path, object, bytes]] = {}
    # a trusting run (see ``verify``) knows the node patch files are the ones it last wrote
    trusted = {} if opts.verify or known is None or encoded is None else encoded
    absent: tuple[ContentKey | None, object] = (None, None)
    patches: Iterable[tuple[str, tuple[dict[str, Any], ...]]] = c.plan.patches.items()
    since = opts.cache.plan.patched_from if opts.cache is not None else None
    if (
        trusted
        and since is not None
        and opts.cache is not None
        and since[0] is opts.cache.encoded_for
        and c.plan.patches is opts.cache.plan.patch_map
    ):
        # the planner made these patches from the ones whose files the last run left, looking
        # at these nodes only: every other node's patch is the very object, its file as written
        patches = [(node_id, c.plan.patches[node_id]) for node_id in since[1]]
        encoded_now = dict(trusted)
    for node_id, ops in patches:
        got = encoded.get(node_id) if encoded is not None else None
        if got is not None and got[1] is ops and trusted.get(node_id) is got:
            assert known is not None
            if known.get(got[0], absent)[0] is got[2]:  # the same patch, known to be there
                encoded_now[node_id] = got
                continue
        if got is not None and got[0].parent == nodes_dir:
            path = got[0]
        else:
            validate_id(node_id, "node id")
            path = nodes_dir / f"{node_id}.json"
        data = got[2] if got is not None and got[1] is ops else pretty_json(list(ops))
        encoded_now[node_id] = (path, ops, data)
        put(path, data, 0o644)
    memo = opts.cache.plan if opts.cache is not None else None
    make_bytes = memo.plan_bytes if memo is not None else plan_bytes
    plan_data = make_bytes(c.plan, c.plan_inputs())
    plan_ident = content_key(plan_data)
    put(out / "plan.json", plan_data, ident=plan_ident)
    flush()
    if opts.cache is not None:
        opts.cache.network_files.written()  # (flushed with the plan)
    if trusted:  # the patch files on disk are the ones the last run left
        names = sorted(f"{n}.json" for n in trusted.keys() - c.plan.patches.keys())
    else:
        with os.scandir(nodes_dir) as entries:  # as glob("*.json"), without a Path per file
            names = sorted(
                e.name for e in entries if e.name.endswith(".json") and not e.is_symlink()
            )
    if encoded is not None:
        encoded.clear()
        encoded.update(encoded_now)
    if opts.cache is not None:
        opts.cache.encoded_for = c.plan.patches
    for name in names:
        if name[: -len(".json")] not in c.plan.patches:
            stale = out / "nodes" / name
            stale.unlink(missing_ok=bool(trusted))
            if known is not None:
                known.pop(stale, None)  # gone: a trusting run must write it if it comes back
            written.append(str(stale.relative_to(state_dir)))
    # the status report after the plan: the plan is what agents wait for, the report is for
    # people (a crash in between leaves the previous report beside the new plan)
    if opts.on_stage is not None:
        opts.on_stage("reporting status")
    uids = AllocationIds(c.checkpoint.allocations, c.checkpoint.since)  # (read when asked)
    raised = c.alerts.raised if c.alerts is not None else []
    status_cache = opts.cache.status if opts.cache is not None else NodeStatusCache()
    status = status_bytes(
        c.view,
        c.result,
        c.diagnostics,
        alerts=raised,
        uids=uids,
        cache=status_cache,
        nodes=c.nodes,
        states=c.final_states,
    )
    status_ident = content_key(status)
    put(out / "status.json", status, ident=status_ident)
    made: list[dict[str, Any]] = []

    def value() -> dict[str, Any]:  # made once, if the page or the caller needs it
        if not made:
            made.append(cached_status(status_cache, c.result, c.diagnostics, alerts=raised))
        return made[0]

    page = _put_page(out / "status.html", value, status_ident, batch, idents, opts)
    if page is not None:
        at = len(written) - (1 if written and written[-1] == "out/status.json" else 0)
        written.insert(at, "out/status.html")
    if checkpoint is not None:  # (None: no checkpoint file, and nothing to reuse)
        plan_digest = digest(plan_data, plan_ident)
        put(out / BASIS_FILE, basis_bytes(c, opts.mode, checkpoint, plan_digest))
    if manifest is not None:  # the configs' own record (see PendingManifest): after the plan
        batch.append((manifest.path, manifest.data(), 0o600))
    if opts.on_stage is not None and batch:
        opts.on_stage("writing the status report")
    flush()
    if page is not None and opts.cache is not None:
        opts.cache.page.source = page  # written
    if manifest is not None:
        manifest.written()
    return written, value


PAGE_HEAD_BYTES = 2048
"""How much of out/status.html a run reads to find the report it was made from."""


def _put_page(
    path: Path,
    value: Callable[[], Mapping[str, Any]],
    report: ContentKey,
    batch: list[tuple[Path, bytes, int]],
    idents: dict[Path, ContentKey],
    opts: ReconcileOptions,
) -> str | None:
    """Put out/status.html (SPEC §20) in ``batch`` unless it was made from this very report
    (``report``: the report's :func:`content_key`; the page names its digest in its head);
    returns that digest if put. It goes just before the report when that is in the batch,
    so a report on disk always has its page beside it. The page's time is when it was
    made: a run that changes nothing leaves it as it is. A watcher's trusting run (``verify``
    off) takes the page it last made for granted, as the other outputs."""
    digest = "sha256:" + (
        report[1].hex() if isinstance(report, tuple) else hashlib.sha256(report).hexdigest()
    )
    memo = opts.cache.page if opts.cache is not None else None
    if memo is not None and not opts.verify and memo.source == digest:
        return None
    try:
        head, _ = read_bytes_at(path, PAGE_HEAD_BYTES)
    except FileReadError:
        head = b""
    if page_source(head) == digest:
        if memo is not None:
            memo.source = digest
        return None
    now = opts.clock() if opts.clock is not None else time.time()
    page = render_status_page(value(), made_at=now, memo=memo, source=digest)
    before = 1 if batch and batch[-1][0] == path.parent / "status.json" else 0
    batch.insert(len(batch) - before, (path, page, 0o600))
    idents[path] = b""  # (flush records each batch entry; the page is never compared)
    return digest


def _lock_wait(opts: ReconcileOptions) -> Callable[[str], None]:
    """Tell whom a run waits for: the log and the spinner (instead of its first stage)."""

    def waiting(holder: str) -> None:
        log.info("waiting for the lock held by %s", holder)
        if opts.on_stage is not None:
            opts.on_stage(f"waiting for the lock held by {holder}")

    return waiting


def reconcile(
    state_dir: Path,
    opts: ReconcileOptions | None = None,
    previous_view: StateView | None = None,
) -> ReconcileReport:
    """One reconcile under the lock, repeated while the inputs change during the run.

    ``previous_view`` (a long-running watcher passes the view of its last run) keeps the last
    good versions in memory and lets unchanged files skip reading and parsing."""
    opts = opts or ReconcileOptions()
    if not state_dir.exists():
        state_dir.mkdir(mode=0o700, parents=True)
    with StateLock(state_dir, opts.lock_timeout, _lock_wait(opts)), collector_paused():
        started = time.monotonic()
        for name in ("checkpoint", "out"):  # a symlink in their place is refused: nothing is
            if (state_dir / name).is_symlink():  # ever written outside the state directory
                raise FileReadError(f"{state_dir / name} is a symlink; refusing to use it")
        if opts.verify or opts.cache is None:  # a watcher's event runs: see ``verify``
            for rel in ("checkpoint", f"checkpoint/{LAST_GOOD}", "out", "out/nodes"):
                remove_stale_temp_files(state_dir, rel)
            # the configs' manifest's, and each instance directory's when a writer died there
            sweep_instance_temps(state_dir)
        written: list[str] = []
        cp_written = False
        problems: list[str] = []
        hint = opts.changed if previous_view is not None else None
        carried: InputChanges | None = None  # see compute_once
        for n in range(1, opts.max_passes + 1):
            c = compute_once(state_dir, opts, previous_view, changed=hint, carried=carried)
            problems.extend(c.loaded.problems)
            if c.alerts is not None:
                for event in c.alerts.events:
                    log.warning("alert: %s", event)
            for p in c.loaded.problems:
                log.error("checkpoint: %s", p)
            if opts.on_stage is not None:
                opts.on_stage("writing out/ and the checkpoint")
            # one commit: every file of the run written beside its target, then made visible
            # in this order with two flushes (see fsio.Commit), the last good inputs first:
            # once a plan is out, an agent may act on it, and an input broken after that must
            # read as the version the plan came from (SPEC §5); then the checkpoint, the
            # configs, the patches and the plan; then, at a second flush, the report
            with Commit(hook=opts.write_hook) as commit:
                LastGoodStore(state_dir / "checkpoint" / LAST_GOOD).sync(
                    c.view,
                    memo=opts.cache.last_good if opts.cache is not None else None,
                    commit=commit,
                )
                # the checkpoint's bytes after this run
                cp_files = (
                    CheckpointFiles(c.loaded.current, c.loaded.delta)
                    if c.loaded.current is not None
                    else None
                )
                if c.checkpoint.generation != c.loaded.checkpoint.generation or (
                    c.loaded.source != "current"
                ):
                    cp_files = save_checkpoint(
                        state_dir / "checkpoint",
                        c.checkpoint,
                        cache=opts.cache.checkpoint if opts.cache is not None else None,
                        current=c.loaded.current,  # read under this lock: not read again
                        commit=commit,
                        # a watcher's run writes what changed, a one-shot run all of it
                        base=c.loaded.base if opts.cache is not None else None,
                    )
                    cp_written = True
                more, status = _write_outputs(state_dir, c, opts, cp_files, commit)
            written += more
            if not opts.recheck and hint is None:
                return ReconcileReport(
                    n, c, tuple(written), cp_written, tuple(problems), status, _since(started)
                )
            # level-triggered after all: every input stat'ed (a watcher's hint may have missed
            # an event; an edit may have landed during the run)
            if opts.on_stage is not None:
                opts.on_stage("checking the inputs again")
            after, _ = load_state(state_dir, c.view)
            if after.input_hash == c.view.input_hash:
                # the same objects (the loader keeps them for the same content), with the stat
                # keys just taken: the next run does not read a recently written file again
                c = dataclasses.replace(c, view=after)
                return ReconcileReport(
                    n, c, tuple(written), cp_written, tuple(problems), status, _since(started)
                )
            log.info("inputs changed during the run; reconciling again")
            previous_view, carried = after, after.changes
            hint = None
        log.warning("inputs kept changing for %d passes; stopping here", opts.max_passes)
        return ReconcileReport(
            opts.max_passes, c, tuple(written), cp_written, tuple(problems), status, _since(started)
        )


def _inputs(
    carried: InputChanges | None, loaded: InputChanges | None, marked: frozenset[str]
) -> InputChanges | None:
    """What the balancer's memo is told changed since its last call."""
    if loaded is None:
        return None
    changes = carried.then(loaded) if carried is not None else loaded
    return changes.with_nodes(marked)


def _since(started: float) -> float:
    return time.monotonic() - started
