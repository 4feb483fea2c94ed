"""The resource manager (SPEC §6.2): a node's named host resources.

A node lists its resources inline (``resources:``) or points at a resources file
(``resourcesFile:``), a JSON array of ``{name, sharedCount, groups, mounts, envs, hosts, devices}``
entries as the AosEdge resource manager reads them. :func:`parse_resources_json` turns such a
file into typed entries or raises :class:`ResourcesFileError` with a line and column;
:class:`ResourceManager` answers the two lookups the balancer and the OCI builder need.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence

from pydantic import TypeAdapter, ValidationError

from reconciler.io.yamlsafe import YamlRejected, json_int, parse_yaml, reject_duplicate_keys
from reconciler.model.documents import HostResource, Node

__all__ = [
    "ResourceManager",
    "ResourceNotFoundError",
    "ResourcesFileError",
    "parse_resources_json",
]

_ENTRIES = TypeAdapter(tuple[HostResource, ...])


class ResourceNotFoundError(LookupError):
    def __init__(self, node_id: str, name: str) -> None:
        super().__init__(f"node {node_id!r} has no resource named {name!r}")
        self.node_id = node_id
        self.name = name


class ResourcesFileError(ValueError):
    def __init__(self, line: int, col: int, message: str) -> None:
        super().__init__(f"{line}:{col}: {message}")
        self.line = line
        self.col = col
        self.message = message


def parse_resources_json(raw: bytes) -> tuple[HostResource, ...]:
    """Parse and validate a resources file; the error names the line and column."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ResourcesFileError(1, 1, "not valid UTF-8") from None
    try:
        data = json.loads(text, object_pairs_hook=reject_duplicate_keys, parse_int=json_int)
    except json.JSONDecodeError as e:
        raise ResourcesFileError(e.lineno, e.colno, f"invalid JSON: {e.msg}") from None
    except (ValueError, RecursionError) as e:
        try:  # JSON is YAML 1.2: the YAML reader finds where (an integer beyond 64 bits)
            parse_yaml(raw)
        except YamlRejected as rejected:
            raise ResourcesFileError(rejected.line, rejected.col, rejected.message) from None
        raise ResourcesFileError(1, 1, f"invalid JSON: {e}") from None
    if not isinstance(data, list):
        raise ResourcesFileError(1, 1, "a resources file is a JSON array of resource entries")
    try:
        entries = _ENTRIES.validate_python(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = tuple(err["loc"])
        line, col = 1, 1
        with contextlib.suppress(YamlRejected):  # JSON is YAML 1.2: only to find the position
            line, col = parse_yaml(raw).position(loc)
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)
        raise ResourcesFileError(line, col, f"{where or 'entry'}: {err['msg']}") from None
    names = [r.name for r in entries]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ResourcesFileError(1, 1, f"[{i}]: duplicate resource name {name!r}")
    return entries


class ResourceManager:
    """Lookups over one node's named resources, in file order."""

    def __init__(self, node_id: str, resources: Sequence[HostResource]) -> None:
        self.node_id = node_id
        self._entries = tuple(resources)
        self._by_name = {r.name: r for r in self._entries}

    @classmethod
    def of(cls, node: Node) -> ResourceManager:
        return cls(node.id, node.host_resources)

    def shared_counts(self) -> list[tuple[str, int]]:
        """Every (name, sharedCount) pair in file order; sharedCount 0 means unlimited."""
        return [(r.name, r.sharedCount) for r in self._entries]

    def get(self, name: str) -> HostResource:
        try:
            return self._by_name[name]
        except KeyError:
            raise ResourceNotFoundError(self.node_id, name) from None

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __len__(self) -> int:
        return len(self._entries)
