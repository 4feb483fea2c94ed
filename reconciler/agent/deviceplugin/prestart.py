"""Before a container holding device plugin devices starts: ``Allocate`` (and
``PreStartContainer``) with the plugin, and a bundle whose config has the answer merged in.

The controller's bundle ``out/instances/<id>/`` is never changed (out/ is the controller's):
the merged ``config.json`` goes to the agent's own ``DIR/.agent-<node>-bundles/<id>/`` and the
container runs from there (the config names the rootfs and every mount source by absolute
path, so it runs from any directory)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from reconciler.agent.deviceplugin.manager import DevicePluginError, DevicePluginManager
from reconciler.agent.deviceplugin.merge import MergeError, merge_allocation
from reconciler.io.fsio import FileReadError, atomic_write, ensure_dir, read_bytes_at
from reconciler.model.jsonbytes import pretty_json

__all__ = ["PluginBundles", "agent_bundles_dir"]

_MAX_CONFIG = 64 * 1024 * 1024


def agent_bundles_dir(state_dir: Path, node_id: str) -> Path:
    """Where the agent keeps the bundles it merged plugin answers into."""
    return state_dir / f".agent-{node_id}-bundles"


class PluginBundles:
    """The agent's ``prepare`` step for containers holding plugin devices."""

    def __init__(self, manager: DevicePluginManager, directory: Path) -> None:
        self.manager = manager
        self.directory = directory

    def prepare(self, iid: str, devices: Mapping[str, Sequence[str]], bundle: Path) -> Path | str:
        """The bundle to run ``iid`` from: ``bundle`` itself when it holds no plugin device,
        else a merged copy; a message when a plugin cannot allocate."""
        served = self.manager.resources()
        mine = {r: ids for r, ids in sorted(devices.items()) if r in served and ids}
        if not mine:
            return bundle
        try:
            raw, _ = read_bytes_at(bundle / "config.json", _MAX_CONFIG)
            config = json.loads(raw)
        except (FileReadError, ValueError) as e:
            return f"cannot read {bundle / 'config.json'}: {e}"
        try:
            for resource, ids in mine.items():
                config = merge_allocation(config, self.manager.allocate(resource, ids))
        except (DevicePluginError, MergeError) as e:
            return f"device plugin: {e}"
        target = self.directory / iid
        try:
            ensure_dir(target)
            atomic_write(target / "config.json", pretty_json(config), mode=0o600)
        except FileReadError as e:
            return str(e)
        return target
