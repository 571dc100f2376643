"""Packed placement: where spreading every connection over the channels gives a GPU more
threadblocks than its SMs keep resident, each connection is cut into slices of
consecutive messages on channels of their own, and a rank's send and receive slices
share threadblocks. AllToAll on 512 H100 GPUs needs it (256 threadblocks spread, 79
packed); here the same shape at 32 GPUs with fewer SMs declared."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import replace

import pytest
from xml_checks import check_structure

from collc import frontend
from collc.backends import BackendOptions, get_backend
from collc.backends.msccl_xml.lowering import lowered_algo
from collc.backends.msccl_xml.channels import (MAX_TBS_PER_CHANNEL, Crowded, PlanCache, plan_compact,
                                               plan_threadblocks)
from collc.backends.msccl_xml.halves import split_schedule
from collc.backends.msccl_xml.program import HalfKind
from collc.backends.msccl_xml.limits import LimitError
from collc.backends.msccl_xml.threadblocks import assign_threadblocks
from collc.backends.msccl_xml.verify import verify_algo
from collc.driver import CompileJob, produce_schedule
from collc.passes.base import CompileUnit
import msccl_xml_schedules as ms


@pytest.fixture(scope="module")
def alltoall32() -> CompileUnit:
    """A synthesized AllToAll on dgx_h100(nodes=4) (4 chunks per pair, 6,784 ops): 10
    peers per GPU, 18 threadblocks on one channel when spread."""
    topo = frontend.resolve_topology("dgx_h100(nodes=4)", None)
    coll = frontend.resolve_collective("alltoall", topo.num_ranks, None)
    unit, _ = produce_schedule(CompileJob(topo, coll, 1 << 30), get_backend("msccl-xml").op_budget(coll.ranks))
    return unit


def with_sms(unit: CompileUnit, sms: int) -> CompileUnit:
    topo = unit.topology
    nodes = tuple(replace(n, sms=sms) if n.rank is not None else n for n in topo.nodes)
    return replace(unit, topology=replace(topo, nodes=nodes))


def test_spread_fits_where_the_sms_allow_and_is_kept(alltoall32):
    spread = assign_threadblocks(alltoall32.schedule)
    assert max(len(g.tbs) for g in spread.gpus) == 18
    same = assign_threadblocks(alltoall32.schedule, sms=20)
    assert [g.tbs for g in same.gpus] == [g.tbs for g in spread.gpus]


def test_a_spread_placement_over_a_limit_is_told_before_it_is_finished(alltoall32):
    split = split_schedule(alltoall32.schedule)
    cache = PlanCache(split.halves, split.candidates, split.places, split.arrays)
    ranks = alltoall32.schedule.collective.ranks
    plan = plan_threadblocks(split.halves, split.preds, ranks, 1, 1, 64, split.candidates, cache)
    counts = [len(tbs) for tbs in plan.tbs]
    most = max(counts)
    assert most == 18
    # Over the limit: the first GPU with the most threadblocks, as the finished plan has it.
    crowded = plan_threadblocks(split.halves, split.preds, ranks, 1, 1, 64, split.candidates, cache, most - 1)
    assert crowded == Crowded(counts.index(most), most)
    # At the limit: the same plan as without one.
    assert plan_threadblocks(split.halves, split.preds, ranks, 1, 1, 64, split.candidates, cache, most) == plan


def test_packed_when_spread_exceeds_the_resident_threadblocks(alltoall32):
    program = assign_threadblocks(alltoall32.schedule, sms=15)
    assert max(len(g.tbs) for g in program.gpus) == 11
    for g in program.gpus:
        # 10 send and 10 receive peers, every send connection sharing a threadblock with a
        # receive connection (a relay's receive with its forward where they fuse), and
        # one threadblock for the local copy.
        with_peers = [tb for tb in g.tbs if tb.send >= 0 or tb.recv >= 0]
        assert len(with_peers) == 10 and all(tb.send >= 0 and tb.recv >= 0 for tb in with_peers)
        assert len({tb.send for tb in with_peers}) == len({tb.recv for tb in with_peers}) == 10


def test_packed_file_verifies_within_the_sms_and_the_executor_rules(alltoall32):
    algo = lowered_algo(with_sms(alltoall32, 15), BackendOptions())
    check_structure(algo)
    assert max(len(tb.steps) for g in algo.gpus for tb in g.tbs) <= 64
    result = verify_algo(algo, sms=15)
    assert result.ok, result
    assert not verify_algo(algo, sms=12).ok


def test_too_few_sms_even_packed_names_both_placements(alltoall32):
    with pytest.raises(LimitError) as exc:
        assign_threadblocks(alltoall32.schedule, sms=12)
    text = exc.value.message
    assert "with 1 channel(s) per instance GPU 0 needs 18 threadblocks" in text
    assert "packed on 1 channel(s), GPU 0 still needs 11" in text


@pytest.mark.parametrize("slice_steps", [4, 12, 32])
def test_slices_keep_their_size_and_pairs_fit_a_threadblock(alltoall32, slice_steps):
    split = split_schedule(alltoall32.schedule)
    cache = PlanCache(split.halves, split.candidates, split.places, split.arrays)
    plan = None
    for c in range(1, 33):
        plan = plan_compact(split.halves, split.preds, alltoall32.schedule.collective.ranks, 1, c, slice_steps, 64,
                            cache)
        if plan is not None:
            break
    assert plan is not None
    light = slice_steps // 4
    heavy = 64 - light  # a heavy connection's slices, each beside a light one
    busiest = max(Counter((h.rank, h.peer) for h in split.halves if h.kind is HalfKind.SEND).values())
    assert plan.channels_per_instance >= -(-busiest // heavy)
    for rank, tbs in enumerate(plan.tbs):
        assert max(Counter(tb.chan for tb in tbs).values()) <= MAX_TBS_PER_CHANNEL
        seen = set()
        for tb in tbs:
            kinds = Counter(split.halves[h].kind is HalfKind.SEND for s in tb.steps for h in s.halves
                            if split.halves[h].peer >= 0)
            sends, recvs = kinds[True], kinds[False]
            if tb.send >= 0:
                assert (tb.send, tb.chan) not in seen, "one threadblock per connection and channel"
                seen.add((tb.send, tb.chan))
                assert sends <= max(slice_steps, heavy)
            if tb.send >= 0 and tb.recv >= 0:
                assert sends + recvs <= 64, "a pair fits one threadblock"


def test_where_spreading_is_predicted_to_fail_packing_comes_first_with_the_same_result(alltoall32,
                                                                                        monkeypatch):
    # One channel holds the 10 peers: at least 10 threadblock ends per GPU (the
    # estimate), within 13 resident, so spreading is tried, gives 18, and packing
    # follows. Predicted to fail, packing is tried first: the same placement.
    from collc.backends.msccl_xml import threadblocks

    assert threadblocks._spread_estimate(split_schedule(alltoall32.schedule).arrays, 10, 64) == 10
    after_spread = assign_threadblocks(alltoall32.schedule, sms=15)
    monkeypatch.setattr(threadblocks, "_spread_estimate", lambda *a: 1000)
    first = assign_threadblocks(alltoall32.schedule, sms=15)
    assert [g.tbs for g in first.gpus] == [g.tbs for g in after_spread.gpus]
    with pytest.raises(LimitError) as exc:
        assign_threadblocks(alltoall32.schedule, sms=12)
    assert ("a GPU has 10 peers, too many to spread over channels within 10 resident threadblocks; packed on 1 "
            "channel(s), GPU 0 still needs 11") in exc.value.message


def test_light_connections_over_many_peers_are_still_spread():
    # 39 peers, one message each: spread needs 2 channels but only about 39 threadblock
    # ends per GPU, within 68 resident; it is tried, and fits.
    schedule = ms.direct_alltoall(40)
    spread = assign_threadblocks(schedule)
    assert assign_threadblocks(schedule, sms=70).gpus == spread.gpus
    # With 42 SMs (40 resident) spreading gives 47 and packing follows: one
    # threadblock per peer and the copy.
    assert max(len(g.tbs) for g in spread.gpus) == 47
    packed = assign_threadblocks(schedule, sms=42)
    assert max(len(g.tbs) for g in packed.gpus) == 40
    algo = lowered_algo(with_sms(ms.unit(schedule), 42), BackendOptions())
    check_structure(algo)
    assert verify_algo(algo, sms=42).ok


def test_packed_placements_given_up_early_are_measured_once_for_the_message(monkeypatch):
    """Every packed placement is given up as soon as a threadblock passes max_steps
    (here: all of them, by a stand-in), and only the last one, whose length the refusal
    names, is measured in full."""
    from collc.backends.msccl_xml import threadblocks

    full = []
    real_longest = threadblocks._longest

    def measured_in_full(program):
        full.append(program.nchannels)
        return real_longest(program)

    monkeypatch.setattr(threadblocks, "_spread_estimate", lambda *a: 1000)  # packing only
    monkeypatch.setattr(threadblocks, "_longest_within", lambda program, max_steps: None)
    monkeypatch.setattr(threadblocks, "_longest", measured_in_full)
    with pytest.raises(LimitError) as exc:
        assign_threadblocks(ms.direct_alltoall(6), sms=1000, max_steps=8)  # SMs enough for any packing
    assert len(full) == 1
    assert re.search(rf"packed on {full[0]} channel\(s\), GPU \d+'s threadblock \(send -?\d+, recv -?\d+, channel "
                     r"\d+\) gets \d+ steps \(max_steps=8\)", exc.value.message)
