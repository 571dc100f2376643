"""Every error the MSCCL lowering passes report, and what it tells the user."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

import msccl_xml_schedules as ms

import collc.backends.msccl_xml.lowering  # noqa: F401  (registers the passes)
from collc.backends import BackendOptions
from collc.backends.msccl_xml.assemble import assemble
from collc.backends.msccl_xml.lowering import lowered_algo
from collc.backends.msccl_xml.limits import LimitError, check_limits
from collc.backends.msccl_xml.merge import merge_ops
from collc.backends.msccl_xml.reader import read_xml
from collc.backends.msccl_xml.threadblocks import assign_threadblocks
from collc.diagnostics import CollcError
from collc.ir import Buffer, Loc, Op, OpKind, Schedule
from collc.ir.collective import Collective, CollectiveKind, broadcast
from collc.passes.base import CompileUnit, PassManager, PipelineError, parse_pipeline

BACK = "msccl-threadblocks,msccl-fuse,msccl-deps,msccl-assemble"


def run(schedule: Schedule, pipeline: str) -> CompileUnit:
    return PassManager(parse_pipeline(pipeline)).run(ms.unit(schedule))


def test_custom_collective_has_no_executor_token():
    sched = ms.ring_allgather(3)
    custom = replace(sched.collective, kind=CollectiveKind.CUSTOM, name="mine")
    with pytest.raises(CollcError, match="'mine' is a custom collective; the MSCCL executor runs only allgather"):
        assign_threadblocks(replace(sched, collective=custom))


def test_collective_must_have_the_layout_its_label_claims():
    sched = ms.ring_allgather(3)
    coll = sched.collective
    swapped = Collective(coll.name, coll.kind, coll.ranks, coll.chunks, coll.inputs,
                         (coll.outputs[0][::-1],) + coll.outputs[1:])
    with pytest.raises(CollcError, match="labelled allgather but its buffers differ from the standard allgather"):
        assign_threadblocks(replace(sched, collective=swapped))


def test_fixed_channels_that_do_not_fit_name_the_threadblock_and_the_way_out():
    with pytest.raises(CollcError, match=r"with channels=1, GPU \d+'s threadblock \(send \d+, recv \d+, "
                                         r"channel 0\) gets 8 steps, more than max_steps=4; let collc choose"):
        assign_threadblocks(ms.ring_allgather(8), inplace=True, channels=1, max_steps=4)


def test_a_threadblock_no_channel_count_can_shorten():
    """A chunk that goes 0 -> 1 -> 0 -> 1 keeps both transfers from rank 0 to rank 1 in
    one chain, hence on one connection, whatever the number of channels."""
    i, o, s = Buffer.INPUT, Buffer.OUTPUT, Buffer.SCRATCH
    ops = (Op(0, OpKind.COPY, Loc(0, i, 0), Loc(0, o, 0), step=0),
           Op(1, OpKind.COPY, Loc(0, i, 0), Loc(1, s, 0), step=0),
           Op(2, OpKind.COPY, Loc(1, s, 0), Loc(0, s, 0), deps=(1,), step=1),
           Op(3, OpKind.COPY, Loc(0, s, 0), Loc(1, o, 0), deps=(2,), step=2))
    sched = Schedule("echo", broadcast(2), "full2", ops, scratch=(1, 1))
    with pytest.raises(CollcError, match=r"even over 32 channels .* gets 2 steps, more than max_steps=1; raise "
                                         r"max_steps"):
        assign_threadblocks(sched, max_steps=1)
    assert lowered_algo(ms.unit(sched), BackendOptions()).nchannels == 1


def test_bad_pass_options():
    with pytest.raises(CollcError, match="instances=0; MSCCL has 1 to 32 channels"):
        assign_threadblocks(ms.ring_allgather(3), instances=0)
    with pytest.raises(CollcError, match="max_steps=0; a threadblock needs room"):
        assign_threadblocks(ms.ring_allgather(3), max_steps=0)
    with pytest.raises(CollcError, match="max_count=72 is out of range; an MSCCL step moves 1 to 71"):
        merge_ops(ms.ring_allgather(3), max_count=72)
    with pytest.raises(PipelineError, match="option 'proto' of pass 'msccl-assemble' expects a Protocol, got 'LL64'"):
        parse_pipeline("msccl-assemble{proto=LL64}")


def test_byte_range_must_select_something():
    unit = run(ms.ring_allgather(3), "msccl-threadblocks,msccl-fuse,msccl-deps")
    with pytest.raises(CollcError, match="maxBytes=10 is below minBytes=100; no message size would select"):
        assemble(unit.lowered, min_bytes=100, max_bytes=10)
    with pytest.raises(CollcError, match="byte range .* is negative"):
        assemble(unit.lowered, min_bytes=-1)


def test_passes_out_of_order_say_what_to_run_first():
    with pytest.raises(CollcError, match="msccl-fuse needs the MSCCL lowered program; run msccl-threadblocks"):
        run(ms.ring_allgather(3), "msccl-fuse")
    with pytest.raises(CollcError, match="msccl-assemble needs numbered steps; run msccl-deps before it"):
        run(ms.ring_allgather(3), "msccl-threadblocks,msccl-assemble")
    with pytest.raises(CollcError, match="msccl-deps has already run"):
        run(ms.ring_allgather(3), "msccl-threadblocks,msccl-deps,msccl-deps")
    with pytest.raises(CollcError, match="msccl-limits checks an MSCCL XML program; run msccl-assemble"):
        run(ms.ring_allgather(3), "msccl-threadblocks,msccl-limits")
    with pytest.raises(CollcError, match="msccl-fuse runs right after msccl-threadblocks"):
        run(ms.ring_allgather(3), "msccl-threadblocks,msccl-fuse,msccl-fuse")


def test_no_schedule():
    unit = ms.unit(ms.ring_allgather(3))
    with pytest.raises(CollcError, match="msccl-threadblocks: there is no schedule to lower"):
        PassManager(parse_pipeline("msccl-threadblocks")).run(replace(unit, schedule=None))
    with pytest.raises(CollcError, match="msccl-merge: there is no schedule"):
        PassManager(parse_pipeline("msccl-merge")).run(replace(unit, schedule=None))


def test_limit_on_steps_per_threadblock_counts_nops():
    unit = run(ms.ring_allgather(4), BACK)
    with pytest.raises(LimitError, match=r"GPU 0 threadblock 1 \(send 1, recv 3, channel 0\) has 4 steps \(0 of "
                                         r"them nop steps for dependencies\), more than max_steps=3; raise "
                                         r"max_steps"):
        check_limits(unit.lowered, max_steps=3)


def test_limit_on_chunks_per_step():
    sched = ms.chain_broadcast(3, 80)
    with pytest.raises(LimitError, match="step 0 moves 80 chunks; an MSCCL step moves 1 to 71 .*msccl-merge"):
        run(sched, BACK + ",msccl-limits")
    algo = run(sched, "msccl-merge," + BACK + ",msccl-limits").lowered
    assert sorted({st.cnt for g in algo.gpus for tb in g.tbs for st in tb.steps}) == [9, 71]


def test_limit_on_xml_nodes_per_rank():
    unit = run(ms.ring_allgather(4), BACK)
    with pytest.raises(LimitError, match=r"GPU 0 needs 12 XML nodes \(<algo>, 4 <gpu>, its <tb>s and <step>s\); "
                                         r"the executor's parser reads at most 10 per rank"):
        PassManager(parse_pipeline("msccl-limits{max_nodes=10}")).run(unit)


def test_limits_on_channels_dependencies_and_offsets():
    algo = run(ms.ring_allgather(4), BACK).lowered
    with pytest.raises(LimitError, match="uses 33 channels; MSCCL has at most 32"):
        check_limits(replace(algo, nchannels=33))
    tb = algo.gpus[0].tbs[1]
    far = replace(tb, steps=[replace(tb.steps[0], depid=130, deps=0)] + tb.steps[1:])
    gpu = replace(algo.gpus[0], tbs=[algo.gpus[0].tbs[0], far])
    with pytest.raises(LimitError, match="depends on threadblock 130; the executor stores dependencies in 8 bits"):
        check_limits(replace(algo, gpus=[gpu] + algo.gpus[1:]))
    small = replace(algo.gpus[0], o_chunks=2)
    with pytest.raises(LimitError, match=r"uses o\[3..4\), but the GPU declares 2 o chunks"):
        check_limits(replace(algo, gpus=[small] + algo.gpus[1:]))


def test_too_many_threadblocks_on_a_channel():
    algo = run(ms.direct_alltoall(4), BACK).lowered
    crowded = replace(algo.gpus[0], tbs=[replace(tb, chan=0) for tb in algo.gpus[0].tbs] * 5)
    with pytest.raises(LimitError, match=r"GPU 0 has 35 threadblocks on channel 0; MSCCL allows 32 per channel"):
        check_limits(replace(algo, gpus=[crowded] + algo.gpus[1:]))


def test_wide_alltoall_spreads_peers_over_channels():
    """40 ranks: each sends to 39 peers, more than one channel's 32 threadblocks."""
    unit = ms.unit(ms.direct_alltoall(40))
    algo = lowered_algo(unit, BackendOptions())
    assert algo.nchannels >= 2
    check_limits(algo)




SHARED_XML = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "msccl-xml"


@pytest.mark.skipif(not SHARED_XML.is_dir(), reason="shared/data is not beside this checkout")
def test_limits_accept_the_files_runtimes_ship():
    files = [f for f in sorted(SHARED_XML.glob("*.xml")) if f.stat().st_size < 200_000]
    assert len(files) > 10
    for f in files:
        check_limits(read_xml(f), max_steps=256)  # some were written for the older runtime
