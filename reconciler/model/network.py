"""Values of networks (SPEC §17): port strings, connection strings and subnets.

``exposedPorts`` entries are ``port[/proto]`` and ``allowedConnections`` entries
``itemId/port[/proto]``, with ``proto`` ``tcp`` (the default) or ``udp``; subnets are IPv4
CIDRs. Each check raises ``ValueError`` with a message a person can act on (the loader turns
it into ``file:line:col: message``).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import AfterValidator, Strict, WithJsonSchema

from reconciler.model.values import ID_PATTERN

__all__ = [
    "DEFAULT_SUBNETS",
    "PROTOCOLS",
    "Connection",
    "PortSpec",
    "Protocol",
    "Subnet",
    "check_connection",
    "check_port",
    "check_subnet",
    "connection_spec",
    "port_spec",
]

Protocol = Literal["tcp", "udp"]
PROTOCOLS: tuple[Protocol, ...] = ("tcp", "udp")

DEFAULT_SUBNETS: tuple[str, ...] = tuple(f"172.{n}.0.0/16" for n in range(17, 32))
"""The subnets networks take by default, in order (as Docker's default pools)."""

_ID_RE = re.compile(ID_PATTERN)
_PORT_RE = re.compile(r"[0-9]{1,5}")


@dataclass(frozen=True, slots=True, order=True)
class PortSpec:
    port: int
    proto: Protocol

    def __str__(self) -> str:
        return f"{self.port}/{self.proto}"


@dataclass(frozen=True, slots=True, order=True)
class Connection:
    item_id: str
    port: int
    proto: Protocol

    @property
    def spec(self) -> PortSpec:
        return PortSpec(self.port, self.proto)

    def __str__(self) -> str:
        return f"{self.item_id}/{self.port}/{self.proto}"


def _port(text: str, whole: str) -> int:
    if not _PORT_RE.fullmatch(text):
        raise ValueError(f"{whole!r}: {text!r} is not a port number (1-65535)")
    port = int(text)
    if not 1 <= port <= 65535:
        raise ValueError(f"{whole!r}: port {port} is out of range (1-65535)")
    return port


def _proto(text: str, whole: str) -> Protocol:
    if text == "tcp":
        return "tcp"
    if text == "udp":
        return "udp"
    raise ValueError(f"{whole!r}: unknown protocol {text!r} (tcp or udp)")


def port_spec(value: str) -> PortSpec:
    """``8080`` or ``8080/tcp`` or ``53/udp``."""
    parts = value.split("/")
    if len(parts) > 2 or not parts[0]:
        raise ValueError(f"{value!r} is not a port: expected port[/proto], e.g. 8080/tcp")
    proto = _proto(parts[1], value) if len(parts) == 2 else "tcp"
    return PortSpec(_port(parts[0], value), proto)


def connection_spec(value: str) -> Connection:
    """``com.example.db/5432`` or ``com.example.db/5432/tcp``."""
    parts = value.split("/")
    if len(parts) not in (2, 3) or not parts[0]:
        raise ValueError(
            f"{value!r} is not a connection: expected itemId/port[/proto], "
            "e.g. com.example.db/5432/tcp"
        )
    if not _ID_RE.match(parts[0]):
        raise ValueError(f"{value!r}: {parts[0]!r} is not a valid item id")
    proto = _proto(parts[2], value) if len(parts) == 3 else "tcp"
    return Connection(parts[0], _port(parts[1], value), proto)


def check_port(value: str) -> str:
    port_spec(value)
    return value


def check_connection(value: str) -> str:
    connection_spec(value)
    return value


def check_subnet(value: str) -> str:
    """An IPv4 network in CIDR form with room for a gateway and an instance (/30 at most)."""
    try:
        net = ipaddress.IPv4Network(value, strict=True)
    except ValueError as e:
        raise ValueError(f"{value!r} is not an IPv4 subnet in CIDR form: {e}") from None
    if "/" not in value:
        raise ValueError(f"{value!r}: give the prefix length, e.g. {value}/24")
    if net.prefixlen > 30:
        raise ValueError(f"{value!r}: a subnet needs room for a gateway and an instance (/30)")
    return value


Subnet = Annotated[
    str,
    Strict(),
    AfterValidator(check_subnet),
    WithJsonSchema({"type": "string", "pattern": r"^[0-9.]+/[0-9]{1,2}$"}),
]
