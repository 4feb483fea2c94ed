"""What changed in a unit's inputs from one load to the next: an explicit value the loader
makes and later stages read, instead of comparing the objects they are handed. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

__all__ = ["InputChanges", "ServiceKey"]

ServiceKey = tuple[str, str]
"""A service's (itemId, subjectId)."""


@dataclass(frozen=True, slots=True)
class InputChanges:
    """What changed in the documents of a state directory from one view of it (revision
    ``since``) to the next (revision ``revision``): the keys of the services, the ids of the
    nodes and of the actual states that were edited, added or removed, and whether unit.yaml
    changed. A superset: a document named here may be equal to what it was (a file rewritten
    with the same meaning), but one not named is the same document.

    ``everything``: nothing is known of what came before (no previous view, or another
    directory's): every document is to be taken as new, and ``since`` is None.

    A revision names the documents a view hands out: a load that changes none of them keeps
    the revision of the view it started from (``since == revision``, nothing named)."""

    since: int | None
    revision: int
    unit: bool = False
    services: frozenset[ServiceKey] = frozenset()
    nodes: frozenset[str] = frozenset()
    actual: frozenset[str] = frozenset()
    everything: bool = False

    @classmethod
    def unknown(cls, revision: int) -> InputChanges:
        """Changes of which nothing is known: everything, since nothing."""
        return cls(None, revision, everything=True)

    def counts_from(self, revision: int | None) -> bool:
        """Whether these changes tell everything that changed since the view of ``revision``
        (they count from it, and are known)."""
        return not self.everything and revision is not None and self.since == revision

    @property
    def empty(self) -> bool:
        """Whether no document changed."""
        return not (self.everything or self.unit or self.services or self.nodes or self.actual)

    def then(self, later: InputChanges) -> InputChanges:
        """These changes followed by ``later``: what changed from ``since`` to
        ``later.revision`` (unknown when ``later`` does not count from this revision)."""
        if later.since != self.revision or self.everything or later.everything:
            return InputChanges.unknown(later.revision)
        return InputChanges(
            self.since,
            later.revision,
            self.unit or later.unit,
            self.services | later.services,
            self.nodes | later.nodes,
            self.actual | later.actual,
        )

    def with_nodes(self, ids: Iterable[str]) -> InputChanges:
        """These changes, with the nodes ``ids`` named as changed too (a node the caller
        changed on its way to the next stage: a stale report's mark, say)."""
        more = frozenset(ids) - self.nodes
        return replace(self, nodes=self.nodes | more) if more else self
