"""An instance the balance placed but that finds no free gid (its item) or no free uid (its
node) fails with reason ``Ids``: not started, no config, listed in the plan, status and
explain; and a watcher's memo stays warm around it. The id ranges are narrowed for the test
(5,000 of each in the product)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import reconciler.accel.ids
import reconciler.planning.checkpoint
from reconciler.cli.commands import main
from reconciler.controller.configs import default_config_builder
from reconciler.controller.reconcile import ReconcileOptions, reconcile
from reconciler.model.values import instance_id
from reconciler.planning.checkpoint import IDS_FAILURE
from tests.support.outputs import copied, warm_options, written, written_afresh
from tests.support.state_files import RUNC_NODE

NODE = RUNC_NODE.replace("{dmips}", "100000")

SERVICE = """apiVersion: reconciler/v1
kind: Service
id: {id}
version: 1.0.0
instances: {n}
{extra}image: {{rootfs: /srv/rootfs, cmd: [sleep]}}
"""


def _state(tmp_path: Path, services: dict[str, int], nodes: tuple[str, ...] = ("n1",)) -> Path:
    state = tmp_path / "state"
    (state / "desired").mkdir(parents=True)
    (state / "nodes").mkdir()
    for node in nodes:
        (state / "nodes" / f"{node}.yaml").write_text(NODE.format(id=node))
    for item, n in services.items():
        (state / "desired" / f"{item}.yaml").write_text(SERVICE.format(id=item, n=n, extra=""))
    return state


def _narrow(monkeypatch: pytest.MonkeyPatch, *, gids: int = 5000, uids: int = 5000) -> None:
    for module in (reconciler.planning.checkpoint, reconciler.accel.ids):
        if hasattr(module, "GID_RANGE"):
            monkeypatch.setattr(module, "GID_RANGE", range(5000, 5000 + gids))
        if hasattr(module, "UID_RANGE"):
            monkeypatch.setattr(module, "UID_RANGE", range(5000, 5000 + uids))


def _out(state: Path, name: str) -> Any:
    return json.loads((state / "out" / name).read_text())


def _assert_fails_everywhere(
    state: Path, iid: str, label: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = _out(state, "plan.json")
    assert [(f["instanceId"], f["reason"]) for f in plan["failures"]] == [(iid, IDS_FAILURE)]
    assert iid not in {a["instanceId"] for a in plan["actions"]}  # never started
    assert not (state / "out" / "instances" / iid).exists()  # no config without its ids
    cp = json.loads((state / "checkpoint" / "allocations.json").read_text())
    assert iid not in cp["data"]["instances"]
    failures = _out(state, "status.json")["failures"]
    assert says in json.dumps(failures)
    capsys.readouterr()
    assert main(["explain", label, "--state", str(state), "--json"]) == 0
    exp = json.loads(capsys.readouterr().out)
    assert exp["placement"] is None
    assert exp["failure"]["reason"] == IDS_FAILURE and says in exp["failure"]["summary"]
    assert main(["plan", "--state", str(state)]) == 3  # (a failure: exit 3)


def test_an_item_without_a_free_gid_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two gids for three items: the third in item order (c) has none."""
    _narrow(monkeypatch, gids=2)
    state = _state(tmp_path, {"a": 1, "b": 1, "c": 1})
    reconcile(state, ReconcileOptions(configs=default_config_builder()))
    iid = instance_id("c", "default", 0)
    _assert_fails_everywhere(state, iid, "c:0", "c:default:0: no free gid in 5000-5001", capsys)
    for item in ("a", "b"):
        assert (state / "out" / "instances" / instance_id(item, "default", 0)).is_dir()


def test_an_instance_without_a_free_uid_on_its_node_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two uids per node and three instances on the one node: the last in placement order."""
    _narrow(monkeypatch, uids=2)
    state = _state(tmp_path, {"a": 3})
    reconcile(state, ReconcileOptions(configs=default_config_builder()))
    iid = instance_id("a", "default", 2)
    says = "a:default:2: no free uid in 5000-5001 on node n1"
    _assert_fails_everywhere(state, iid, "a:2", says, capsys)


def test_a_watcher_stays_warm_around_an_id_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The balance places the instance, the ids phase takes it out: the next runs (unchanged,
    then another service edited, then a service added before the failing one in item order)
    are answered from the memo and write what a process of its own writes from the same
    inputs and checkpoint."""
    _narrow(monkeypatch, gids=2)
    state = _state(tmp_path / "warm", {"a": 1, "c": 2, "d": 1}, nodes=("n1", "n2"))

    warm, cache = warm_options()
    view = reconcile(state, warm).computed.view
    assert not cache.balance.incremental

    def again(failing: list[str]) -> None:
        nonlocal view
        fresh = copied(state, tmp_path / "fresh")
        report = reconcile(state, warm, view)
        view = report.computed.view
        assert cache.balance.incremental
        assert [f.label for f in report.computed.result.failures] == failing
        assert {f.reason for f in report.computed.result.failures} <= {IDS_FAILURE}
        assert written(state) == written_afresh(fresh, state)

    again(["d:default:0"])
    (state / "desired" / "a.yaml").write_text(SERVICE.format(id="a", n=2, extra=""))
    again(["d:default:0"])
    (state / "desired" / "b.yaml").write_text(SERVICE.format(id="b", n=1, extra=""))
    # b comes before c and d in item order; c keeps its gid, b takes nothing (two held)
    again(["b:default:0", "d:default:0"])
