"""The read cache's files (reconciler.io.readcache): what is read back is what was stored, to
the type of every value, the fields set and the private attributes of every part, though equal
parts are stored once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from benchmarks.statedir import write_state_dir
from benchmarks.synth import SHAPES
from reconciler.io import readcache
from reconciler.io.loader import StateView, load_state


def same_to_the_type(a: Any, b: Any, at: str = "") -> None:
    assert type(a) is type(b), at
    if isinstance(a, BaseModel):
        assert a.model_fields_set == b.model_fields_set, at
        assert a.__pydantic_private__ == b.__pydantic_private__, at
        for name in type(a).model_fields:
            same_to_the_type(getattr(a, name), getattr(b, name), f"{at}.{name}")
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b), at
        for k, (x, y) in enumerate(zip(a, b, strict=True)):
            same_to_the_type(x, y, f"{at}[{k}]")
    elif isinstance(a, dict):
        assert list(a) == list(b), at
        for k in a:
            same_to_the_type(a[k], b[k], f"{at}[{k!r}]")
    else:
        assert a == b, at


@pytest.mark.parametrize("shape", SHAPES)
def test_a_view_is_read_back_as_it_was_stored(tmp_path: Path, shape: str) -> None:
    root = tmp_path / "state"
    write_state_dir(root, 12, 40, seed=5, shape=shape)
    view, diags = load_state(root)
    assert diags == []
    cache = readcache.open_cache(root, {readcache.CACHE_ENV: str(tmp_path / "cache")})
    assert cache is not None
    cache.put("view", "k", view)
    got = cache.get("view", "k")
    assert isinstance(got, StateView)
    assert got == view
    for name in ("unit", "services", "nodes", "actual"):
        same_to_the_type(getattr(view, name), getattr(got, name), name)
    assert got.input_hash == view.input_hash and got.hash_lines == view.hash_lines
    assert list(got.files) == list(view.files)
    documents = {id(d) for m in (got.services, got.nodes, got.actual) for d in m.values()} | {
        id(got.unit)
    }
    for rel, rec in view.files.items():
        back = got.files[rel]
        assert (back.key, back.sha256, back.deps, back.diagnostics) == (
            rec.key,
            rec.sha256,
            rec.deps,
            rec.diagnostics,
        )
        assert id(back.good) in documents, rel  # one object, as loaded


def test_equal_parts_are_stored_once(tmp_path: Path) -> None:
    root = tmp_path / "state"
    write_state_dir(root, 12, 40, seed=5, shape="many-small")
    view, _ = load_state(root)
    cache = readcache.open_cache(root, {readcache.CACHE_ENV: str(tmp_path / "cache")})
    assert cache is not None
    cache.put("view", "k", view)
    got = cache.get("view", "k")
    assert isinstance(got, StateView)
    images = {id(s.image) for s in view.services.values()}
    shared = {id(s.image) for s in got.services.values()}
    assert len(shared) < len(images) == len(view.services)
    assert {s.image for s in got.services.values()} == {s.image for s in view.services.values()}


def test_equal_parts_with_other_fields_set_stay_apart(tmp_path: Path) -> None:
    """pydantic calls two parts equal when one sets a field to its default and the other
    leaves it unset; a few checks read which fields were set, so they are kept apart."""
    from reconciler.model.documents import RuntimePlatform

    unset = RuntimePlatform(architecture="x86_64")
    explicit = RuntimePlatform(architecture="x86_64", os="linux")
    assert unset == explicit
    cache = readcache.open_cache(tmp_path, {readcache.CACHE_ENV: str(tmp_path / "cache")})
    assert cache is not None
    cache.put("parts", "k", (unset, explicit, unset.model_copy()))
    got = cache.get("parts", "k")
    assert isinstance(got, tuple)
    assert [p.model_fields_set for p in got] == [
        {"architecture"},
        {"architecture", "os"},
        {"architecture"},
    ]
    assert got[0] is got[2] and got[0] is not got[1]


@pytest.mark.parametrize("shape", ["devices", "preemption", "unplaceable-15"])
def test_a_balance_is_read_back_as_it_was_stored(tmp_path: Path, shape: str) -> None:
    from reconciler.accel import balance

    root = tmp_path / "state"
    write_state_dir(root, 12, 40, seed=5, shape=shape)
    view, _ = load_state(root)
    result = balance(view.unit, list(view.nodes.values()), view.services_sorted())
    assert result.placements
    cache = readcache.open_cache(root, {readcache.CACHE_ENV: str(tmp_path / "cache")})
    assert cache is not None
    cache.put("balance", "k", result)
    got = cache.get("balance", "k")
    assert type(got) is type(result)
    assert got == result
    assert got.placements == result.placements and got.failures == result.failures
    for a, b in zip(result.placements, got.placements, strict=True):
        for name in a.__slots__:
            same_to_the_type(getattr(a, name), getattr(b, name), name)


def test_a_write_killed_before_its_rename_leaves_no_temp_file_behind(tmp_path: Path) -> None:
    """The temp file of a process that died mid-write is removed by the next write; a live
    writer's is left alone."""
    cache = readcache.open_cache(tmp_path, {readcache.CACHE_ENV: str(tmp_path / "cache")})
    assert cache is not None
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    dead = cache.directory / f".view.pickle.tmp-{int(gone.stdout)}"
    live = cache.directory / f".view.pickle.tmp-{os.getpid()}"
    dead.write_bytes(b"torn")
    live.write_bytes(b"being written")
    cache.put("balance", "k", {"a": 1})
    assert not dead.exists() and live.exists()
    assert cache.get("balance", "k") == {"a": 1}
