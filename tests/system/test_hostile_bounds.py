"""Hostile numbers: every integer, byte quantity and duration has a bound, and out of range is a
validation error at ``file:line:col``, never a crash (a 64-bit encoder, the interpreter's
4300-digit limit, a float overflow) and never a value saved as last good. A unit whose services
together ask for more instances than unit.yaml's ``maxInstances`` is refused as a whole: nothing
placed, nothing stopped."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from reconciler.cli.commands import main
from reconciler.controller.configs import default_config_builder
from reconciler.controller.reconcile import (
    LAST_GOOD,
    ReconcileError,
    ReconcileOptions,
    compute_once,
    reconcile,
)
from reconciler.io.lastgood import LastGoodStore
from reconciler.io.yamlsafe import Engine, YamlRejected, parse_yaml
from reconciler.model.documents import ActualState, Node
from reconciler.model.schema import all_schemas
from reconciler.model.values import instance_id
from reconciler.planning.checkpoint import IDS_FAILURE, UID_RANGE

# Independent of the code under test: the bounds as documented (docs/state.md).
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_BYTES = 1024 * 1024**5  # 1024Pi
MAX_DURATION = 87600 * 3600  # ten years
MAX_SERVICE_INSTANCES = 10_000
UNIT_MAX_INSTANCES = (1, 1_000_000)

NODE = """apiVersion: reconciler/v1
kind: Node
id: n1
type: t
maxDMIPS: 1000
totalRAM: 1Gi
numCores: 2
runtimes:
  - {id: runc, type: runc, platform: {architecture: x86_64}}
"""
SERVICE = """apiVersion: reconciler/v1
kind: Service
id: web
version: 1.0.0
priority: 0
instances: 2
runtimes: [runc]
image: {rootfs: /r, cmd: [/bin/true]}
quotas: {pidsLimit: 100}
requestedResources: {cpu: 100, ram: 16Mi}
"""
UNIT = """apiVersion: reconciler/v1
kind: UnitConfig
version: 1.0.0
nodes:
  - nodeType: t
    priority: 1
    alertRules:
      cpu: {minThreshold: 10, maxThreshold: 90, minTimeout: 30s}
"""
ACTUAL = """apiVersion: reconciler/v1
kind: ActualState
nodeId: n1
revision: 3
"""
FILES = {"nodes/n1.yaml": NODE, "desired/web.yaml": SERVICE, "unit.yaml": UNIT}

BIG = "9" * 20  # above 2**63 - 1
HEX = "0x" + "f" * 5000  # a power-of-two base: int() converts it whatever its length
DIGITS = "9" * 5000  # over the interpreter's 4300-digit limit for int(str)


def _edit(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


# (file, old text, new text, a fragment of the message): each fault in the form it was
# reported. The position expected is where ``new`` starts, found in the file's text below.
FAULTS: dict[str, tuple[str, str, str, str]] = {
    "service priority": ("desired/web.yaml", "priority: 0", f"priority: {BIG}", "out of range"),
    "negative priority": ("desired/web.yaml", "priority: 0", f"priority: -{BIG}", "out of range"),
    "unit priority": ("unit.yaml", "priority: 1", f"priority: {BIG}", "out of range"),
    "maxDMIPS": ("nodes/n1.yaml", "maxDMIPS: 1000", f"maxDMIPS: {BIG}", "out of range"),
    "totalRAM": ("nodes/n1.yaml", "totalRAM: 1Gi", f"totalRAM: {BIG}", "out of range"),
    "totalRAM suffixed": ("nodes/n1.yaml", "totalRAM: 1Gi", "totalRAM: 99999999Pi", "1024Pi"),
    "totalRAM 5000 digits": (
        "nodes/n1.yaml",
        "totalRAM: 1Gi",
        f"totalRAM: {DIGITS}Ki",
        "1024Pi",
    ),
    "totalRAM over 1024Pi": (
        "nodes/n1.yaml",
        "totalRAM: 1Gi",
        f"totalRAM: {MAX_BYTES + 1}",
        "1024Pi",
    ),
    "numCores": ("nodes/n1.yaml", "numCores: 2", f"numCores: {BIG}", "out of range"),
    "pidsLimit": ("desired/web.yaml", "pidsLimit: 100", f"pidsLimit: {BIG}", "out of range"),
    "noFileLimit": (
        "desired/web.yaml",
        "pidsLimit: 100",
        f"pidsLimit: 100, noFileLimit: {BIG}",
        "out of range",
    ),
    "revision": ("actual/n1.yaml", "revision: 3", f"revision: {BIG}", "out of range"),
    "revision 2**63": ("actual/n1.yaml", "revision: 3", f"revision: {2**63}", "out of range"),
    "instances in hex": ("desired/web.yaml", "instances: 2", f"instances: {HEX}", "out of range"),
    "instances in decimal": (
        "desired/web.yaml",
        "instances: 2",
        f"instances: {DIGITS}",
        "out of range",
    ),
    "instances 100000000": (
        "desired/web.yaml",
        "instances: 2",
        "instances: 100000000",
        str(MAX_SERVICE_INSTANCES),
    ),
    "minTimeout 400 digits": (
        "unit.yaml",
        "minTimeout: 30s",
        f"minTimeout: {'9' * 400}s",
        "87600h",
    ),
    "minTimeout 400-digit hours": (
        "unit.yaml",
        "minTimeout: 30s",
        f"minTimeout: {'9' * 400}h30m",
        "87600h",
    ),
    "minTimeout over ten years": (
        "unit.yaml",
        "minTimeout: 30s",
        f"minTimeout: {MAX_DURATION + 1}",
        "87600h",
    ),
    "minTimeout as a float": ("unit.yaml", "minTimeout: 30s", "minTimeout: 1e300", "87600h"),
}


def _write(state: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = state / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _faulty(state: Path, fault: str) -> tuple[Path, tuple[int, int]]:
    """Write the good unit with ``fault`` in it; the faulty file and where the fault is."""
    rel, old, new, _ = FAULTS[fault]
    files = {**FILES, "actual/n1.yaml": ACTUAL}
    files[rel] = _edit(files[rel], old, new)
    _write(state, files)
    text = files[rel]
    offset = text.index(new) + new.rindex(": ") + 2  # the value, after the last "key: "
    line = text.count("\n", 0, offset) + 1
    col = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return state / rel, (line, col)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_an_out_of_range_number_is_a_validation_error_at_its_position(
    fault: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    path, (line, col) = _faulty(state, fault)
    fragment = FAULTS[fault][3]
    where = f"{path}:{line}:{col}: "

    code, out, err = run(capsys, "validate", "--state", str(state))
    assert code == 1, out + err
    assert where in out and fragment in out.split(where, 1)[1].splitlines()[0], out

    code, out, err = run(capsys, "plan", "--state", str(state))
    assert code == 1, out + err  # a plan is a gate: an invalid input file fails it
    assert where in err and "Traceback" not in err, err
    code, out, err = run(capsys, "plan", "--allow-invalid", "--state", str(state))
    assert code in (0, 2, 3), out + err  # planned with the other files; not an error exit
    assert where in err and "Traceback" not in err, err

    code, out, err = run(capsys, "reconcile", "--state", str(state))
    assert code == 0, out + err
    assert where in err and "Traceback" not in err, err
    # the faulty file never became its object's last good version: the object does not exist
    rel = str(path.relative_to(state))
    assert LastGoodStore(state / "checkpoint" / LAST_GOOD).get(rel) is None
    code, out, err = run(capsys, "reconcile", "--state", str(state))  # and again: not sticky
    assert code == 0 and "Traceback" not in err, err


def test_a_good_value_turned_huge_keeps_its_last_good_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The crash that stuck: the huge value was saved as last good before the encoder died, so
    every later run died too. Now the file is invalid and the node keeps its good version."""
    state = tmp_path / "state"
    _write(state, FILES)
    assert run(capsys, "reconcile", "--state", str(state))[0] == 0
    node = state / "nodes" / "n1.yaml"
    node.write_text(_edit(NODE, "maxDMIPS: 1000", f"maxDMIPS: {BIG}"))
    for _ in range(2):
        code, _, err = run(capsys, "reconcile", "--state", str(state))
        assert code == 0 and f"{node}:5:11: " in err and "Traceback" not in err, err
    kept = LastGoodStore(state / "checkpoint" / LAST_GOOD).get("nodes/n1.yaml")
    assert isinstance(kept, Node) and kept.maxDMIPS == 1000
    status = json.loads((state / "out" / "status.json").read_text())
    assert status["nodes"]["n1"]["cpu"]["capacity"] <= 1000


def test_every_fault_at_once_in_a_real_process(tmp_path: Path) -> None:
    """The CLI as a process: no traceback on stderr from validate, plan or reconcile."""
    state = tmp_path / "state"
    _write(state, {**FILES, "actual/n1.yaml": ACTUAL})
    expected: dict[str, tuple[int, int]] = {}
    for n, fault in enumerate(sorted(FAULTS)):
        rel = FAULTS[fault][0]
        if rel == "unit.yaml":
            continue  # one unit.yaml only; covered by the test above
        folder = rel.split("/")[0]
        path, where = _faulty(tmp_path / f"scratch{n}", fault)
        # its own object: a node and an actual file are named after their node id
        faulty = path.read_text().replace("id: n1", f"id: f{n}").replace("id: web", f"id: s{n}")
        target = state / folder / (f"s{n}.yaml" if folder == "desired" else f"f{n}.yaml")
        target.write_text(faulty)
        expected[str(target)] = where
    for command, codes in (("validate", {1}), ("plan", {1}), ("reconcile", {0})):
        proc = subprocess.run(
            [sys.executable, "-m", "reconciler", command, "--state", str(state)],
            capture_output=True,
            timeout=120,
            check=False,
        )
        text = (proc.stdout + proc.stderr).decode()
        assert proc.returncode in codes, text
        assert "Traceback" not in text, text
        for shown, (line, col) in expected.items():
            assert f"{shown}:{line}:{col}: " in text, (command, shown, text)


@pytest.mark.parametrize("engine", ["ruamel", "libyaml", "json", "auto"])
@pytest.mark.parametrize(
    ("literal", "value"),
    [
        (str(INT64_MAX), INT64_MAX),
        (str(INT64_MIN), INT64_MIN),
        ("0x7fffffffffffffff", INT64_MAX),
        ("0o777777777777777777777", INT64_MAX),
        ("0" * 5000 + "7", 7),  # leading zeros are no magnitude
        ("0x" + "0" * 5000 + "f", 15),
        (str(INT64_MAX + 1), None),
        (str(INT64_MIN - 1), None),
        ("0x8000000000000000", None),
        ("0o1000000000000000000000", None),
        (HEX, None),
        (DIGITS, None),
        ("-" + DIGITS, None),
    ],
)
def test_every_engine_bounds_integers_at_64_bits(
    engine: Engine, literal: str, value: int | None
) -> None:
    if engine == "json" and literal.startswith("0"):
        pytest.skip("not a JSON number")  # the json engine reads these as YAML (tested there)
    raw = f'{{"a": [1,\n  {literal}]}}'.encode()
    if value is not None:
        assert parse_yaml(raw, engine=engine).data == {"a": [1, value]}
        return
    with pytest.raises(YamlRejected) as e:
        parse_yaml(raw, engine=engine)
    assert (e.value.line, e.value.col) == (2, 3)
    assert "out of range" in e.value.message and len(e.value.message) < 200


def test_the_schema_documents_every_bound() -> None:
    schemas = all_schemas()
    ints = {kind: _int_fields(schema, schema) for kind, schema in schemas.items()}
    for kind, fields in ints.items():
        for path, (lo, hi) in fields.items():
            assert lo is not None and hi is not None, (kind, path)
            assert INT64_MIN <= lo <= hi <= INT64_MAX, (kind, path)
    service = ints["Service"]
    assert service[("instances",)] == (0, MAX_SERVICE_INSTANCES)
    assert service[("quotas", "ramLimit")] == (0, MAX_BYTES)
    assert ints["UnitConfig"][("maxInstances",)] == UNIT_MAX_INSTANCES
    timeout = ("nodes", "*", "alertRules", "cpu", "minTimeout")
    assert ints["UnitConfig"][timeout] == (0, MAX_DURATION)


# ---------------------------------------------------------------- any accepted value survives

Path_ = tuple[str, ...]


def _int_fields(schema: dict[str, Any], root: dict[str, Any], path: Path_ = ()) -> dict[Path_, Any]:
    """Every integer field of a JSON Schema with its (minimum, maximum): "*" for an item of
    an array or a value of a map."""
    if "$ref" in schema:
        schema = root["$defs"][schema["$ref"].rsplit("/", 1)[-1]]
    out: dict[Path_, Any] = {}
    for sub in schema.get("anyOf", []):
        out |= _int_fields(sub, root, path)
    kind = schema.get("type")
    if kind == "integer":
        out[path] = (schema.get("minimum"), schema.get("maximum"))
    elif kind == "object":
        for name, sub in schema.get("properties", {}).items():
            out |= _int_fields(sub, root, (*path, name))
        if isinstance(schema.get("additionalProperties"), dict):
            out |= _int_fields(schema["additionalProperties"], root, (*path, "*"))
    elif kind == "array" and "items" in schema:
        out |= _int_fields(schema["items"], root, (*path, "*"))
    return out


Draw = Callable[[str, Path_], Any]
"""A value for the integer field at a path of a kind (bounds from the schema)."""

_INVENTORY_INTS = ("reserved", "minUnit", "maxUnit", "stepSize")


def _amount(value: int | str) -> int:
    """A byte quantity as ``_unit`` writes it (an integer, or whole ``Ki``)."""
    return int(value[:-2]) * 1024 if isinstance(value, str) else value


def _documents(v: Draw) -> dict[str, dict[str, Any]]:
    """A unit that uses every integer field of every kind; ``v`` gives each value."""
    rule = {
        "minThreshold": v("UnitConfig", ("nodes", "*", "alertRules", "cpu", "minThreshold")),
        "maxThreshold": v("UnitConfig", ("nodes", "*", "alertRules", "cpu", "maxThreshold")),
        "minTimeout": v("UnitConfig", ("nodes", "*", "alertRules", "cpu", "minTimeout")),
    }
    low, high = sorted([rule["minThreshold"], rule["maxThreshold"]])
    rule |= {"minThreshold": low, "maxThreshold": high}
    ram_rule = {
        k: v("UnitConfig", ("nodes", "*", "alertRules", "ram", k))
        for k in ("minThreshold", "maxThreshold", "minTimeout")
    }
    low, high = sorted([ram_rule["minThreshold"], ram_rule["maxThreshold"]])
    ram_rule |= {"minThreshold": low, "maxThreshold": high}
    unit = {
        "apiVersion": "reconciler/v1",
        "kind": "UnitConfig",
        "version": "1.0.0",
        "maxInstances": v("UnitConfig", ("maxInstances",)),
        "nodeTimeout": v("UnitConfig", ("nodeTimeout",)),
        "nodes": [
            {
                "nodeType": "t",
                "priority": v("UnitConfig", ("nodes", "*", "priority")),
                "resourceRatios": {
                    k: v("UnitConfig", ("nodes", "*", "resourceRatios", k))
                    for k in ("cpu", "ram", "storage", "state")
                },
                "alertRules": {"cpu": rule, "ram": ram_rule},
            }
        ],
    }

    def service(item: str, *, easy: bool) -> dict[str, Any]:
        """``easy``: placed whenever the runtime has a slot (no resources, no devices, and no
        amounts requested), so its quotas reach an OCI config."""

        def q(*path: str) -> Any:
            return v("Service", path)

        memory = q("devices", "*", "memory")
        return {
            "apiVersion": "reconciler/v1",
            "kind": "Service",
            "id": item,
            "version": "1.0.0",
            "priority": q("priority"),
            "instances": q("instances"),
            "runtimes": ["runc"],
            "image": {"rootfs": "/r", "cmd": ["/bin/true"]},
            "quotas": {
                k: q("quotas", k)
                for k in (
                    "cpuDMIPSLimit",
                    "ramLimit",
                    "storageLimit",
                    "stateLimit",
                    "pidsLimit",
                    "noFileLimit",
                    "tmpLimit",
                    "downloadSpeed",
                    "uploadSpeed",
                )
            },
            "requestedResources": {
                k: q("requestedResources", k) for k in ("cpu", "ram", "storage", "state")
            },
            "skipResourceLimits": easy,
            "resources": [] if easy else [{"name": "res"}],
            "devices": []
            if easy
            else [
                {"resource": "example.com/gpu", "count": q("devices", "*", "count")},
                # a fractional request asks for memory > 0 (a rule of the model, not the schema)
                {"resource": "vram", "memory": memory if memory != 0 else 1},
            ],
        }

    index = v("ActualState", ("instances", "*", "index"))
    running = instance_id("web", "default", index)
    totals = {
        "cpu": v("Node", ("maxDMIPS",)),
        "ram": v("Node", ("totalRAM",)),
        "storage": v("Node", ("partitions", "*", "totalSize")),
        "state": v("Node", ("partitions", "*", "totalSize")),
    }

    def inventory(name: str) -> dict[str, Any]:
        """A reserved part within the total, and maxUnit at least minUnit (rules of the model,
        not the schema)."""
        field = {k: v("Node", ("inventories", name, k)) for k in _INVENTORY_INTS}
        if _amount(field["reserved"]) > _amount(totals[name]):
            field["reserved"] = totals[name]
        low, high = sorted([field["minUnit"], field["maxUnit"]], key=_amount)
        return {**field, "minUnit": low, "maxUnit": high}

    node = {
        "apiVersion": "reconciler/v1",
        "kind": "Node",
        "id": "n1",
        "type": "t",
        "maxDMIPS": totals["cpu"],
        "totalRAM": totals["ram"],
        "numCores": v("Node", ("numCores",)),
        "partitions": [
            {"name": "disk", "types": ["storages"], "totalSize": totals["storage"]},
            {"name": "st", "types": ["states"], "totalSize": totals["state"]},
        ],
        "inventories": {name: inventory(name) for name in totals},
        "runtimes": [
            {
                "id": "runc",
                "type": "runc",
                "platform": {"architecture": "x86_64"},
                "maxInstances": v("Node", ("runtimes", "*", "maxInstances")),
                "allowedDMIPS": v("Node", ("runtimes", "*", "allowedDMIPS")),
                "allowedRAM": v("Node", ("runtimes", "*", "allowedRAM")),
            }
        ],
        "resources": [{"name": "res", "sharedCount": v("Node", ("resources", "*", "sharedCount"))}],
        "devicePools": [
            {
                "resource": "example.com/gpu",
                "policy": "exclusive",
                "devices": [
                    {
                        "id": "g0",
                        "memory": v("Node", ("devicePools", "*", "devices", "*", "memory")),
                    }
                ],
            },
            {
                "resource": "vram",
                "policy": "fractional",
                "devices": [
                    {
                        "id": "v0",
                        "memory": v("Node", ("devicePools", "*", "devices", "*", "memory")),
                    }
                ],
            },
        ],
        "usage": {
            "cpu": v("Node", ("usage", "cpu")),
            "ram": v("Node", ("usage", "ram")),
            "instances": {
                running: {
                    "cpu": v("Node", ("usage", "instances", "*", "cpu")),
                    "ram": v("Node", ("usage", "instances", "*", "ram")),
                }
            },
        },
    }
    actual = {
        "apiVersion": "reconciler/v1",
        "kind": "ActualState",
        "nodeId": "n1",
        "revision": v("ActualState", ("revision",)),
        "instances": {
            running: {
                "itemId": "web",
                "subjectId": "default",
                "index": index,
                "version": "1.0.0",
                "runtimeId": "runc",
                "state": "active",
                "restartCount": v("ActualState", ("instances", "*", "restartCount")),
                "lastExit": {
                    "code": v("ActualState", ("instances", "*", "lastExit", "code")),
                    "signal": v("ActualState", ("instances", "*", "lastExit", "signal")),
                    "reason": "stopped",
                    "at": "2026-11-25T10:00:00Z",
                },
            }
        },
    }
    return {
        "unit.yaml": unit,
        "desired/web.yaml": service("web", easy=False),
        "desired/db.yaml": service("db", easy=True),
        "nodes/n1.yaml": node,
        "actual/n1.yaml": actual,
    }


KIND_OF = {
    "unit.yaml": "UnitConfig",
    "desired": "Service",
    "nodes": "Node",
    "actual": "ActualState",
}
FEW_INSTANCES = 3
"""The hypothesis test draws at most this many instances per service (two services):
``instances`` at its bound of 10,000 is placed by its own test below."""


def test_the_unit_uses_every_integer_field_of_the_schema() -> None:
    asked: dict[str, set[Path_]] = {}

    def record(kind: str, path: Path_) -> int:
        asked.setdefault(kind, set()).add(path)
        return 1

    _documents(record)
    schemas = all_schemas()
    for kind in ("UnitConfig", "Service", "Node", "ActualState"):
        assert asked[kind] == set(_int_fields(schemas[kind], schemas[kind])), kind


def _near_bounds(lo: int, hi: int) -> st.SearchStrategy[int]:
    edges = sorted({x for x in (lo, lo + 1, hi - 1, hi) if lo <= x <= hi})
    return st.one_of(st.sampled_from(edges), st.integers(lo, hi))


@functools.cache
def _bounds(kind: str, path: Path_) -> tuple[int, int]:
    """The schema's (minimum, maximum) of a field; at most FEW_INSTANCES for ``instances``."""
    schema = all_schemas()[kind]
    lo, hi = _int_fields(schema, schema)[path]
    return (lo, min(hi, FEW_INSTANCES)) if path == ("instances",) else (lo, hi)


@st.composite
def _unit(draw: st.DrawFn) -> dict[str, dict[str, Any]]:
    def v(kind: str, path: Path_) -> Any:
        lo, hi = _bounds(kind, path)
        value = draw(_near_bounds(lo, hi))
        if (lo, hi) == (0, MAX_BYTES) and value and value % 1024 == 0 and draw(st.booleans()):
            return f"{value // 1024}Ki"  # the same amount, written with a suffix
        return value

    return _documents(v)


def _every_field_at(end: int) -> dict[str, dict[str, Any]]:
    """Every field at its minimum (``end`` 0) or its maximum (1)."""
    return _documents(lambda kind, path: _bounds(kind, path)[end])


def _yaml_text(doc: dict[str, Any], as_json: bool) -> str:
    """JSON is YAML: plain (the json engine reads it), or behind a comment (libyaml's)."""
    text = json.dumps(doc, indent=1)
    return text if as_json else "# a unit at its bounds\n" + text


def _state_dirs() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as tmp:
        n = 0
        while True:
            n += 1
            yield Path(tmp) / f"s{n}"


_STATES = _state_dirs()


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(docs=_unit(), as_json=st.booleans())
@example(docs=_every_field_at(0), as_json=False)
@example(docs=_every_field_at(1), as_json=True)
def test_any_integer_the_schema_accepts_survives_plan_and_reconcile(
    docs: dict[str, dict[str, Any]], as_json: bool
) -> None:
    state = next(_STATES)
    _write(state, {rel: _yaml_text(doc, as_json) for rel, doc in docs.items()})
    opts = ReconcileOptions(configs=default_config_builder())
    total = sum(docs[rel]["instances"] for rel in ("desired/web.yaml", "desired/db.yaml"))
    if total > docs["unit.yaml"]["maxInstances"]:  # the unit-wide limit refuses the run
        event("over the unit-wide limit")
        with pytest.raises(ReconcileError, match="maxInstances"):
            compute_once(state, opts, read_only=True)
        with pytest.raises(ReconcileError, match="maxInstances"):
            reconcile(state, opts)
        assert not (state / "out").exists() and not (state / "checkpoint").exists()
        return
    planned = compute_once(state, opts, read_only=True)
    assert planned.diagnostics == []  # every document was accepted
    json.dumps(planned.plan_document())
    report = reconcile(state, opts)
    event(f"{len(report.plan.actions)} actions, {len(report.plan.failures)} failures")
    assert report.computed.diagnostics == []
    for path in (state / "out").rglob("*.json"):
        json.loads(path.read_bytes())  # every output is JSON, whatever the numbers
    last_good = LastGoodStore(state / "checkpoint" / LAST_GOOD)
    for rel in docs:  # and every input came back from the last-good store as it was loaded
        assert last_good.get(rel) == report.computed.view.files[rel].good, rel
    assert isinstance(last_good.get("actual/n1.yaml"), ActualState)


def test_a_service_at_its_instance_bound_is_planned(tmp_path: Path) -> None:
    state = tmp_path / "state"
    big = _edit(SERVICE, "instances: 2", f"instances: {MAX_SERVICE_INSTANCES}")
    big = _edit(big, "requestedResources: {cpu: 100, ram: 16Mi}", "skipResourceLimits: true")
    _write(state, {**FILES, "desired/web.yaml": big})
    stages: list[str] = []
    opts = ReconcileOptions(configs=default_config_builder(), on_stage=stages.append)
    planned = compute_once(state, opts, read_only=True)
    assert planned.diagnostics == []
    assert f"placing {MAX_SERVICE_INSTANCES} instances on 1 nodes" in stages
    # no resource is asked for: the balancer places every one, and those past the node's
    # 5,000 uids fail for want of one (never started without their ids)
    assert len(planned.balanced.placements) == MAX_SERVICE_INSTANCES  # type: ignore[union-attr]
    assert len(planned.result.placements) == len(UID_RANGE)
    failures = planned.result.failures
    assert len(failures) == MAX_SERVICE_INSTANCES - len(UID_RANGE)
    assert {f.reason for f in failures} == {IDS_FAILURE}
    assert failures[0].summary == (
        f"web:default:{len(UID_RANGE)}: no free uid in 5000-9999 on node n1 "
        "(each instance there holds one)"
    )


def test_one_more_than_the_unit_wide_limit_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Over unit.yaml's maxInstances: validate, plan and reconcile fail at the position of the
    largest service's ``instances``; what runs keeps running (no stop is planned or written)."""
    state = tmp_path / "state"
    _write(state, {**FILES, "unit.yaml": UNIT + "maxInstances: 3\n"})
    assert run(capsys, "reconcile", "--state", str(state))[0] == 0
    # the agent started both instances
    ids = [instance_id("web", "default", i) for i in range(2)]
    running = "".join(
        f"  {iid}: {{itemId: web, subjectId: default, index: {i}, version: 1.0.0, "
        "runtimeId: runc, state: active}\n"
        for i, iid in enumerate(ids)
    )
    _write(state, {"actual/n1.yaml": ACTUAL + "instances:\n" + running})
    assert run(capsys, "reconcile", "--state", str(state))[0] == 0
    before = {p: p.read_bytes() for p in state.rglob("*") if p.is_file()}

    # a second service of two instances and a version bump of the first: 4 > 3
    _write(state, {"desired/db.yaml": _edit(SERVICE, "id: web", "id: db")})
    web = state / "desired" / "web.yaml"
    web.write_text(_edit(SERVICE, "version: 1.0.0", "version: 2.0.0"))
    changed = {p: p.read_bytes() for p in state.rglob("*") if p.is_file()}
    where = f"{web}:6:12: "  # two services of 2: the tie goes to the larger key (web)
    for command, code in (("validate", 1), ("plan", 1), ("reconcile", 1)):
        got, out, err = run(capsys, command, "--state", str(state))
        assert got == code, out + err
        message = (out + err).split(where, 1)[1].splitlines()[0]
        assert "4 instances" in message and "maxInstances of 3" in message, message
        assert "Traceback" not in err
    after = {p: p.read_bytes() for p in state.rglob("*") if p.is_file()}
    # nothing written: the plan that keeps both instances, the checkpoint, the last good
    assert after == changed and set(before) <= set(after)


def test_a_cpu_quota_stays_within_64_bits() -> None:
    from reconciler.oci.builder import CPU_PERIOD, cpu_quota

    assert cpu_quota(INT64_MAX, INT64_MAX, 1) == INT64_MAX
    assert cpu_quota(500, 2, 1000) == 500 * CPU_PERIOD * 2 // 1000  # the usual formula


def test_a_large_unit_shows_its_progress_on_a_terminal(tmp_path: Path) -> None:
    """On a terminal, each stage shows with the time spent in it (h:mm:ss), the balance of a
    large unit included; piped, nothing of it. (2,000 instances: the plan's table of every
    placement takes a terminal long to print.)"""
    import os
    import re

    from tests.support.terminal import run_in_pty

    state = tmp_path / "state"
    many = 2000
    big = _edit(SERVICE, "instances: 2", f"instances: {many}")
    big = _edit(big, "requestedResources: {cpu: 100, ram: 16Mi}", "skipResourceLimits: true")
    _write(state, {**FILES, "desired/web.yaml": big})
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    shown = run_in_pty(["plan", "--state", str(state)], {**env, "TERM": "xterm"})
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown.decode(errors="replace"))
    lines = re.split(r"[\r\n]", text)
    placing = f"placing {many} instances on 1 nodes... "
    assert any(re.search(re.escape(placing) + r"\d+:\d\d:\d\d", line) for line in lines), text
    assert f"Plan: {many} to start" in text
    piped = subprocess.run(
        [sys.executable, "-m", "reconciler", "plan", "--state", str(state)],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert b"placing" not in piped.stderr + piped.stdout


@pytest.mark.parametrize("digits", [30, 5000])
def test_a_resources_file_with_a_huge_integer_is_an_error_at_its_position(
    digits: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    resources = '[\n  {"name": "can", "sharedCount": ' + "9" * digits + "}\n]\n"
    node = NODE + "resourcesFile: resources/n1.json\n"
    _write(state, {**FILES, "nodes/n1.yaml": node, "resources/n1.json": resources})
    where = f"{state / 'resources' / 'n1.json'}:2:34: "  # `  {"name": "can", "sharedCount": `
    code, out, err = run(capsys, "validate", "--state", str(state))
    assert code == 1 and where in out and "out of range" in out, out + err
    code, out, err = run(capsys, "reconcile", "--state", str(state))
    assert code == 0 and where in err and "Traceback" not in err, err


def test_the_long_running_loop_survives_both(tmp_path: Path) -> None:
    """``watch`` and the etcd leader run each reconcile through ``run_logged``: a huge number
    is a diagnostic of a run that completes; a unit over its limit is a run that fails and is
    logged, and the loop goes on (it once exited, and took the standby with it)."""
    from reconciler.controller.watch import run_logged

    state = tmp_path / "state"
    path, _ = _faulty(state, "maxDMIPS")
    opts = ReconcileOptions(configs=default_config_builder())
    views: list[Any] = []
    runs: list[object] = []
    report = run_logged(state, opts, views, "test", runs.append)
    assert report is not None and any(d.path == str(path) for d in report.computed.diagnostics)
    _write(state, {"unit.yaml": UNIT + "maxInstances: 1\n"})
    assert run_logged(state, opts, views, "test", runs.append) is None
    assert runs == [None]  # the failed run, reported
    _write(state, {"unit.yaml": UNIT})
    assert run_logged(state, opts, views, "test", runs.append) is not None  # and it goes on
