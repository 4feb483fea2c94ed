"""'Did you mean …?' for ids typed on the command line."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["closest", "did_you_mean"]


def closest(word: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """difflib's close matches (cutoff 0.6), only those nearly as close as the closest: ids
    that share a long prefix (com.example.…, edge-…) are all a little alike."""
    scored = []
    for name in sorted(set(choices)):
        m = difflib.SequenceMatcher(None, word, name)
        if m.real_quick_ratio() >= 0.6 and m.quick_ratio() >= 0.6 and m.ratio() >= 0.6:
            scored.append((-m.ratio(), name))
    scored.sort()
    if not scored:
        return []
    best = -scored[0][0]
    return [name for score, name in scored[:n] if -score >= best - 0.05]


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``; did you mean 'a' or 'b'?``, or "" when nothing is close."""
    close = closest(word, choices)
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
