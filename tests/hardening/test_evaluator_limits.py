"""Programs that would run for minutes or overflow get a located error within seconds,
naming the limit and the environment variable that raises it."""

from __future__ import annotations

import time

import pytest

from collc import frontend
from collc.diagnostics import CollcError
from collc.limits import LIMITS, limit

from hardening_inputs import topology_with, write


def _check(tmp_path, text: str, name: str = "p.coll"):
    frontend.clear_caches()
    return frontend.check_file(write(tmp_path / name, text))


def _fails_fast(tmp_path, text: str, *words: str, seconds: float = 10.0) -> CollcError:
    start = time.perf_counter()
    with pytest.raises(CollcError) as info:
        _check(tmp_path, text)
    assert time.perf_counter() - start < seconds
    for word in words:
        assert word in info.value.message, info.value.message
    assert info.value.span is not None
    return info.value


def test_if_nested_400_deep_is_a_located_error(tmp_path):
    body = "if true { " * 400 + "}" * 400
    err = _fails_fast(tmp_path, topology_with(body), "nested too deeply", "COLLC_LIMIT_NESTING")
    assert err.span.line == 1


def test_parentheses_nested_400_deep_is_a_located_error(tmp_path):
    _fails_fast(tmp_path, topology_with("let x = " + "(" * 400 + "1" + ")" * 400 + ";"), "nested too deeply")


def test_long_operator_chain_is_an_error_not_a_recursion_crash(tmp_path):
    # 5,000 operators in a row make a tree deeper than Python's stack.
    with pytest.raises(CollcError, match="nested too deeply"):
        _check(tmp_path, topology_with("let x = " + " + ".join(["1"] * 5000) + ";"))


def test_loop_to_1e300(tmp_path):
    _fails_fast(tmp_path, topology_with("for i in 0..1e300 { }"), "digits", "COLLC_LIMIT_INT_DIGITS")


def test_5000_digit_integer_literal(tmp_path):
    err = _fails_fast(tmp_path, topology_with("let x = " + "9" * 5000 + ";"), "5000 digits")
    assert err.span.column == len("topology t() { gpu g[2]; switch s; let x = ") + 1


def test_pow_with_huge_exponent_is_refused_before_computing(tmp_path):
    _fails_fast(tmp_path, topology_with("let x = pow(10, 100000000);"), "pow()", "digits", seconds=2)


def test_pow_of_zero_to_negative_power(tmp_path):
    _fails_fast(tmp_path, topology_with("let x = pow(0, -1);"), "divides by zero")


def test_forty_chained_squarings(tmp_path):
    squares = "let a0 = 10;" + "".join(f" let a{i + 1} = a{i} * a{i};" for i in range(40))
    _fails_fast(tmp_path, topology_with(squares), "digits", seconds=2)


def test_part_fan_out_to_a_billion_nodes(tmp_path):
    text = "topology leaf() { gpu g[2]; switch s; link g[0] <-> s bw 1 GB/s; link g[1] <-> s bw 1 GB/s; }\n"
    prev = "leaf"
    for name in "abcdef":
        text += f"topology {name}() {{ part p[32] = {prev}(); }}\n"
        prev = name
    # Stopped where the parts would pass the GPU (rank) limit, before they are copied.
    err = _fails_fast(tmp_path, text, "COLLC_LIMIT_RANKS", seconds=3)
    assert "GPUs" in err.message and err.span.line > 1  # at a `part` declaration


def test_node_limit_counts_switches_and_nics_too(tmp_path):
    _fails_fast(tmp_path, "topology big() { gpu g[2]; switch s[100000]; nic h[100000]; }\n",
                "200,002 nodes", "COLLC_LIMIT_NODES", seconds=3)


def test_loop_of_ten_million_links(tmp_path):
    _fails_fast(tmp_path, topology_with("for i in 0..10000000 { link g[0] -> s bw 1 GB/s; }"),
                "COLLC_LIMIT_LOOP_ITERATIONS")


def test_nested_loops_of_links_stop_at_the_link_limit(tmp_path, monkeypatch):
    monkeypatch.setenv("COLLC_LIMIT_LINKS", "20000")  # the default takes a few seconds to reach
    _fails_fast(tmp_path, topology_with("for i in 0..10000 { for j in 0..10000 { link g[0] -> s bw 1 GB/s; } }"),
                "20,000 links", "COLLC_LIMIT_LINKS")


def test_nested_empty_loops_stop_at_the_iteration_limit(tmp_path, monkeypatch):
    monkeypatch.setenv("COLLC_LIMIT_LOOP_ITERATIONS", "200000")
    _fails_fast(tmp_path, topology_with("for i in 0..10000 { for j in 0..10000 { } }"), "200,000")


def test_environment_variable_raises_a_limit(tmp_path, monkeypatch):
    text = topology_with("for i in 0..3000 { }")
    monkeypatch.setenv("COLLC_LIMIT_LOOP_ITERATIONS", "1000")
    with pytest.raises(CollcError, match="1,000 loop iterations"):
        _check(tmp_path, text)
    monkeypatch.setenv("COLLC_LIMIT_LOOP_ITERATIONS", "5000")
    assert _check(tmp_path, text).topologies


def test_malformed_limit_variable_is_a_collc_error(monkeypatch):
    monkeypatch.setenv("COLLC_LIMIT_NODES", "lots")
    with pytest.raises(CollcError, match="COLLC_LIMIT_NODES"):
        limit("nodes")


def test_switch_of_100000_gpus_is_refused_quickly(collc):
    start = time.perf_counter()
    run = collc("compile", "--topology", "switch(n=100000)", "--collective", "allgather", "--size", "1MiB",
                "-o", "x.json")
    assert run.status == 1 and "COLLC_LIMIT_RANKS" in run.err
    assert time.perf_counter() - start < 10


def test_show_of_a_million_ranks_is_a_usage_error(collc):
    run = collc("show", "--collective", "allgather", "--ranks", "1000000")
    assert run.status == 2


def test_every_limit_is_documented():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "robustness.md").read_text(encoding="utf-8")
    for lim in LIMITS.values():
        assert lim.env_var in doc, lim.env_var
