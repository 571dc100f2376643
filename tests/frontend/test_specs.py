"""collc.frontend.specs.parse_size: a whole number of bytes or of a binary unit is read
without Lark, to the integer the language makes of it; other sizes, and errors, are the
language's."""

from __future__ import annotations

import pytest

from collc.diagnostics import CollcError
from collc.frontend import parser
from collc.frontend.eval.requests import size_bytes
from collc.frontend.evaluate import Evaluator, Scope
from collc.frontend.parser import parse_value
from collc.frontend.specs import parse_size


def _by_the_language(text: str) -> int:
    expr = parse_value(text, "<size>")
    return size_bytes(Evaluator().eval(expr, Scope()), expr.span, minimum=0)


@pytest.mark.parametrize("text", ["256MiB", "0", "1024", "64 KiB", "1 B", "3TiB", "12345678 KiB"])
def test_a_whole_binary_size_is_the_languages_integer_without_lark(text, monkeypatch):
    expected = _by_the_language(text)
    monkeypatch.setattr(parser, "lark_parser", lambda: pytest.fail("Lark was asked"))
    got = parse_size(text)
    assert got == expected and type(got) is int


@pytest.mark.parametrize("text", ["1.5MiB", "256MB", "2 * 1 MiB", "1M", "0x10"])
def test_other_sizes_are_read_by_the_language(text):
    try:
        expected = _by_the_language(text.replace("1M", "1MiB") if text == "1M" else text)
    except CollcError:
        with pytest.raises(CollcError):
            parse_size(text)
    else:
        assert parse_size(text) == expected


def test_a_size_past_the_limit_is_the_languages_error(monkeypatch):
    monkeypatch.setenv("COLLC_LIMIT_SIZE_BYTES", str(1 << 20))
    assert parse_size("1MiB") == 1 << 20
    with pytest.raises(CollcError) as err:
        parse_size("2MiB")
    with pytest.raises(CollcError) as again:
        _by_the_language("2MiB")
    assert err.value.message == again.value.message
