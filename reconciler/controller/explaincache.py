"""After a run, the controller leaves what it loaded and balanced in the read cache
(:mod:`reconciler.io.readcache`), so that the first ``reconciler explain`` after it starts warm
instead of reading every input file and balancing the unit again (docs/placement.md, "The read
cache").

The controller only ever writes the cache, never reads it: its own runs start from its own
memory (a watcher) or from the files (a oneshot), exactly as before. And it only refreshes a
cache a read-only command of the same user made for the state directory (``explain``,
``plan``, ``validate``): pickling a large unit's inputs costs an eighth to a fifth of its
parse, which a unit no one explains should not pay on every run.

What is kept, and why it is what ``explain`` would compute itself:

- **the loaded inputs** (the view), when the run had no input problem: the same rule as a
  read-only command's (:func:`readcache.keep_view`);
- **the balance**, under the key ``explain`` looks it up by: the inputs' contents, the
  checkpoint files as the run left them, the mode asked for and the nodes marked stale.
  ``explain`` balances with the new checkpoint's allocations as the previous ones; the balance
  is a fixed point of that (every instance placed stays where it is, every failure fails the
  same way and every held instance stays held: ``tests/placement/test_balancer_properties.py``),
  so the run's own result is the one ``explain`` computes, provided the checkpoint holds
  exactly its placements. It is therefore kept only when nothing after the balancer took a
  placement out (a network failure, a config that could not be built, an id that could not be
  assigned) and the run balanced in the mode asked for (an alert's rebalance is not a mode
  ``explain`` can ask for);
- **what that balance holds on each node** (``nodestate.occupancy``), under the same key, with
  the balance: ``explain`` then reserves again only on its instance's own node. The run's
  own node states are gone by then (the status report read them), so they are replayed here,
  after the run's output is written: about a fifth of the pickling's cost.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from reconciler.accel import node_states
from reconciler.controller.reconcile import Computed
from reconciler.io import readcache
from reconciler.placement.instances import Mode
from reconciler.placement.nodestate import occupancy

__all__ = ["keep_for_explain"]

log = logging.getLogger(__name__)


def keep_for_explain(
    state_dir: Path,
    c: Computed,
    mode: Mode | None,
    environ: Mapping[str, str] | None = None,
) -> bool:
    """Keep the run ``c`` of ``state_dir`` (``mode``: the mode the run was asked for, None for
    the unit's) in the read cache for the next ``explain``, if the state directory has one
    (a read-only command made it); whether the balance was kept too. Never fails: a cache that
    cannot be written is one that misses."""
    environ = os.environ if environ is None else environ
    cache = readcache.open_cache(state_dir, environ, create=False)
    if cache is None or c.diagnostics or not readcache.exact(c.view):
        return False
    readcache.keep_view(state_dir, cache, c.view, None)
    if (
        c.balanced is not c.result
        or c.id_errors
        or c.mode != c.requested
        or mode == "rebalance"
        or c.nodes is None
    ):
        return False
    try:
        key = readcache.balance_key(c.view, state_dir / "checkpoint", mode, c.nodes)
    except OSError as e:  # (the checkpoint files could not be read back)
        log.debug("read cache: the balance not kept: %s", e)
        return False
    cache.put("balance", key, c.result)
    try:
        states = node_states(c.view.unit, c.nodes, c.view.services_sorted(), c.result)
    except KeyError as e:  # (a placement on a runtime its node lacks: explain replays it all)
        log.debug("read cache: the node states not kept: %s", e)
        return True
    cache.put("occupancy", key, {node_id: occupancy(states[node_id]) for node_id in sorted(states)})
    return True
