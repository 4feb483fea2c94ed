"""``reconciler schema``: the JSON Schemas validate every input file of state/ and examples/, and
reject what the loader rejects (SPEC §5, §13)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from reconciler.cli.commands import EXIT_USAGE, main
from reconciler.io.yamlsafe import parse_yaml
from tests.support.paths import DEMO, ROOT

KINDS = ("ActualState", "Node", "Service", "UnitConfig")
# What the controller and the demo scripts generate inside a unit; never an input (.gitignore).
GENERATED = {"out", "checkpoint", "rootfs", ".lock"}


def units() -> list[Path]:
    """The demo and every unit under examples/ (each sub-directory of examples/ is a unit)."""
    return [DEMO, *sorted(p for p in (ROOT / "examples").iterdir() if p.is_dir())]


def schemas_from_cli(capsys: pytest.CaptureFixture[str]) -> dict[str, dict[str, Any]]:
    code = main(["schema"])
    out, _ = capsys.readouterr()
    assert code == 0
    document = json.loads(out)
    assert document["formatVersion"] == 1
    schemas: dict[str, dict[str, Any]] = document["schemas"]
    return schemas


def input_files(unit: Path) -> list[tuple[str, Path]]:
    """Every file of ``unit`` with the schema it must satisfy; a file that fits no schema fails
    the test, so nothing in the directory escapes the check."""
    files = sorted(
        p
        for p in unit.rglob("*")
        if p.is_file()
        and not p.name.startswith(".")
        and not GENERATED & set(p.relative_to(unit).parts)
    )
    resource_files: set[Path] = set()
    for node in sorted((unit / "nodes").glob("*.yaml")):
        ref = parse_yaml(node.read_bytes()).data.get("resourcesFile")
        if ref is not None:
            resource_files.add((unit / ref).resolve())  # an absolute ref stays itself
    out: list[tuple[str, Path]] = []
    for p in files:
        rel = p.relative_to(unit)
        if rel == Path("unit.yaml"):
            kind = "UnitConfig"
        elif rel.parts[0] == "desired" and p.suffix == ".yaml":
            kind = "Service"
        elif rel.parts[0] == "nodes" and len(rel.parts) == 2 and p.suffix == ".yaml":
            kind = "Node"
        elif rel.parts[0] == "actual" and len(rel.parts) == 2 and p.suffix == ".yaml":
            kind = "ActualState"
        elif p.resolve() in resource_files:
            kind = "ResourcesFile"
        else:
            raise AssertionError(f"{p}: no schema covers this file")
        out.append((kind, p))
    return out


class TestBundledFiles:
    def test_there_is_a_demo_and_at_least_two_examples(self) -> None:
        assert len(units()) >= 3

    @pytest.mark.parametrize("unit", units(), ids=lambda p: p.name)
    def test_schemas_validate_every_file(
        self, unit: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        schemas = schemas_from_cli(capsys)
        kinds_seen: set[str] = set()
        for kind, path in input_files(unit):
            schema = schemas[kind]
            Draft202012Validator.check_schema(schema)
            raw = path.read_bytes()
            data = json.loads(raw) if kind == "ResourcesFile" else parse_yaml(raw).data
            errors = [e.message for e in Draft202012Validator(schema).iter_errors(data)]
            assert errors == [], (path, errors)
            kinds_seen.add(kind)
        # every unit has services and nodes; the demo shows every kind but ActualState,
        # whose directory starts empty in a clean checkout
        assert {"UnitConfig", "Service", "Node"} <= kinds_seen, kinds_seen
        if unit == DEMO:
            assert "ResourcesFile" in kinds_seen

    def test_every_bundled_resources_file_is_checked(self) -> None:
        checked = {p for u in units() for kind, p in input_files(u) if kind == "ResourcesFile"}
        assert {DEMO / "resources" / "edge-1.json"} <= checked
        assert len(checked) >= 2


class TestOutput:
    def test_one_schema_per_kind_plus_the_resources_file(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        schemas = schemas_from_cli(capsys)
        assert set(schemas) == {*KINDS, "ResourcesFile"}
        for name, schema in schemas.items():
            assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
            assert schema["$id"] == f"reconciler/v1/{name}"

    @pytest.mark.parametrize("kind", [*KINDS, "ResourcesFile"])
    def test_one_kind_alone_is_the_same_schema(
        self, kind: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        schemas = schemas_from_cli(capsys)
        assert main(["schema", "--kind", kind]) == 0
        out, _ = capsys.readouterr()
        assert json.loads(out) == schemas[kind]

    def test_unknown_kind_is_a_usage_error(self, capsys: pytest.CaptureFixture[str]) -> None:
        assert main(["schema", "--kind", "Nope"]) == EXIT_USAGE


def _doc(path: Path) -> dict[str, Any]:
    data = parse_yaml(path.read_bytes()).data
    assert isinstance(data, dict)
    return data


class TestRejections:
    """The schema says no where the loader says no (unknown fields, bad ids, bad values)."""

    @pytest.mark.parametrize(
        ("kind", "path", "bad"),
        [
            ("Service", "desired/navigation.yaml", {"colour": "red"}),
            ("Service", "desired/navigation.yaml", {"instances": -1}),
            ("Service", "desired/navigation.yaml", {"instances": "1"}),
            ("Service", "desired/navigation.yaml", {"id": "../x"}),
            ("Service", "desired/navigation.yaml", {"version": "1.0"}),
            ("Service", "desired/navigation.yaml", {"apiVersion": "reconciler/v2"}),
            ("Service", "desired/navigation.yaml", {"quotas": {"ramLimit": "512MB"}}),
            ("Node", "nodes/edge-2.yaml", {"id": "../../etc"}),
            ("Node", "nodes/edge-2.yaml", {"state": "running"}),
            ("Node", "nodes/edge-2.yaml", {"totalRAM": "4GB"}),
            ("UnitConfig", "unit.yaml", {"placement": "random"}),
            ("UnitConfig", "unit.yaml", {"kind": "Service"}),
        ],
    )
    def test_document_schemas(
        self,
        kind: str,
        path: str,
        bad: dict[str, Any],
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        validator = Draft202012Validator(schemas_from_cli(capsys)[kind])
        base = _doc(DEMO / path)
        assert validator.is_valid(base)
        assert not validator.is_valid({**base, **bad}), bad

    @pytest.mark.parametrize(
        "bad",
        [
            {"name": "gpu0", "colour": "red"},
            {"name": "../gpu"},
            {"name": "gpu0", "sharedCount": -1},
            {"name": "gpu0", "hosts": [{"hostname": "h"}]},
            {"sharedCount": 1},
        ],
    )
    def test_resources_file_schema(
        self, bad: dict[str, Any], capsys: pytest.CaptureFixture[str]
    ) -> None:
        validator = Draft202012Validator(schemas_from_cli(capsys)["ResourcesFile"])
        good = json.loads((DEMO / "resources" / "edge-1.json").read_bytes())
        assert validator.is_valid(good)
        assert not validator.is_valid([*good, bad]), bad
        assert not validator.is_valid({"name": "gpu0"})  # an array, not one entry
