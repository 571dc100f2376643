"""The direct AllReduce (collc.synthesis.direct): reduction and gathering trees from one
rate LP, pipelined together, kept where it beats the composition.

dgx2(chassis=2) is the case it is for: its InfiniBand links enter only even GPUs, so
the composition (each half alone at the AllGather's bound) takes 1.05 x the AllReduce's
bound, while one LP for both halves reaches the bound."""

from __future__ import annotations

from dataclasses import replace

import pytest

from collc.analysis.bounds import lower_bounds
from collc.backends import BackendOptions
from collc.backends.msccl_xml.limits import resident_threadblocks
from collc.backends.msccl_xml.lowering import lower
from collc.backends.msccl_xml.verify import verify_algo
from collc.analysis.simulate import simulate
from collc.ir.collective import standard
from collc.synthesis import direct
from collc.synthesis.candidates import problem_for, to_result
from collc.passes.base import CompileUnit
from collc.synthesis.core import synthesize
from collc.synthesis.network import Network, reversed_topology
from collc.synthesis.options import Method, SynthesisOptions
from collc.synthesis.progress import Progress
from collc.synthesis.solver import Deadline
from collc.synthesis.steady.pipelining import paced_transfers
from collc.verify import verify
from topos import dgx1, stdlib

GIB = 1 << 30
OPTIONS = SynthesisOptions(progress=False)


@pytest.fixture(scope="module")
def dgx2():
    topo = stdlib("dgx2(chassis=2)")
    coll = standard("allreduce", topo.num_ranks, 1)
    forward, backward = Network(topo), Network(reversed_topology(topo))
    rates = direct.joint_rates(forward, backward, coll, GIB, OPTIONS, Deadline(600), Progress(False))
    rates = direct.with_own_rates(rates, forward, backward, coll, GIB, OPTIONS, Deadline(600), Progress(False))
    bound = lower_bounds(topo, coll, GIB).best_s
    return topo, coll, forward, backward, rates, bound


@pytest.fixture(scope="module")
def eight_pieces(dgx2):
    topo, coll, forward, backward, rates, _ = dgx2
    return direct.direct_candidate(forward, backward, coll, GIB, 8, rates, OPTIONS, Deadline(600), Progress(False))


def test_one_lp_for_both_halves_reaches_the_allreduce_bound(dgx2):
    topo, coll, forward, backward, rates, bound = dgx2
    assert rates.seconds == pytest.approx(bound, rel=1e-6)
    # Each half alone is slower than the pair's share of T: the halves lean on different
    # links. Alone, the AllGather needs 8,321.5 us on this topology; together, 15,850.
    assert rates.seconds < 2 * 8321.5e-6 * 0.96
    # Reduction trees live on the reversed network, gathering trees on the real one:
    # every GPU's chunk has both, shares adding up to 1.
    for side in (rates.reduce, rates.gather):
        assert len(side.shares) == topo.num_ranks
        for trees in side.shares.values():
            assert sum(share for _, share in trees) == pytest.approx(1.0, abs=1e-6)
    red_routes = {r for trees in rates.reduce.shares.values() for routes, _ in trees for r in routes}
    assert all(backward.routes[r].links for r in red_routes)


def test_the_direct_schedule_verifies_and_its_estimate_is_the_simulators(dgx2, eight_pieces):
    topo, coll, *_ = dgx2
    result = to_result(eight_pieces, coll, topo, Deadline(600))
    verify(result.schedule, topo)
    sim = simulate(result.schedule, topo, GIB)
    assert sim.time_s == pytest.approx(eight_pieces.estimate_s, rel=1e-9)
    assert result.schedule.collective.chunks == 8


def test_pieces_are_matched_so_the_first_reduced_is_the_first_gathered(dgx2):
    topo, coll, forward, backward, rates, _ = dgx2
    base = direct._base(coll)
    up = problem_for(backward, base, GIB, 8)
    down = problem_for(forward, base, GIB, 8)
    paced_up = paced_transfers(up, rates.reduce)
    paced_down = paced_transfers(down, rates.gather)
    relabel = direct._match_pieces(up, paced_up, paced_down, rates.seconds)
    # A bijection within every GPU's chunk.
    assert sorted(relabel) == sorted(relabel.values()) == list(range(len(up.commodities)))
    assert all(up.commodities[k].holders == up.commodities[j].holders for k, j in relabel.items())
    ends = direct._first_key(paced_up)
    starts = direct._first_key(paced_down)
    for root in range(topo.num_ranks):
        mine = [k for k, c in enumerate(up.commodities) if c.holders[0] == root]
        by_end = sorted(mine, key=lambda k: (rates.seconds - ends[k], k))
        assert [starts[relabel[k]] for k in by_end] == sorted(starts[j] for j in mine)


def test_the_pipelines_ends_run_on_each_halfs_own_trees(dgx2, eight_pieces, monkeypatch):
    topo, coll, forward, backward, rates, bound = dgx2
    assert direct.end_pieces(8) == 1 and direct.end_pieces(128) == 8 and direct.end_pieces(4) == 0
    # The first piece of every GPU's chunk reduced and the last gathered on the halves'
    # own trees: 1.190 of the bound at 8 pieces, against 1.249 on the joint trees alone.
    assert eight_pieces.estimate_s / bound < 1.21
    monkeypatch.setattr(direct, "ENDS_FROM", 9)
    joint_only = direct.direct_candidate(forward, backward, coll, GIB, 8, rates, OPTIONS, Deadline(600),
                                         Progress(False))
    assert eight_pieces.estimate_s < joint_only.estimate_s * 0.97


def test_a_gather_lead_moves_only_the_gatherings_keys(dgx2):
    """direct_ops's list-order knobs (measured by bench/bench_direct_structures.py): a
    gather lead moves every gathering op's key by that share of T and nothing else; a
    relay lead changes the order."""
    topo, coll, forward, backward, rates, _ = dgx2

    def built(**knobs):
        return direct.direct_ops(forward, backward, coll, GIB, 2, rates, OPTIONS, Deadline(600), Progress(False),
                                 **knobs)

    plain = built()
    ahead = built(gather_lead=0.25)
    moved = [a.step - b.step for a, b in zip(plain.ops, ahead.ops)]
    assert [(a.src, a.dst, a.deps) for a in plain.ops] == [(b.src, b.dst, b.deps) for b in ahead.ops]
    reductions = moved.index(next(m for m in moved if m))
    assert set(moved[:reductions]) == {0}
    assert set(moved[reductions:]) == {direct.KEY_STEPS // 4}
    assert built(relay_lead=0.2).ops != plain.ops


def test_the_direct_schedule_lowers_to_msccl_xml_within_a_v100s_limits(dgx2, eight_pieces):
    topo, coll, *_ = dgx2
    result = to_result(eight_pieces, coll, topo, Deadline(600))
    unit = lower(CompileUnit(topo, result.schedule.collective, GIB).with_verified(result.schedule), BackendOptions())
    report = verify_algo(unit.lowered, sms=80)
    assert report.ok, report.errors[:3]
    assert max(len(gpu.tbs) for gpu in unit.lowered.gpus) <= resident_threadblocks(80)


def test_the_same_input_gives_the_same_schedule(dgx2, eight_pieces):
    topo, coll, forward, backward, rates, _ = dgx2
    again = direct.direct_candidate(forward, backward, coll, GIB, 8, rates, OPTIONS, Deadline(600), Progress(False))
    assert again.timeline.ops == eight_pieces.timeline.ops
    assert again.estimate_s == eight_pieces.estimate_s


def test_piece_counts_keep_to_the_op_budget():
    coll = standard("allreduce", 32, 1)
    counts = direct.piece_counts(coll, GIB, SynthesisOptions(max_ops=300_000))
    assert counts == [128, 64]  # 2 x 32 x 31 x 128 = 253,952 ops
    assert direct.piece_counts(coll, GIB, SynthesisOptions(max_ops=100_000)) == [32, 16]
    assert direct.piece_counts(coll, GIB, SynthesisOptions(chunks=4)) == [4]
    # Pieces stay at 32 KiB and up: 1 MiB over 32 GPUs is 32 KiB already.
    assert direct.piece_counts(coll, 1 << 20, SynthesisOptions(max_ops=300_000)) == [1]


def test_synthesis_keeps_the_direct_allreduce_where_it_beats_the_composition(dgx2):
    topo, coll, *_, bound = dgx2
    # An op budget that allows 64 pieces, not the default's 128 (half the test's time;
    # the default's piece counts: test_piece_counts_keep_to_the_op_budget).
    result = synthesize(topo, coll, GIB, replace(OPTIONS, max_ops=150_000))
    facts = result.facts
    assert facts["allreduce"] == "direct"
    assert result.estimate_s < facts["composed_estimate_s"] * 0.98
    # The composition: 1.0506; the direct AllReduce at 64 pieces: 1.0191 (128: 1.0101).
    assert result.estimate_s / bound < 1.025
    assert [t["chunks"] for t in facts["direct_tried"]] == [64, 32]
    assert simulate(result.schedule, topo, GIB).time_s == pytest.approx(result.estimate_s, rel=1e-9)


def test_the_direct_allreduce_is_not_tried_where_its_most_pieces_cannot_beat_the_composition(dgx2, eight_pieces):
    topo, coll, *_, bound = dgx2
    # A budget of 8 pieces: 2 x 32 x 31 x 8 = 15,872 ops (16 would need 31,744).
    options = replace(OPTIONS, max_ops=20_000)
    assert direct.piece_counts(coll, GIB, options) == [8, 4]
    result = synthesize(topo, coll, GIB, options)
    facts = result.facts
    assert facts["allreduce"] == "composed"
    assert "direct_fluid_s" not in facts and "direct_tried" not in facts  # its LP was not solved
    assert facts["direct_floor_s"] == pytest.approx(bound * (1 + direct.PIECE_OVERHEAD / 8), rel=1e-9)
    assert result.estimate_s <= facts["direct_floor_s"]
    # What the prediction stands for: the direct AllReduce at 8 pieces is above the floor
    # and slower than the composition that was kept.
    assert eight_pieces.estimate_s >= facts["direct_floor_s"] > result.estimate_s


def test_the_direct_allreduce_is_not_tried_where_the_composition_is_within_tolerance():
    topo = dgx1()
    coll = standard("allreduce", topo.num_ranks, 1)
    result = synthesize(topo, coll, 256 << 20, OPTIONS)
    assert "direct_fluid_s" not in result.facts and "allreduce" not in result.facts
    # Other methods than auto and steady keep the composition as asked.
    composed = synthesize(topo, coll, 1 << 20, replace(OPTIONS, method=Method.GREEDY))
    assert "allreduce" not in composed.facts
