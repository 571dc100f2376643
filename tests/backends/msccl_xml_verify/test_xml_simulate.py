"""The symbolic executor: how the executor compiles threadblocks, values, FIFOs, races."""

from __future__ import annotations

from collc.backends.msccl_xml.model import BufferName, XmlThreadblock
from collc.backends.msccl_xml.reader import read_xml_bytes
from collc.backends.msccl_xml.simulate import (
    IssueKind,
    RankLayout,
    Severity,
    compile_threadblock,
    simulate,
)
from collc.ir.collective import ChunkId
from xml_verify_programs import pair_allreduce, render, ring_allgather, step, steps_of


def threadblock(steps) -> XmlThreadblock:
    text = render({"algo": dict(proto="Simple", nchannels=1, nchunksperloop=1, ngpus=2, coll="allreduce", inplace=1),
                   "gpus": [{"attrs": dict(id=0, i_chunks=4, o_chunks=0, s_chunks=4),
                             "tbs": [{"attrs": dict(id=0, send=-1, recv=-1, chan=0), "steps": steps}]}]})
    return read_xml_bytes(text).algo.gpus[0].tbs[0]


def one(v: int, i: int) -> frozenset:
    return frozenset({ChunkId(v, i)})


def test_nops_lend_their_dependencies_to_the_next_transmission():
    tb = threadblock([
        step(0, "nop", "i", -1, "o", -1, cnt=0, depid=3, deps=1),
        step(1, "nop", "i", -1, "o", -1, cnt=0, depid=4, deps=2),
        step(2, "re", "s", 0, "i", 0, depid=5, deps=0, hasdep=1),
        step(3, "cpy", "i", 0, "s", 1),
    ])
    program = compile_threadblock(0, tb)
    first, second = program.instructions
    assert [(w.tb, w.step) for w in first.waits] == [(3, 1), (4, 2), (5, 0)]
    assert first.publishes and first.number == 2  # the executor's count matches s
    assert second.waits == [] and second.number == 3 and not second.publishes
    assert program.notes == []


def test_consecutive_reductions_into_one_slot_are_fused():
    tb = threadblock([step(k, "re", "s", k, "i", 0) for k in range(3)] + [step(3, "re", "s", 3, "i", 1, hasdep=1)])
    program = compile_threadblock(0, tb)
    assert [[s.s for s in i.steps] for i in program.instructions] == [[0, 1, 2], [3]]
    assert [i.number for i in program.instructions] == [2, 3]


def test_reduction_fusion_follows_the_executors_count():
    # The executor closes a fused group once the threadblock's 16th re is in, and only then.
    tb = threadblock([step(k, "re", "s", 0, "i", 0) for k in range(16)]
                     + [step(16 + k, "re", "s", 0, "i", 1) for k in range(17)])
    program = compile_threadblock(0, tb)
    assert [len(i.steps) for i in program.instructions] == [16, 17]
    (note,) = program.notes
    assert (note.kind, note.where.s) == (IssueKind.EXECUTOR_OVERFLOW, 32)
    assert "17th consecutive re step into input[1]" in note.message


def test_what_the_executor_reads_differently_is_noted():
    nop = dict(srcbuf="i", srcoff=-1, dstbuf="o", dstoff=-1, cnt=0)
    rejected = compile_threadblock(0, threadblock([
        step(0, "nop", depid=1, deps=0, **nop),
        step(1, "cpy", "i", 0, "s", 0),  # no dependency of its own: the executor rejects the file
    ])).notes
    assert [(n.kind, n.severity, n.where.s) for n in rejected][0] == (IssueKind.EXECUTOR_REJECTS, Severity.ERROR, 1)
    renumbered = compile_threadblock(0, threadblock([
        step(0, "cpy", "i", 0, "s", 0),
        step(1, "nop", **nop),  # no dependency: the executor does not count it
        step(2, "cpy", "i", 1, "s", 1, hasdep=1),
        step(3, "cpy", "i", 2, "s", 2, hasdep=1),
    ]))
    (note,) = renumbered.notes
    assert (note.kind, note.severity, note.where.s) == (IssueKind.RENUMBERED, Severity.WARNING, 2)
    assert "counts GPU 0 tb 0 step 2 as step 1" in note.message
    assert [i.number for i in renumbered.instructions] == [0, 1, 2]
    trailing = compile_threadblock(0, threadblock([
        step(0, "cpy", "i", 0, "s", 0, hasdep=1),
        step(1, "nop", depid=2, deps=0, **nop),  # nothing follows: the executor never waits
    ]))
    (note,) = trailing.notes
    assert (note.kind, note.severity, note.where.s) == (IssueKind.IGNORED_WAIT, Severity.WARNING, 1)
    assert trailing.instructions[-1].waits == []


def _ring(n: int, **kw):
    algo = read_xml_bytes(render(ring_allgather(n))).algo
    layouts = [RankLayout.separate(1, n, 0) for _ in range(n)]
    inputs = [[one(r, 0)] for r in range(n)]
    return simulate(algo, layouts, inputs, **kw)


def test_ring_allgather_delivers_every_chunk_everywhere():
    result = _ring(4)
    assert result.finished and result.issues == []
    for r in range(4):
        assert [result.value(r, BufferName.OUTPUT, j) for j in range(4)] == [one(j, 0) for j in range(4)]
    writer = result.last_writer(2, BufferName.OUTPUT, 0)
    assert (writer.gpu, writer.tb, writer.s) == (2, 0, 3)  # forwarded 2 hops, received last


def test_bounded_connections_expose_a_ring_that_needs_buffering():
    # Every rank sends, then forwards: with one message per connection each waits for room
    # its right neighbour only makes after its own send.
    stuck = _ring(4, fifo_capacity=1)
    assert not stuck.finished
    (issue,) = stuck.issues
    assert issue.kind is IssueKind.DEADLOCK
    assert "waits for room on its full connection" in issue.message
    assert any(note.startswith("wait cycle: GPU 0 tb 0 -> GPU 1 tb 0") for note in issue.notes)
    assert _ring(4, fifo_capacity=2).issues == []


def test_reductions_are_unions_and_double_counts_are_errors():
    text = render(pair_allreduce())
    algo = read_xml_bytes(text).algo
    layouts = [RankLayout({BufferName.INPUT: 2, BufferName.SCRATCH: 2},
                          {BufferName.INPUT: (BufferName.INPUT, 0), BufferName.OUTPUT: (BufferName.INPUT, 0),
                           BufferName.SCRATCH: (BufferName.SCRATCH, 0)}) for _ in range(2)]
    inputs = [[one(r, 0), one(r, 1)] for r in range(2)]
    result = simulate(algo, layouts, inputs)
    assert result.issues == []
    assert result.value(1, BufferName.OUTPUT, 1) == frozenset({ChunkId(0, 1), ChunkId(1, 1)})
    # Reducing the received chunk into slot 0 a second time counts it twice.
    algo.gpus[0].tbs[2].steps[2].srcoff = 0
    algo.gpus[0].tbs[2].steps[2].dstoff = 0
    result = simulate(algo, layouts, inputs)
    (issue,) = result.issues
    assert issue.kind is IssueKind.DOUBLE_COUNT
    assert (issue.where.gpu, issue.where.tb, issue.where.s) == (0, 2, 2)
    assert "counting chunk(1, 0) twice" in issue.message


def test_unordered_accesses_are_races_even_when_this_interleaving_is_lucky():
    program = pair_allreduce()
    for r in range(2):
        steps = steps_of(program, r, 2)
        steps[1]["depid"] = steps[1]["deps"] = -1  # the re no longer waits for the receive
    algo = read_xml_bytes(render(program)).algo
    layouts = [RankLayout({BufferName.INPUT: 2, BufferName.SCRATCH: 2},
                          {BufferName.INPUT: (BufferName.INPUT, 0), BufferName.OUTPUT: (BufferName.INPUT, 0),
                           BufferName.SCRATCH: (BufferName.SCRATCH, 0)}) for _ in range(2)]
    inputs = [[one(r, 0), one(r, 1)] for r in range(2)]
    result = simulate(algo, layouts, inputs)
    races = [i for i in result.issues if i.kind is IssueKind.RACE]
    assert races, result.issues
    assert "no dependency or message orders the two" in races[0].message
    assert {(races[0].where.tb, races[0].where.s)} <= {(1, 0), (2, 1), (2, 2)}
    unchecked = simulate(algo, layouts, inputs, check_races=False)
    assert not any(i.kind is IssueKind.RACE for i in unchecked.issues)
