"""collc.units: sizes, times and bandwidths parsed and written in the language's units."""

from __future__ import annotations

import pytest

from collc import units
from collc.diagnostics import CollcError, Span
from collc.units import (
    BANDWIDTH, SIZE, TIME, format_bandwidth, format_bytes, format_time, parse_bandwidth, parse_quantity,
    parse_size, parse_size_list, parse_size_range, parse_time,
)


@pytest.mark.parametrize("text, expected", [
    ("1024", 1024), ("0", 0), ("1MiB", 2 ** 20), ("64 KiB", 64 << 10), ("256MB", 256_000_000),
    ("1KB", 1000), ("2GB", 2 * 10 ** 9), ("1TiB", 2 ** 40), ("3 B", 3),
    # nccl-tests' short forms are powers of 1024: 1M is 1 MiB, not 1 MB
    ("1M", 2 ** 20), ("64K", 64 << 10), ("2G", 2 << 30), ("1T", 2 ** 40), ("1.5M", 3 << 19), ("1 M", 2 ** 20),
    ("1e3", 1000), ("1.5e3", 1500), ("0.5 KiB", 512), (" 4MiB ", 4 << 20),
])
def test_sizes_in_the_language_units_and_the_nccl_tests_shorthand(text, expected):
    assert parse_size(text) == expected


def test_the_shorthand_is_only_for_sizes():
    with pytest.raises(CollcError, match="unknown unit 'M'"):
        parse_time("1M")


@pytest.mark.parametrize("text, message", [
    ("abc", "cannot read 'abc' as a size such as `64 MiB`"),
    ("-1", "cannot read '-1'"),
    ("64 MiB extra", "cannot read"),
    ("", "cannot read"),
    ("1.5 B", "a size must be a whole number of bytes, got 1.5 B"),
    ("5 us", "expected a size such as `64 MiB`, got a time (5 us)"),
    ("1 GB/s", "expected a size such as `64 MiB`, got a bandwidth (1 GB/s)"),
    ("1 Mi", "unknown unit 'Mi' in '1 Mi': a size takes B, KB, MB, GB, TB, KiB, MiB, GiB, TiB, K, M, G, T"),
    ("512mb", "unknown unit 'mb'"),  # case matters in the language: `Mb/s` is megabits
])
def test_bad_sizes_are_clear_errors(text, message):
    with pytest.raises(CollcError) as info:
        parse_size(text)
    assert message in info.value.message


def test_errors_are_located_in_the_text_and_at_the_caller_span():
    with pytest.raises(CollcError) as info:
        parse_size("64 XB")
    assert (info.value.span.file, info.value.span.line, info.value.span.column, info.value.span.end_column) == \
        ("<size>", 1, 4, 6)
    with pytest.raises(CollcError) as info:
        parse_size("64 XB", Span("<--size>", 1, 10))
    assert (info.value.span.file, info.value.span.column, info.value.span.end_column) == ("<--size>", 13, 15)


def test_ignore_case_reads_every_size_spelling_harvest_took():
    for text, expected in [("512m", 512 << 20), ("2gib", 2 << 30), ("8b", 8), ("1kib", 1024), ("512MB", 512 * 10 ** 6),
                           ("1E3", 1000), (".5G", 1 << 29)]:
        assert parse_quantity(text, SIZE, ignore_case=True) == expected, text
    with pytest.raises(AssertionError):  # `Mb/s` and `MB/s` differ by a factor of 8
        parse_quantity("1 gb/s", BANDWIDTH, ignore_case=True)


def test_times_and_bandwidths():
    assert parse_time("5 us") == pytest.approx(5e-6)
    assert parse_time("1.2ms") == pytest.approx(1.2e-3)
    assert parse_time("2") == 2.0
    assert parse_bandwidth("25 GB/s") == 25e9
    assert parse_bandwidth("100 Gbit/s") == parse_bandwidth("100 Gb/s") == 12.5e9
    with pytest.raises(CollcError, match="expected a bandwidth such as `25 GB/s`, got a size \\(1 GiB\\)"):
        parse_bandwidth("1 GiB")
    with pytest.raises(CollcError, match="too large"):
        parse_time("1e400 s")


def test_units_agree_with_the_language():
    from collc.frontend.values import UNITS as LANGUAGE_UNITS

    assert LANGUAGE_UNITS is units.UNITS
    assert units.UNITS["MB"] == (1e6, SIZE) and units.UNITS["MiB"] == (2 ** 20, SIZE)
    assert units.units_of(TIME) == ["s", "ms", "us", "ns"]


def test_size_lists_and_ranges_are_located_by_column():
    assert parse_size_list("1MiB, 4MiB,64M", "<--size>") == [1 << 20, 4 << 20, 64 << 20]
    with pytest.raises(CollcError) as info:
        parse_size_list("1MiB, 4XB", "<--size>")
    assert (info.value.span.file, info.value.span.column) == ("<--size>", 8)
    assert parse_size_range("0:1MiB", "<--size-range>") == (0, 1 << 20)
    assert parse_size_range(":", "<--size-range>") == (0, 0)
    with pytest.raises(CollcError) as info:
        parse_size_range("1MiB:2XB", "<--size-range>")
    assert info.value.span.column == 7
    with pytest.raises(ValueError, match="--size-range takes MIN:MAX"):
        parse_size_range("1MiB", "<--size-range>")


def test_a_caller_adds_its_own_limit_through_parse_one():
    def at_most_1k(text: str, span: Span) -> int:
        n = parse_size(text, span)
        if n > 1024:
            raise CollcError("too big", span)
        return n

    assert parse_size_list("1K", "<--size>", at_most_1k) == [1024]
    with pytest.raises(CollcError, match="too big"):
        parse_size_list("1K,2K", "<--size>", at_most_1k)


@pytest.mark.parametrize("n, exact, rounded", [
    (0, "0 B", "0 B"), (1000, "1 KB", "1000 B"), (1024, "1 KiB", "1 KiB"), (1536, "1536 B", "1.5 KiB"),
    (64 << 20, "64 MiB", "64 MiB"), (256_000_000, "250000 KiB", "244.1 MiB"), (3 * 10 ** 9, "3 GB", "2.8 GiB"), (2 ** 42, "4 TiB", "4 TiB"),
    (2 ** 50, "1024 TiB", "1024 TiB"), (1.5, "1.5 B", "2 B"),
])
def test_bytes_written_exactly_or_rounded(n, exact, rounded):
    assert format_bytes(n) == exact
    assert format_bytes(n, exact=False) == rounded


def test_times_and_bandwidths_written():
    assert format_time(1.2e-3) == "1.2 ms"
    assert format_time(7e-7) == "0.7 us"  # from 0.1 us, microseconds
    assert format_time(5e-8) == "50 ns"
    assert format_time(3) == "3 s"
    assert format_bandwidth(25e9) == "25 GB/s"
    assert format_bandwidth(12.5e9) == "12.5 GB/s"


def test_written_sizes_read_back():
    for n in (1, 1000, 1024, 3 << 20, 256_000_000, 5 * 2 ** 40):
        assert parse_size(format_bytes(n)) == n


def test_the_compiler_reads_every_plain_size_as_units_does():
    from collc.frontend import parse_size as compiler_parse_size

    for text in ("1024", "1MiB", "64 KiB", "256MB", "1KB", "1M", "64K", "2G", "1.5M", "1e3", "0.5 KiB", "10 TB"):
        assert compiler_parse_size(text) == parse_size(text), text
    for text in ("5 us", "1.5 B", "1 GB/s"):
        assert _message(compiler_parse_size, text) == _message(parse_size, text), text


def _message(parse, text: str) -> str:
    with pytest.raises(CollcError) as info:
        parse(text)
    return info.value.message
