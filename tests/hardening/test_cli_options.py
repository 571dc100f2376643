"""Every option validates its value (usage errors exit 2) and has help."""

from __future__ import annotations

import argparse

import pytest

from collc.cli import build_parser

from hardening_inputs import RING4, listing, write

ONE = RING4 + "compile allgather on t() size 1 MiB using ring;\n"


@pytest.mark.parametrize("argv", [
    ["compile", "p.coll", "--backend", "nccl", "-o", "o.json"],
    ["compile", "p.coll", "--time-limit", "nan", "-o", "o.json"],
    ["compile", "p.coll", "--time-limit", "inf", "-o", "o.json"],
    ["compile", "p.coll", "--time-limit", "0", "-o", "o.json"],
    ["compile", "p.coll", "--mip-gap", "nan", "-o", "o.json"],
    ["compile", "p.coll", "--mip-gap", "-0.1", "-o", "o.json"],
    ["compile", "p.coll", "--chunks", "0", "-o", "o.json"],
    ["compile", "p.coll", "--threads", "0", "-o", "o.json"],
    ["compile", "p.coll", "--seed", "-1", "-o", "o.json"],
    ["compile", "p.coll", "--instances", "0", "-o", "o.json"],
    ["compile", "p.coll", "--max-steps", "0", "-o", "o.json"],
    ["compile", "p.coll", "--channels", "-1", "-o", "o.json"],
    ["compile", "p.coll", "--proto", "LL256", "-o", "o.json"],
    ["compile", "p.coll", "-o", ""],
    ["verify", "x.xml", "--max-steps", "-1"],
    ["verify", "x.xml", "--fifo-capacity", "-1"],
    ["verify", "x.xml", "--fifo-capacity", "0"],
    ["show", "--collective", "allgather", "--ranks", "0"],
])
def test_bad_option_value_is_a_usage_error_and_writes_nothing(collc, tmp_path, argv):
    write(tmp_path / "p.coll", ONE)
    run = collc(*argv)
    assert run.status == 2, (argv, run.err)
    assert "usage:" in run.err
    assert listing(tmp_path) == ["p.coll"]


def test_every_option_has_help_and_backend_lists_choices():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name in ("check", "list", "show", "compile", "verify"):
        for action in sub.choices[name]._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"collc {name} {action.option_strings or action.dest} has no help"
    backend = next(a for a in sub.choices["compile"]._actions if "--backend" in a.option_strings)
    assert set(backend.choices) == {"json", "msccl-xml", "cupy"}


@pytest.mark.parametrize("text, expected", [("1M", 1 << 20), ("64K", 64 << 10), ("2G", 2 << 30),
                                            ("1MiB", 1 << 20), ("1MB", 10 ** 6), ("1.5M", 3 << 19)])
def test_size_takes_the_executors_binary_suffixes(text, expected):
    from collc.commands.compile import parse_sizes as _parse_sizes

    assert _parse_sizes(text) == [expected]


def test_size_of_1e99_is_refused_with_the_limit(collc, tmp_path):
    run = collc("compile", "--topology", "ring(4)", "--collective", "allgather", "--size", "1e99",
                "--algorithm", "ring", "-o", "o.json", "-q")
    assert run.status == 1 and "COLLC_LIMIT_SIZE_BYTES" in run.err
    assert listing(tmp_path) == []


def test_chunks_beyond_the_limit_are_refused_before_solving(collc, tmp_path):
    run = collc("compile", "--topology", "ring(4)", "--collective", "allgather", "--size", "1MiB",
                "--chunks", "100000000", "-o", "o.json", "-q")
    assert run.status == 1 and "COLLC_LIMIT_CHUNKS" in run.err
