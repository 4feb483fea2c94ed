"""The untrusted-YAML reader: YAML 1.2 scalars, positions, and every rejection of SPEC §5."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from reconciler.io import yamlsafe
from reconciler.io.yamlsafe import Engine, YamlRejected, parse_yaml


class TestScalarsAreYaml12:
    def test_core_schema(self) -> None:
        data = parse_yaml(
            b"a: no\nb: yes\nc: 0755\nd: 0o17\ne: 0x1f\nf: 1.5\ng: true\nh: ~\ni: '12'\nj: .inf\n"
        ).data
        assert data == {
            "a": "no",
            "b": "yes",
            "c": 755,
            "d": 15,
            "e": 31,
            "f": 1.5,
            "g": True,
            "h": None,
            "i": "12",
            "j": math.inf,
        }

    def test_keys_stay_strings(self) -> None:
        assert parse_yaml(b"1: a\ntrue: b\n").data == {"1": "a", "true": "b"}


class TestPositions:
    def test_value_and_key_positions_are_one_based(self) -> None:
        parsed = parse_yaml(b"top:\n  items:\n    - x\n    - {k: v}\n")
        assert parsed.position(("top", "items", 0)) == (3, 7)
        assert parsed.position(("top", "items", 1, "k")) == (4, 11)
        assert parsed.position(("top", "items"), prefer_key=True) == (2, 3)
        # an unknown path falls back to its longest known prefix
        assert parsed.position(("top", "items", 1, "missing")) == (4, 7)


REJECTIONS = [
    (b'a: &a ["x","x"]\nb: &b [*a,*a]\n', "anchors", (1, 4)),
    (b"[" * 50_000 + b"]" * 50_000, "nesting deeper", (1, 65)),
    (b"a: 1\nb: 2\na: 3\n", "duplicate key 'a'", (3, 1)),
    (b"%YAML 1.1\n---\nno: 1\n", "directives", (1, 1)),
    (b"a: 1\n%TAG ! tag:x,2000:\n---\nb: 2\n", "", (0, 0)),
    (b"a: !!python/object/apply:os.system [ls]\n", "explicit tags", (1, 4)),
    (b"base: {x: 1}\nb:\n  <<: {y: 2}\n", "merge keys", (3, 3)),
    (b"a: 1\n---\nb: 2\n", "more than one document", (2, 1)),
    (b"", "no document", (1, 1)),
    (b"# only a comment\n", "no document", (1, 1)),
    ("a: 1\n".encode("utf-16"), "UTF-8", (1, 1)),
    (b"a: 1\nb: x\x00y\n", "control character", (2, 5)),
    (b"a: " + b"x" * (2 * 1024 * 1024), "over the limit", (1, 1)),
    (b"a: [1, 2\nb: 3\n", "invalid YAML", (1, 9)),  # where the "]" is missing
    (b"? [1]\n: 2\n", "plain strings", (1, 3)),
    (b"~\n", "empty", (1, 1)),
]


ENGINES = ["ruamel", "libyaml", "json", "auto"]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("raw", "fragment", "where"), REJECTIONS)
def test_rejections_name_the_problem_and_its_position(
    raw: bytes, fragment: str, where: tuple[int, int], engine: Engine
) -> None:
    with pytest.raises(YamlRejected) as info:
        parse_yaml(raw, engine=engine)
    assert fragment in info.value.message
    if where != (0, 0):
        assert (info.value.line, info.value.col) == where


@pytest.mark.parametrize("engine", ENGINES)
def test_engines_agree_on_values_and_positions(engine: Engine) -> None:
    src = (
        b"top:\n  items:\n    - x\n    - {k: v, n: 0o17}\n  flag: no\n"
        b"  quoted: 'yes'\n  num: 1.5e3\n  empty: ~\n"
    )
    reference = parse_yaml(src, engine="ruamel")
    got = parse_yaml(src, engine=engine)
    assert got.data == reference.data
    for path in (("top", "items", 1, "k"), ("top", "flag"), ("top", "items", 0)):
        assert got.position(path) == reference.position(path)


@pytest.mark.parametrize("engine", ENGINES)
def test_json_documents_keep_positions_for_errors(engine: Engine) -> None:
    src = b'{\n  "a": 1,\n  "b": {"c": [1, 2]}\n}\n'
    parsed = parse_yaml(src, engine=engine)
    assert parsed.data == {"a": 1, "b": {"c": [1, 2]}}
    assert parsed.position(("b", "c", 1)) == (3, 18)


def test_json_special_constants_are_not_json() -> None:
    # NaN is no JSON value: the YAML reader decides (a plain string in YAML 1.2)
    assert parse_yaml(b'{"a": NaN}').data == {"a": "NaN"}


def test_utf8_bom_is_accepted() -> None:
    assert parse_yaml(b"\xef\xbb\xbfa: 1\n").data == {"a": 1}


# The libyaml engine answers a plainly acceptable document with a tight loop
# (yamlsafe._plain_libyaml) and leaves everything else to the reference composer over the same
# events (yamlsafe._compose_libyaml). The loop may say "look closer" too often, never accept
# what the reference rejects, nor give another value.

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.floats(allow_nan=False)
    | st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=12)
    | st.sampled_from(["yes", "no", "0o17", "0x1F", "~", "<<", "1e3", ".inf", "-", "a: b", "#"])
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=8), inner, max_size=4
        )
    ),
    max_leaves=25,
)
_BREAKS = st.sampled_from(
    [
        "&a ",
        "*a",
        "!!str ",
        "!x ",
        "<<: {}\n",
        "%YAML 1.1\n---\n",
        "---\n",
        "...\n",
        "? ",
        "[",
        "]",
        "{",
        "}",
        ": ",
        "- ",
        "\n",
        "  ",
        "'",
        '"',
        "#c\n",
        "k: 1\nk: 2\n",
        "x: [1, {y: 2}]\n",
        "1" * 5000,
    ]
)


def _outcome(parse: Any, text: str) -> Any:
    try:
        return ("value", json.dumps(parse(text)))  # json: key order and int/float/bool kept apart
    except YamlRejected as e:
        return ("rejected", str(e))


def _break(text: str, where: tuple[bool, int], fragment: str) -> str:
    """``fragment`` put in ``text``: at a line's start with its indentation, or at any char."""
    at_line, n = where
    if not at_line:
        n %= len(text) + 1
        return text[:n] + fragment + text[n:]
    lines = text.splitlines(keepends=True)
    n %= len(lines) + 1
    indent = lines[n][: len(lines[n]) - len(lines[n].lstrip(" -"))] if n < len(lines) else ""
    return "".join([*lines[:n], indent + fragment, *lines[n:]])


@settings(max_examples=400, deadline=None)
@given(
    value=_VALUES,
    flow=st.sampled_from([False, True, None]),
    breaks=st.lists(
        st.tuples(st.tuples(st.booleans(), st.integers(0, 10**6)), _BREAKS), max_size=3
    ),
)
@example(value={"a": 1, "b": {"c": 2}}, flow=False, breaks=[((True, 1), "k: 1\nk: 2\n")])
@example(value={"a": 1, "b": {"c": 2}}, flow=False, breaks=[((True, 2), "a: 1\n")])
@example(value={"a": 1}, flow=False, breaks=[((True, 0), "<<: {}\n")])
@example(value={"a": [1, 2]}, flow=False, breaks=[((False, 0), "&a ")])
@example(value={"a": 1}, flow=False, breaks=[((True, 0), "? [x]\n: 1\n")])
def test_the_plain_loop_agrees_with_the_reference_composer(
    value: Any, flow: bool | None, breaks: list[tuple[tuple[bool, int], str]]
) -> None:
    text = yaml.safe_dump(value, default_flow_style=flow, allow_unicode=True, sort_keys=False)
    for where, fragment in breaks:  # text that may break a rule
        text = _break(text, where, fragment)
    reference = _outcome(yamlsafe._compose_libyaml, text)
    fast = yamlsafe._plain_libyaml(text)
    if fast is not yamlsafe._LOOK_CLOSER:
        assert ("value", json.dumps(fast)) == reference  # never another value, never laxer
    elif not breaks and reference[0] == "value":
        pytest.fail(f"a plain document was left to the reference: {text!r}")
    # and what parse_yaml answers is the reference's outcome
    assert _outcome(lambda t: parse_yaml(t.encode(), engine="libyaml").data, text) == reference


@pytest.mark.parametrize(
    "depth", [yamlsafe.MAX_DEPTH - 1, yamlsafe.MAX_DEPTH, yamlsafe.MAX_DEPTH + 1]
)
@pytest.mark.parametrize("style", ["block", "flow", "mapping"])
def test_the_plain_loop_and_the_reference_agree_at_the_depth_limit(depth: int, style: str) -> None:
    if style == "block":
        text = "- " * depth + "x\n"
    elif style == "flow":
        text = "[" * depth + "]" * depth + "\n"
    else:
        text = "".join(f"{'  ' * n}k{n}:\n" for n in range(depth)) + "  " * depth + "x\n"
    reference = _outcome(yamlsafe._compose_libyaml, text)
    assert reference[0] == ("value" if depth <= yamlsafe.MAX_DEPTH else "rejected")
    fast = yamlsafe._plain_libyaml(text)
    got = reference if fast is yamlsafe._LOOK_CLOSER else ("value", json.dumps(fast))
    assert got == reference


def _core_schema(value: str) -> Any:
    """YAML 1.2's core schema tag resolution, straight from its table (a reference for the
    loader's faster resolver; https://yaml.org/spec/1.2.2/#1032-tag-resolution)."""
    table: list[tuple[str, Any]] = [
        (r"null|Null|NULL|~|", lambda v: None),
        (r"true|True|TRUE", lambda v: True),
        (r"false|False|FALSE", lambda v: False),
        (r"[-+]?[0-9]+", int),
        (r"0o[0-7]+", lambda v: int(v[2:], 8)),
        (r"0x[0-9a-fA-F]+", lambda v: int(v[2:], 16)),
        (r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?", float),
        (r"[-+]?\.(inf|Inf|INF)", lambda v: -math.inf if v.startswith("-") else math.inf),
        (r"\.(nan|NaN|NAN)", lambda v: math.nan),
    ]
    for pattern, make in table:
        if re.fullmatch(pattern, value):
            return make(value)
    return value


@settings(max_examples=2000, deadline=None)
@given(
    st.text(alphabet="0123456789+-.eExXoOabcdfinlrstuNTFALSEUR~_ /", max_size=8)
    | st.sampled_from(["null", "Null", "NULL", "~", "", "true", "TRUE", "False", ".inf", "-.Inf"])
    | st.sampled_from([".nan", ".NaN", "0o17", "0x1F", "1e3", "+12", "-0", ".5", "1.", "nul"])
)
def test_plain_scalars_resolve_as_the_core_schema_says(value: str) -> None:
    got, want = yamlsafe._resolve_plain(value), _core_schema(value)
    assert type(got) is type(want)
    if isinstance(want, float) and math.isnan(want):
        assert math.isnan(got)
    else:
        assert got == want
