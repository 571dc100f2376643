"""Independent work units on worker processes: every result, under its unit's index;
an error raised by a unit reaches the caller with its location."""

import pytest

from collc.diagnostics import CollcError, Span
from collc.parallel import run_units


def _square_or_fail(x: int) -> int:
    if x < 0:
        raise CollcError("negative", Span("units.txt", x + 10, 1))
    return x * x


@pytest.mark.parametrize("workers", [1, 2])
def test_every_unit_once_under_its_index(workers):
    seen = []
    results = dict(run_units(_square_or_fail, [(x,) for x in range(5)], workers,
                             progress=lambda done, total: seen.append((done, total))))
    assert results == {x: x * x for x in range(5)}
    assert seen == [(n, 5) for n in range(1, 6)]


def test_a_unit_error_keeps_its_location():
    with pytest.raises(CollcError) as e:
        dict(run_units(_square_or_fail, [(1,), (-3,)], 2))
    assert e.value.message == "negative" and e.value.span.line == 7
