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


def _pid_and_square(x: int) -> tuple[int, int]:
    import os

    return os.getpid(), x * x


def _fail_in_child_only(parent: int) -> int:
    import os

    if os.getpid() != parent:
        raise RuntimeError("only in the child")
    return 7


def _unpicklable(parent: int):
    import os
    import threading

    return threading.Lock() if os.getpid() != parent else "made here"


def _raise_collc_error() -> None:
    raise CollcError("no such thing", Span("a.coll", 3, 4))


def _sleep_long() -> int:
    import time

    time.sleep(60)
    return 1


def _cpus(n: int):
    return lambda: n


def test_work_in_a_child_gives_its_value_from_another_process(monkeypatch):
    import os

    from collc import parallel

    monkeypatch.setattr(parallel, "local_workers", _cpus(2))
    child = parallel.in_child(_pid_and_square, 9)
    assert child is not None
    pid, value = child.result()
    assert value == 81 and pid != os.getpid()
    assert child.result() == (pid, 81)  # kept, not asked of the child again


def test_what_the_child_cannot_give_is_computed_here_with_its_own_error(monkeypatch):
    import os

    from collc import parallel

    monkeypatch.setattr(parallel, "local_workers", _cpus(2))
    # It raised in the child (only there): this process computes it and gets the value.
    assert parallel.in_child(_fail_in_child_only, os.getpid()).result() == 7
    # Its value would not pickle: computed here.
    assert parallel.in_child(_unpicklable, os.getpid()).result() == "made here"
    # An error it raises anyway reaches the caller as a call here raises it, location and all.
    with pytest.raises(CollcError) as e:
        parallel.in_child(_raise_collc_error).result()
    assert e.value.message == "no such thing" and e.value.span.line == 3


def test_a_cancelled_child_stops_at_once(monkeypatch):
    import multiprocessing
    import time

    from collc import parallel

    monkeypatch.setattr(parallel, "local_workers", _cpus(2))
    child = parallel.in_child(_sleep_long)
    t0 = time.monotonic()
    child.cancel()
    assert time.monotonic() - t0 < 5 and not multiprocessing.active_children()


def test_no_child_on_one_cpu_or_beside_other_threads(monkeypatch):
    import threading

    from collc import parallel

    monkeypatch.setattr(parallel, "local_workers", _cpus(1))
    assert parallel.in_child(_pid_and_square, 2) is None
    monkeypatch.setattr(parallel, "local_workers", _cpus(2))
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert parallel.in_child(_pid_and_square, 2) is None
    finally:
        stop.set()
        other.join()


def _child_from_a_daemon(writer) -> None:
    from collc import parallel

    parallel.local_workers = _cpus(2)  # this process's own copy of the module
    writer.send(parallel.in_child(_pid_and_square, 3) is None)


def test_a_daemon_process_starts_no_child():
    # multiprocessing.Pool's workers (and any daemon process) may not have children.
    import multiprocessing

    context = multiprocessing.get_context("fork")
    reader, writer = context.Pipe(duplex=False)
    daemon = context.Process(target=_child_from_a_daemon, args=(writer,), daemon=True)
    daemon.start()
    answered = reader.poll(30)  # a daemon that tried to start a child fails without a word
    daemon.join()
    assert answered and reader.recv() is True
