"""The resource manager (SPEC §6.2) with the AosEdge GPU + serial resources file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from reconciler.io.loader import load_state
from reconciler.io.resources import ResourceManager, ResourceNotFoundError
from reconciler.model.documents import HostEntry, Mount

GPU_SERIAL = [
    {
        "name": "gpu0",
        "sharedCount": 2,
        "groups": ["video", "render"],
        "mounts": [
            {
                "destination": "/dev/dri",
                "type": "bind",
                "source": "/dev/dri",
                "options": ["rbind", "rw"],
            }
        ],
        "envs": ["GPU_VENDOR=example"],
        "hosts": [{"hostname": "gpu-host", "ip": "10.0.0.100"}],
        "devices": ["/dev/dri/card0:/dev/dri/card0:rw", "/dev/dri/renderD128"],
    },
    {"name": "serial0", "sharedCount": 1, "devices": ["/dev/ttyS0"]},
]

NODE = """apiVersion: reconciler/v1
kind: Node
id: n1
type: t
maxDMIPS: 1000
totalRAM: 1Gi
resourcesFile: res/n1.json
"""


@pytest.fixture
def state(tmp_path: Path) -> Path:
    (tmp_path / "nodes").mkdir()
    (tmp_path / "res").mkdir()
    (tmp_path / "nodes" / "n1.yaml").write_text(NODE)
    (tmp_path / "res" / "n1.json").write_text(json.dumps(GPU_SERIAL, indent=2))
    return tmp_path


def test_lists_name_and_shared_count_in_file_order(state: Path) -> None:
    view, diags = load_state(state)
    assert diags == []
    rm = ResourceManager.of(view.nodes["n1"])
    assert rm.shared_counts() == [("gpu0", 2), ("serial0", 1)]


def test_lookup_by_name_returns_every_field(state: Path) -> None:
    view, _ = load_state(state)
    gpu = ResourceManager.of(view.nodes["n1"]).get("gpu0")
    assert gpu.sharedCount == 2
    assert gpu.groups == ("video", "render")
    assert gpu.mounts == (
        Mount(destination="/dev/dri", type="bind", source="/dev/dri", options=("rbind", "rw")),
    )
    assert gpu.envs == ("GPU_VENDOR=example",)
    assert gpu.hosts == (HostEntry(hostname="gpu-host", ip="10.0.0.100"),)
    assert gpu.devices == ("/dev/dri/card0:/dev/dri/card0:rw", "/dev/dri/renderD128")
    assert gpu.name == "gpu0"
    # nothing lost or added on the way: the entry is the file's entry, field for field
    assert gpu.model_dump(mode="json") == GPU_SERIAL[0]


def test_lookup_of_the_serial_port(state: Path) -> None:
    view, _ = load_state(state)
    serial = ResourceManager.of(view.nodes["n1"]).get("serial0")
    assert (serial.name, serial.sharedCount, serial.devices) == ("serial0", 1, ("/dev/ttyS0",))
    assert (serial.groups, serial.mounts, serial.envs, serial.hosts) == ((), (), (), ())


def test_lookup_of_an_unknown_name_is_an_error(state: Path) -> None:
    view, _ = load_state(state)
    with pytest.raises(ResourceNotFoundError, match="no resource named 'gpu9'"):
        ResourceManager.of(view.nodes["n1"]).get("gpu9")


def test_missing_file_gives_no_resources_and_a_warning(state: Path) -> None:
    (state / "res" / "n1.json").unlink()
    view, diags = load_state(state)
    assert ResourceManager.of(view.nodes["n1"]).shared_counts() == []
    assert [d.severity for d in diags] == ["warning"]
    assert "missing" in diags[0].message and (diags[0].line, diags[0].col) == (7, 16)


def test_invalid_json_marks_the_node_invalid_and_keeps_its_last_good_version(
    state: Path,
) -> None:
    view, _ = load_state(state)
    res = state / "res" / "n1.json"
    res.write_text('[{"name": "gpu0", "sharedCount": 2,}]')
    st = res.stat()
    os.utime(res, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    view2, diags = load_state(state, view)
    assert [d.severity for d in diags] == ["error"]
    assert diags[0].path.endswith("res/n1.json") and (diags[0].line, diags[0].col) == (1, 36)
    # the node keeps its last good version, resources included
    assert ResourceManager.of(view2.nodes["n1"]).shared_counts() == [("gpu0", 2), ("serial0", 1)]

    # on a first load, the invalid node does not exist yet
    view3, _ = load_state(state)
    assert "n1" not in view3.nodes


def test_duplicate_json_keys_are_rejected(state: Path) -> None:
    (state / "res" / "n1.json").write_text('[{"name": "a", "name": "b"}]')
    view, diags = load_state(state)
    assert "n1" not in view.nodes
    assert "duplicate key" in diags[0].message


def test_inline_resources(tmp_path: Path) -> None:
    (tmp_path / "nodes").mkdir()
    text = NODE.replace("resourcesFile: res/n1.json\n", "resources:\n  - {name: can0}\n")
    (tmp_path / "nodes" / "n1.yaml").write_text(text)
    view, diags = load_state(tmp_path)
    assert diags == []
    assert ResourceManager.of(view.nodes["n1"]).shared_counts() == [("can0", 0)]
