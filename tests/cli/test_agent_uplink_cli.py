"""``reconciler agent --uplink IFACE``: checked before anything runs, then handed to the run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reconciler.agent import node
from reconciler.agent.node import AgentError
from reconciler.cli.agentopts import SYS_NET
from reconciler.cli.commands import EXIT_ERROR, EXIT_USAGE, main


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def state(tmp_path: Path) -> Path:
    d = tmp_path / "state"
    (d / "nodes").mkdir(parents=True)
    return d


@pytest.mark.parametrize(
    ("uplink", "said"),
    [
        ("rcnosuch0", "no network interface 'rcnosuch0' on this node"),
        ("a/b", "no '/'"),
        ("x" * 16, "1 to 15 characters"),
        ("-eth0", "is not an interface name"),
    ],
)
def test_a_wrong_uplink_is_a_usage_error_and_nothing_runs(
    state: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    uplink: str,
    said: str,
) -> None:
    ran: list[str] = []
    monkeypatch.setattr(node, "run_agent_once", lambda *a, **kw: ran.append("run"))
    code, out, err = run(
        capsys, "agent", "--node", "n1", "--state", str(state), f"--uplink={uplink}"
    )
    assert code == EXIT_USAGE
    assert "--uplink" in err and said in err, err
    assert "Traceback" not in err + out
    assert ran == []
    assert not (state / "actual").exists()


def test_the_uplink_is_handed_to_the_run(
    state: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if not (SYS_NET / "lo").exists():
        pytest.skip(f"no {SYS_NET}/lo here to stand for an uplink")
    seen: list[dict[str, Any]] = []

    def fake(*_args: Any, **kw: Any) -> None:
        seen.append(kw)
        raise AgentError("stopped by the test")

    monkeypatch.setattr(node, "run_agent_once", fake)
    code, _, err = run(capsys, "agent", "--node", "n1", "--state", str(state), "--uplink", "lo")
    assert code == EXIT_ERROR and "stopped by the test" in err
    assert [kw["uplink"] for kw in seen] == ["lo"]
    code, _, _ = run(capsys, "agent", "--node", "n1", "--state", str(state))
    assert [kw["uplink"] for kw in seen] == ["lo", None]
