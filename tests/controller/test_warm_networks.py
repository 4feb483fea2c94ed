"""The watcher's network phase (``NetworkMemo``) and network files along random edit
sequences: every warm run writes what a process of its own writes from the same inputs and
checkpoint, whether the memo gave its last answer or ran the phase; and the memo does give it
when no networked placement or input changed."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.controller.reconcile import reconcile
from tests.support.outputs import copied, warm_options, written, written_afresh
from tests.support.state_files import RUNC_NODE

UNIT = """apiVersion: reconciler/v1
kind: UnitConfig
version: 1.0.0
network:
  subnets: ['10.9.0.0/29', '10.9.1.0/29']
"""

NODE = RUNC_NODE.replace("{dmips}", "1000")

ITEMS = ("api", "db", "web")


@st.composite
def service_docs(draw: st.DrawFn, item: str) -> str:
    """A service of ``item``: an owner or none (its network; two at most, and /29 subnets
    when the unit declares them, so that subnets and addresses run out), sometimes a hostname
    another item may share (a DNS name taken), ports, connections to another item's port, a
    node pinned, a priority, CPU (the nodes have 1,000 DMIPS: instances move and fail)."""
    lines = [
        "apiVersion: reconciler/v1",
        "kind: Service",
        f"id: {item}",
        "version: 1.0.0",
        f"instances: {draw(st.integers(0, 4))}",
        f"priority: {draw(st.sampled_from([0, 0, 5]))}",
    ]
    owner = draw(st.sampled_from(["red", "blue", None]))
    if owner is not None:
        lines.append(f"owner: {owner}")
    if draw(st.booleans()):
        lines.append(f"hostname: {draw(st.sampled_from(['www', 'svc']))}")
    ports = draw(st.lists(st.sampled_from(["80/tcp", "81/tcp"]), max_size=2, unique=True))
    if ports:
        lines.append(f"exposedPorts: {ports}")
    targets = [f"{i}/{p}" for i in ITEMS if i != item for p in ("80/tcp", "81/tcp")]
    allowed = draw(st.lists(st.sampled_from(targets), max_size=2, unique=True))
    if allowed:
        lines.append(f"allowedConnections: {allowed}")
    if draw(st.integers(0, 4)) == 0:
        lines.append(f"nodeId: {draw(st.sampled_from(['n1', 'n2', 'n3']))}")
    lines.append(f"requestedResources: {{cpu: {draw(st.sampled_from([0, 100, 250]))}}}")
    lines.append("image: {rootfs: /srv/rootfs, cmd: [sleep]}")
    return "\n".join(lines) + "\n"


PLAIN = """apiVersion: reconciler/v1
kind: Service
id: plain
version: 1.0.0
instances: {n}
priority: {priority}
requestedResources: {{cpu: {cpu}}}
image: {{rootfs: /srv/rootfs, cmd: [sleep]}}
"""


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_warm_network_runs_write_what_a_fresh_process_writes(
    tmp_path: Path, data: st.DataObject
) -> None:
    root = tmp_path / "case"
    shutil.rmtree(root, ignore_errors=True)
    state = root / "warm" / "state"
    (state / "desired").mkdir(parents=True)
    (state / "nodes").mkdir()
    if data.draw(st.booleans(), label="unit network"):  # (else: the services' owners)
        (state / "unit.yaml").write_text(UNIT)
    for n in ("n1", "n2", "n3"):
        (state / "nodes" / f"{n}.yaml").write_text(NODE.format(id=n))
    for item in ITEMS:
        (state / "desired" / f"{item}.yaml").write_text(data.draw(service_docs(item), label=item))
    (state / "desired" / "plain.yaml").write_text(PLAIN.format(n=2, priority=0, cpu=100))

    def checkpoint() -> object:
        return written(state)["checkpoint"]  # (its delta applied)

    verifying, cache = warm_options()
    before: object = None  # the checkpoint the last run started from (none: the first)
    view = reconcile(state, verifying).computed.view
    for step in range(data.draw(st.integers(1, 5), label="steps")):
        what = data.draw(
            st.sampled_from(["service", "plain", "none", "none"]), label=f"edit {step}"
        )
        if what == "service":
            item = data.draw(st.sampled_from(ITEMS), label="item")
            doc = data.draw(service_docs(item), label="doc")
            (state / "desired" / f"{item}.yaml").write_text(doc)
        elif what == "plain":
            plain = PLAIN.format(
                n=data.draw(st.integers(0, 4), label="plain instances"),
                priority=data.draw(st.sampled_from([0, 9]), label="plain priority"),
                cpu=data.draw(st.sampled_from([0, 200, 400]), label="plain cpu"),
            )
            (state / "desired" / "plain.yaml").write_text(plain)
        fresh = copied(state, root / f"fresh-{step}")
        trusting = dataclasses.replace(verifying, verify=data.draw(st.booleans(), label="verify"))
        now = checkpoint()
        report = reconcile(state, trusting, view)
        view = report.computed.view
        assert written(state) == written_afresh(fresh, state), f"step {step}: {what}"
        if what == "none" and now == before:
            # nothing changed, and the checkpoint this run starts from is the one the last run
            # started from: the same balance and network state, so the memo's last answer
            assert cache.balance.incremental and cache.network.reused, f"step {step}"
        before = now
