"""Shared by the tests that run real containers: a static busybox and a rootfs made of it."""

from __future__ import annotations

import os
import shutil
import struct
from collections.abc import Iterable
from pathlib import Path


def is_static_elf(path: str) -> bool:
    """True for a 64-bit little-endian ELF without a PT_INTERP (no dynamic loader needed)."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            return False
        phoff = struct.unpack_from("<Q", head, 0x20)[0]
        phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    return all(
        struct.unpack_from("<I", table, i * phentsize)[0] != 3  # PT_INTERP
        for i in range(phnum)
    )


def find_static_busybox() -> str | None:
    for candidate in ("/bin/busybox", shutil.which("busybox")):
        if candidate and os.path.isfile(candidate) and is_static_elf(candidate):
            return candidate
    return None


def make_busybox_rootfs(
    rootfs: Path, busybox: str, applets: Iterable[str], dirs: Iterable[str]
) -> None:
    """``rootfs/bin/busybox`` with one symlink per applet, plus the empty directories."""
    (rootfs / "bin").mkdir(parents=True)
    shutil.copy2(busybox, rootfs / "bin" / "busybox")
    for applet in applets:
        (rootfs / "bin" / applet).symlink_to("busybox")
    for d in dirs:
        (rootfs / d).mkdir(exist_ok=True)
