"""The checkpoint's checksum covers ``canonical()``'s bytes; a cold run serialises each
allocation with the faster ``canonical_plain``: the two must give the very same bytes on every
value an allocation can hold, or the next load would find a wrong checksum and quarantine the
checkpoint."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.planning.checkpoint import Allocation, canonical, canonical_plain

# every code point but the surrogates (a str holding one cannot be encoded to UTF-8 at all)
TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
INT = st.integers(min_value=-(2**70), max_value=2**70)  # beyond 64 bits too: the fallback
SCALARS = st.one_of(st.none(), st.booleans(), INT, TEXT)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(TEXT, inner, max_size=4),
        st.dictionaries(st.integers(-3, 3), inner, max_size=2),  # keys json turns into str
    ),
    max_leaves=20,
)


@settings(max_examples=500)
@given(VALUES)
def test_the_plain_serialiser_gives_canonicals_bytes(value: Any) -> None:
    assert canonical_plain(value) == canonical(value)


@settings(max_examples=200)
@given(
    ids=st.lists(TEXT, min_size=5, max_size=5),
    numbers=st.lists(st.integers(0, 2**63 - 1), min_size=7, max_size=7),
    resources=st.lists(TEXT, max_size=3),
    devices=st.dictionaries(TEXT, st.lists(TEXT, max_size=3), max_size=3),
    cause=st.sampled_from([None, "rebalanced", "preempted"]),
)
def test_an_allocations_fragment_is_canonical(
    ids: list[str],
    numbers: list[int],
    resources: list[str],
    devices: dict[str, list[str]],
    cause: Any,
) -> None:
    item, subject, version, node, runtime = ids
    index, cpu, ram, storage, state, uid, gid = numbers
    a = Allocation(
        item,
        subject,
        index,
        version,
        node,
        runtime,
        (cpu, ram, storage, state),
        tuple(resources),
        tuple((r, tuple(i)) for r, i in sorted(devices.items())),
        uid,
        gid,
        cause,
    )
    assert canonical_plain(a.to_json()) == canonical(a.to_json())
    assert json.loads(canonical_plain(a.to_json())) == a.to_json()


def test_a_float_is_not_promised_the_same_spelling() -> None:
    # why the plain serialiser is kept to values without floats (an allocation has none)
    assert canonical(1e-7) == b"1e-07" != canonical_plain(1e-7)
