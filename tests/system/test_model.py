"""Model-based tests of the whole controller (issue 10).

A hypothesis ``RuleBasedStateMachine`` drives the real shell (``reconcile``, ``compute_once``, the
``plan`` command in a new process, the atomic writers with a fault-injecting write hook, an agent
applying patches) over a real state directory in a temp dir, and checks the invariants listed in
docs/testing.md after every step. No mocks: the only thing injected is the clock (a fake,
monotonic one that rules move forward) and, for crashes, an exception raised from the write hook.

The CI profile is bounded (``RECONCILER_MODEL_EXAMPLES`` examples of at most
``RECONCILER_MODEL_STEPS`` steps, defaults 40 and 20); docs/testing.md gives the long command.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from reconciler.controller.configs import default_config_builder
from reconciler.controller.reconcile import (
    Computed,
    ReconcileError,
    ReconcileOptions,
    ReconcileReport,
    compute_once,
    reconcile,
)
from reconciler.io.checkpoint_files import (
    CURRENT,
    LINEAGE,
    PREVIOUS,
    load_checkpoint,
)
from reconciler.io.lastgood import LastGoodStore
from reconciler.io.loader import Doc, load_state
from reconciler.model.documents import Node, Service, UnitConfig
from reconciler.oci.writer import WRITING
from tests.support.agent_sim import apply_all
from tests.support.model_universe import (
    GARBAGE,
    GI,
    GPU,
    LABELS,
    MI,
    NODE_IDS,
    SERVICE_IDS,
    START,
    VGPU,
    NodeSpec,
    ServiceSpec,
    UnitSpec,
    actual_documents,
    agent_apply_refusing,
    all_devices,
    check_capacity,
    check_outputs_parse,
    decoded_checkpoint,
    desired_actual,
    empty_actual,
    garbage_bytes,
    instance_uuid,
    node_doc,
    running_instances,
    service_doc,
    snapshot,
    temp_files,
    to_bytes,
    unit_doc,
)
from tests.support.paths import ROOT

EXAMPLES = int(os.environ.get("RECONCILER_MODEL_EXAMPLES", "40"))
STEPS = int(os.environ.get("RECONCILER_MODEL_STEPS", "20"))
SHRINK = os.environ.get("RECONCILER_MODEL_SHRINK", "1") != "0"  # 0: report unshrunk (faster)

# Known bugs this machine found. Each is reproduced by an xfail(strict=True) test in
# TestFindings below; the machine tolerates exactly that symptom (counted as an event, see
# --hypothesis-show-statistics) and checks everything else. When a fix lands, its test XPASSes,
# strict xfail turns that into a failure, and the flag and its exemption are to be removed.

UNIT_REL = "unit.yaml"
SERVICE_RELS = tuple(f"desired/{s}.yaml" for s in SERVICE_IDS)
NODE_RELS = tuple(f"nodes/{n}.yaml" for n in NODE_IDS)
ALL_RELS = (UNIT_REL, *SERVICE_RELS, *NODE_RELS)

Placed = dict[str, tuple[str, str, tuple[tuple[str, tuple[str, ...]], ...]]]


def _event(text: str) -> None:
    """Count an event for ``--hypothesis-show-statistics`` (ignored outside a test run)."""
    with contextlib.suppress(InvalidArgument):
        event(text)


class Crash(Exception):
    """Raised from the write hook: the process "dies" at that step of a write."""


# ----------------------------------------------------------------------------- strategies

labels_st = st.lists(st.sampled_from(LABELS), unique=True, max_size=2).map(
    lambda xs: tuple(sorted(xs))
)


def service_specs(item: str | None = None) -> st.SearchStrategy[ServiceSpec]:
    return st.builds(
        ServiceSpec,
        id=st.just(item) if item is not None else st.sampled_from(SERVICE_IDS),
        priority=st.integers(0, 3),
        instances=st.integers(0, 4),
        labels=st.one_of(st.just(()), st.just(()), labels_st),
        cpu=st.sampled_from([0, 100, 250, 400]),
        ram=st.sampled_from([0, 64 * MI, 256 * MI]),
        storage=st.sampled_from([0, 32 * MI, 100 * MI]),
        state=st.sampled_from([0, 16 * MI, 48 * MI]),
        resources=st.sampled_from([(), ("can",), ("bus",)]),
        device=st.sampled_from(
            [None, None, None, None, (GPU, 1), (GPU, 2), (VGPU, 512 * MI), (VGPU, GI)]
        ),
        runtimes=st.sampled_from([None, None, ("runc",), ("crun",)]),
        balancing=st.sampled_from(["enabled", "disabled"]),
    )


unit_specs = st.builds(
    UnitSpec,
    priority=st.fixed_dictionaries({n: st.integers(0, 2) for n in NODE_IDS}),
    labels=st.fixed_dictionaries({n: labels_st for n in NODE_IDS}),
)


@dataclass(frozen=True)
class Decision:
    """What one reconcile decided: where every instance goes, and under which inputs."""

    placed: Placed
    failed: frozenset[str]
    inputs: str  # the effective inputs (after last-good substitution), canonical JSON
    now: float


def placed_of(c: Computed) -> Placed:
    return {p.instance_id: (p.node_id, p.runtime_id, p.devices) for p in c.result.placements}


def typed(rel: str, doc: Mapping[str, Any]) -> Doc:
    if rel == UNIT_REL:
        return UnitConfig.model_validate(doc)
    if rel.startswith("nodes/"):
        return Node.model_validate(doc)
    return Service.model_validate(doc)


# ----------------------------------------------------------------------------- the machine


class ControllerMachine(RuleBasedStateMachine):
    """The controller as a oneshot process over a state directory, with the world around it."""

    def __init__(self) -> None:
        super().__init__()
        self.state = Path(tempfile.mkdtemp(prefix="reconciler-model-"))
        self.now = START
        self.unit = UnitSpec()
        self.services: dict[str, ServiceSpec] = {}
        self.nodes: dict[str, NodeSpec] = {}
        self.corrupt: dict[str, bytes] = {}  # rel -> the garbage now in the file
        self.last_good: dict[str, Doc] = {}  # what checkpoint/last-good must hold
        self.seen_deleted: set[str] = set(ALL_RELS)  # rels the controller knows as absent
        self.decision: Decision | None = None
        self.held: dict[str, dict[str, tuple[str, ...]]] = {}  # see remember_devices
        self.outputs_whole = False  # out/ is entirely the last successful reconcile's
        self.patches_fresh = False  # ... and its node patches were not applied yet
        self.actual_in_sync = False  # actual/ is what the last decision wants
        self.configs = default_config_builder()

    def teardown(self) -> None:
        shutil.rmtree(self.state, ignore_errors=True)

    # ------------------------------------------------------------------ model helpers

    def opts(self, hook: Callable[[str], None] | None = None, **kw: Any) -> ReconcileOptions:
        return ReconcileOptions(clock=lambda: self.now, configs=self.configs, write_hook=hook, **kw)

    def intended(self, rel: str) -> dict[str, Any] | None:
        """The document the world means to have in ``rel`` (None: no file)."""
        if rel == UNIT_REL:
            return unit_doc(self.unit)
        kind, name = rel.split("/", 1)
        key = name.removesuffix(".yaml")
        if kind == "nodes":
            return node_doc(self.nodes[key]) if key in self.nodes else None
        return service_doc(self.services[key]) if key in self.services else None

    def write(self, rel: str) -> None:
        """Write ``rel`` from the model (this also repairs a corrupt file)."""
        path = self.state / rel
        doc = self.intended(rel)
        self.corrupt.pop(rel, None)
        if doc is None:
            path.unlink(missing_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(to_bytes(doc))

    def effective(self, rel: str) -> Doc | None:
        """What the controller must see for ``rel`` (SPEC §5): the current document when it is
        valid, else its last good version, else nothing."""
        if rel in self.corrupt:
            return self.last_good.get(rel)
        doc = self.intended(rel)
        return typed(rel, doc) if doc is not None else None

    def effective_view(self) -> tuple[UnitConfig | None, dict[str, Service], dict[str, Node]]:
        unit = self.effective(UNIT_REL)
        assert unit is None or isinstance(unit, UnitConfig)
        services: dict[str, Service] = {}
        for rel in SERVICE_RELS:
            s = self.effective(rel)
            if s is not None:
                assert isinstance(s, Service)
                services[s.id] = s
        nodes: dict[str, Node] = {}
        for rel in NODE_RELS:
            n = self.effective(rel)
            if n is not None:
                assert isinstance(n, Node)
                nodes[n.id] = n
        return unit, services, nodes

    def inputs_key(self) -> str:
        unit, services, nodes = self.effective_view()
        return json.dumps(
            {
                "unit": unit.model_dump(mode="json") if unit else None,
                "services": {k: v.model_dump(mode="json") for k, v in sorted(services.items())},
                "nodes": {k: v.model_dump(mode="json") for k, v in sorted(nodes.items())},
            },
            sort_keys=True,
        )

    def unchanged_since_decision(self) -> bool:
        d = self.decision
        return d is not None and d.inputs == self.inputs_key() and d.now == self.now

    def expect_refusal(self) -> bool:
        """SPEC §5's mass-deletion guard: no valid desired service left while instances run,
        or no valid node left while instances run or are allocated."""
        _, services, nodes = self.effective_view()
        running = bool(running_instances(self.state))
        if not services:
            return running
        if nodes or running:
            return not nodes
        view, _ = load_state(self.state)
        loaded = load_checkpoint(self.state / "checkpoint", view.actual, quarantine=False)
        return bool(loaded.checkpoint.allocations)

    def check_view(self, c: Computed) -> None:
        """The loader saw exactly the effective inputs, and reported every corrupt file."""
        unit, services, nodes = self.effective_view()
        assert c.view.unit == unit
        assert {s.id: s for s in c.view.services.values()} == services
        assert dict(c.view.nodes) == nodes
        errors = {d.path for d in c.diagnostics if d.severity == "error"}
        assert errors == {str(self.state / rel) for rel in self.corrupt}, (errors, self.corrupt)
        assert all(d.line >= 1 and d.col >= 1 for d in c.diagnostics)

    def check_placed_xor_failed(self, c: Computed) -> None:
        _, services, _ = self.effective_view()
        wanted = {instance_uuid(s.id, i) for s in services.values() for i in range(s.instances)}
        placed = {p.instance_id for p in c.result.placements}
        failed = [f.instance_id for f in c.result.failures]
        assert len(failed) == len(set(failed)), "an instance failed twice"
        # only a held instance (kept where it runs while its spec places nowhere) is both
        assert placed & set(failed) == c.result.held, f"placed and failed: {placed & set(failed)}"
        assert placed | set(failed) == wanted, (placed | set(failed)) ^ wanted
        # no desired instance is ever stopped as not desired
        wrongly = [
            a for a in c.plan.stops() if a.reason == "not-desired" and a.instance_id in wanted
        ]
        assert not wrongly, f"desired instances stopped as not-desired: {wrongly}"
        if c.result.held:
            _event("hold: an instance kept where it runs while its spec places nowhere")
        for f in c.result.failures:
            assert f.reason and f.summary.startswith(f"{f.item_id}:{f.subject_id}:{f.index}: ")
            # counts per reason of the nodes that rejected it: none when the unit has none
            seen = c.nodes if c.nodes is not None else list(c.view.nodes.values())
            assert f.counts or (f.reason == "NoNodes" and not seen), f

    def sync_last_good_model(self) -> None:
        """What a completed LastGoodStore.sync leaves (reconcile's last step)."""
        for rel in ALL_RELS:
            doc = self.intended(rel)
            if not (self.state / rel).exists():
                self.last_good.pop(rel, None)
                self.seen_deleted.add(rel)
            elif rel not in self.corrupt:
                assert doc is not None
                self.last_good[rel] = typed(rel, doc)
                self.seen_deleted.discard(rel)

    def check_last_good_on_disk(self) -> None:
        store = LastGoodStore(self.state / "checkpoint" / "last-good")
        for rel in ALL_RELS:
            assert store.get(rel) == self.last_good.get(rel), rel

    def remember_devices(self, placed: Placed, *, reset: bool) -> None:
        """Device ids instances may legitimately keep (sticky, even when unhealthy): those of
        the last decision, plus those of any crashed run since (its checkpoint may be on disk)."""
        if reset:
            self.held = {}
        for iid, (_, _, devices) in placed.items():
            mine = self.held.setdefault(iid, {})
            for resource, ids in devices:
                mine[resource] = tuple(sorted({*mine.get(resource, ()), *ids}))

    # ------------------------------------------------------------------ checks of one run

    def check_outputs(
        self, report: ReconcileReport, previous: Mapping[str, Mapping[str, tuple[str, ...]]]
    ) -> None:
        """out/ after a successful reconcile: status within capacity, patches that turn each
        actual document into the desired one, the plan as computed."""
        c = report.computed
        unit, services, nodes = self.effective_view()
        status = json.loads((self.state / "out" / "status.json").read_bytes())
        assert set(status["instances"]) == {p.instance_id for p in c.result.placements}
        for p in c.result.placements:
            rec = status["instances"][p.instance_id]
            assert (rec["nodeId"], rec["runtimeId"]) == (p.node_id, p.runtime_id)
            assert rec["devices"] == {r: list(ids) for r, ids in p.devices}
        # the checkpoint holds what was decided, with the requested amounts (a held instance:
        # those it was placed with, checked when it was)
        cp = decoded_checkpoint(self.state)
        assert cp is not None
        allocs = cp["data"]["instances"]
        held = {iid: allocs[iid]["reserved"] for iid in c.result.held}
        check_capacity(status, services, nodes, unit, previous, held)
        assert set(allocs) == set(status["instances"])
        for iid, a in allocs.items():
            if iid in held:
                continue
            req = services[a["itemId"]].requestedResources
            want = {"cpu": req.cpu, "ram": req.ram, "storage": req.storage, "state": req.state}
            assert a["reserved"] == {k: v or 0 for k, v in want.items()}, (iid, a)
        plan = json.loads((self.state / "out" / "plan.json").read_bytes())
        expected_plan = c.plan.to_json()
        expected_plan["inputs"]["mode"] = c.requested
        assert plan == expected_plan
        actual = actual_documents(self.state)
        patched_nodes = {p.stem for p in (self.state / "out" / "nodes").glob("*.json")}
        assert patched_nodes == set(nodes) | set(actual)
        for node_id in sorted(patched_nodes):
            doc = actual.get(node_id, empty_actual(node_id))
            ops = json.loads((self.state / "out" / "nodes" / f"{node_id}.json").read_bytes())
            assert ops[0] == {"op": "test", "path": "/revision", "value": doc["revision"]}
            got = jsonpatch.apply_patch(doc, ops)
            if node_id in nodes:
                assert got == desired_actual(node_id, doc, status["instances"]), node_id
            else:
                assert got == dict(doc, instances={}), node_id  # a lost node runs nothing

    def after_success(self, report: ReconcileReport) -> None:
        c = report.computed
        _event(f"reconcile: mode {c.mode}")
        _event(f"reconcile: {len(c.result.placements)} placed, {len(c.result.failures)} failed")
        _event(f"reconcile: {len(c.plan.stops())} stops, {len(c.plan.starts())} starts")
        if c.result.preempted:
            _event("reconcile: preemption")
        if any(p.unhealthy_devices for p in c.result.placements):
            _event("reconcile: holds an unhealthy device")
        for reason in sorted({f.reason for f in c.result.failures}):
            _event(f"reconcile: failure reason {reason}")
        assert not report.problems, report.problems  # the checkpoint is never quarantined
        self.check_view(c)
        self.check_placed_xor_failed(c)
        if self.unchanged_since_decision():
            assert self.decision is not None
            assert placed_of(c) == self.decision.placed, "unchanged inputs moved instances"
            if self.actual_in_sync:
                assert not c.plan.changes_present, c.plan.actions
        self.check_second_run(report)
        self.check_outputs(report, self.held)
        s = report.computed
        self.remember_devices(placed_of(s), reset=True)
        self.decision = Decision(
            placed_of(s),
            frozenset(f.instance_id for f in s.result.failures),
            self.inputs_key(),
            self.now,
        )
        self.outputs_whole = self.patches_fresh = True
        self.actual_in_sync = not s.plan.changes_present
        self.sync_last_good_model()
        self.check_last_good_on_disk()

    def check_second_run(self, first: ReconcileReport) -> None:
        """A second reconcile right after one plans the same and rewrites no file (after a
        preemption or a rebalance too: failures are summarized against the final state, and a
        rebalance ends in the state the next run starts from)."""
        c = first.computed
        before = snapshot(self.state, with_mtime=True)
        again = reconcile(self.state, self.opts(allow_empty=True))
        assert again.written == () and not again.checkpoint_written, again.written
        assert snapshot(self.state, with_mtime=True) == before
        assert again.plan.actions == c.plan.actions
        assert again.plan.failures == c.plan.failures
        assert placed_of(again.computed) == placed_of(c)

    # ------------------------------------------------------------------ setup

    @initialize(
        nodes=st.lists(st.sampled_from(NODE_IDS), min_size=2, max_size=4, unique=True),
        services=st.lists(service_specs(), min_size=1, max_size=2, unique_by=lambda s: s.id),
        unit=unit_specs,
        usage=st.fixed_dictionaries(
            {n: st.sampled_from([None, None, None, 0, 900]) for n in NODE_IDS}
        ),
        start=st.sampled_from(["files", "reconciled", "running", "running"]),
    )
    def setup(
        self,
        nodes: list[str],
        services: list[ServiceSpec],
        unit: UnitSpec,
        usage: dict[str, int | None],
        start: str,
    ) -> None:
        """A unit of 2-4 nodes and 1-2 services: only the files, or already reconciled, or
        reconciled and started by the agents."""
        self.unit = unit
        self.write(UNIT_REL)
        for n in nodes:
            self.nodes[n] = NodeSpec(n, usage_cpu=usage[n])
            self.write(f"nodes/{n}.yaml")
        for s in services:
            self.services[s.id] = s
            self.write(f"desired/{s.id}.yaml")
        if start != "files":
            self.run_reconcile(allow_empty=False, agents=start == "running")

    # ------------------------------------------------------------------ desired services

    @rule(spec=service_specs())
    def put_service(self, spec: ServiceSpec) -> None:
        """Add a service, or replace one with a new document."""
        self.services[spec.id] = spec
        self.write(f"desired/{spec.id}.yaml")

    @rule(item=st.sampled_from(SERVICE_IDS))
    def remove_service(self, item: str) -> None:
        self.services.pop(item, None)
        self.write(f"desired/{item}.yaml")

    def _edit(self, item: str, **changes: Any) -> None:
        if item in self.services:
            self.services[item] = replace(self.services[item], **changes)
            self.write(f"desired/{item}.yaml")

    @rule(item=st.sampled_from(SERVICE_IDS), n=st.integers(0, 4))
    def scale(self, item: str, n: int) -> None:
        self._edit(item, instances=n)

    @rule(item=st.sampled_from(SERVICE_IDS))
    def bump_version(self, item: str) -> None:
        if item in self.services:
            self.services[item] = self.services[item].bumped()
            self.write(f"desired/{item}.yaml")

    @rule(item=st.sampled_from(SERVICE_IDS), priority=st.integers(0, 3))
    def set_priority(self, item: str, priority: int) -> None:
        self._edit(item, priority=priority)

    @rule(item=st.sampled_from(SERVICE_IDS), labels=labels_st)
    def set_labels(self, item: str, labels: tuple[str, ...]) -> None:
        self._edit(item, labels=labels)

    # ------------------------------------------------------------------ nodes and the unit

    @rule(node=st.sampled_from(NODE_IDS))
    def add_node(self, node: str) -> None:
        if node not in self.nodes:
            self.nodes[node] = NodeSpec(node)
            self.write(f"nodes/{node}.yaml")

    @precondition(lambda self: len(self.nodes) > 1)
    @rule(node=st.sampled_from(NODE_IDS))
    def remove_node(self, node: str) -> None:
        self.nodes.pop(node, None)
        self.write(f"nodes/{node}.yaml")

    def _node(self, node: str, **changes: Any) -> None:
        if node in self.nodes:
            self.nodes[node] = replace(self.nodes[node], **changes)
            self.write(f"nodes/{node}.yaml")

    @rule(node=st.sampled_from(NODE_IDS), connected=st.booleans())
    def set_connected(self, node: str, connected: bool) -> None:
        self._node(node, connected=connected)

    @rule(device=st.sampled_from(all_devices()), healthy=st.booleans())
    def set_device_health(self, device: tuple[str, str, str], healthy: bool) -> None:
        node, resource, dev = device
        if node in self.nodes:
            bad = set(self.nodes[node].unhealthy)
            (bad.discard if healthy else bad.add)((resource, dev))
            self._node(node, unhealthy=frozenset(bad))

    @rule(node=st.sampled_from(NODE_IDS), cpu=st.sampled_from([None, 0, 200, 550, 900]))
    def set_usage(self, node: str, cpu: int | None) -> None:
        """The agent reports measured usage (cpu 550 and 900 are above n1's and n2's alert
        thresholds; the node's system usage also lowers its free cpu, SPEC §7.3)."""
        self._node(node, usage_cpu=cpu)

    @rule(seconds=st.sampled_from([15, 60, 120]))
    def advance_time(self, seconds: int) -> None:
        self.now += seconds

    @rule(seconds=st.sampled_from([60, 120, 300]), agents=st.booleans())
    def timer_reconcile(self, seconds: int, agents: bool) -> None:
        """reconciler.timer: time passes and a plain ``reconciler reconcile`` runs."""
        self.now += seconds
        self.run_reconcile(allow_empty=False, agents=agents)

    @rule(node=st.sampled_from(NODE_IDS), priority=st.integers(0, 2), labels=labels_st)
    def configure_node(self, node: str, priority: int, labels: tuple[str, ...]) -> None:
        self.unit = UnitSpec(
            {**self.unit.priority, node: priority}, {**self.unit.labels, node: labels}
        )
        self.write(UNIT_REL)

    # ------------------------------------------------------------------ corrupt and repair

    @rule(rel=st.sampled_from(ALL_RELS), variant=st.sampled_from(GARBAGE))
    def corrupt_file(self, rel: str, variant: str) -> None:
        intended = self.intended(rel)
        data = garbage_bytes(variant, rel, to_bytes(intended) if intended else None)
        path = self.state / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        self.corrupt[rel] = data
        self.check_corruption_stops_nothing(rel)

    @precondition(lambda self: bool(self.corrupt))
    @rule(data=st.data())
    def repair_file(self, data: st.DataObject) -> None:
        self.write(data.draw(st.sampled_from(sorted(self.corrupt)), label="rel"))

    def check_corruption_stops_nothing(self, rel: str) -> None:
        """SPEC §5: an unreadable input is never treated as deleted. The next plan equals the plan
        with the file holding its last good version (or absent, for a first-ever invalid file),
        and stops nothing that runs because of it."""
        if self.expect_refusal():
            with pytest.raises(ReconcileError):
                compute_once(self.state, self.opts(), read_only=True)
            return
        c = compute_once(self.state, self.opts(), read_only=True)
        self.check_view(c)
        running = running_instances(self.state)
        good = self.last_good.get(rel)
        _event(
            f"corrupt: {rel.split('/')[0]}, last good {good is not None}, {len(running)} running"
        )
        known = rel not in self.seen_deleted  # the controller planned from a valid version
        self.check_placed_xor_failed(c)
        if rel.startswith("desired/"):
            item = rel.removeprefix("desired/").removesuffix(".yaml")
            for a in c.plan.stops():
                if a.item_id != item or a.reason != "not-desired" or a.instance_id not in running:
                    continue
                if good is not None:
                    assert isinstance(good, Service)
                    assert a.index >= good.instances, f"stopped {a} of a broken {rel}"
                else:
                    assert not known, (
                        f"{rel} broke after a run planned {item} from a valid version, and the "
                        f"next plan stops its running instance {a.item_id}:{a.index} "
                        "(SPEC §5: the object keeps its last good version)"
                    )
        if rel.startswith("nodes/") and (good is not None or known):
            node = rel.removeprefix("nodes/").removesuffix(".yaml")
            lost = [a for a in c.plan.stops() if a.node_id == node and a.reason == "node-lost"]
            assert not lost, f"a broken {rel} reads as a lost node: {lost}"
        # equivalence with the last good version written back in place
        path = self.state / rel
        garbage = path.read_bytes()
        try:
            if good is None:
                path.unlink()
            else:
                path.write_bytes(to_bytes(good.model_dump(mode="json")))
            try:
                ref = compute_once(self.state, self.opts(), read_only=True)
            except ReconcileError:
                pytest.fail(f"with {rel} at its last good version the guard refuses")
        finally:
            path.write_bytes(garbage)
        assert placed_of(c) == placed_of(ref)
        assert c.plan.actions == ref.plan.actions

    # ------------------------------------------------------------------ the controller

    @rule(allow_empty=st.booleans(), agents=st.booleans())
    def run_reconcile(self, allow_empty: bool, agents: bool) -> None:
        """``reconciler reconcile`` (``--allow-empty`` or not); with ``agents`` the node agents
        apply the new patches right away, as they would on a live unit."""
        if self.expect_refusal() and not allow_empty:
            before = snapshot(self.state)
            with pytest.raises(ReconcileError, match="refusing to stop"):
                reconcile(self.state, self.opts())
            assert snapshot(self.state) == before  # a refused run writes nothing
            _event("reconcile: the mass-deletion guard refused")
            return
        self.after_success(reconcile(self.state, self.opts(allow_empty=allow_empty)))
        if agents:
            self.apply_plans()

    @rule(via=st.sampled_from(["memory", "memory", "memory", "process"]))
    def restart(self, via: str) -> None:
        """Drop every in-memory object: a fresh read-only computation from the disk alone (or
        ``reconciler plan --json`` in a new process, at the fake clock's time)."""
        if self.expect_refusal():
            with pytest.raises(ReconcileError):
                compute_once(self.state, self.opts(), read_only=True)
            return
        before = snapshot(self.state, with_mtime=True)
        c = compute_once(self.state, self.opts(), read_only=True)
        assert snapshot(self.state, with_mtime=True) == before  # plan writes nothing
        same = self.unchanged_since_decision()
        _event(f"restart: {via}, inputs {'unchanged' if same else 'changed'}")
        self.check_view(c)
        self.check_placed_xor_failed(c)
        if same:
            assert self.decision is not None
            assert placed_of(c) == self.decision.placed, "a restart moved instances"
            assert {f.instance_id for f in c.result.failures} == self.decision.failed
            if self.actual_in_sync:
                assert not c.plan.changes_present, c.plan.actions
        if via == "process":
            doc = c.plan.to_json()
            doc["inputs"]["mode"] = c.requested
            code = (
                "import sys\n"
                "from datetime import datetime, timezone\n"
                "from freezegun import freeze_time\n"
                "from reconciler.cli.commands import main\n"
                "with freeze_time(datetime.fromtimestamp(float(sys.argv[2]), timezone.utc)):\n"
                "    rc = main(['plan', '--json', '--allow-invalid', '--state', sys.argv[1]])\n"
                "sys.exit(rc)\n"
            )
            proc = subprocess.run(
                [sys.executable, "-c", code, str(self.state), repr(self.now)],
                capture_output=True,
                cwd=ROOT,
                timeout=60,
                check=False,
            )
            want_rc = 3 if c.plan.failures else 2 if c.plan.changes_present else 0
            assert proc.returncode == want_rc, proc.stderr.decode()
            got = json.loads(proc.stdout)
            # (past the gate: invalid files are listed and the plan is not complete)
            invalid = got.pop("invalidFiles", [])
            got.pop("invalidInputs", None)
            assert invalid == sorted(str(self.state / rel) for rel in self.corrupt)
            if invalid:
                assert got["complete"] is False
                got["complete"] = doc["complete"]
            assert got == doc
            assert snapshot(self.state, with_mtime=True) == before

    @rule(nth=st.integers(1, 12))  # a run's commit: ten steps (five per flush)
    def crash(self, nth: int) -> None:
        """Die at the nth step of the run's commit (open, then write, fsync, rename and
        fsync-dir at each of its flushes); a run with fewer steps just completes."""
        if self.expect_refusal():
            return  # the guard refuses before any write: nothing to crash in
        old = snapshot(self.state)
        # what the run would decide and write: the same run in a copy of the directory
        scratch = Path(tempfile.mkdtemp(prefix="reconciler-model-copy-"))
        try:
            shutil.copytree(self.state, scratch / "s", symlinks=True)
            ref = reconcile(scratch / "s", self.opts(allow_empty=True))
            new = {
                rel: (_unscratch(data, scratch / "s", self.state), m)
                for rel, (data, m) in snapshot(scratch / "s").items()
            }
            _page_names_its_report(new)
            decided = placed_of(ref.computed)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        steps: list[str] = []

        def hook(step: str) -> None:
            steps.append(step)
            if len(steps) == nth:
                raise Crash(step)

        try:
            report = reconcile(self.state, self.opts(hook, allow_empty=True))
        except Crash as e:
            _event(f"crash: at {e} (step {nth})")
        else:
            self.after_success(report)
            return
        mid = snapshot(self.state)
        self.check_old_or_new(old, mid, new)
        # a restart after the crash decides what the crashed run decided
        c = compute_once(self.state, self.opts(), read_only=True)
        assert placed_of(c) == decided, "the crash changed the placements"
        self.remember_devices(decided, reset=False)
        self.decision = Decision(
            decided,
            frozenset(f.instance_id for f in ref.computed.result.failures),
            self.inputs_key(),
            self.now,
        )
        self.outputs_whole = self.patches_fresh = False
        self.actual_in_sync = not ref.plan.changes_present
        # the last-good store holds, per file, the old or the new entry
        store = LastGoodStore(self.state / "checkpoint" / "last-good")
        # (the run records it before it writes any plan: a run that crashed before the record
        # was complete published nothing, so what the controller knows is what the store holds)
        before_sync = dict(self.last_good)
        seen_deleted = set(self.seen_deleted)
        self.sync_last_good_model()
        after_sync = dict(self.last_good)
        for rel in ALL_RELS:
            got = store.get(rel)
            assert got in (before_sync.get(rel), after_sync.get(rel)), rel
            if got is None:
                self.last_good.pop(rel, None)
                if not (self.state / rel).exists():
                    seen_deleted.add(rel)
            else:
                self.last_good[rel] = got
                seen_deleted.discard(rel)
        self.seen_deleted = seen_deleted

    def check_old_or_new(
        self,
        old: Mapping[str, tuple[bytes, int]],
        mid: Mapping[str, tuple[bytes, int]],
        new: Mapping[str, tuple[bytes, int]],
    ) -> None:
        """Every output file is the old or the new version, never torn or mixed (SPEC §9)."""
        outputs = {r for r in (*old, *mid, *new) if r.startswith(("out/", "checkpoint/"))}
        for rel in sorted(outputs):
            got = mid.get(rel)
            if rel.endswith((CURRENT, PREVIOUS)) and rel.count("/") == 1:
                # lineage differs between the copy and the original on a first run
                variants: list[tuple[int, str] | None] = [
                    decoded_checkpoint_bytes(x[0]) for x in (old.get(rel), new.get(rel)) if x
                ]
                if old.get(rel) is None:
                    variants.append(None)
                got_cp = decoded_checkpoint_bytes(got[0]) if got else None
                assert got_cp in variants, rel
                continue
            if rel == f"checkpoint/{LINEAGE}" and rel not in old:
                continue  # a first run's random lineage
            if rel.endswith("/.manifest.json"):
                continue  # the config writer's cache of stat keys: differs in a copy by design
            if rel == f"out/instances/{WRITING}" and rel not in new:
                # the mark of a batch of configs cut short, by design (the next verifying run
                # sweeps the instance directories' temps, then removes it)
                continue
            options = [x[0] if x else None for x in (old.get(rel), new.get(rel))]
            if rel == "out/plan.basis.json" and f"checkpoint/{LINEAGE}" not in old:
                continue  # digests the checkpoint's bytes, which hold a first run's lineage
            assert (got[0] if got else None) in options, f"{rel} is neither old nor new"

    # ------------------------------------------------------------------ the node agents

    @precondition(lambda self: (self.state / "out" / "nodes").is_dir())
    @rule()
    def apply_plans(self) -> None:
        """Every agent applies its node's patch to its actual document (SPEC §15)."""
        if self.patches_fresh:
            apply_all(self.state)  # fresh patches: every revision test passes
            self.actual_in_sync = True
        else:
            # stale or crash-mixed patches: an agent refuses a patch whose test fails
            applied, _refused = agent_apply_refusing(self.state)
            if applied:
                self.actual_in_sync = False
        self.patches_fresh = False

    # ------------------------------------------------------------------ always

    @invariant()
    def outputs_show_the_decision(self) -> None:
        """out/status.json shows what the last run decided, until a run crashes: then out/
        may mix the old run's files and the new one's (each whole), and this check, like the
        patch checks, waits for the next successful reconcile."""
        if not self.outputs_whole or self.decision is None:
            return
        status = json.loads((self.state / "out" / "status.json").read_bytes())
        shown = {
            iid: (
                rec["nodeId"],
                rec["runtimeId"],
                tuple(sorted((r, tuple(ids)) for r, ids in rec["devices"].items())),
            )
            for iid, rec in status["instances"].items()
        }
        assert shown == self.decision.placed
        assert {f["instanceId"] for f in status["failures"]} == self.decision.failed

    @invariant()
    def outputs_are_whole(self) -> None:
        check_outputs_parse(self.state)
        assert not temp_files(self.state), temp_files(self.state)
        assert not (self.state / "checkpoint" / "quarantine").exists()


def decoded_checkpoint_bytes(raw: bytes) -> tuple[int, str]:
    env = json.loads(raw)
    return env["generation"], json.dumps(env["data"], sort_keys=True)


def _page_names_its_report(files: dict[str, tuple[bytes, int]]) -> None:
    """The status page's head names the digest of the report it was made from: in a copy,
    of the copy's report, whose paths :func:`_unscratch` changed; name the changed one."""
    page, report = files.get("out/status.html"), files.get("out/status.json")
    if page is None or report is None:
        return
    digest = "sha256:" + hashlib.sha256(report[0]).hexdigest()
    named = re.sub(
        rb'(<meta name="reconciler-report" content=")sha256:[0-9a-f]{64}"',
        lambda m: m.group(1) + digest.encode() + b'"',
        page[0],
        count=1,
    )
    files["out/status.html"] = (named, page[1])


def _unscratch(data: bytes, scratch: Path, state: Path) -> bytes:
    for form in (str(scratch.resolve()), str(scratch)):
        data = data.replace(form.encode(), str(state).encode())
    return data


ControllerMachine.TestCase.settings = settings(
    max_examples=EXAMPLES,
    phases=[p for p in Phase if p is not Phase.shrink or SHRINK],
    stateful_step_count=STEPS,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestControllerModel = ControllerMachine.TestCase


# ----------------------------------------------------------------------------- findings


def _state(root: Path, nodes: list[NodeSpec], services: list[ServiceSpec]) -> Path:
    (root / "nodes").mkdir(parents=True)
    (root / "desired").mkdir()
    (root / "unit.yaml").write_bytes(to_bytes(unit_doc(UnitSpec())))
    for n in nodes:
        (root / "nodes" / f"{n.id}.yaml").write_bytes(to_bytes(node_doc(n)))
    for s in services:
        (root / "desired" / f"{s.id}.yaml").write_bytes(to_bytes(service_doc(s)))
    return root


class TestFindings:
    """Minimal reproductions of the bugs the state machine found (see docs/testing.md)."""

    def test_failure_summaries_are_a_fixpoint(self, tmp_path: Path) -> None:
        """Found by the machine: failure reasons were computed against the node states of the
        moment the instance failed; a later preemption freed what was charged, so the next run
        with unchanged inputs reported another reason and rewrote plan and status."""
        # n2: one slot of the shared resource "can", a 64Mi states partition
        low = ServiceSpec("low", instances=2, resources=("can",), state=48 * MI)
        state = _state(tmp_path / "s", [NodeSpec("n2")], [low])
        reconcile(state)  # low:0 placed (holds can), low:1 fails: Resources
        high = ServiceSpec("high", priority=2, state=48 * MI)
        (state / "desired" / "high.yaml").write_bytes(to_bytes(service_doc(high)))
        first = reconcile(state)  # high preempts low:0: can is free, the states partition full
        assert [p.item_id for p in first.computed.result.placements] == ["high"]
        second = reconcile(state)  # nothing changed
        assert [p.item_id for p in second.computed.result.placements] == ["high"]
        reasons = {f.label: f.reason for f in first.computed.result.failures}
        again = {f.label: f.reason for f in second.computed.result.failures}
        assert reasons == {"low:default:0": "State", "low:default:1": "State"}
        assert again == reasons
        assert second.written == ()

    def test_the_run_after_a_rebalance_changes_nothing(self, tmp_path: Path) -> None:
        """Found by the machine: a rebalance that found no room on the lowered capacity of an
        overloaded node stopped the running instance, and the very next reconcile (same inputs,
        same time) planned it back. Now an instance the lowered capacity places nowhere keeps
        its place, so the rebalance changes nothing here and neither does the next run."""
        now = START
        opts = ReconcileOptions(clock=lambda: now)
        # n1: cpu alert rule 50/80%, 60 s; usage 850 of 1000 DMIPS, 100 DMIPS left
        state = _state(
            tmp_path / "s", [NodeSpec("n1", usage_cpu=850)], [ServiceSpec("svc-a", cpu=100)]
        )
        reconcile(state, opts)
        apply_all(state)
        now += 60  # the alert is raised: a rebalance, with n1 lowered to 50% - usage = 0
        rebalanced = reconcile(state, opts)
        assert rebalanced.computed.mode == "rebalance"
        assert rebalanced.plan.actions == ()  # nowhere else to go: it stays on n1
        assert not rebalanced.computed.result.failures
        after = reconcile(state, opts)  # no input changed, no time passed
        assert after.plan.actions == ()
        assert after.written == () and not after.checkpoint_written

    def test_a_crash_after_the_plan_then_a_broken_file_stops_nothing(self, tmp_path: Path) -> None:
        """Found by the machine: last good versions were recorded after the plans, so a crash
        in between left plans an agent applied, and a desired file broken next read as absent."""
        state = _state(
            tmp_path / "s", [NodeSpec("n4")], [ServiceSpec("svc-a"), ServiceSpec("svc-b")]
        )

        def crash_once_the_plan_is_written(step: str) -> None:
            if (state / "out" / "plan.json").exists():
                raise Crash(step)  # power lost after the plan's rename, before anything else

        with pytest.raises(Crash):
            reconcile(state, ReconcileOptions(write_hook=crash_once_the_plan_is_written))
        assert apply_all(state) == 2  # the agent starts svc-a:0 and svc-b:0
        (state / "desired" / "svc-a.yaml").write_text("id: [broken\n")  # a bad edit
        c = compute_once(state, ReconcileOptions(), read_only=True)
        assert not c.plan.stops(), c.plan.stops()  # svc-a:0 keeps running
