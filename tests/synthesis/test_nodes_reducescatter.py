"""ReduceScatter over identical nodes (collc.synthesis.nodes_reducescatter): rows summed
inside each node, rings along the rails."""

from __future__ import annotations

import pytest

from collc.analysis.bounds import lower_bounds
from collc.analysis.simulate import simulate
from collc.diagnostics import CollcError
from collc.ir.collective import standard
from collc.ir.schedule import Buffer, Loc, Op, OpKind
from collc.synthesis.core import synthesize
from collc.synthesis.nodes import node_groups, reducescatter_wins, wanted
from collc.synthesis.nodes_reducescatter import own_add_after, rail_chunks_for, received_first, row_order
from collc.synthesis.options import SynthesisOptions
from topos import dgx_h100, switch

GIB = 1 << 30
# Below the flat composition's 2 R (R - 1) ops at its best on 64 ranks (8,064): it
# chains its partial sums in lanes.
TIGHT = 8000


@pytest.fixture(scope="module")
def h8():
    return dgx_h100(nodes=8)


@pytest.fixture(scope="module")
def over_nodes(h8):
    coll = standard("reducescatter", h8.num_ranks, 1)
    return synthesize(h8, coll, GIB, SynthesisOptions(progress=False, max_ops=TIGHT, nodes="on"))


def test_each_node_sums_its_rows_in_the_order_its_ring_needs_them():
    assert row_order(0, 4) == [3, 2, 1, 0]
    assert row_order(2, 4) == [1, 0, 3, 2]
    assert rail_chunks_for(128) == 2 and rail_chunks_for(4) == 8 and rail_chunks_for(128, chunks=3) == 3


def test_auto_keeps_the_flat_composition_where_the_fill_costs_more(h8):
    # On 8 nodes the pipeline's fill is about 0.6 of 7 ring steps (1.081 of the bound),
    # where the flat composition at the MSCCL budget gave 1.029.
    coll = standard("reducescatter", h8.num_ranks, 1)
    assert wanted(h8, coll, SynthesisOptions(max_ops=TIGHT)) is None
    assert wanted(h8, coll, SynthesisOptions(max_ops=TIGHT, nodes="on")) is not None


def test_auto_composes_over_nodes_from_24_nodes_on():
    # 16 nodes: 1.038 over nodes, 1.027 flat; 32 nodes: 1.019 against 1.027.
    assert [n for n in (2, 8, 16, 23, 24, 32, 128) if reducescatter_wins(n)] == [24, 32, 128]


def test_each_accumulator_starts_with_a_received_transfer(over_nodes):
    # A local op that waits for nothing takes an MSCCL threadblock without peers, one
    # step per row: 71 steps on 64 nodes, over the 64 a threadblock runs.
    waiting = [op for op in over_nodes.schedule.ops if not op.is_transfer and not op.deps]
    assert waiting == []


def test_received_first_swaps_the_own_copy_behind_the_first_transfer():
    own = Op(0, OpKind.COPY, Loc(0, Buffer.INPUT, 0), Loc(0, Buffer.OUTPUT, 0))
    first = Op(1, OpKind.REDUCE, Loc(1, Buffer.INPUT, 0), Loc(0, Buffer.OUTPUT, 0), deps=(0,), step=1)
    second = Op(2, OpKind.REDUCE, Loc(2, Buffer.INPUT, 0), Loc(0, Buffer.OUTPUT, 0), deps=(1,), step=2)
    ops = received_first((own, first, second))
    assert [(op.kind, op.src, op.deps) for op in ops] == [
        (OpKind.COPY, first.src, ()), (OpKind.REDUCE, own.src, (0,)), (OpKind.REDUCE, second.src, (1,))]
    # A copy something else also reads stays as it is.
    reader = Op(3, OpKind.COPY, Loc(0, Buffer.OUTPUT, 0), Loc(3, Buffer.SCRATCH, 0), deps=(0,))
    assert received_first((own, first, reader)) == (own, first, reader)


def test_over_nodes_beats_the_flat_composition_at_one_chunk_per_rank(h8, over_nodes):
    # Within this budget the flat composition chains its partial sums in 3 lanes:
    # 1.114 of the bound (the code before this composition). Over the nodes: 1.081,
    # the rest the pipeline's fill (a node sums two rows while its ring sends one).
    # synthesize verifies the schedule.
    coll = standard("reducescatter", h8.num_ranks, 1)
    facts = over_nodes.facts["over_nodes"]
    assert facts["nodes"] == 8 and facts["gpus_per_node"] == 8 and facts["rail_chunks"] == 4
    assert over_nodes.estimate_s / lower_bounds(h8, coll, GIB).best_s < 1.09
    assert simulate(over_nodes.schedule, h8, GIB).time_s == pytest.approx(over_nodes.estimate_s, rel=1e-9)


def test_rails_carry_only_ring_hops_and_every_output_ends_in_place(h8, over_nodes):
    groups = node_groups(h8)
    rail_of = {r: l for node in groups.ranks for l, r in enumerate(node)}
    node_of = {r: n for n, node in enumerate(groups.ranks) for r in node}
    for op in over_nodes.schedule.ops:
        if op.is_transfer and node_of[op.src.rank] != node_of[op.dst.rank]:
            assert rail_of[op.src.rank] == rail_of[op.dst.rank]
            assert node_of[op.dst.rank] == (node_of[op.src.rank] + 1) % groups.count
    writes = {(op.dst.rank, op.dst.index) for op in over_nodes.schedule.ops if op.dst.buffer is Buffer.OUTPUT}
    assert writes == {(r, j) for r in range(h8.num_ranks) for j in range(4)}
    assert any(op.kind is OpKind.REDUCE and not op.is_transfer for op in over_nodes.schedule.ops)  # landings


def test_nodes_on_needs_nodes():
    coll = standard("reducescatter", 4, 1)
    with pytest.raises(CollcError, match="do not form two or more nodes"):
        synthesize(switch(4), coll, GIB, SynthesisOptions(progress=False, nodes="on"))


def test_own_add_after_moves_the_add_behind_a_later_sum():
    acc = Loc(0, Buffer.OUTPUT, 0)
    ops = received_first((
        Op(0, OpKind.COPY, Loc(0, Buffer.INPUT, 0), acc),
        Op(1, OpKind.REDUCE, Loc(1, Buffer.INPUT, 0), acc, deps=(0,)),
        Op(2, OpKind.REDUCE, Loc(2, Buffer.INPUT, 0), acc, deps=(1,)),
        Op(3, OpKind.REDUCE, Loc(3, Buffer.INPUT, 0), acc, deps=(2,))))
    assert own_add_after(ops, 0) == ops
    moved = own_add_after(ops, 1)
    # The copy from rank 1, the sum from rank 2, the own input, the sum from rank 3.
    assert [(op.src.rank, op.deps) for op in moved] == [(1, ()), (2, (0,)), (0, (1,)), (3, (2,))]
    assert own_add_after(ops, 2) == ops  # nothing after the last sum to put it before
