"""Where a balance run looks for nodes: the candidate-search interface and its reference
implementation.

A :class:`~reconciler.placement.balancer.Run` holds the node states and the passes (what SPEC
§7 decides); it asks its search two questions: may an instance keep its previous place (pass 1),
and where do these instances go (pass 2). Any search must answer exactly as
:class:`Exhaustive` does, which evaluates every filter unit on every node for every instance;
the class index of :mod:`reconciler.accel` answers the same, fast, and the differential tests
compare the two. So a placement rule is changed in one place, its filter unit in
:mod:`~reconciler.placement.filters`, and both searches follow.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from reconciler.placement.ask import Ask
from reconciler.placement.instances import Cause, Instance, PreviousAllocation
from reconciler.placement.nodestate import NO_KEEP, Basics, NodeSlot
from reconciler.placement.pipeline import best_runtime, choice_key, evaluate, static_runtimes
from reconciler.placement.sharing import ShareRequest

if TYPE_CHECKING:
    from reconciler.placement.balancer import Run

__all__ = [
    "CandidateSearch",
    "Exhaustive",
    "SearchFactory",
    "all_charges",
    "kept_devices",
]


class CandidateSearch(Protocol):
    """The questions a :class:`~reconciler.placement.balancer.Run` asks of its search. A search
    reserves through the run's node states and records where each instance went in
    ``run.where``; it may keep what it learns between calls (an index, refusals) as long as
    it hears of every change to a node state through :meth:`moved` and :meth:`freed`."""

    name: str

    def keep(self, instance: Instance, prev: PreviousAllocation, slot: NodeSlot) -> bool:
        """Pass 1: reserve ``prev``'s runtime and devices on ``slot`` (its node) for
        ``instance`` when every filter passes there; whether it did."""
        ...

    def place(self, instances: Sequence[Instance], cause: Cause | None) -> list[Instance]:
        """Pass 2 for consecutive instances of one service with one cause and one measured
        usage, in their order: each on the best node (SPEC §7.5) whose filters all pass, on
        its best runtime. Returns those left without a place (in order)."""
        ...

    def restore(
        self,
        instance: Instance,
        slot: NodeSlot,
        runtime_index: int,
        keep: Mapping[str, tuple[str, ...]],
        cause: Cause | None,
    ) -> None:
        """Reserve again a placement already made (its runtime and devices), without asking
        the filters: the state a result describes (``explain``, ``status``)."""
        ...

    def static_candidates(self, ask: Ask) -> list[tuple[NodeSlot, tuple[int, ...]]]:
        """Every node where some runtime passes every static filter for ``ask``, with those
        runtimes, by node id: the only nodes any eviction can open to it."""
        ...

    def alike(self, instance: Instance) -> Hashable:
        """A key equal for instances that every filter answers alike on every node (at least
        the instances of one service with one measured usage): their failures are charged
        from one pass."""
        ...

    def charges(self, ask: Ask) -> Mapping[str, int]:
        """How many nodes each filter drops ``ask`` on now: the code of the filter that
        drops each node dropping it, counted (SPEC §7.7; no zero counts)."""
        ...

    def moved(self, slot: NodeSlot) -> None:
        """``slot`` was reserved on or released from by the run."""
        ...

    def freed(self) -> None:
        """Something was released: a node that refused a request may accept it now."""
        ...

    def renewed(self, basics: Basics) -> bool:
        """Whether the search can take in a node whose capacity became ``basics`` (measured
        usage changed, see :meth:`~reconciler.placement.balancer.Run.renew_usage`); its
        state, when built, is then reported through :meth:`moved`."""
        ...


SearchFactory = Callable[["Run"], CandidateSearch]
"""Makes a run's search once the run has its nodes (the search may read them)."""


def all_charges(slots: Iterable[NodeSlot], ask: Ask) -> list[str]:
    """The code of the filter that drops each of ``slots`` dropping ``ask``."""
    out = []
    for slot in slots:
        code = evaluate(slot, ask).dropped_by
        if code is not None:
            out.append(code)
    return out


def kept_devices(
    asked: Sequence[ShareRequest], prev: PreviousAllocation
) -> Mapping[str, tuple[str, ...]] | None:
    """The device ids pass 1 keeps, per resource: the previous ones, when the instance asks
    for devices of exactly the resources it held (else None: it cannot keep its place)."""
    if not prev.devices:
        return None if asked else NO_KEEP
    held = dict(prev.devices)
    if held.keys() != {d.resource for d in asked}:
        return None
    return held


class Exhaustive:
    """The reference search: every filter unit on every node for every instance."""

    name = "exhaustive"

    @property
    def run(self) -> Run:
        run = self._run()
        assert run is not None, "a search outlived its run"
        return run

    def __init__(self, run: Run) -> None:
        self._run = weakref.ref(run)  # the run owns its search: no cycle for the collector

    def keep(self, instance: Instance, prev: PreviousAllocation, slot: NodeSlot) -> bool:
        ask = self.run.ask(instance)
        devices = kept_devices(ask.devices, prev)
        if devices is None:
            return False
        ask.keep_runtime = prev.runtime_id
        ask.cause = prev.cause
        ask.keep_devices = tuple(devices.items())
        verdict = evaluate(slot, ask)
        if verdict.dropped_by is not None:
            return False
        self.run.reserve(slot, ask, verdict.runtimes[0])
        return True

    def place(self, instances: Sequence[Instance], cause: Cause | None) -> list[Instance]:
        return [inst for inst in instances if not self._place_one(inst, cause)]

    def _place_one(self, instance: Instance, cause: Cause | None) -> bool:
        run = self.run
        ask = run.ask(instance)
        ask.cause = cause
        best = None
        for slot in run.all_slots():
            verdict = evaluate(slot, ask)
            if verdict.dropped_by is not None:
                continue
            key = choice_key(slot)
            if best is None or key < best[0]:
                best = (key, slot, verdict)
        if best is None:
            return False
        _, slot, verdict = best
        run.reserve(slot, ask, best_runtime(slot, verdict))
        return True

    def restore(
        self,
        instance: Instance,
        slot: NodeSlot,
        runtime_index: int,
        keep: Mapping[str, tuple[str, ...]],
        cause: Cause | None,
    ) -> None:
        ask: Ask = self.run.ask(instance)
        ask.keep_devices = tuple(keep.items())
        ask.cause = cause
        self.run.reserve(slot, ask, runtime_index)

    def static_candidates(self, ask: Ask) -> list[tuple[NodeSlot, tuple[int, ...]]]:
        out = []
        for slot in self.run.all_slots():
            runtimes = static_runtimes(slot, ask)
            if runtimes:
                out.append((slot, runtimes))
        return out

    def alike(self, instance: Instance) -> Hashable:
        return (id(instance.service), self.run.usage.get(instance.id))

    def charges(self, ask: Ask) -> Mapping[str, int]:
        return Counter(all_charges(self.run.all_slots(), ask))

    def moved(self, slot: NodeSlot) -> None:
        pass

    def freed(self) -> None:
        pass

    def renewed(self, basics: Basics) -> bool:
        return True
