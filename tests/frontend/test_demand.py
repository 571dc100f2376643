"""Demand matrices (collc.frontend.demand): parsing, bad input, the collective they make."""

from __future__ import annotations

import numpy as np
import pytest

from collc.analysis.bounds import lower_bounds
from collc.diagnostics import CollcError
from collc.frontend.demand import (
    ROUNDING, demand_collective, direct_schedule, padded_alltoall, parse_demand, read_demand,
)
from collc.frontend import resolve_topology
from collc.synthesis.core import synthesize
from collc.synthesis.options import SynthesisOptions
from collc.verify import verify


def test_bytes_shares_comments_and_blanks():
    text = "# bytes rank i sends rank j\n0, 10, 20\n\n30 0 0  # blanks separate too\n0,0,0\n"
    m = parse_demand(text, "m.csv", 3)
    assert m.tolist() == [[0, 10, 20], [30, 0, 0], [0, 0, 0]]
    shares = parse_demand("0,0.5\n0.25,0\n", "m.csv", 2, size_bytes=1 << 20)
    assert shares.tolist() == [[0, 1 << 19], [1 << 18, 0]]


@pytest.mark.parametrize("text, ranks, size, message, line, column", [
    ("0,1,2\n3,0,4\n", 3, None, "not square: 2 rows of 3", 2, 1),
    ("0,1\n3,0,4\n", 2, None, "row 2 of the demand matrix has 3 entries", 2, 1),
    ("0,1\n-3,0\n", 2, None, "negative", 2, 1),
    ("0,1\n3, nan\n", 2, None, "not a finite number", 2, 4),
    ("0,1\n3,inf\n", 2, None, "not a finite number", 2, 3),
    ("0,x\n3,0\n", 2, None, "'x' is not a number", 1, 3),
    ("0,1\n1,0\n", 4, None, "2 x 2, but the topology has 4 GPUs", 1, 1),
    ("5,0\n0,7\n", 2, None, "moves nothing between GPUs", 1, 1),
    ("# nothing\n", 2, None, "empty", 1, 1),
    ("0,2\n1,0\n", 2, 1024, "above 1: with a size given, entries are shares", 1, 3),
])
def test_bad_input_is_a_located_error(text, ranks, size, message, line, column):
    with pytest.raises(CollcError, match=message) as err:
        parse_demand(text, "m.csv", ranks, size)
    span = err.value.span
    assert (span.file, span.line, span.column) == ("m.csv", line, column)


def test_an_unreadable_file_is_an_error(tmp_path):
    with pytest.raises(CollcError, match="cannot read demand matrix"):
        read_demand(tmp_path / "missing.csv", 2)


def _delivered(coll, i, j) -> int:
    """Slots of rank i's input that rank j's output holds."""
    mine = {c for v in coll.inputs[i] for c in v}
    return sum(1 for v in coll.outputs[j] if v is not None and next(iter(v)) in mine)


def test_the_collective_rounds_every_entry_up_to_whole_slots():
    rng = np.random.default_rng(3)
    m = rng.integers(0, 1 << 20, size=(6, 6)).astype(float)
    m[2, :] = 0  # a rank that sends nothing
    m[:, 4] = 0  # a rank that receives nothing
    d = demand_collective(m)
    coll = d.collective
    assert coll.inputs[2] == () and coll.outputs[4] == ()
    for i in range(6):
        for j in range(6):
            assert _delivered(coll, i, j) * d.slot_bytes >= m[i, j]
    assert 0 <= d.rounding <= ROUNDING
    assert coll.demand == tuple((i, j, m[i, j]) for i in range(6) for j in range(6) if m[i, j] > 0)
    assert coll.slot_bytes(d.size_bytes) == pytest.approx(d.slot_bytes)


def test_a_single_entry_is_synthesized_at_its_bound():
    topo = resolve_topology("switch(4)")
    m = np.zeros((4, 4))
    m[1, 3] = 3e6
    d = demand_collective(m)
    result = synthesize(topo, d.collective, d.size_bytes, SynthesisOptions(progress=False))
    verify(result.schedule, topo)
    bound = lower_bounds(topo, d.collective, d.size_bytes)
    assert bound.best_s == pytest.approx(3e6 / topo.link("g[1]", "sw").capacity)
    assert result.estimate_s <= 1.05 * bound.cut_latency_s


def test_direct_schedule_sends_each_block_in_one_op():
    m = np.array([[0, 4, 0], [1, 0, 2], [0, 0, 5.0]])
    coll = demand_collective(m).collective
    sched = direct_schedule(coll, resolve_topology("switch(3)"))
    verify(sched, resolve_topology("switch(3)"))
    assert [(op.src.rank, op.dst.rank) for op in sched.ops if op.is_transfer] == [(0, 1), (1, 0), (1, 2)]


def test_padded_alltoall_has_equal_blocks_of_the_largest():
    m = np.array([[0, 4, 1], [1, 0, 2], [3, 0, 0.0]])
    padded = padded_alltoall(m)
    assert padded.collective.kind.value == "alltoall" and padded.size_bytes == 12


def test_1024_ranks_sparse():
    n = 1024
    m = np.zeros((n, n))
    m[np.arange(n), (np.arange(n) + 1) % n] = 1 << 20  # a shift: one block per rank
    d = demand_collective(m)
    assert len(d.collective.inputs[0]) == 1 and d.rounding == 0


def test_direct_schedule_relays_where_no_switch_joins_two_gpus():
    """dgx_h100(nodes=2): GPU 0 reaches node 1's GPU 1 only through a GPU; the block
    goes as NCCL's PXN sends it, over NVLink to GPU 1 of its own node, then the rail."""
    topo = resolve_topology("dgx_h100(nodes=2)")
    m = np.zeros((16, 16))
    m[0, 9] = 1 << 20
    sched = direct_schedule(demand_collective(m).collective, topo)
    verify(sched, topo)
    assert [(op.src.rank, op.dst.rank) for op in sched.ops] == [(0, 1), (1, 9)]
