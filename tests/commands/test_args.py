"""The commands' argument types: a value they refuse is a usage error naming the bound."""

from __future__ import annotations

import argparse

import pytest

from collc.commands.args import finite_float, int_at_least, path_text


def test_int_at_least_takes_whole_numbers_within_the_bounds():
    parse = int_at_least(1, 256)
    assert parse("1") == 1 and parse("256") == 256
    with pytest.raises(argparse.ArgumentTypeError, match="must be between 1 and 256, got 257"):
        parse("257")
    with pytest.raises(argparse.ArgumentTypeError, match="'1.5' is not a whole number"):
        parse("1.5")
    with pytest.raises(argparse.ArgumentTypeError, match="must be at least 0, got -1"):
        int_at_least(0)("-1")


def test_finite_float_refuses_infinities_and_an_open_lower_bound():
    assert finite_float(0, 1)("0.5") == 0.5
    with pytest.raises(argparse.ArgumentTypeError, match="greater than 0, got 0"):
        finite_float(0, lo_open=True)("0")
    with pytest.raises(argparse.ArgumentTypeError, match="at least 0 and at most 1, got inf"):
        finite_float(0, 1)("inf")
    with pytest.raises(argparse.ArgumentTypeError, match="'x' is not a number"):
        finite_float(0)("x")


def test_a_blank_path_names_no_file():
    assert path_text("out.json") == "out.json"
    with pytest.raises(argparse.ArgumentTypeError, match="an empty path names no file"):
        path_text("  ")
