"""The user docs stand alone: every relative link in README.md, CHANGELOG.md and docs/ resolves
to a file of the repository (and a #fragment to a heading of the Markdown page it names), no
link or path points outside the repository, and no page cites the maintainers' specification or
notes instead of explaining."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.paths import ROOT

LINK = re.compile(r"(?<!\\)\[(?:[^\]\\]|\\.)*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
"""An inline Markdown link ``[text](target "title")``; the target is group 1."""
REFERENCE_DEF = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)", re.MULTILINE)
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
OUTSIDE = re.compile(r"\.\./shared|/work/|SPEC\.md|SPEC §|FIELD-NOTES")
"""Text that points at files outside the repository, or cites them instead of explaining."""


def pages() -> list[Path]:
    found = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    changelog = ROOT / "CHANGELOG.md"
    return [*found, changelog] if changelog.exists() else found


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as dashes."""
    text = INLINE_CODE.sub(lambda m: m.group(0).strip("`"), heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in text.splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    text = INLINE_CODE.sub("", text)
    return [m.group(1) for m in LINK.finditer(text)] + REFERENCE_DEF.findall(text)


def test_the_checker_finds_links_and_anchors() -> None:
    assert slug("Reporting the node (`--node-config`)") == "reporting-the-node---node-config"
    assert len(pages()) > 10
    total = sum(len(links(p)) for p in pages())
    assert total > 50


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_inside_the_repository(page: Path) -> None:
    problems: list[str] = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path_part, _, fragment = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.is_relative_to(ROOT):
            problems.append(f"{target}: points outside the repository")
            continue
        if not resolved.exists():
            problems.append(f"{target}: no such file")
            continue
        if fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            problems.append(f"{target}: no heading #{fragment} in {resolved.name}")
    assert not problems, f"{page.relative_to(ROOT)}: " + "; ".join(problems)


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_points_outside_the_repository(page: Path) -> None:
    hits = [
        f"line {n}: {line.strip()}"
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert not hits, f"{page.relative_to(ROOT)}: " + "; ".join(hits)
