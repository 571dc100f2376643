"""Work begun on a MILP's incumbents: the product is always the final answer's."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from collc.synthesis.ahead import Steps, finish, solve_ahead
from collc.synthesis.solver import Outcome, Result


def _result(values: list[float]) -> Result:
    return Result(Outcome.OPTIMAL, np.array(values), values[0], values[0], 0.0, 0.0)


class _Recorder:
    """A work function that records which keys it was begun and finished on."""

    def __init__(self, fail_on: int | None = None):
        self.begun: list[int] = []
        self.finished: list[int] = []
        self.optional: list[int] = []
        self.fail_on = fail_on

    def __call__(self, key: int) -> Steps[str]:
        self.begun.append(key)
        yield
        if key == self.fail_on:
            raise ValueError(f"no work for {key}")
        if (yield):
            self.optional.append(key)
        self.finished.append(key)
        return f"product of {key}"


def _busy(seconds: float, until: threading.Event | None = None) -> None:
    """Spend `seconds` of this thread's CPU time (as a solver does), or less once
    `until` is set."""
    end = time.thread_time() + seconds
    while time.thread_time() < end and not (until is not None and until.is_set()):
        pass


def _solver(incumbents: list[list[float]], final: list[float], release: threading.Event | None = None,
            gap_s: float = 0.0):
    """A solve that reports `incumbents`, `gap_s` of its CPU time apart, then works on
    (until `release` is set, 5 s at most) and returns `final`."""

    def solve(on_incumbent) -> Result:
        for i, values in enumerate(incumbents):
            if i:
                _busy(gap_s)
            on_incumbent(values)
        if release is not None:
            _busy(5.0, release)
        return _result(final)

    return solve


def test_finish_skips_the_optional_step():
    work = _Recorder()
    assert finish(work(3)) == "product of 3"
    assert work.optional == []


def _key_of(values) -> int:
    return int(values[0])


def _releasing(work: _Recorder, release: threading.Event):
    """`work`, then `release` set: the test's solver goes on until its work is done."""
    def work_then_release(key: int) -> Steps[str]:
        product = yield from work(key)
        release.set()
        return product
    return work_then_release


def test_work_begun_on_the_final_incumbent_is_kept():
    work = _Recorder()
    release = threading.Event()
    work_then_release = _releasing(work, release)

    result, key, product = solve_ahead(_solver([[1.0], [2.0]], [2.0], release), _key_of,
                                       lambda res: _key_of(res.values), work_then_release)
    assert (key, product) == (2, "product of 2")
    assert work.begun.count(2) == 1  # not done again after the solve
    assert result.objective == 2.0


def test_incumbents_in_quick_succession_are_not_begun_on():
    work = _Recorder()
    release = threading.Event()
    work_then_release = _releasing(work, release)

    _, key, product = solve_ahead(_solver([[1.0], [2.0], [3.0]], [3.0], release, gap_s=0.02), _key_of,
                                  lambda res: _key_of(res.values), work_then_release, settle_s=0.1)
    assert work.begun == [3] and product == "product of 3"
    assert work.optional == [3]  # done while the solve still ran


def test_work_on_an_incumbent_that_is_not_the_answer_is_done_again():
    work = _Recorder()
    _, key, product = solve_ahead(_solver([[1.0]], [4.0]), _key_of, lambda res: _key_of(res.values), work)
    assert (key, product) == (4, "product of 4")
    assert work.finished[-1] == 4


def test_an_error_ahead_on_a_discarded_incumbent_does_not_reach_the_caller():
    work = _Recorder(fail_on=1)
    _, key, product = solve_ahead(_solver([[1.0]], [5.0]), _key_of, lambda res: _key_of(res.values), work)
    assert product == "product of 5"


def test_an_error_of_the_final_work_and_of_the_solve_reach_the_caller():
    with pytest.raises(ValueError, match="no work for 6"):
        solve_ahead(_solver([[6.0]], [6.0]), _key_of, lambda res: _key_of(res.values), _Recorder(fail_on=6))

    def broken(on_incumbent) -> Result:
        raise RuntimeError("solver broke")

    with pytest.raises(RuntimeError, match="solver broke"):
        solve_ahead(broken, _key_of, lambda res: _key_of(res.values), _Recorder())


def test_idle_work_is_done_while_waiting_and_changes_nothing():
    from collc import idle

    done: list[str] = []
    release = threading.Event()
    work = _Recorder()
    with idle.idle_queue():
        import_like = idle.defer(lambda: done.append("imports") or "loaded")
        idle.defer(lambda: done.append("baselines"))
        result, key, product = solve_ahead(_solver([[1.0], [2.0]], [2.0], release), _key_of,
                                           lambda res: _key_of(res.values), _releasing(work, release))
        assert done == ["imports", "baselines"]  # both in the wait, before the work was asked for
        assert import_like.result() == "loaded" and done == ["imports", "baselines"]
    assert (key, product) == (2, "product of 2") and work.begun.count(2) == 1
