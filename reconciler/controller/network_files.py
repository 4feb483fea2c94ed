"""The network phase's files in ``out/`` (SPEC §17): ``out/network.json`` (the networks and
the DNS table, for the node agents' bridges and DNS servers) and, per instance with a network,
``out/instances/<id>/network.json`` (its parameters) and ``resolv.conf`` (its gateway as
name server; its config binds it at ``/etc/resolv.conf``). Each is written atomically and
only when its bytes change; an instance that no longer has a network loses both files (its
directory goes with its config when it is no longer placed)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from reconciler.io.fsio import Commit, FileReadError, atomic_write_many, read_bytes_at
from reconciler.model.jsonbytes import pretty_json
from reconciler.planning.network import InstanceNetwork, NetworkResult

__all__ = ["NETWORK_FILE", "NetworkFilesMemo", "instance_network_files", "write_network_files"]

NETWORK_FILE = "network.json"
_FILES = (NETWORK_FILE, "resolv.conf")
_MAX = 4 << 20


def instance_network_files(net: InstanceNetwork) -> dict[str, bytes]:
    """The files of one instance with a network: ``network.json`` and ``resolv.conf``."""
    resolv = "".join(f"nameserver {ip}\n" for ip in net.dns_servers)
    return {NETWORK_FILE: pretty_json(net.to_json()), "resolv.conf": resolv.encode()}


class NetworkFilesMemo:
    """What a watcher's last run left in the network files: per instance whose config it wrote,
    the parameters its ``network.json`` and ``resolv.conf`` hold (None: it has neither), and
    ``out/network.json``'s bytes. A trusting run (``verify`` off, as for the other outputs of
    an event's run) skips an instance given equal parameters without a system call; a
    verifying run compares every file. Taken (emptied) by each call and kept again only once
    the run's commit has written the files (:meth:`written`): a run that fails leaves it
    empty, so the next one compares every file."""

    def __init__(self) -> None:
        self._known: dict[str, InstanceNetwork | None] = {}
        self._top: bytes | None = None
        self._pending: tuple[dict[str, InstanceNetwork | None], bytes | None] | None = None
        self.trusted = 0  # in the last call: instances skipped as known

    def _take(self) -> tuple[dict[str, InstanceNetwork | None], bytes | None]:
        known, top = self._known, self._top
        self._known, self._top, self._pending = {}, None, None
        return known, top

    def written(self) -> None:
        """The commit holding the last call's files was flushed: they are on disk."""
        if self._pending is not None:
            self._known, self._top = self._pending
            self._pending = None


def _differs(path: Path, data: bytes) -> bool:
    try:
        current, _ = read_bytes_at(path, _MAX)
    except FileReadError:
        return True
    return current != data


def write_network_files(
    state_dir: Path,
    network: NetworkResult | None,
    built: Iterable[str],
    commit: Commit | None = None,
    *,
    memo: NetworkFilesMemo | None = None,
    verify: bool = True,
) -> list[str]:
    """Write the network files of this run; ``built``: the ids whose config was written (an
    instance's files go into its directory only when it has one). Returns what it wrote or
    removed, relative to the state directory. ``memo``: see :class:`NetworkFilesMemo` (call
    its ``written`` once ``commit`` is flushed); ``verify`` off trusts it."""
    known, known_top = memo._take() if memo is not None else ({}, None)
    if verify:
        known, known_top = {}, None
    out = state_dir / "out"
    top = out / NETWORK_FILE
    had = known_top is not None or top.exists() or top.is_symlink()
    if network is None and not had:
        return []  # networks were off last run too: nothing to look at
    if commit is not None and not os.path.isdir(out / "instances"):
        # a first run's instance directories wait for the commit's flush to be renamed into
        # place (one tree): they are made first, the network files go into them
        commit.flush()
    instances: Mapping[str, InstanceNetwork] = network.instances if network is not None else {}
    batch: list[tuple[Path, bytes, int]] = []
    written: list[str] = []
    gone: list[Path] = []
    now: dict[str, InstanceNetwork | None] = {}
    absent = object()
    trusted = 0
    for iid in built:
        net = instances.get(iid)
        now[iid] = net
        if known.get(iid, absent) == net:
            trusted += 1
            continue
        directory = out / "instances" / iid
        if net is None:
            gone += [directory / name for name in _FILES]
            continue
        for name, data in instance_network_files(net).items():
            if _differs(directory / name, data):
                batch.append((directory / name, data, 0o644))
    top_data = None
    if network is not None:
        top_data = pretty_json(network.network_json())
        if top_data != known_top and _differs(top, top_data):
            batch.append((top, top_data, 0o644))
    if memo is not None:
        memo._pending, memo.trusted = (now, top_data), trusted
    atomic_write_many(batch, commit=commit)
    written += [str(p.relative_to(state_dir)) for p, _d, _m in batch]
    if network is None:
        gone.append(top)
    for path in gone:
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        written.append(str(path.relative_to(state_dir)))
    return written
