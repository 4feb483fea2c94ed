"""Shell completion, as docs/howto.md documents it: ``_RECONCILER_COMPLETE=bash_source
reconciler`` prints a bash completion script, and the completions it asks for name the
commands and options."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.paths import ROOT

# run as the console script runs: argv[0] is "reconciler", whose name gives the variable
_AS_SCRIPT = (
    "import sys; sys.argv[0] = 'reconciler'; from reconciler.cli import main; sys.exit(main())"
)


def _run(env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", _AS_SCRIPT],
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_bash_source_prints_a_completion_script() -> None:
    script = _run({"_RECONCILER_COMPLETE": "bash_source"})
    assert "complete -o nosort -F _reconciler_completion reconciler" in script


def test_completions_name_commands_and_options() -> None:
    words = _run(
        {"_RECONCILER_COMPLETE": "bash_complete", "COMP_WORDS": "reconciler re", "COMP_CWORD": "1"}
    )
    assert words.split() == ["plain,rebalance", "plain,reconcile"]
    options = _run(
        {
            "_RECONCILER_COMPLETE": "bash_complete",
            "COMP_WORDS": "reconciler plan --all",
            "COMP_CWORD": "2",
        }
    )
    assert "plain,--allow-invalid" in options.split()


def test_the_howto_documents_it() -> None:
    text = (ROOT / "docs" / "howto.md").read_text(encoding="utf-8")
    assert "_RECONCILER_COMPLETE=bash_source reconciler" in text
