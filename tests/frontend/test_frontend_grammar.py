"""The grammar: coverage, printing round trip, and syntax errors in words with positions."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from lark import Tree

from collc.diagnostics import CollcError
from collc.frontend import ast, parse
from collc.frontend.module import stdlib_modules
from collc.frontend.parser import CollSyntaxError, lark_parser, parse_spec, parse_tree, parse_value
from collc.frontend.printer import format_module


# Valid programs that, with the standard library, exercise every grammar rule (the
# coverage test below checks that they do).
SNIPPETS: dict[str, str] = {
    "imports_and_constants": """
import topologies.ndv2;
import "other.coll";
let lanes = 2;
let fast = 2 * 25 GB/s;
""",
    "topology_everything": """
// A topology using every statement and operator.
topology demo(n = 4, bw = 10 Gbit/s, lat = 500 ns) {
    require n >= 2 and not (n > 64), "n must be between 2 and 64";
    gpu g[n];
    switch sw;
    nic hca[n];
    part box = ring(2);
    part boxes[2] = switch(n = 2);
    let half = n // 2;
    let frac = n / 2;
    let rem = (n - 1) % 3;
    let small = -1;
    let big = 1e3 KiB + 2 MiB - 1 KB;
    for i in 0..n {
        link g[i] <-> sw bw bw lat lat;
        link g[i] -> hca[i] bw 1 TB/s x lanes;
        if i == 0 or i != 1 {
            link hca[i] -> sw bw 100 MB/s lat 1 ms;
        } else if i < 3 {
            link sw -> hca[i] bw 8 Mbit/s lat 1 s;
        } else {
            link sw -> hca[i] bw 1 Tbit/s;
        }
    }
    if half <= 2 and frac >= 1 and rem > -1 and big > 1 GB {
        link box.g[0] <-> boxes[1].g[1] bw 1 Gb/s lat 2 us;
    }
    link box.g[1] -> g[0] bw 1 Tb/s + 1 Mb/s + 1 KB/s * 1 + 1 MB / 1 ms lat 1 ns;
}
""",
    "collective_everything": """
collective custom(width = 2) {
    input width;
    output 3;
    let everyone = {0, 1, 2};
    pre in[0][1] = chunk(1, 1) + chunk(2, 1);
    post out[0][0] = sum(s in 0..ranks: chunk(s, 0));
    deliver chunk(0, 1) to {1, 2};
    deliver chunk(1, 0) to everyone;
    if true { } else { }
    require ranks == len(everyone) or false;
}
""",
    "algorithm_everything": """
algorithm demo(extra = 0) for allgather {
    scratch 1 + extra;
    for r in 0..ranks {
        copy in[r][0..chunks] -> out[r][r * chunks..(r + 1) * chunks];
        copy in[r][0] -> scratch[r][0];
        reduce scratch[r][0] -> scratch[ring[(index_of(ring, r) + 1) % ranks]][0];
    }
    let m = max(min(ranks, 4), abs(-2), pow(2, 1), floor(1.5), ceil(0.5));
}
""",
    "requests": """
compile allgather(chunks = 2) on ndv2(chassis = 2) size 1 GiB using ring;
compile alltoall on dgx1 size 64 MiB using synthesize(method = "lp", chunks = 4, tight = true);
compile broadcast(root = 1) on dgx1() size 1024 using tree();
""",
}

# Command-line specs (the `spec` and `value` start rules).
SPECS: list[str] = ["ndv2(chassis=2)", "dgx1", "allgather(chunks = 4)", "ring()"]
VALUES: list[str] = ["64 MiB", "1024", "2 * 1 GiB"]


LANGUAGE_DOC = Path(__file__).resolve().parents[2] / "docs" / "language.md"


def _doc_examples() -> dict[str, str]:
    blocks = re.findall(r"```\n(.*?)```", LANGUAGE_DOC.read_text(), re.S)
    return {f"<docs/language.md example {i}>": b for i, b in enumerate(blocks)}


def _corpus() -> dict[str, str]:
    texts = {str(p): p.read_text() for p in stdlib_modules().values()}
    texts.update({f"<{k}>": v for k, v in SNIPPETS.items()})
    texts.update(_doc_examples())
    return texts


def test_the_language_reference_has_examples():
    assert len(_doc_examples()) >= 4


def _rule_names(tree: Tree) -> set[str]:
    return {str(t.data) for t in tree.iter_subtrees()}


def _expected_rules() -> set[str]:
    """Every rule or alias that can appear in a parse tree (rules Lark always inlines
    - `_name`, and `?name` expansions with one child and no alias - cannot)."""
    names = set()
    for rule in lark_parser().rules:
        name = rule.alias or rule.origin.name
        name = str(getattr(name, "value", name))
        if name.startswith("_"):
            continue
        kept = [sym for sym in rule.expansion if not (sym.is_term and sym.filter_out)]
        if rule.options.expand1 and rule.alias is None and len(kept) == 1:
            continue
        names.add(name)
    return names


def test_every_grammar_rule_is_exercised_by_the_corpus():
    seen: set[str] = set()
    for name, text in _corpus().items():
        seen |= _rule_names(parse_tree(text, name))
    for spec in SPECS:
        seen |= _rule_names(parse_tree(spec, "<spec>", start="spec"))
    for value in VALUES:
        seen |= _rule_names(parse_tree(value, "<value>", start="value"))
    missing = _expected_rules() - seen
    assert not missing, f"grammar rules no test program uses: {sorted(missing)}"


def test_expected_rules_are_not_trivially_small():
    # Guard the coverage test itself: it must be checking real rules.
    expected = _expected_rules()
    assert {"link_two_way", "floordiv", "comprehension", "part_decl", "deliver_stmt", "keyword_argument"} <= expected
    assert len(expected) > 50


@pytest.mark.parametrize("name", sorted(_corpus()))
def test_print_then_parse_gives_the_same_ast(name):
    text = _corpus()[name]
    first = parse(text, name)
    printed = format_module(first)
    again = parse(printed, name)
    assert again == first
    assert format_module(again) == printed  # printing is canonical


def test_round_trip_keeps_doc_comments_and_parentheses():
    m = parse("// Says what t is.\n// Second line.\ntopology t(n = 2) { let a = (n + 1) * 2 - (3 - 1); }\n", "t.coll")
    printed = format_module(m)
    assert "// Says what t is.\n// Second line.\ntopology t(n = 2) {" in printed
    assert "(n + 1) * 2 - (3 - 1)" in printed
    assert m.items[0].doc == "Says what t is.\nSecond line."


def test_equality_ignores_positions_but_not_content():
    a = parse("let x = 1 + 2;", "a.coll")
    b = parse("\n\n   let  x=1+2 ;", "b.coll")
    c = parse("let x = 2 + 1;", "a.coll")
    assert a == b
    assert a != c


def test_double_slash_is_division_after_a_value_and_a_comment_elsewhere():
    m = parse("topology t(n = 8) { // opening comment\n  let a = n // 2; // trailing comment\n}\n", "t.coll")
    (let,) = m.items[0].body
    assert isinstance(let.value, ast.Binary) and let.value.op is ast.BinaryOp.FLOORDIV


def test_keywords_are_contextual():
    # `switch` names a node kind at the start of a statement and a topology elsewhere;
    # `x` is the multiplicity after a link and a parameter name in expressions.
    m = parse("topology switch(x = 2) { switch sw; gpu g[x]; link g[0] <-> sw bw 1 GB/s x x; }", "t.coll")
    topo = m.items[0]
    assert topo.name == "switch"
    link = topo.body[2]
    assert isinstance(link.multiplicity, ast.Name) and link.multiplicity.id == "x"


def test_units_and_numbers():
    value = parse_value("0.7 us", "<v>")
    assert value == ast.Number(0.7, "us")
    # `using` must not be read as the unit `us` followed by `ing`.
    m = parse("compile allgather on dgx1 size 1 GiB using ring;", "c.coll")
    assert m.items[0].using.name == "ring"
    assert parse_value("0..4", "<v>") == ast.Range(ast.Number(0), ast.Number(4))


# --- syntax errors -------------------------------------------------------------------

def _syntax_error(text: str) -> CollSyntaxError:
    with pytest.raises(CollSyntaxError) as info:
        parse(text, "bad.coll")
    return info.value


def test_missing_semicolon_points_at_the_end_of_the_line():
    err = _syntax_error("topology t {\n    gpu g[2]\n    link g[0] -> g[1] bw 1 GB/s;\n}\n")
    assert (err.span.file, err.span.line, err.span.column) == ("bad.coll", 2, 13)
    assert "expected `;`" in err.message


def test_unexpected_token_names_what_was_expected():
    err = _syntax_error("topology t { gpu g[2]; link g[0] => g[1]; }")
    assert (err.span.line, err.span.column) == (1, 34)
    assert "unexpected `=`" in err.message
    assert "`->`" in err.message and "`<->`" in err.message


def test_unexpected_end_of_input():
    err = _syntax_error("topology t { gpu g[2];\n")
    assert (err.span.line, err.span.column) == (1, 23)
    assert "unexpected end of input" in err.message and "`}`" in err.message


def test_unexpected_character():
    err = _syntax_error("topology t {\n  gpu g[2] @;\n}")
    assert (err.span.line, err.span.column) == (2, 12)
    assert "unexpected character `@`" in err.message


def test_link_attribute_given_twice():
    err = _syntax_error("topology t { gpu g[2]; link g[0] -> g[1] bw 1 GB/s bw 2 GB/s; }")
    assert (err.span.line, err.span.column) == (1, 52)
    assert "`bw` is given twice" in err.message


def test_positional_argument_after_keyword():
    err = _syntax_error("compile allgather on ring(n = 2, 3);")
    assert (err.span.line, err.span.column) == (1, 34)
    assert "positional argument cannot follow a keyword" in err.message


def test_division_where_a_comment_was_meant_gets_a_hint():
    err = _syntax_error("topology t { gpu g[2]; link g[0] -> g[1] bw 1 GB/s x 2 // two lanes\n; }")
    assert (err.span.line, err.span.column) == (1, 63)
    assert any("`//`" in n for n in err.notes)


_RAW_TERMINAL = re.compile(r"__ANON|\b(SEMICOLON|LSQB|RSQB|LPAR|RPAR|LBRACE|RBRACE|NAME|NUMBER|_FLOORDIV|\$END)\b")


def test_no_truncation_of_a_real_file_gives_a_traceback_or_raw_terminal_names():
    text = (stdlib_modules()["topologies.ndv2"]).read_text() + SNIPPETS["topology_everything"]
    cuts = range(0, len(text), 7)
    for cut in cuts:
        try:
            parse(text[:cut], "cut.coll")
        except CollSyntaxError as err:
            assert err.span is not None and err.span.file == "cut.coll"
            assert err.span.line >= 1 and err.span.column >= 1
            assert not _RAW_TERMINAL.search(err.message), err.message


def test_spec_errors_are_located_in_a_pseudo_file():
    with pytest.raises(CollcError) as info:
        parse_spec("ndv2(chassis=)", "<--topology>")
    err = info.value
    assert (err.span.file, err.span.line, err.span.column) == ("<--topology>", 1, 14)
