"""The standard library's algorithms produce verified schedules, and every standard
library file passes `check_file`."""

from __future__ import annotations

import time

import pytest

import collc.frontend as fe
from collc.ir.schedule import OpKind
from collc.verify import verify


@pytest.mark.parametrize("coll", ["allgather", "reducescatter", "allreduce"])
@pytest.mark.parametrize("n", [2, 3, 4, 8])
@pytest.mark.parametrize("chunks", [1, 2])
def test_ring_algorithms_verify(coll, n, chunks):
    topo = fe.resolve_topology(f"ring(n={n})")
    collective = fe.resolve_collective(f"{coll}(chunks={chunks})", n)
    sched = fe.instantiate_algorithm("ring", topo, collective)
    verify(sched, topo)
    transfers = [op for op in sched.ops if op.is_transfer]
    # Every transfer goes to the next GPU of the ring, over a direct link.
    assert all((topo.gpu(op.src.rank).name, topo.gpu(op.dst.rank).name) in topo.link_map for op in transfers)
    per_slot = {"allgather": n - 1, "reducescatter": n - 1, "allreduce": 2 * (n - 1)}[coll]
    assert len(transfers) == per_slot * n * chunks
    if coll != "allgather":
        assert any(op.kind is OpKind.REDUCE for op in transfers)


def test_ring_allgather_on_dgx1_stays_on_nvlink():
    topo = fe.resolve_topology("dgx1")
    sched = fe.instantiate_algorithm("ring", topo, fe.resolve_collective("allgather(chunks=2)", 8))
    assert sched.num_steps == 7
    for op in sched.ops:
        if op.is_transfer:
            assert topo.link(topo.gpu(op.src.rank).name, topo.gpu(op.dst.rank).name).multiplicity == 2


@pytest.mark.parametrize("coll", ["broadcast", "reduce"])
@pytest.mark.parametrize("n, root", [(2, 1), (3, 0), (5, 3), (8, 6)])
@pytest.mark.parametrize("chunks", [1, 2])
def test_tree_algorithms_verify(coll, n, root, chunks):
    topo = fe.resolve_topology(f"switch(n={n})")
    sched = fe.instantiate_algorithm("tree", topo, fe.resolve_collective(f"{coll}(chunks={chunks}, root={root})", n))
    verify(sched, topo)
    depth = (n).bit_length()  # tree depth + 1 for the local copies
    assert sched.num_steps <= depth + 1


@pytest.mark.parametrize("dotted", sorted(fe.stdlib_modules()))
def test_every_stdlib_file_passes_check_file(dotted):
    summary = fe.check_file(fe.stdlib_modules()[dotted])
    assert "needs arguments" not in str(summary)
    assert "verified at ranks none" not in str(summary)


def test_checking_the_whole_stdlib_is_fast():
    fe.clear_caches()
    t = time.perf_counter()
    for path in fe.stdlib_modules().values():
        fe.check_file(path)
    # bench/bench_frontend.py measures it properly; this guards against regressions
    # of an order of magnitude on a loaded machine.
    assert time.perf_counter() - t < 5.0


@pytest.mark.parametrize("n, chunks", [(2, 1), (5, 2), (8, 1)])
def test_direct_alltoall_sends_every_block_straight_to_its_owner(n, chunks):
    topo = fe.resolve_topology(f"switch(n={n})")
    sched = fe.instantiate_algorithm("direct", topo, fe.resolve_collective(f"alltoall(chunks={chunks})", n))
    verify(sched, topo)
    assert len(sched.ops) == n * n * chunks and sched.num_steps == 1  # all in flight at once
    assert all(op.dst.index == op.src.rank * chunks + op.src.index % chunks for op in sched.ops)


def test_direct_alltoall_is_refused_where_a_pair_has_no_switch_path():
    # dgx1 is a GPU mesh: g[0] and g[5] share no link and no switch (NCCL relays there).
    from collc.diagnostics import CollcError

    with pytest.raises(CollcError, match="no path joins them through switches"):
        fe.instantiate_algorithm("direct", fe.resolve_topology("dgx1"), fe.resolve_collective("alltoall", 8))
