"""What the class index is built from, derived from the filters' declarations: the class key
of a node (what every filter reads of it and its runtimes) and the shape of an ask (what they
read of a request), so a rule added to a filter cannot be left out of the index."""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any

from reconciler.model.documents import Node
from reconciler.placement import filters
from reconciler.placement.ask import Ask, requested
from reconciler.placement.instances import Requested
from reconciler.placement.nodestate import (
    NodeSlot,
    RequestKey,
    Settings,
    node_facts,
    ordered_runtimes,
)
from reconciler.placement.sharing import ShareRequest

Entry = int
"""A node's place in the choice order of SPEC §7.5 (smallest is best): one integer that orders
like (-priority, -free CPU, -free RAM, node id), and whose remainder by the number of nodes is
the rank of the node id (see :class:`~reconciler.accel.index.ClassIndex`)."""

__all__ = [
    "ClassKey",
    "Entry",
    "Group",
    "Shape",
    "class_key",
    "shape_of",
]


def _getter(paths: tuple[str, ...]) -> Callable[[Any], tuple[object, ...]]:
    """The values at attribute ``paths`` of an object, as a tuple."""
    if len(paths) > 1:
        return attrgetter(*paths)
    if paths:
        one = attrgetter(paths[0])
        return lambda obj: (one(obj),)
    return lambda obj: ()


_CHOICE_READS = ("priority",)
"""What the choice order reads of a class besides the filters' reads: its priority level."""


ClassKey = Callable[[Node, Settings, frozenset[str]], tuple[object, ...]]


def class_key() -> ClassKey:
    """The class key of the registered filters (Nomad's computed class): what every filter
    reads of a node (``filters.node_reads``: for the dynamic ones, what their requested
    amounts depend on) and of each runtime (``filters.runtime_reads``), from their
    declarations, with the priority the choice order reads. Nodes with equal keys answer every
    static filter alike, and are asked the same amounts.

    The runtimes are listed in their order in the node state (by type, then id) without their
    ids, so nodes whose runtimes differ only in ids share a class, and a runtime's index (its
    place in that order) means the same on every node of the class: a static verdict by index
    holds for each of them."""
    paths = (*_CHOICE_READS, *filters.node_reads())
    if "node" in paths:
        raise ValueError("a filter reads fields of a node's document: declare node.<field>")
    # reads of the node's document ("node.<path>") are read per node; the other facts come from
    # its unit.yaml entry and overload alone, so they are read once per entry and overload
    of_document = _getter(tuple([p[5:] for p in paths if p.startswith("node.")]))
    of_facts = _getter(tuple([p for p in paths if not p.startswith("node.")]))
    of_runtime = _getter(filters.runtime_reads())
    by_entry: dict[tuple[int, frozenset[str]], tuple[object, ...]] = {}

    def key(node: Node, settings: Settings, overload: frozenset[str]) -> tuple[object, ...]:
        entry = (id(settings), overload)  # (the call's basics hold every settings value)
        facts = by_entry.get(entry)
        if facts is None:
            facts = by_entry[entry] = of_facts(node_facts(node, settings, overload))
        runtimes = tuple(map(of_runtime, ordered_runtimes(node)))
        return (facts, of_document(node), runtimes)

    return key


Shape = tuple[tuple[object, ...], tuple[object, ...]]
"""What the static filters, then the dynamic ones, read of an ask (``shape_of``)."""


def shape_of() -> Callable[[Ask], Shape]:
    """The shape of an ask for the registered filters: what the static filters read of it
    (``filters.ask_reads``; the class index computes their answers once per class and static
    part), then what the dynamic ones read (named resources, device requests, the inputs of
    its requested amounts, the measured usage where it matters), from their declarations. A
    :class:`Group` is made from one ask of its shape, so asks with equal shapes share one."""
    of_static = _getter(filters.ask_reads(True))
    of_dynamic = _getter(filters.ask_reads(False))

    def shape(ask: Ask) -> Shape:
        return (of_static(ask), of_dynamic(ask))

    return shape


class Group:
    """What the instances of every service with one :func:`shape_of` ask, made once from the
    shape and shared by them all (services mostly differ only in name, priority and number
    of instances, so most share a group with others)."""

    __slots__ = (
        "_requested",
        "ask",
        "device_resources",
        "devices",
        "inputs",
        "instance",
        "merged",
        "names",
        "node_id",
        "passed",
        "per_class",
        "pinned",
        "refused",
        "resources",
        "static_key",
        "usage",
        "walk",
        "walkable",
    )

    def __init__(self, ask: Ask, shape: Shape) -> None:
        self.ask = ask  # the first one's, for the filter units (no keep_*: valid for them all)
        self.instance = ask.instance
        self.usage = ask.usage  # the measured (cpu, ram) of its instances where that matters
        self.resources = ask.resources
        self.names = tuple([r.resource for r in ask.resources])
        self.devices = ask.devices
        self.device_resources = frozenset([d.resource for d in ask.devices])
        self.node_id = ask.node_id
        self.static_key = shape[0]  # everything the static filters read
        self.inputs = ask.amounts
        self._requested: dict[RequestKey, Requested] = {}
        self.per_class: list[tuple[int, ...]] | None = None  # static runtimes per class
        # per class, the static runtimes where pass 2 may place it (none where no device
        # pool serves what it asks), and whether any class has some
        self.walk: list[tuple[int, ...]] | None = None
        self.walkable = False
        self.pinned: tuple[int, ...] | None = None  # static runtimes on the node it names
        self.refused: set[int] | None = (
            None  # shared by groups asking the same (ClassIndex._refused)
        )
        self.passed: dict[int, Entry] = {}  # (shared as refused is, see ClassIndex._refused)
        self.merged: dict[str | ShareRequest, int] = {}  # (the same)

    def requested(self, slot: NodeSlot) -> Requested:
        """SPEC §7.2 on ``slot`` (cached per ratios and overload), as ``Ask.requested``."""
        key = slot.request_key
        got = self._requested.get(key)
        if got is None:
            measured = self.usage if key[4] else None
            got = self._requested[key] = requested(self.inputs, key, measured)
        return got
