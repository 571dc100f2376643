"""collc.frontend.parser: a spec that is one bare name is read without Lark, to the call
(spans included) that Lark's parse gives; anything else still goes through Lark."""

from __future__ import annotations

import pytest

from collc.diagnostics import CollcError
from collc.frontend import parser
from collc.frontend.parser import parse_spec, parse_tree
from collc.frontend.to_ast import ToAst


def _by_lark(text: str, filename: str):
    return ToAst(filename, text).transform(parse_tree(text, filename, start="spec"))


@pytest.mark.parametrize("text", ["dgx1", "allgather", "  ring  ", "y", "_a1 ", "Ndv2_b9"])
def test_a_bare_name_is_lark_s_call_without_lark(text, monkeypatch):
    expected = _by_lark(text, "<--topology>")
    monkeypatch.setattr(parser, "lark_parser", lambda: pytest.fail("Lark was asked"))
    got = parse_spec(text, "<--topology>")
    assert got == expected
    assert (got.span, got.name_span) == (expected.span, expected.name_span)
    assert (got.span.end_line, got.span.end_column) == (expected.span.end_line, expected.span.end_column)


@pytest.mark.parametrize("text", ["ndv2(chassis=2)", "dgx1\n", "\tdgx1", "dgx1 // c", "topology", "1abc", ""])
def test_other_specs_go_through_lark(text, monkeypatch):
    asked = []
    real = parser.lark_parser
    monkeypatch.setattr(parser, "lark_parser", lambda: (asked.append(1), real())[1])
    try:
        got = parse_spec(text, "<--topology>")
    except CollcError as err:
        with pytest.raises(CollcError) as again:
            _by_lark(text, "<--topology>")
        assert err.message == again.value.message and err.span == again.value.span
    else:
        assert got == _by_lark(text, "<--topology>")
    assert asked
