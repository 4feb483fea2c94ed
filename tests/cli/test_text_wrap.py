"""The plain text output's :func:`~reconciler.cli.textout.wrap`: a line that fits is given
back as it is, exactly as :mod:`textwrap` gives it."""

from __future__ import annotations

import textwrap

from hypothesis import given, settings
from hypothesis import strategies as st

from reconciler.cli.textout import wrap


def reference(text: str, width: int, indent: str, hang: str) -> list[str]:
    return textwrap.wrap(
        text,
        max(width, 20),
        initial_indent=indent,
        subsequent_indent=indent + hang,
        break_on_hyphens=False,
    ) or [indent]


@settings(max_examples=1000)
@given(
    st.text(alphabet=st.sampled_from(list("ab -:\t\n\r\x0b\x0c\u00a0\u2003é")), max_size=40),
    st.integers(0, 45),
    st.sampled_from(["", "  ", " \t"]),
    st.sampled_from(["    ", ""]),
)
def test_it_wraps_as_textwrap_does(text: str, width: int, indent: str, hang: str) -> None:
    assert wrap(text, width, indent, hang) == reference(text, width, indent, hang)
