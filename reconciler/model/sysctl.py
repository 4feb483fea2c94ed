"""Which sysctls a service may set: only those its container's own namespaces isolate.

Every container gets new ipc, network and uts namespaces (see :mod:`reconciler.oci.builder`), and
runc (1.1) accepts exactly the sysctls those isolate, refusing any other when the container starts:

- ipc: ``kernel.msgmax``, ``kernel.msgmnb``, ``kernel.msgmni``, ``kernel.sem``, ``kernel.shmall``,
  ``kernel.shmmax``, ``kernel.shmmni``, ``kernel.shm_rmid_forced`` and ``fs.mqueue.*``;
- network: ``net.*``;
- uts: ``kernel.domainname`` (``kernel.hostname`` is refused: the ``hostname`` field sets it).

A name is dot-separated (``net.ipv4.ip_forward``) or, as runc also reads it, slash-separated
(``net/ipv4/conf/eth0.1/rp_filter``, where a dot may then sit inside a component); each component
is non-empty. :data:`SysctlName` checks this when a document is validated, so a service that
runc would refuse (``kernel.core_pattern``, which would be the host's) is an input error with its
file, line and column, never a container that fails to start.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Strict

__all__ = ["IPC_SYSCTLS", "SysctlName", "check_sysctl_name"]

IPC_SYSCTLS = frozenset(
    {
        "kernel.msgmax",
        "kernel.msgmnb",
        "kernel.msgmni",
        "kernel.sem",
        "kernel.shmall",
        "kernel.shmmax",
        "kernel.shmmni",
        "kernel.shm_rmid_forced",
    }
)
_PREFIXES = ("fs.mqueue.", "net.")  # ipc message queues; the network namespace
_UTS_SYSCTLS = frozenset({"kernel.domainname"})
_NAME_RE = re.compile(r"^[A-Za-z0-9_-]+([./][A-Za-z0-9_-]+)*$")


def _dotted(name: str) -> str:
    """The dot-separated form: a name whose first separator is ``/`` has ``.`` and ``/``
    swapped (``net/ipv4/conf/eth0.1/rp_filter`` → ``net.ipv4.conf.eth0/1.rp_filter``)."""
    first = re.search(r"[./]", name)
    if first is None or first.group() == ".":
        return name
    return name.translate(str.maketrans("./", "/."))


def check_sysctl_name(name: str) -> str:
    """``name`` when a container may set it, else ValueError saying why."""
    if not _NAME_RE.match(name):
        raise ValueError(
            f"invalid sysctl name {name!r}: components of letters, digits, '_' and '-', "
            "separated by '.' (or '/')"
        )
    dotted = _dotted(name)
    if dotted in IPC_SYSCTLS or dotted in _UTS_SYSCTLS or dotted.startswith(_PREFIXES):
        return name
    if dotted == "kernel.hostname":
        raise ValueError("sysctl 'kernel.hostname' is not allowed: set the service's hostname")
    allowed = ", ".join([f"{p}*" for p in _PREFIXES] + sorted(_UTS_SYSCTLS | IPC_SYSCTLS))
    raise ValueError(
        f"sysctl {name!r} is not namespaced: it would change the whole host, and runc refuses "
        f"it (allowed: {allowed})"
    )


SysctlName = Annotated[str, Strict(), AfterValidator(check_sysctl_name)]
