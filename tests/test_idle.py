"""Idle work: done once, in a wait or when asked for; errors reach whoever asks."""

from __future__ import annotations

import pytest

from collc import idle


def test_work_runs_once_in_an_idle_turn_and_its_result_is_kept():
    calls: list[int] = []
    with idle.idle_queue():
        first = idle.defer(lambda: calls.append(1) or "one")
        second = idle.defer(lambda: calls.append(2) or "two")
        assert idle.pending()
        assert idle.run_one() and calls == [1]
        assert second.result() == "two" and calls == [1, 2]  # asked for before its turn: done then
        assert not idle.pending() and not idle.run_one()  # the queue skips work already done
        assert first.result() == "one" and calls == [1, 2]


def test_an_error_is_raised_where_the_result_is_asked_for():
    def broken() -> None:
        raise ValueError("no baseline")

    with idle.idle_queue():
        deferred = idle.defer(broken)
        assert idle.run_one()  # the idle turn itself does not raise
        with pytest.raises(ValueError, match="no baseline"):
            deferred.result()


def test_outside_a_block_nothing_is_queued_and_work_left_in_a_block_is_dropped():
    calls: list[str] = []
    outside = idle.defer(lambda: calls.append("outside"))
    assert not idle.pending()
    with idle.idle_queue():
        idle.defer(lambda: calls.append("left"))
    assert not idle.pending() and calls == []
    outside.result()
    assert calls == ["outside"]
