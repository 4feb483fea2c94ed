"""A device plugin for the tests that knows nothing of this project: a plain grpcio server whose
messages are encoded and decoded by hand from the Kubernetes device plugin API v1beta1's field
numbers (the wire format itself), never with the project's generated modules. It serves
``v1beta1.DevicePlugin`` on its own socket in a plugin directory, registers with
``<dir>/kubelet.sock`` and registers again whenever that socket is made anew (as plugins do
when the kubelet restarts)."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc

# ---------------------------------------------------------------- protobuf wire format


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_bytes(number: int, value: bytes | str) -> bytes:
    """A length-delimited field (wire type 2)."""
    raw = value.encode() if isinstance(value, str) else value
    return _varint(number << 3 | 2) + _varint(len(raw)) + raw


def field_bool(number: int, value: bool) -> bytes:
    """A varint field (wire type 0); proto3 leaves out the default."""
    return _varint(number << 3) + _varint(1) if value else b""


def decode(raw: bytes) -> dict[int, list[bytes | int]]:
    """The fields of a message: number -> values (bytes for wire type 2, int for 0)."""
    out: dict[int, list[bytes | int]] = {}
    i = 0

    def varint() -> int:
        nonlocal i
        shift = n = 0
        while True:
            b = raw[i]
            i += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return n

    while i < len(raw):
        key = varint()
        number, wire = key >> 3, key & 7
        if wire == 0:
            out.setdefault(number, []).append(varint())
        elif wire == 2:
            size = varint()
            out.setdefault(number, []).append(raw[i : i + size])
            i += size
        else:
            raise ValueError(f"unexpected wire type {wire}")
    return out


def strings(msg: dict[int, list[bytes | int]], number: int) -> list[str]:
    return [v.decode() for v in msg.get(number, []) if isinstance(v, bytes)]


# ---------------------------------------------------------------- the plugin


@dataclass
class Answer:
    """What ``Allocate`` answers for a container."""

    envs: dict[str, str] = field(default_factory=dict)
    mounts: list[tuple[str, str, bool]] = field(default_factory=list)  # (container, host, ro)
    devices: list[tuple[str, str, str]] = field(default_factory=list)  # (container, host, perms)
    annotations: dict[str, str] = field(default_factory=dict)


class TestPlugin:
    """A device plugin for ``resource`` with ``devices`` (id -> healthy)."""

    __test__ = False  # (not a test class)

    def __init__(
        self,
        directory: Path,
        resource: str,
        devices: dict[str, bool],
        answer: Answer | None = None,
        *,
        endpoint: str = "test-plugin.sock",
        pre_start_required: bool = False,
    ) -> None:
        self.directory = directory
        self.resource = resource
        self.endpoint = endpoint
        self.pre_start_required = pre_start_required
        self.answer = answer or Answer()
        self._devices = dict(devices)
        self._cond = threading.Condition()
        self._version = 0
        self._server: grpc.Server | None = None
        self._stopped = threading.Event()
        self._watcher: threading.Thread | None = None
        self.allocations: list[list[str]] = []  # each Allocate's device ids
        self.prestarts: list[list[str]] = []
        self.registrations = 0
        self.registered = threading.Event()

    # -- the DevicePlugin service, bytes in and out

    def _options(self, _req: bytes, _ctx: grpc.ServicerContext) -> bytes:
        return field_bool(1, self.pre_start_required)

    def _device_list(self) -> bytes:
        body = b""
        for device_id, healthy in sorted(self._devices.items()):
            dev = field_bytes(1, device_id) + field_bytes(2, "Healthy" if healthy else "Unhealthy")
            body += field_bytes(1, dev)
        return body

    def _list_and_watch(self, _req: bytes, ctx: grpc.ServicerContext) -> Iterator[bytes]:
        seen = -1
        while ctx.is_active() and not self._stopped.is_set():
            with self._cond:
                if seen == self._version:
                    self._cond.wait(0.1)
                    continue
                seen = self._version
                data = self._device_list()
            yield data

    def _allocate(self, req: bytes, _ctx: grpc.ServicerContext) -> bytes:
        body = b""
        for container in decode(req).get(1, []):
            assert isinstance(container, bytes)
            self.allocations.append(strings(decode(container), 1))
            a = self.answer
            resp = b""
            for k, v in sorted(a.envs.items()):
                resp += field_bytes(1, field_bytes(1, k) + field_bytes(2, v))
            for c, h, ro in a.mounts:
                resp += field_bytes(2, field_bytes(1, c) + field_bytes(2, h) + field_bool(3, ro))
            for c, h, p in a.devices:
                resp += field_bytes(3, field_bytes(1, c) + field_bytes(2, h) + field_bytes(3, p))
            for k, v in sorted(a.annotations.items()):
                resp += field_bytes(4, field_bytes(1, k) + field_bytes(2, v))
            body += field_bytes(1, resp)
        return body

    def _pre_start(self, req: bytes, _ctx: grpc.ServicerContext) -> bytes:
        self.prestarts.append(strings(decode(req), 1))
        return b""

    # -- lifecycle

    @property
    def socket(self) -> Path:
        return self.directory / self.endpoint

    def _serve(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handler = grpc.method_handlers_generic_handler(
            "v1beta1.DevicePlugin",
            {
                "GetDevicePluginOptions": grpc.unary_unary_rpc_method_handler(self._options),
                "ListAndWatch": grpc.unary_stream_rpc_method_handler(self._list_and_watch),
                "Allocate": grpc.unary_unary_rpc_method_handler(self._allocate),
                "PreStartContainer": grpc.unary_unary_rpc_method_handler(self._pre_start),
            },
        )
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server

    def register(self) -> None:
        """Register with ``<dir>/kubelet.sock`` (raises grpc.RpcError when refused)."""
        options = field_bool(1, self.pre_start_required)
        request = (
            field_bytes(1, "v1beta1")
            + field_bytes(2, self.endpoint)
            + field_bytes(3, self.resource)
            + field_bytes(4, options)
        )
        with grpc.insecure_channel(f"unix://{self.directory / 'kubelet.sock'}") as channel:
            register: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
                "/v1beta1.Registration/Register"
            )
            register(request, timeout=10)
        self.registrations += 1
        self.registered.set()

    def start(self) -> None:
        """Serve, register, and keep watching kubelet.sock to register again."""
        self._stopped.clear()
        self._serve()
        self.register()
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()

    def _inode(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.directory / "kubelet.sock")
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_ctime_ns

    def _watch(self) -> None:
        known = self._inode()
        while not self._stopped.wait(0.05):
            now = self._inode()
            if now is None:
                known = None
            elif now != known:
                known = now
                if self._server is not None:
                    self._server.stop(None)
                self._serve()  # the agent removed our socket at its start
                with contextlib.suppress(grpc.RpcError):
                    self.register()

    def set_health(self, device_id: str, healthy: bool) -> None:
        with self._cond:
            self._devices[device_id] = healthy
            self._version += 1
            self._cond.notify_all()

    def stop(self) -> None:
        """Die: the server goes (its streams end) and the socket with it."""
        self._stopped.set()
        if self._server is not None:
            self._server.stop(None).wait()
            self._server = None
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
