"""A YAML syntax error is reported where the problem is, with the parser's context kept.

Every expected position below was worked out by hand from the text (lines and columns are
1-based, a column counts characters from the start of the line); each case runs on every
engine, whose parsers notice the problem in the same place but word it differently.
"""

from __future__ import annotations

import pytest

from reconciler.io.yamlsafe import Engine, YamlRejected, parse_yaml

ENGINES: list[Engine] = ["ruamel", "libyaml", "auto"]

SERVICE_HEAD = "apiVersion: reconciler/v1\nkind: Service\nid: web\nversion: 1.0.0\n"


def _rejected(text: str, engine: Engine) -> YamlRejected:
    with pytest.raises(YamlRejected) as info:
        parse_yaml(text.encode(), engine=engine)
    return info.value


CASES = [
    pytest.param(
        # line 5 is "labels: [edge, gpu": 18 characters, the "]" belongs at column 19; the
        # parsers notice only at line 6 ("runtimes:" read as part of a plain scalar)
        SERVICE_HEAD + "labels: [edge, gpu\nruntimes: [runc]\nimage: {rootfs: x}\n",
        (5, 19),
        ["'[' opened at 5:9 is not closed", "while parsing a flow sequence started at 5:9"],
        id="flow-sequence-unclosed-before-next-key",
    ),
    pytest.param(
        # the bracket runs to the end of the file past blank and comment lines: the parsers
        # notice at the end (line 8), the "]" belongs after "gpu" on line 5
        SERVICE_HEAD + "labels: [edge, gpu   # the GPU nodes\n\n# more\n\n",
        (5, 19),
        ["'[' opened at 5:9 is not closed", "while parsing a flow sequence started at 5:9"],
        id="flow-sequence-unclosed-at-end-of-file",
    ),
    pytest.param(
        # line 5 is "image: {rootfs: x, cmd: [sh]": 28 characters, "}" belongs at column 29
        SERVICE_HEAD + "image: {rootfs: x, cmd: [sh]\nlabels: [a]\n",
        (5, 29),
        ["'{' opened at 5:8 is not closed", "while parsing a flow mapping started at 5:8"],
        id="flow-mapping-unclosed",
    ),
    pytest.param(
        # a nested bracket: line 6 is '  cmd: [sh, "-c"' (16 characters), its block ends at
        # line 7 ("  env:" is indented no deeper than line 6)
        SERVICE_HEAD + 'image:\n  cmd: [sh, "-c"\n  env: [A=1]\n  rootfs: x\n',
        (6, 17),
        ["'[' opened at 6:8 is not closed", "while parsing a flow sequence started at 6:8"],
        id="flow-sequence-unclosed-nested",
    ),
    pytest.param(
        # the quote opened on line 5 is closed by the one on line 9, so the parsers notice at
        # 9:11; the closing quote is missing after "svc" on line 5 ('hostname: "svc': 14)
        SERVICE_HEAD + 'hostname: "svc\ninstances: 2\npriority: 1\nsubject: a\nnodeId: "n1"\n',
        (5, 15),
        ["the quote opened at 5:11 is not closed"],
        id="double-quote-unclosed-closed-later",
    ),
    pytest.param(
        # a quote never closed: the parsers notice at the end of the file (7:1)
        SERVICE_HEAD + "hostname: 'svc\ninstances: 2\n",
        (5, 15),
        [
            "the quote opened at 5:11 is not closed",
            "while scanning a quoted scalar started at 5:11",
        ],
        id="single-quote-unclosed-at-end-of-file",
    ),
]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("text", "where", "says"), CASES)
def test_unclosed_brackets_and_quotes_point_where_the_closing_character_is_missing(
    text: str, where: tuple[int, int], says: list[str], engine: Engine
) -> None:
    err = _rejected(text, engine)
    assert (err.line, err.col) == where, err.message
    assert err.message.startswith("invalid YAML: ")
    for words in says:
        assert words in err.message
    assert "noticed at" in err.message  # the parser's place is kept in the message


@pytest.mark.parametrize("engine", ENGINES)
def test_a_tab_indentation_is_named_at_the_tab(engine: Engine) -> None:
    # line 6 is "\trootfs: x": the tab is its first character
    err = _rejected(SERVICE_HEAD + "image:\n\trootfs: x\n", engine)
    assert (err.line, err.col) == (6, 1)
    assert "tab" in err.message


@pytest.mark.parametrize("engine", ENGINES)
def test_a_tab_after_a_good_line_is_named_at_the_tab(engine: Engine) -> None:
    # line 7 is "\tcmd: [sh]" after a good line 6: the tab is its first character
    text = SERVICE_HEAD + "image:\n  rootfs: x\n\tcmd: [sh]\n"
    err = _rejected(text, engine)
    assert (err.line, err.col) == (7, 1)
    assert "tab" in err.message


@pytest.mark.parametrize("engine", ENGINES)
def test_a_bad_indentation_points_at_the_misplaced_key(engine: Engine) -> None:
    # "cmd" on line 7 is indented by one space, neither under "image:" (0) nor with "rootfs"
    # (2): column 2 is where it starts
    text = SERVICE_HEAD + "image:\n  rootfs: x\n cmd: [sh]\n"
    err = _rejected(text, engine)
    assert (err.line, err.col) == (7, 2)
    assert "while parsing a block mapping started at 1:1" in err.message


@pytest.mark.parametrize("engine", ENGINES)
def test_an_error_inside_a_well_indented_bracket_stays_where_the_parser_saw_it(
    engine: Engine,
) -> None:
    # line 2 is "  b: c: d,": the second ':' at column 7 is the problem; the bracket is
    # indented correctly and is closed on line 3, so nothing is moved
    err = _rejected("x: [a,\n  b: c: d,\n]\n", engine)
    assert (err.line, err.col) == (2, 7)
    assert "while parsing a flow sequence started at 1:4" in err.message
    assert "not closed" not in err.message


@pytest.mark.parametrize("engine", ENGINES)
def test_a_multi_line_bracket_indented_under_its_key_is_valid(engine: Engine) -> None:
    text = SERVICE_HEAD + 'labels: [a,\n  b,\n  c]\nhostname: "x\n  y"\n'
    parsed = parse_yaml(text.encode(), engine=engine)
    assert parsed.data["labels"] == ["a", "b", "c"]
    assert parsed.data["hostname"] == "x y"
