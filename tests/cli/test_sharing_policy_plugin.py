"""A sharing policy is one module plus one registration (SPEC §6.3): ``paired``, defined and
registered only here, is usable from a node file, checked by ``validate`` and the JSON Schema,
placed by the balancer, explained, and reported by ``status``; unregistered, node files naming
it are invalid again."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from jsonschema import Draft202012Validator

from reconciler.cli.commands import main
from reconciler.io.yamlsafe import parse_yaml
from reconciler.placement import sharing
from reconciler.placement.sharing import PoolStatus, ShareRequest, SharingPolicy, Status
from reconciler.placement.sharing.base import SUCCESS, PoolState, StatusCode, bump
from tests.support.state_files import write

USERS = 2


class PairedPolicy(SharingPolicy):
    """Each device serves up to two instances (``count: 1`` each); a request goes to the
    device with the most users that has room (bin-packing), ties by id."""

    name: ClassVar[str] = "paired"

    def check_devices(self, devices: tuple[Any, ...]) -> None:
        if not devices:
            raise ValueError("a paired pool needs at least one device")

    def _choose(
        self, state: PoolState, request: ShareRequest, keep: tuple[str, ...]
    ) -> str | Status:
        if request.memory is not None or request.count != 1:
            return Status(StatusCode.ERROR, f"{state.resource} is paired: request count 1")
        if keep:
            if keep[0] not in state.by_id:
                return Status(StatusCode.UNRESOLVABLE, f"{state.resource}: {keep[0]} vanished")
            if state.holders_of(keep[0]) >= USERS:
                return Status(StatusCode.UNSCHEDULABLE, f"{state.resource}: {keep[0]} is full")
            return keep[0]
        healthy = [i for i in state.items if i.healthy]
        if not healthy:
            return Status(StatusCode.UNRESOLVABLE, f"{state.resource}: no healthy device")
        room = [i.id for i in healthy if state.holders_of(i.id) < USERS]
        if not room:
            return Status(
                StatusCode.UNSCHEDULABLE, f"{state.resource}: every device has {USERS} users"
            )
        return min(room, key=lambda i: (-state.holders_of(i), i))

    def filter(self, state: PoolState, request: ShareRequest, keep: tuple[str, ...] = ()) -> Status:
        chosen = self._choose(state, request, keep)
        return chosen if isinstance(chosen, Status) else SUCCESS

    def allocate(
        self, state: PoolState, request: ShareRequest, keep: tuple[str, ...] = ()
    ) -> tuple[PoolState, tuple[str, ...]]:
        chosen = self._choose(state, request, keep)
        if isinstance(chosen, Status):
            raise ValueError(chosen.reason)
        slots = state.slots if state.holders_of(chosen) else state.slots.consume(1)
        return state.evolve(slots, bump(state.holders, chosen, 1)), (chosen,)

    def release(self, state: PoolState, request: ShareRequest, ids: tuple[str, ...]) -> PoolState:
        holders, slots = state.holders, state.slots
        for i in ids:
            holders = bump(holders, i, -1)
            if dict(holders).get(i, 0) == 0:
                slots = slots.release(1)
        return state.evolve(slots, holders)

    def status(self, state: PoolState) -> PoolStatus:
        base = super().status(state)
        detail = {i.id: {"users": state.holders_of(i.id)} for i in state.items}
        return PoolStatus(base.resource, "paired", base.total, base.healthy, base.allocated, detail)


@pytest.fixture
def paired() -> Iterator[None]:
    sharing.register(PairedPolicy())  # the one registration
    try:
        yield
    finally:
        sharing.unregister(PairedPolicy.name)


NODE = """apiVersion: reconciler/v1
kind: Node
id: n1
type: edge
maxDMIPS: 1000
totalRAM: 1Gi
runtimes:
  - {{id: runc, type: runc, platform: {{architecture: x86_64}}}}
devicePools:
  - resource: example.com/npu
    policy: paired
    devices: [{devices}]
"""

SERVICE = """apiVersion: reconciler/v1
kind: Service
id: infer
version: 1.0.0
instances: 5
devices: [{resource: example.com/npu, count: 1}]
image: {rootfs: /r, cmd: [/bin/true]}
"""


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def unit(root: Path, devices: str = "{id: d0}, {id: d1}") -> Path:
    write(root, "nodes/n1.yaml", NODE.format(devices=devices))
    write(root, "desired/infer.yaml", SERVICE)
    return root


def test_an_unregistered_policy_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = unit(tmp_path)
    code, out, _ = run(capsys, "validate", "--state", str(state))
    assert code == 1
    assert "unknown sharing policy 'paired' (known: exclusive, fractional)" in out
    code, out, _ = run(capsys, "schema", "--kind", "Node")
    assert "paired" not in out


@pytest.mark.usefixtures("paired")
def test_the_registered_policy_is_validated_by_the_node_files_and_the_schema(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = unit(tmp_path)
    code, out, _ = run(capsys, "validate", "--state", str(state))
    assert code == 0, out
    code, out, _ = run(capsys, "schema", "--kind", "Node")
    assert code == 0
    schema = json.loads(out)
    assert schema["$defs"]["DevicePool"]["properties"]["policy"]["enum"] == [
        "exclusive",
        "fractional",
        "paired",
    ]
    validator = Draft202012Validator(schema)
    doc: dict[str, Any] = parse_yaml((state / "nodes" / "n1.yaml").read_bytes()).data
    assert list(validator.iter_errors(doc)) == []
    doc["devicePools"][0]["policy"] = "pairs"
    assert list(validator.iter_errors(doc))
    # the policy's own rule on its pools' devices
    write(state, "nodes/n1.yaml", NODE.format(devices=""))
    code, out, _ = run(capsys, "validate", "--state", str(state))
    assert code == 1
    assert "a paired pool needs at least one device" in out


@pytest.mark.usefixtures("paired")
def test_the_registered_policy_places_explains_and_reports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two devices of two users each: four instances placed (bin-packed: d0, d0, d1, d1), the
    fifth refused with the policy's Unschedulable verdict; status reports the pool through the
    policy."""
    state = unit(tmp_path)
    code, _, err = run(capsys, "reconcile", "--state", str(state))
    assert code == 0, err
    code, out, _ = run(capsys, "status", "--state", str(state), "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["nodes"]["n1"]["devices"] == {
        "example.com/npu": {
            "policy": "paired",
            "total": 2,
            "healthy": 2,
            "allocated": 2,
            "devices": {"d0": {"users": 2}, "d1": {"users": 2}},
        }
    }
    by_index = {i["index"]: i["devices"] for i in doc["instances"].values()}
    assert by_index == {
        0: {"example.com/npu": ["d0"]},
        1: {"example.com/npu": ["d0"]},
        2: {"example.com/npu": ["d1"]},
        3: {"example.com/npu": ["d1"]},
    }
    (failure,) = doc["failures"]
    assert failure["reason"] == "Devices"
    code, out, _ = run(capsys, "explain", "infer:4", "--state", str(state), "--json")
    (node,) = json.loads(out)["nodes"]
    assert node["filters"]["Devices"]["reason"] == (
        "Unschedulable: example.com/npu: every device has 2 users"
    )
    code, out, _ = run(capsys, "status", "--state", str(state))
    assert code == 0
    assert "example.com/npu: 2/2/2" in out


def test_the_read_cache_follows_the_registered_policies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """validate keeps the loaded inputs for the next command; a node file naming a policy
    that is no longer registered is invalid again, not the cached valid document."""
    monkeypatch.setenv("RECONCILER_CACHE_DIR", str(tmp_path / "cache"))
    root = unit(tmp_path / "state")
    sharing.register(PairedPolicy())
    try:
        assert run(capsys, "validate", "--state", str(root))[0] == 0
    finally:
        sharing.unregister(PairedPolicy.name)
    code, out, err = run(capsys, "validate", "--state", str(root))
    assert code == 1 and "nodes/n1.yaml" in out + err and "paired" in out + err
