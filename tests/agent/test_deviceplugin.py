"""The agent's device plugin manager against a plugin that is a plain grpcio server (SPEC §19)."""

from __future__ import annotations

import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.agent.deviceplugin import api_pb2
from reconciler.agent.deviceplugin.manager import DevicePluginManager
from reconciler.agent.deviceplugin.merge import merge_allocation
from reconciler.model.documents import DevicePool
from tests.support.deviceplugin import Answer, TestPlugin
from tests.support.waiting import wait_for

RESOURCE = "example.com/widget"


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    # a short path: unix socket paths are limited to 108 bytes
    with tempfile.TemporaryDirectory(prefix="dp-", dir="/tmp") as d:
        yield Path(d)


def pool(manager: DevicePluginManager) -> DevicePool | None:
    return next((p for p in manager.pools() if p.resource == RESOURCE), None)


def health(manager: DevicePluginManager) -> dict[str, bool]:
    p = pool(manager)
    return {} if p is None else {d.id: d.healthy for d in p.devices}


def test_wire_names_are_the_kubernetes_ones() -> None:
    file = api_pb2.DESCRIPTOR
    assert file.package == "v1beta1"
    methods = {
        f"/{s.full_name}/{m.name}" for s in file.services_by_name.values() for m in s.methods
    }
    assert methods == {
        "/v1beta1.Registration/Register",
        "/v1beta1.DevicePlugin/GetDevicePluginOptions",
        "/v1beta1.DevicePlugin/ListAndWatch",
        "/v1beta1.DevicePlugin/GetPreferredAllocation",
        "/v1beta1.DevicePlugin/Allocate",
        "/v1beta1.DevicePlugin/PreStartContainer",
    }
    assert file.services_by_name["DevicePlugin"].methods_by_name["ListAndWatch"].server_streaming
    numbers = {
        name: {f.name: f.number for f in m.fields} for name, m in file.message_types_by_name.items()
    }
    assert numbers["RegisterRequest"] == {
        "version": 1,
        "endpoint": 2,
        "resource_name": 3,
        "options": 4,
    }
    assert numbers["Device"] == {"ID": 1, "health": 2, "topology": 3}
    assert numbers["ContainerAllocateResponse"] == {
        "envs": 1,
        "mounts": 2,
        "devices": 3,
        "annotations": 4,
        "cdi_devices": 5,
    }
    assert numbers["DeviceSpec"] == {"container_path": 1, "host_path": 2, "permissions": 3}
    assert numbers["Mount"] == {"container_path": 1, "host_path": 2, "read_only": 3}
    assert numbers["DevicePluginOptions"] == {
        "pre_start_required": 1,
        "get_preferred_allocation_available": 2,
    }
    # the generated stubs call the same full names
    from reconciler.agent.deviceplugin import api_pb2_grpc

    source = Path(api_pb2_grpc.__file__).read_text()
    assert "'/v1beta1.Registration/Register'" in source
    assert "'/v1beta1.DevicePlugin/ListAndWatch'" in source


def test_plugin_registers_streams_health_dies_and_its_pool_goes_after_grace(
    plugin_dir: Path,
) -> None:
    clock = Clock()
    changed = threading.Event()
    plugin = TestPlugin(plugin_dir, RESOURCE, {"w1": True, "w0": True})
    with DevicePluginManager(plugin_dir, clock=clock, grace=300, on_change=changed.set) as m:
        plugin.start()
        wait_for(lambda: health(m) == {"w0": True, "w1": True}, "the two devices")
        got = pool(m)
        assert got is not None and got.policy == "exclusive"
        assert [d.id for d in got.devices] == ["w0", "w1"]
        assert changed.is_set()

        plugin.set_health("w1", False)
        wait_for(lambda: health(m) == {"w0": True, "w1": False}, "w1 unhealthy")

        plugin.stop()  # the plugin dies: every device unhealthy at once
        wait_for(lambda: health(m) == {"w0": False, "w1": False}, "all unhealthy")
        clock.t += 299
        assert pool(m) is not None  # within the grace period
        clock.t += 1
        assert pool(m) is None  # gone after it


def test_agent_restart_removes_stale_sockets_and_the_plugin_registers_again(
    plugin_dir: Path,
) -> None:
    plugin = TestPlugin(plugin_dir, RESOURCE, {"w0": True})
    first = DevicePluginManager(plugin_dir, clock=Clock())
    first.start()
    plugin.start()
    wait_for(lambda: health(first) == {"w0": True}, "the device")
    first.stop()
    # a stale socket nobody listens on, as a crashed agent or plugin leaves behind
    stale = plugin_dir / "stale.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(stale))
    s.close()
    (plugin_dir / "notes.txt").write_text("not a socket\n")
    assert stale.exists()

    second = DevicePluginManager(plugin_dir, clock=Clock())
    try:
        second.start()
        assert "stale.sock" in second.removed_at_start
        assert not stale.exists()
        assert (plugin_dir / "notes.txt").exists()
        wait_for(lambda: plugin.registrations >= 2, "the plugin's second registration")
        wait_for(lambda: health(second) == {"w0": True}, "the device after re-registering")
    finally:
        plugin.stop()
        second.stop()


def test_allocate_and_prestart_reach_the_plugin_and_merge_into_the_config(
    plugin_dir: Path,
) -> None:
    answer = Answer(
        envs={"WIDGET": "w0"},
        mounts=[("/opt/widget", "/usr/share", True)],
        devices=[("/dev/widget0", "/dev/null", "rw")],
        annotations={"example.com/widget": "w0"},
    )
    plugin = TestPlugin(plugin_dir, RESOURCE, {"w0": True}, answer, pre_start_required=True)
    with DevicePluginManager(plugin_dir, clock=Clock()) as m:
        plugin.start()
        wait_for(lambda: health(m) == {"w0": True}, "the device")
        got = m.allocate(RESOURCE, ["w0"])
        plugin.stop()
    assert plugin.prestarts == [["w0"]]
    assert plugin.allocations == [["w0"]]
    config = {
        "process": {"env": ["PATH=/bin", "WIDGET=old"]},
        "mounts": [{"destination": "/opt/widget", "type": "bind", "source": "/x", "options": []}],
        "linux": {"resources": {"devices": [{"allow": False, "access": "rwm"}]}},
    }
    merged = merge_allocation(config, got)
    assert merged["process"]["env"] == ["PATH=/bin", "WIDGET=w0"]
    assert merged["mounts"] == [
        {
            "destination": "/opt/widget",
            "type": "bind",
            "source": "/usr/share",
            "options": ["rbind", "ro"],
        }
    ]
    (dev,) = merged["linux"]["devices"]
    assert (dev["path"], dev["type"], dev["major"], dev["minor"]) == ("/dev/widget0", "c", 1, 3)
    assert merged["linux"]["resources"]["devices"][-1] == {
        "allow": True,
        "type": "c",
        "major": 1,
        "minor": 3,
        "access": "rw",
    }
    assert merged["annotations"] == {"example.com/widget": "w0"}
    assert config["process"] == {"env": ["PATH=/bin", "WIDGET=old"]}  # the input is unchanged


def test_a_registration_with_another_api_version_is_refused(plugin_dir: Path) -> None:
    import grpc

    from tests.support.deviceplugin import field_bytes

    with (
        DevicePluginManager(plugin_dir, clock=Clock()) as m,
        grpc.insecure_channel(f"unix://{plugin_dir / 'kubelet.sock'}") as channel,
    ):
        register: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
            "/v1beta1.Registration/Register"
        )
        request = field_bytes(1, "v1alpha") + field_bytes(2, "x.sock") + field_bytes(3, RESOURCE)
        with pytest.raises(grpc.RpcError) as e:
            register(request, timeout=10)
        assert "v1alpha" in str(e.value)
        assert m.pools() == ()
