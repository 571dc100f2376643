"""The MSCCL XML lowering on ring and direct schedules of every standard shape: the
programs are well formed, pass `collc verify` (structure, symbolic execution without
deadlock or race, postcondition) in place and out of place, with several instances."""

from __future__ import annotations

import pytest

import msccl_xml_schedules as ms
from xml_checks import check_structure, check_text

from collc.backends import BackendOptions, get_backend
from collc.backends.msccl_xml.backend import BACKEND
from collc.backends.msccl_xml.lowering import lowered_algo
from collc.backends.msccl_xml.model import Protocol, StepType
from collc.backends.msccl_xml.verify import verify_algo
from collc.backends.msccl_xml.writer import algo_to_xml
from collc.diagnostics import CollcError
from collc.passes.base import parse_pipeline

CASES = {
    "ring-allgather": lambda: ms.ring_allgather(4),
    "ring-allgather-pipelined": lambda: ms.ring_allgather(4, 3, pipelined=True),
    "ring-reducescatter": lambda: ms.ring_reducescatter(4),
    "ring-allreduce": lambda: ms.ring_allreduce(5),
    "direct-alltoall": lambda: ms.direct_alltoall(4),
    "chain-broadcast": lambda: ms.chain_broadcast(4, 4, root=1, split=True),
    "chain-reduce": lambda: ms.chain_reduce(4, root=1),
    "direct-gather": lambda: ms.direct_gather(4, root=2),
    "direct-scatter": lambda: ms.direct_scatter(4, root=3),
}


def lower(schedule, **options):
    return lowered_algo(ms.unit(schedule), BackendOptions(**options))


def assert_valid(algo, max_steps: int = 64) -> None:
    check_structure(algo)
    check_text(algo_to_xml(algo))
    report = verify_algo(algo, max_steps=max_steps)
    assert report.ok, report.render()


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("instances", [1, 2])
def test_out_of_place_programs_verify(name, instances):
    algo = lower(CASES[name](), instances=instances)
    assert (algo.inplace, algo.outofplace) == (False, True)
    assert_valid(algo)


@pytest.mark.parametrize("name", sorted(set(CASES) - {"direct-alltoall"}))
def test_in_place_programs_verify(name):
    algo = lower(CASES[name](), inplace=True, proto="LL128")
    assert (algo.inplace, algo.outofplace, algo.proto) == (True, False, Protocol.LL128)
    assert_valid(algo)


def test_header_follows_the_collective():
    algo = lower(ms.ring_allgather(4, 3), instances=2)
    assert (algo.coll, algo.ngpus, algo.nchunksperloop) == ("allgather", 4, 4 * 3 * 2)
    assert [(g.i_chunks, g.o_chunks, g.s_chunks) for g in algo.gpus] == [(6, 24, 0)] * 4
    rs = lower(ms.ring_reducescatter(4))
    assert (rs.coll, rs.nchunksperloop) == ("reducescatter", 4)  # the input: 4 ranks x 1 chunk
    assert [(g.i_chunks, g.o_chunks, g.s_chunks) for g in rs.gpus] == [(4, 1, 4)] * 4
    bc = lower(ms.chain_broadcast(4, 4, root=1))
    assert (bc.coll, bc.nchunksperloop, bc.extra_attrs) == ("broadcast", 4, {"root": "1"})


def test_in_place_uses_one_buffer_as_the_executor_aliases_it():
    ag = lower(ms.ring_allgather(4), inplace=True)
    assert all((g.i_chunks, g.o_chunks) == (0, 4) for g in ag.gpus)
    first = ag.gpus[2].tbs[0].steps[0]  # rank 2 sends its own chunk: output slot 2
    assert (first.type, first.srcbuf.value, first.srcoff) == (StepType.SEND, "o", 2)
    ar = lower(ms.ring_allreduce(4), inplace=True)
    assert all((g.i_chunks, g.o_chunks) == (4, 0) for g in ar.gpus)
    assert {st.srcbuf.value for g in ar.gpus for tb in g.tbs for st in tb.steps} == {"i"}
    rs = lower(ms.ring_reducescatter(4), inplace=True)
    owner_step = [st for tb in rs.gpus[3].tbs for st in tb.steps if st.type is StepType.RECV_REDUCE_COPY]
    assert [(st.dstbuf.value, st.dstoff) for st in owner_step] == [("i", 3)]  # output = input window 3


def test_in_place_copies_onto_themselves_disappear():
    out_of_place = lower(ms.ring_allgather(4))
    in_place = lower(ms.ring_allgather(4), inplace=True)
    kinds = lambda a: [st.type for g in a.gpus for tb in g.tbs for st in tb.steps]  # noqa: E731
    assert kinds(out_of_place).count(StepType.COPY) == 4
    assert StepType.COPY not in kinds(in_place)


def test_in_place_alltoall_is_rejected_with_the_verifiers_reason():
    with pytest.raises(CollcError, match=r"cannot run in place: .*race"):
        lower(ms.direct_alltoall(4), inplace=True)


def test_instances_use_separate_channels_and_sub_chunks():
    one = lower(ms.ring_allgather(4), inplace=True)
    three = lower(ms.ring_allgather(4), inplace=True, instances=3)
    assert three.nchannels == 3 * one.nchannels
    assert three.nchunksperloop == 3 * one.nchunksperloop
    for g in three.gpus:
        by_channel: dict[int, set[int]] = {}
        for tb in g.tbs:
            by_channel.setdefault(tb.chan, set()).update(st.dstoff % 3 for st in tb.steps)
        # Instance j moves sub-chunk j of every chunk, on channel j.
        assert by_channel == {0: {0}, 1: {1}, 2: {2}}


def test_too_many_instances_is_an_error():
    with pytest.raises(CollcError, match="instances=33; MSCCL has 1 to 32 channels"):
        lower(ms.ring_allgather(3), instances=33)
    with pytest.raises(CollcError, match=r"channels=17 x instances=2"):
        lower(ms.ring_allgather(3), instances=2, extra={"channels": 17})


def test_channels_grow_until_threadblocks_fit_max_steps():
    algo = lower(ms.ring_allgather(8, 4, pipelined=True), inplace=True, max_steps_per_tb=8)
    assert algo.nchannels == 4  # 32 chunks pass every rank: 8 per threadblock on 4 channels
    assert max(len(tb.steps) for g in algo.gpus for tb in g.tbs) <= 8
    assert_valid(algo, max_steps=8)


def test_backend_is_registered_and_its_pipeline_parses():
    assert get_backend("msccl-xml") is BACKEND
    text = BACKEND.lowering(BackendOptions(inplace=True, proto="LL", instances=2, size_range=(1024, 4096),
                                           max_steps_per_tb=256))
    passes = parse_pipeline(text)
    assert [p.name for p in passes] == ["msccl-coalesce", "msccl-merge", "msccl-threadblocks", "msccl-fuse",
                                        "msccl-deps", "msccl-assemble", "msccl-limits"]
    tbs, assemble, limits = passes[2], passes[5], passes[6]
    assert (tbs.instances, tbs.inplace, tbs.channels, tbs.max_steps) == (2, True, 0, 256)
    assert (assemble.proto, assemble.min_bytes, assemble.max_bytes) == (Protocol.LL, 1024, 4096)
    assert limits.max_steps == 256


def test_unknown_protocol_names_the_known_ones():
    with pytest.raises(CollcError, match="unknown MSCCL protocol 'LL64' .*Simple, LL, LL128"):
        BACKEND.lowering(BackendOptions(proto="LL64"))


@pytest.mark.parametrize("seed", range(12))
def test_random_relay_schedules_verify(seed):
    """Chunks spread along random trees with random delays: many share a step and a link."""
    n, chunks = 3 + seed % 4, 1 + seed % 3
    schedule = ms.random_allgather(n, chunks, seed)
    for options in ({}, {"inplace": True}, {"instances": 2}, {"inplace": True, "max_steps_per_tb": 8}):
        assert_valid(lower(schedule, **options), max_steps=options.get("max_steps_per_tb", 64))
