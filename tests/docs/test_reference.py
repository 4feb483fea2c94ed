"""docs/reference/fields.md: generated from the JSON Schemas, it names every property of every
document kind, each with a description, and the committed page is exactly what
scripts/gen-reference writes (so it cannot drift from the models)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from reconciler.model.reference import property_paths, render_reference
from reconciler.model.schema import all_schemas
from tests.support.paths import ROOT

PAGE = ROOT / "docs" / "reference" / "fields.md"
KINDS = ("ActualState", "Node", "ResourcesFile", "Service", "UnitConfig")


def test_every_kind_is_covered() -> None:
    assert sorted(all_schemas()) == sorted(KINDS)


@pytest.mark.parametrize("kind", KINDS)
def test_the_page_lists_every_property_of_the_kind(kind: str) -> None:
    schema = all_schemas()[kind]
    paths = property_paths(schema)
    assert len(paths) >= 5
    text = PAGE.read_text(encoding="utf-8")
    section = text.split(f"\n## {kind}\n", 1)[1].split("\n## ", 1)[0]
    rows = {
        line.split("|")[1].strip().strip("`")
        for line in section.splitlines()
        if line.startswith("| `")
    }
    missing = [p for p in paths if p not in rows]
    assert not missing, f"fields.md lacks {missing}: run scripts/gen-reference"


def _all_properties(schema: dict[str, object]) -> int:
    """How many properties the schema declares, in itself and its $defs."""
    count = 0
    stack: list[object] = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            props = node.get("properties")
            if isinstance(props, dict):
                count += len(props)
            stack.extend(v for k, v in node.items() if k != "properties")
            if isinstance(props, dict):
                stack.extend(props.values())
        elif isinstance(node, list):
            stack.extend(node)
    return count


@pytest.mark.parametrize("kind", KINDS)
def test_every_property_has_a_description(kind: str) -> None:
    schema = all_schemas()[kind]
    assert _all_properties(schema) > 0
    undescribed: list[str] = []

    def walk(node: dict[str, object], where: str) -> None:
        props = node.get("properties")
        if isinstance(props, dict):
            for name, prop in props.items():
                if not (isinstance(prop, dict) and prop.get("description")):
                    undescribed.append(f"{where}.{name}")
        defs = node.get("$defs")
        if isinstance(defs, dict):
            for name, sub in defs.items():
                walk(sub, name)

    walk(schema, kind)
    assert not undescribed


def test_dmips_is_explained_where_cpu_fields_are() -> None:
    text = PAGE.read_text(encoding="utf-8")
    assert "Dhrystone" in text
    cpu_rows = [
        line
        for line in text.splitlines()
        if line.startswith(("| `maxDMIPS`", "| `quotas.cpuDMIPSLimit`"))
    ]
    assert len(cpu_rows) == 2 and all("DMIPS (Dhrystone" in row for row in cpu_rows)


def test_committed_page_equals_the_generated_one() -> None:
    assert PAGE.read_text(encoding="utf-8") == render_reference(all_schemas()), (
        "docs/reference/fields.md is stale: run scripts/gen-reference"
    )


def test_the_script_checks_the_page() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen-reference"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
