"""Synthetic state directories for benchmarks, from :func:`benchmarks.synth.synth_documents`.

Layout (SPEC §2), deterministic per (n_nodes, n_instances, seed, node_format):

- ``unit.yaml`` and ``desired/<service>.yaml``: YAML in block style, as a person writes it
  (a comment line on top, keys in the order of the documents, two-space indentation);
- ``nodes/<id>.yaml``: what a node agent writes, YAML (``node_format="yaml"``) or one line of
  JSON in a ``.yaml`` file (``node_format="json"``);
- ``actual/<id>.yaml`` for a fraction of the nodes (every ``actual_every``-th), with no instances
  yet, in the nodes' format.

Each service gets a command (``image.entrypoint``/``cmd``, some an ``env``) so that its OCI
config can be built. ``image.rootfs`` stays the synthetic ``/srv/rootfs``; building a config
does not need it to exist, so no rootfs is created.

.venv/bin/python -m benchmarks.statedir DIR [--nodes 500] [--instances 2000] [--seed 1]
[--node-format yaml|json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from .synth import SHAPES, synth_documents

__all__ = [
    "NodeFormat",
    "StateDirInfo",
    "bump_instances",
    "iter_input_files",
    "runnable",
    "write_state_dir",
]

NodeFormat = Literal["yaml", "json"]

_Dumper: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


@dataclass(frozen=True)
class StateDirInfo:
    root: Path
    n_nodes: int
    n_services: int
    n_instances: int
    n_actual: int
    n_files: int
    n_bytes: int


def _person_yaml(doc: dict[str, Any], comment: str) -> bytes:
    """Block-style YAML as a person writes it. Every string in the synthetic documents is a
    plain YAML 1.2 string too (PyYAML quotes what YAML 1.1 would read as something else)."""
    body = yaml.dump(
        doc,
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=100,
    )
    return f"# {comment}\n{body}".encode()


def _agent_bytes(doc: dict[str, Any], node_format: NodeFormat) -> bytes:
    """A machine-written file: YAML as PyYAML dumps it, or one line of compact JSON."""
    if node_format == "json":
        return (json.dumps(doc, separators=(",", ":"), ensure_ascii=False) + "\n").encode()
    text = yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False)
    return text.encode()


_COMMANDS: tuple[dict[str, Any], ...] = (
    {"entrypoint": ["/bin/sleep"], "cmd": ["infinity"]},
    {"entrypoint": ["/bin/sh", "-c"], "cmd": ["exec /usr/bin/server --port 8080"]},
    {"cmd": ["/usr/local/bin/agent", "--config", "/etc/agent.yaml"], "env": ["LOG_LEVEL=info"]},
)


def runnable(service: dict[str, Any], k: int) -> dict[str, Any]:
    """The service with a command in its image (one of a few, by ``k``): a service without
    one has nothing to run and its OCI config fails."""
    image = {**service["image"], **_COMMANDS[k % len(_COMMANDS)]}
    return {**service, "image": image}


def _write(path: Path, data: bytes) -> int:
    with open(path, "wb") as f:
        f.write(data)
    return len(data)


def write_state_dir(
    root: Path,
    n_nodes: int,
    n_instances: int,
    seed: int = 1,
    *,
    node_format: NodeFormat = "yaml",
    actual_every: int = 4,
    shape: str = "homogeneous",
) -> StateDirInfo:
    """Write a synthetic state directory at ``root`` (created; it must not hold any input yet).

    Writes only inputs: no ``out/``, no ``checkpoint/``. ``actual_every``: every such node gets
    an ``actual/<id>.yaml`` with no instances (0: none)."""
    if node_format not in ("yaml", "json"):
        raise ValueError(f"node_format must be 'yaml' or 'json', not {node_format!r}")
    unit_path = root / "unit.yaml"
    if unit_path.exists() or any((root / d).exists() for d in ("desired", "nodes", "actual")):
        raise FileExistsError(f"{root} already holds a state directory")
    unit, nodes, services = synth_documents(n_nodes, n_instances, seed, shape)
    for sub in ("desired", "nodes", "actual"):
        (root / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
    n_bytes = _write(unit_path, _person_yaml(unit, "unit configuration"))
    n_files = 1
    services = [runnable(svc, k) for k, svc in enumerate(services)]
    for svc in services:
        name = svc["id"] if "subject" not in svc else f"{svc['id']}.{svc['subject']}"
        data = _person_yaml(svc, f"service {name}")
        n_bytes += _write(root / "desired" / f"{name}.yaml", data)
        n_files += 1
    n_actual = 0
    for i, node in enumerate(nodes):
        n_bytes += _write(root / "nodes" / f"{node['id']}.yaml", _agent_bytes(node, node_format))
        n_files += 1
        if actual_every > 0 and i % actual_every == 0:
            actual = {
                "apiVersion": "reconciler/v1",
                "kind": "ActualState",
                "nodeId": node["id"],
                "revision": 1,
                "instances": {},
            }
            data = _agent_bytes(actual, node_format)
            n_bytes += _write(root / "actual" / f"{node['id']}.yaml", data)
            n_files += 1
            n_actual += 1
    total = sum(int(s["instances"]) for s in services)
    return StateDirInfo(root, len(nodes), len(services), total, n_actual, n_files, n_bytes)


def iter_input_files(root: Path) -> Iterator[Path]:
    """Every input file the loader reads, in its order: unit.yaml, desired/**/*.yaml (recursive),
    nodes/*.yaml, actual/*.yaml; regular files only, hidden names skipped."""
    unit = root / "unit.yaml"
    if unit.is_file() and not unit.is_symlink():
        yield unit
    for sub, recursive in (("desired", True), ("nodes", False), ("actual", False)):
        base = root / sub
        if not base.is_dir():
            continue
        found: list[tuple[str, Path]] = []
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".")) if recursive else []
            for name in filenames:
                path = Path(dirpath) / name
                if name.startswith(".") or not name.endswith(".yaml") or path.is_symlink():
                    continue
                if path.is_file():
                    found.append((path.relative_to(base).as_posix(), path))
        for _, path in sorted(found):
            yield path


def copy_state_dir(src: Path, dst: Path) -> None:
    """Copy an existing state directory's inputs to ``dst`` (a benchmark writes there): not its
    ``out/``, ``checkpoint/``, lock or agent state."""
    shutil.copytree(
        src,
        dst,
        symlinks=True,
        ignore=shutil.ignore_patterns("out", "checkpoint", ".lock", ".agent-*"),
    )


def edit_target(
    root: Path, failing: frozenset[str] | None = None, unplaceable: bool = False
) -> str:
    """The desired file a benchmark edits: the first (in path order) whose top-level
    ``instances:`` line counts at least one instance. With ``failing`` (the ids of the services
    with an unplaceable instance), the first of those services (``unplaceable``) or the first
    of the others. Returns its path relative to ``root``."""
    for path in sorted((root / "desired").rglob("*")):
        if path.suffix not in (".yaml", ".yml") or path.name.startswith("."):
            continue
        count, service = "", ""
        for line in path.read_text().splitlines():
            if line.startswith("instances:"):
                count = line.split(":", 1)[1].strip()
            elif line.startswith("id:"):
                service = line.split(":", 1)[1].strip().strip("'\"")
        if not (count.isdigit() and int(count) >= 1):
            continue
        if failing is None or (service in failing) == unplaceable:
            return str(path.relative_to(root))
    kind = "" if failing is None else (" unplaceable" if unplaceable else " placeable")
    raise ValueError(
        f"{root}/desired holds no{kind} service's file with a top-level 'instances:' line of 1+"
    )


def bump_instances(root: Path, target: str, delta: int = 1) -> Path:
    """Edit a desired file as an editor saves it (a new file renamed over the old one): its
    ``instances`` count changes by ``delta``. ``target``: a path relative to ``root``
    (``desired/x.yaml``), or a service id of a generated directory (``desired/<id>.yaml``).
    Returns the path."""
    path = root / target if "/" in target else root / "desired" / f"{target}.yaml"
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    for n, line in enumerate(lines):
        if line.startswith("instances:"):
            count = int(line.split(":", 1)[1]) + delta
            if count < 0:
                raise ValueError(f"{path}: instances would become {count}")
            lines[n] = f"instances: {count}\n"
            break
    else:
        raise ValueError(f"{path} has no top-level 'instances:' line")
    tmp = path.with_name(f".{path.name}.edit")
    tmp.write_text("".join(lines))
    os.replace(tmp, path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description="Write a synthetic state directory.")
    parser.add_argument("root", type=Path)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--instances", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--node-format", choices=("yaml", "json"), default="yaml")
    parser.add_argument("--actual-every", type=int, default=4)
    parser.add_argument("--shape", choices=SHAPES, default="homogeneous")
    args = parser.parse_args()
    fmt: NodeFormat = "json" if args.node_format == "json" else "yaml"
    info = write_state_dir(
        args.root,
        args.nodes,
        args.instances,
        args.seed,
        node_format=fmt,
        actual_every=args.actual_every,
        shape=args.shape,
    )
    print(
        f"{info.root}: {info.n_nodes} nodes, {info.n_services} services, "
        f"{info.n_instances} instances, {info.n_actual} actual-state files; "
        f"{info.n_files} files, {info.n_bytes} bytes"
    )


if __name__ == "__main__":
    main()
