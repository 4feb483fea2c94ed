"""Amounts and lists in messages as people read them (issue 30)."""

from __future__ import annotations

import pytest

from reconciler.model.human import human_amount, human_bytes, plain_list

GI, MI = 1024**3, 1024**2


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (512, "512 B"),
        (4096, "4 KiB"),
        (6 * GI, "6 GiB"),
        (6442450944, "6 GiB"),
        (3 * GI // 2, "1.5 GiB"),
        (1025 * MI, "1025 MiB"),  # exact in MiB, not "~1 GiB" beside "1 GiB free"
        (300 * MI, "300 MiB"),
        (10_000 * MI, "10000 MiB"),
        (GI - 1, "~1024 MiB (1073741823 bytes)"),  # never rounded without the exact bytes
        (12_345, "~12.06 KiB (12345 bytes)"),
        (-2 * GI, "-2 GiB"),
    ],
)
def test_human_bytes(n: int, text: str) -> None:
    assert human_bytes(n) == text


def test_amounts_and_lists() -> None:
    assert human_amount("ram", 8 * GI) == "8 GiB"
    assert human_amount("cpu", 2500) == "2500"  # DMIPS: a plain number
    assert plain_list(["lidar"]) == "lidar"
    assert plain_list(["lidar", "can0"]) == "lidar, can0"
    assert plain_list([]) == "none"
