"""Splitting the chunks of any collective (collc.synthesis.problem.refine, split)."""

from __future__ import annotations

from pathlib import Path

import pytest

import collc.frontend as fe
from collc.analysis.bounds import lower_bounds
from collc.ir.collective import ChunkId, Collective, CollectiveKind, alltoall, reducescatter, standard
from collc.synthesis.core import SynthesisOptions, synthesize
from collc.synthesis.problem import build_problem, refinable, refine
from collc.synthesis.network import Network
from collc.verify import verify
from topos import switch

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")


def _custom(inputs, outputs, chunks: int = 1) -> Collective:
    ins = tuple(tuple(frozenset((ChunkId(r, i),)) for i in range(n)) for r, n in enumerate(inputs))
    return Collective("mine", CollectiveKind.CUSTOM, len(inputs), chunks, ins, outputs)


def fan_out() -> Collective:
    """Rank 0's chunk 0 to ranks 1 and 2 (a multicast), chunk 1 to rank 3."""
    c = lambda i: frozenset((ChunkId(0, i),))
    outs = ((), (c(0),), (c(0),), (c(1),))
    return _custom([2, 0, 0, 0], outs, chunks=2)


def test_every_collective_is_refinable_and_the_standard_ones_keep_their_builder():
    assert refinable(fan_out())
    fine = refine(alltoall(4), 8)
    assert fine.inputs is standard("alltoall", 4, 8).inputs  # the standard builder's cached object


def test_a_custom_copy_collective_splits_into_pieces_with_the_same_destinations():
    fine = refine(fan_out(), 6)  # 3 pieces per slot
    assert fine.chunks == 6 and fine.kind is CollectiveKind.CUSTOM
    assert len(fine.inputs[0]) == 6
    assert fine.outputs[1] == tuple(frozenset((ChunkId(0, p),)) for p in range(3))
    assert fine.outputs[3] == tuple(frozenset((ChunkId(0, 3 + p),)) for p in range(3))
    p = build_problem(fine, Network(switch(4)), 6 << 20)
    assert p.slot_bytes == pytest.approx(1 << 20)  # a third of a 3 MiB slot
    assert sorted(c.demand for c in p.commodities) == [(1, 2)] * 3 + [(3,)] * 3


def test_a_count_that_is_not_a_multiple_is_refused():
    with pytest.raises(Exception, match="multiple of 2"):
        refine(fan_out(), 3)


def test_a_custom_reduction_splits_elementwise():
    """A reduction in the IR is an elementwise sum: piece p of a sum is the sum of the
    pieces p, with the same contributors."""
    rs = reducescatter(3)
    mine = Collective("rs", CollectiveKind.CUSTOM, rs.ranks, rs.chunks, rs.inputs, rs.outputs)
    fine = refine(mine, 2)
    assert fine.has_reduction and fine.chunks == 2
    assert fine.outputs[1] == (frozenset(ChunkId(s, 2) for s in range(3)), frozenset(ChunkId(s, 3) for s in range(3)))
    # the same postcondition the standard builder gives at that count
    assert fine.outputs == reducescatter(3, 2).outputs and fine.inputs == reducescatter(3, 2).inputs


def test_readme_fan_out_splits_over_every_nic(tmp_path):
    """The README's fan_out: chunk(0, 1) for the other server used to cross one NIC whole
    (4.5x the bound at 1 MiB); split and relayed through the other GPUs it crosses all four."""
    example = "// my_cluster.coll\n" + README.split("```\n// my_cluster.coll\n", 1)[1].split("```", 1)[0]
    (tmp_path / "my_cluster.coll").write_text(example)
    topo = fe.resolve_topology(f"{tmp_path}/my_cluster.coll:two_servers")
    coll = fe.resolve_collective(f"{tmp_path}/my_cluster.coll:fan_out", topo.num_ranks)
    big = synthesize(topo, coll, 64 << 20, SynthesisOptions(progress=False))
    verify(big.schedule, topo)
    assert big.chunks > coll.chunks
    assert big.estimate_s <= 1.05 * lower_bounds(topo, coll, 64 << 20).best_s
    small = synthesize(topo, coll, 1 << 20, SynthesisOptions(progress=False))
    bounds = lower_bounds(topo, coll, 1 << 20)
    # No schedule beats the cut bound with latency windows and late entry: three of the
    # four NICs are a hop (1.4 us) from rank 0, each byte must reach two GPUs behind the
    # other server's NICs (1.4 us apart), and bytes sent in the last 1.4 us must reach
    # each through its own NIC: 512 KiB <= 12.5 GB/s x ((T - 4.0) + 3 (T - 5.4) + 1.4) us
    # (docs/lower-bounds.md). 1.3x the bandwidth bound alone is below it.
    assert bounds.cut_latency_s == pytest.approx((524288 / 12.5e3 + 18.8) / 4 * 1e-6, rel=1e-6)
    assert bounds.cut_latency_s > 1.3 * bounds.best_s
    # Whole 32 KiB pieces take at least 16.10 us (the same page); 4 KiB pieces dealt by
    # latency, more of them to rank 0's NIC, come within 1.05 of the bound.
    verify(small.schedule, topo)
    assert small.estimate_s <= 1.05 * bounds.cut_latency_s
    assert small.estimate_s < 16.10e-6


def test_pieces_stay_32_kib_where_latency_does_not_decide():
    """A custom multicast on dgx1 at 16 MiB: the cut bound with latency is within 5% of
    the best bound, so its pieces stop at 32 KiB (finer ones only lengthen the compile);
    at 1 MiB latency decides and they go finer."""
    c = lambda i: frozenset((ChunkId(0, i),))
    outs = ((), (c(1),), (c(1),), (), (c(0),), (c(0),), (c(0),), (c(0),))
    spread = _custom([2, 0, 0, 0, 0, 0, 0, 0], outs, chunks=2)
    topo = fe.resolve_topology("dgx1")
    for size, smallest in ((16 << 20, 32 * 1024), (1 << 20, 4 * 1024)):
        result = synthesize(topo, spread, size, SynthesisOptions(progress=False))
        verify(result.schedule, topo)
        piece = size / result.schedule.collective.chunks
        bounds = lower_bounds(topo, spread, size)
        assert (bounds.cut_latency_s >= 1.05 * bounds.best_s) == (size == 1 << 20)
        assert smallest <= piece < 32 * 1024 or size != 1 << 20
        assert piece >= smallest


@pytest.mark.parametrize("std", [reducescatter(4), standard("reduce", 4, 1, 2)])
def test_a_custom_reduction_in_a_standard_form_is_split_and_composed(std):
    topo = fe.resolve_topology("switch(4)")
    mine = Collective("mine", CollectiveKind.CUSTOM, 4, std.chunks, std.inputs, std.outputs)
    result = synthesize(topo, mine, 16 << 20, SynthesisOptions(progress=False))
    verify(result.schedule, topo)
    assert result.schedule.collective.chunks > 1
    assert result.schedule.collective == refine(mine, result.schedule.collective.chunks)


def test_other_custom_reductions_are_refused_with_the_reason():
    """Splitting works for any sum (elementwise), but synthesis composes only the
    reductions it can reverse from an AllGather or Broadcast."""
    rs = reducescatter(4)
    partial = list(rs.outputs)
    partial[0] = (frozenset({ChunkId(1, 0), ChunkId(2, 0)}),)  # a sum over two ranks only
    mine = Collective("mine", CollectiveKind.CUSTOM, 4, 1, rs.inputs, tuple(partial))
    assert refine(mine, 2).has_reduction
    with pytest.raises(Exception, match="write other reductions as an algorithm"):
        synthesize(fe.resolve_topology("switch(4)"), mine, 1 << 20, SynthesisOptions(progress=False))


def test_the_classes_are_the_commodities_with_demand_by_class_key():
    from collc.synthesis.steady.solution import class_key

    problem = build_problem(refine(standard("allgather", 4), 3), Network(switch(4)), 1 << 20)
    by_key: dict[tuple, list[int]] = {}
    for k, c in enumerate(problem.commodities):
        if c.demand:
            by_key.setdefault(class_key(problem, k), []).append(k)
    assert problem.classes == by_key and len(by_key) == 4  # a class per source rank
    assert problem.classes is problem.classes  # grouped once
