"""The agent's side of the kubelet device plugin API v1beta1: registration, ListAndWatch,
Allocate.

:class:`DevicePluginManager` serves ``Registration`` on ``<dir>/kubelet.sock``. For each
``Register`` it dials the plugin's endpoint (a socket in the same directory), reads
``GetDevicePluginOptions`` and follows ``ListAndWatch`` in a thread of its own: the resource
becomes a device pool (``policy: exclusive``) holding each device's id and health. A stream
that ends (the plugin died or closed it) marks its devices unhealthy at once and drops the pool
``grace`` seconds later (by the injected clock). At start every socket in the directory is
removed: sockets of a previous agent and of plugins registered with it are stale, and plugins
watching ``kubelet.sock`` register again when it comes back, as with the kubelet.

:meth:`DevicePluginManager.allocate` calls ``Allocate`` (and ``PreStartContainer`` when the
plugin's options ask for it) for the devices of one container; :mod:`.merge` puts the answer
into the container's OCI config.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
import threading
import time
from collections.abc import Callable, Iterable
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from reconciler.agent.deviceplugin import api_pb2, api_pb2_grpc
from reconciler.model.documents import Device, DevicePool
from reconciler.model.values import ID_PATTERN, RESOURCE_NAME_PATTERN

__all__ = [
    "API_VERSION",
    "DEFAULT_GRACE",
    "DEFAULT_PLUGIN_DIR",
    "KUBELET_SOCKET",
    "DevicePluginError",
    "DevicePluginManager",
    "remove_stale_sockets",
]

log = logging.getLogger("reconciler.agent.deviceplugin")

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
DEFAULT_PLUGIN_DIR = Path("/var/lib/reconciler/device-plugins")
DEFAULT_GRACE = 300.0  # seconds a dead plugin's pool stays (all unhealthy) before it goes
HEALTHY = "Healthy"
_CALL_TIMEOUT = 30.0  # seconds for a unary call to a plugin
_ENDPOINT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")
_ID = re.compile(ID_PATTERN)
_RESOURCE = re.compile(RESOURCE_NAME_PATTERN)


class DevicePluginError(RuntimeError):
    """A plugin cannot serve a request: not registered, unreachable, or it answered an error."""


def remove_stale_sockets(directory: Path) -> list[str]:
    """Remove every unix socket in ``directory`` (not following symlinks); the names removed,
    sorted. Other files are left alone."""
    removed = []
    with os.scandir(directory) as entries:
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISSOCK(st.st_mode):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                    removed.append(entry.name)
    return sorted(removed)


@dataclass
class _Plugin:
    """One registered plugin and what its ListAndWatch stream last said."""

    resource: str
    endpoint: str
    options: api_pb2.DevicePluginOptions
    channel: grpc.Channel
    stub: Any  # api_pb2_grpc.DevicePluginStub (untyped generated code)
    devices: dict[str, bool] = field(default_factory=dict)  # id -> healthy
    ended_at: float | None = None  # when its stream ended (by the manager's clock)
    closed: bool = False  # replaced by a newer registration, or the manager stopped


class DevicePluginManager:
    """Registration server and ListAndWatch followers for one plugin directory."""

    def __init__(
        self,
        directory: Path = DEFAULT_PLUGIN_DIR,
        *,
        clock: Callable[[], float] = time.time,
        grace: float = DEFAULT_GRACE,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.directory = directory
        self.clock = clock
        self.grace = grace
        self.on_change = on_change
        self._lock = threading.Lock()
        self._plugins: dict[str, _Plugin] = {}
        self._server: grpc.Server | None = None
        self._threads: list[threading.Thread] = []
        self.removed_at_start: list[str] = []

    @property
    def socket_path(self) -> Path:
        return self.directory / KUBELET_SOCKET

    # -- lifecycle

    def start(self) -> None:
        """Remove the directory's stale sockets and serve Registration on kubelet.sock."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.removed_at_start = remove_stale_sockets(self.directory)
        if self.removed_at_start:
            log.info(
                "device plugins: removed stale sockets %s from %s",
                ", ".join(self.removed_at_start),
                self.directory,
            )
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        server.start()
        self._server = server
        log.info("device plugins: serving Registration on %s", self.socket_path)

    def stop(self) -> None:
        """Stop serving, end every stream and remove kubelet.sock."""
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None
        with self._lock:
            plugins = list(self._plugins.values())
            self._plugins.clear()
        for p in plugins:
            p.closed = True
            p.channel.close()
        for t in self._threads:
            t.join(timeout=5)
        self._threads.clear()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    def __enter__(self) -> DevicePluginManager:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    # -- registration

    def register(self, request: api_pb2.RegisterRequest) -> str | None:
        """Accept a registration (None) or say why it is refused."""
        if request.version != API_VERSION:
            return f"unsupported device plugin API version {request.version!r} (want {API_VERSION})"
        if not _RESOURCE.match(request.resource_name):
            return f"invalid resource name {request.resource_name!r}"
        endpoint = request.endpoint
        if not _ENDPOINT.match(endpoint) or endpoint == KUBELET_SOCKET:
            return f"invalid endpoint {endpoint!r}: a socket name in {self.directory}"
        channel = grpc.insecure_channel(f"unix://{self.directory / endpoint}")
        stub = api_pb2_grpc.DevicePluginStub(channel)
        try:
            options = stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=_CALL_TIMEOUT)
        except grpc.RpcError as e:
            channel.close()
            return f"cannot reach the plugin at {endpoint}: {_rpc_text(e)}"
        plugin = _Plugin(request.resource_name, endpoint, options, channel, stub)
        with self._lock:
            old = self._plugins.get(plugin.resource)
            self._plugins[plugin.resource] = plugin
        if old is not None:
            old.closed = True
            old.channel.close()
        log.info(
            "device plugins: %s registered (endpoint %s%s)",
            plugin.resource,
            endpoint,
            ", PreStartContainer required" if options.pre_start_required else "",
        )
        thread = threading.Thread(
            target=self._follow, args=(plugin,), name=f"ListAndWatch {plugin.resource}", daemon=True
        )
        self._threads = [t for t in self._threads if t.is_alive()]
        self._threads.append(thread)
        thread.start()
        return None

    def _follow(self, plugin: _Plugin) -> None:
        try:
            for response in plugin.stub.ListAndWatch(api_pb2.Empty()):
                devices = {}
                for d in response.devices:
                    if not _ID.match(d.ID):
                        log.warning(
                            "device plugins: %s: ignoring device id %r", plugin.resource, d.ID
                        )
                        continue
                    devices[d.ID] = d.health == HEALTHY
                with self._lock:
                    if plugin.closed:
                        return
                    plugin.devices = devices
                self._changed()
        except grpc.RpcError as e:
            if not plugin.closed:
                log.warning(
                    "device plugins: %s: ListAndWatch failed: %s", plugin.resource, _rpc_text(e)
                )
        with self._lock:
            if plugin.closed:
                return
            plugin.ended_at = self.clock()
            plugin.devices = dict.fromkeys(plugin.devices, False)
        log.warning(
            "device plugins: %s: the stream ended; its devices are unhealthy, the pool goes in %gs",
            plugin.resource,
            self.grace,
        )
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    # -- what the node document shows

    def pools(self) -> tuple[DevicePool, ...]:
        """Every plugin's pool, by resource name, devices by id. A plugin whose stream ended
        more than ``grace`` ago is forgotten here."""
        now = self.clock()
        out = []
        with self._lock:
            for resource in sorted(self._plugins):
                p = self._plugins[resource]
                if p.ended_at is not None and now - p.ended_at >= self.grace:
                    del self._plugins[resource]
                    p.closed = True
                    p.channel.close()
                    log.info("device plugins: %s: pool removed after %gs", resource, self.grace)
                    continue
                devices = tuple(Device(id=i, healthy=h) for i, h in sorted(p.devices.items()))
                out.append(DevicePool(resource=resource, policy="exclusive", devices=devices))
        return tuple(out)

    def resources(self) -> frozenset[str]:
        """The resources of the plugins registered now."""
        with self._lock:
            return frozenset(self._plugins)

    # -- before a container starts

    def allocate(
        self, resource: str, device_ids: Iterable[str]
    ) -> api_pb2.ContainerAllocateResponse:
        """``Allocate`` for one container holding ``device_ids`` of ``resource``, then
        ``PreStartContainer`` when the plugin's options ask for it."""
        ids = sorted(device_ids)
        with self._lock:
            plugin = self._plugins.get(resource)
        if plugin is None or plugin.ended_at is not None:
            raise DevicePluginError(f"no device plugin serves {resource} now")
        try:
            response = plugin.stub.Allocate(
                api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
                ),
                timeout=_CALL_TIMEOUT,
            )
            if plugin.options.pre_start_required:  # (as the kubelet: after Allocate)
                plugin.stub.PreStartContainer(
                    api_pb2.PreStartContainerRequest(devices_ids=ids), timeout=_CALL_TIMEOUT
                )
        except grpc.RpcError as e:
            raise DevicePluginError(
                f"{resource}: Allocate({', '.join(ids)}): {_rpc_text(e)}"
            ) from None
        if len(response.container_responses) != 1:
            raise DevicePluginError(
                f"{resource}: Allocate answered {len(response.container_responses)} "
                "container responses for one container"
            )
        result: api_pb2.ContainerAllocateResponse = response.container_responses[0]
        return result


class _Registration(api_pb2_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, manager: DevicePluginManager) -> None:
        self.manager = manager

    def Register(  # (the API's method name)
        self, request: api_pb2.RegisterRequest, context: grpc.ServicerContext
    ) -> api_pb2.Empty:
        refused = self.manager.register(request)
        if refused is not None:
            log.warning("device plugins: registration refused: %s", refused)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, refused)
        return api_pb2.Empty()


def _rpc_text(e: grpc.RpcError) -> str:
    if isinstance(e, grpc.Call):
        return f"{e.code().name}: {e.details()}"
    return str(e)
