"""The restart policy's pure core (issue 24): back-off, reset, policies; and how the policy
reaches the agent (an OCI config annotation)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reconciler.agent.restarts import (
    RESTART_POLICY_ANNOTATION,
    RestartRecord,
    backoff_delay,
    decide,
    policy_of_config,
    seen_down,
    seen_running,
    tried_start,
)
from reconciler.controller.configs import default_config_builder
from reconciler.controller.reconcile import ReconcileOptions, reconcile
from reconciler.model.values import instance_id
from tests.support.oci import assert_valid

T = 1_800_000_000.0


def test_the_back_off_is_at_once_then_10s_doubling_to_5_min() -> None:
    assert [backoff_delay(n) for n in range(8)] == [0, 10, 20, 40, 80, 160, 300, 300]
    assert backoff_delay(10_000) == 300


def test_a_crash_loop_restarts_later_and_later() -> None:
    rec, times = RestartRecord(startedAt=T), []
    now = T
    for _ in range(5):
        now += 1  # it dies a second after each start
        rec = seen_down(rec, now)
        while not decide("always", None, rec, now).restart:
            now += 1
        times.append(now - rec.downSince if rec.downSince is not None else None)
        rec = tried_start(rec, now, ok=True, restart=True)
    assert times == [0, 10, 20, 40, 80]
    assert rec.streak == 5


def test_running_ten_minutes_resets_the_streak_and_a_plan_start_begins_anew() -> None:
    rec = RestartRecord(startedAt=T, streak=4)
    assert seen_running(rec, T + 599).streak == 4
    assert seen_running(rec, T + 600).streak == 0
    assert tried_start(rec, T, ok=True, restart=False).streak == 0


def test_policies() -> None:
    down = seen_down(RestartRecord(startedAt=T, streak=1), T + 5)
    assert decide("always", None, down, T + 14).restart is False
    assert decide("always", None, down, T + 15).restart is True
    assert decide("on-failure", None, down, T + 15).restart is True  # unknown: not a success
    assert decide("on-failure", 1, down, T + 15).restart is True
    exited = decide("on-failure", 0, down, T + 15)
    assert not exited.restart and exited.at is None and "code 0" in exited.why
    never = decide("never", 137, down, T + 1e9)
    assert not never.restart and never.at is None and "never" in never.why


def test_a_clock_that_steps_back_neither_fires_early_nor_sticks() -> None:
    down = seen_down(RestartRecord(streak=1), T + 100)
    back = seen_down(down, T)  # the clock went back 100 s: found down "now"
    assert back.downSince == T
    assert decide("always", None, down, T).at == T + 10  # no earlier than found + back-off
    assert seen_running(RestartRecord(startedAt=T + 100), T).startedAt == T


@pytest.mark.parametrize(
    ("config", "policy"),
    [
        ({}, "always"),
        ({"annotations": {RESTART_POLICY_ANNOTATION: "never"}}, "never"),
        ({"annotations": {RESTART_POLICY_ANNOTATION: "on-failure"}}, "on-failure"),
        ({"annotations": {RESTART_POLICY_ANNOTATION: "sometimes"}}, "always"),
        ({"annotations": ["x"]}, "always"),
        ([], "always"),
    ],
)
def test_the_policy_of_a_config(config: object, policy: str) -> None:
    assert policy_of_config(config) == policy


def test_the_controller_puts_a_non_default_policy_in_the_config(demo_copy: Path) -> None:
    nav = demo_copy / "desired" / "navigation.yaml"
    opts = ReconcileOptions(configs=default_config_builder())
    first = reconcile(demo_copy, opts)
    nav_id = instance_id("com.example.nav", "default", 0)
    config_path = demo_copy / "out" / "instances" / nav_id / "config.json"
    config = json.loads(config_path.read_text())
    assert "annotations" not in config  # the default adds nothing
    nav.write_text(nav.read_text() + "restartPolicy: never\n")
    report = reconcile(demo_copy, opts)
    assert report.plan.actions == first.plan.actions  # a policy is no plan action
    config = json.loads(config_path.read_text())
    assert config["annotations"] == {RESTART_POLICY_ANNOTATION: "never"}
    assert_valid(config)
    nav.write_text(nav.read_text().replace("restartPolicy: never", "restartPolicy: maybe"))
    refused = reconcile(demo_copy, opts)
    assert any("restartPolicy" in d.message for d in refused.computed.diagnostics)
