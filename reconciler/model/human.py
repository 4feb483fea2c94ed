"""Amounts and lists as people read them in messages: ``6 GiB`` (not ``6442450944 bytes``),
``lidar, can0`` (not ``['lidar', 'can0']``). Pure."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["human_amount", "human_bytes", "plain_list"]

_UNITS = (("PiB", 1024**5), ("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024))


def human_bytes(n: int) -> str:
    """``6 GiB``, ``1.5 GiB``, ``1025 MiB``, ``512 B``: the largest binary unit in which the
    amount is exact with at most two decimals (and under 100,000 of it); otherwise rounded in
    the largest unit it reaches, with the exact bytes: ``~1 GiB (1073741823 bytes)``."""
    if n < 0:
        return "-" + human_bytes(-n)
    for unit, size in _UNITS:
        if n >= size and (n * 100) % size == 0 and n // size < 100_000:
            return f"{_decimals(n / size)} {unit}"
    if n < 10_000:
        return f"{n} B"
    unit, size = next((u, s) for u, s in _UNITS if n >= s)
    return f"~{_decimals(n / size)} {unit} ({n} bytes)"


def _decimals(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".")


def human_amount(resource: str, n: int) -> str:
    """An amount of ``cpu`` (DMIPS: the plain number) or of ``ram``, ``storage``, ``state``
    (bytes: :func:`human_bytes`)."""
    return str(n) if resource == "cpu" else human_bytes(n)


def plain_list(items: Iterable[object]) -> str:
    """``lidar`` or ``lidar, can0`` (in the order given); ``none`` when empty."""
    text = ", ".join(str(i) for i in items)
    return text or "none"
