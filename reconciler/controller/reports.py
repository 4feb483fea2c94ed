"""Node reports that are too old (SPEC §19): a node whose agent writes ``reportedAt`` and has
not reported for longer than unit.yaml's ``nodeTimeout`` fails ``NodeState`` ("no report for
3m"). A node without ``reportedAt`` (written by hand) is never stale.

:class:`StaleMarks` gives the balancer the nodes with the stale ones replaced by disconnected
copies. A long-running caller keeps one: the copy of a node stays the same object while its
document and the whole minutes of its age do not change, and :attr:`StaleMarks.changed` names
the nodes whose mark changed since the last call (the balancer's memo is told them with the
loader's changes)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from reconciler.model.documents import Node, UnitConfig

__all__ = ["DEFAULT_NODE_TIMEOUT", "StaleMarks", "age_text"]

DEFAULT_NODE_TIMEOUT = 60.0


def age_text(seconds: float) -> str:
    """``3m``, ``1h5m``, ``40s`` (whole minutes from a minute on, tens of seconds below)."""
    s = int(seconds)
    if s < 60:
        return f"{s // 10 * 10}s"
    hours, minutes = divmod(s // 60, 60)
    if hours:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    return f"{minutes}m"


class StaleMarks:
    """The stale nodes' disconnected copies, kept while they stay the same."""

    def __init__(self) -> None:
        self._copies: dict[str, tuple[Node, str, Node]] = {}
        self.changed: frozenset[str] = frozenset()
        """The nodes whose mark the last :meth:`apply` changed: marked, unmarked, or marked
        with another reason than by the call before."""
        # the last call's nodes when none was stale: their mapping, and the oldest report's
        # time (None: no node reports)
        self._fresh: tuple[Mapping[str, Node], float | None] | None = None

    def apply(
        self, unit: UnitConfig | None, nodes: Iterable[Node] | Mapping[str, Node], now: float
    ) -> list[Node]:
        """The nodes (``nodes``' values, for a mapping), each stale one replaced by its
        disconnected copy. Given the same mapping again while none was stale, only its
        oldest report is looked at (no other can be older)."""
        timeout = unit.nodeTimeout if unit is not None else DEFAULT_NODE_TIMEOUT
        source = nodes if isinstance(nodes, Mapping) else None
        fresh = self._fresh
        self._fresh = None
        if source is not None and fresh is not None and fresh[0] is source:
            first = fresh[1]
            # (each age as below: a report older than the oldest has a larger one)
            if first is None or now - first <= timeout:
                self.changed = frozenset()
                self._fresh = fresh
                return list(source.values())
        given: Iterable[Node] = nodes.values() if isinstance(nodes, Mapping) else nodes
        out: list[Node] = []
        copies: dict[str, tuple[Node, str, Node]] = {}
        before = self._copies
        changed: set[str] = set()
        oldest: float | None = None
        for node in given:
            at = node.reportedAt
            if at is None:
                out.append(node)
                continue
            stamp = at.timestamp()
            if oldest is None or stamp < oldest:
                oldest = stamp
            age = now - stamp
            if age <= timeout:
                out.append(node)
                continue
            why = f"no report for {age_text(age)}"
            got = before.get(node.id)
            if got is None or got[1] != why:
                changed.add(node.id)
            if got is None or got[0] is not node or got[1] != why:
                got = (node, why, node.marked_stale(why))
            copies[node.id] = got
            out.append(got[2])
        changed.update(node_id for node_id in before if node_id not in copies)
        self._copies = copies
        self.changed = frozenset(changed)
        if source is not None and not copies:
            self._fresh = (source, oldest)
        return out
