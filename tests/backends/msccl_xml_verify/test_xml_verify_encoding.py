"""The simulator's encoded values (ints and rank masks) and its happens-before without
vector clocks: they must say exactly what sets and vector clocks said, at any rank count."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collc.backends.msccl_xml.simulate import ChunkCodec
from collc.backends.msccl_xml.verify import (
    PER_RANK_SHARE,
    expected_codes,
    expected_collective,
)
from collc.ir.collective import ChunkId, CollectiveKind
from xml_verify_programs import algo, gpu, render, step, tb, verify_program, verify_text

RANKS = 1024
chunk_sets = st.frozensets(st.builds(ChunkId, st.integers(0, RANKS - 1), st.integers(0, 3)), min_size=1, max_size=40)
# Most reductions share one index: draw those often, so both forms are exercised.
same_index = st.integers(0, 3).flatmap(
    lambda i: st.frozensets(st.integers(0, RANKS - 1), min_size=1, max_size=40).map(
        lambda ranks: frozenset(ChunkId(r, i) for r in ranks)))
values = st.one_of(chunk_sets, same_index)


@settings(max_examples=300, deadline=None)
@given(values, values)
def test_encoded_values_behave_as_sets(a, b):
    codec = ChunkCodec(RANKS)
    ca, cb = codec.encode(a), codec.encode(b)
    assert codec.decode(ca) == a and codec.decode(cb) == b
    assert (ca == cb) == (a == b)  # one form per set
    total, twice = codec.combine(ca, cb)
    assert codec.decode(total) == a | b
    assert total == codec.encode(a | b)
    assert (twice is None) == (not a & b)
    if twice is not None:
        assert codec.decode(twice) == a & b


def test_forms_of_values():
    codec = ChunkCodec(RANKS)
    assert type(codec.encode(frozenset({ChunkId(1023, 7)}))) is int
    full = codec.encode(frozenset(ChunkId(r, 5) for r in range(RANKS)))
    assert full == (5, (1 << RANKS) - 1) == codec.sum_over_ranks(RANKS, 5)
    mixed = codec.encode(frozenset({ChunkId(0, 0), ChunkId(1, 1)}))
    assert isinstance(mixed, frozenset)
    with pytest.raises(ValueError):
        codec.encode(frozenset({ChunkId(RANKS, 0)}))


@pytest.mark.parametrize("kind", [k for k in CollectiveKind if k is not CollectiveKind.CUSTOM])
@pytest.mark.parametrize("ranks,chunks_per_loop,root", [(1, 1, 0), (3, 6, 2), (4, 4, 1), (5, 10, 3)])
def test_expected_codes_match_the_collective(kind, ranks, chunks_per_loop, root):
    expected = expected_codes(kind, ranks, chunks_per_loop, root)
    coll = expected_collective(kind, ranks, chunks_per_loop, root)
    codec = ChunkCodec(ranks)
    for r in range(ranks):
        assert expected.in_chunks[r] == len(coll.inputs[r])
        assert all(v == frozenset({ChunkId(r, i)}) for i, v in enumerate(coll.inputs[r]))
        decoded = [None if c is None else codec.decode(c) for c in expected.outputs[r]]
        assert decoded == list(coll.outputs[r])


def test_allreduce_with_slots_not_split_by_ranks():
    expected = expected_codes(CollectiveKind.ALLREDUCE, 3, 4)
    coll = expected_collective(CollectiveKind.ALLREDUCE, 3, 4)
    codec = ChunkCodec(3)
    assert [codec.decode(c) for c in expected.outputs[2]] == list(coll.outputs[2])
    assert CollectiveKind.ALLREDUCE in PER_RANK_SHARE


# --- a reduction along a chain of 1,024 GPUs: every rank's chunk in one mask -------------------

def chain_reduce(n: int = RANKS) -> dict:
    """Reduce to root 0: GPU n-1 sends its chunk, each GPU between adds its own and passes
    the sum on, GPU 0 adds its own into its output."""
    gpus = [gpu(n - 1, 1, 1, 1, [tb(0, n - 2, -1, 0, [step(0, "s", "i", 0, "i", 0)])])]
    for r in range(n - 2, 0, -1):
        gpus.append(gpu(r, 1, 1, 1, [tb(0, r - 1, r + 1, 0, [step(0, "rrs", "i", 0, "i", 0)])]))
    gpus.append(gpu(0, 1, 1, 1, [tb(0, -1, 1, 0, [step(0, "rrc", "i", 0, "o", 0)])]))
    return algo("reduce", n, 1, gpus[::-1], root=0)


def _steps(program: dict, rank: int) -> list[dict]:
    return next(g for g in program["gpus"] if g["attrs"]["id"] == rank)["tbs"][0]["steps"]


def test_reduce_along_1024_gpus_passes():
    report = verify_program(chain_reduce())
    assert report.ok, report.render()
    assert report.stats.gpus == RANKS


def test_one_chunk_missing_at_1024_gpus_is_named():
    program = chain_reduce()
    _steps(program, 517)[0].update(type="rcs", dstbuf="s")  # forwards without adding its own
    report = verify_program(program)
    (err,) = report.errors
    assert "GPU 0 output[0] holds sum of 1023 chunks" in err.message
    assert "but reduce needs sum of 1024 chunks" in err.message
    assert err.message.endswith("(missing chunk(517, 0))")


def test_a_double_count_at_1024_gpus_is_named():
    program = chain_reduce()
    # GPU 1000 stores the partial sum (its own and ranks 1001..1023) and adds it to itself.
    _steps(program, 1000)[:] = [step(0, "rrc", "i", 0, "s", 0), step(1, "re", "s", 0, "s", 0),
                                step(2, "s", "s", 0, "s", 0)]
    report = verify_program(program)
    messages = [e.message for e in report.errors]
    assert messages[0] == ("GPU 1000 tb 0 step 1 reduces sum of 24 chunks (chunk(1000, 0), chunk(1001, 0), "
                           "chunk(1002, 0), ...) with sum of 24 chunks (chunk(1000, 0), chunk(1001, 0), "
                           "chunk(1002, 0), ...), counting sum of 24 chunks (chunk(1000, 0), chunk(1001, 0), "
                           "chunk(1002, 0), ...) twice")


def test_a_reduction_that_mixes_indices_is_reported_as_sets():
    # Rank 1 adds rank 0's chunk 0 into its own slot 1: a sum of two indices.
    program = algo("allreduce", 2, 2, [
        gpu(0, 2, 2, 0, [tb(0, 1, -1, 0, [step(0, "s", "i", 0, "o", 0)]),
                         tb(1, -1, -1, 0, [step(0, "cpy", "i", 0, "o", 0), step(1, "cpy", "i", 1, "o", 1)])]),
        gpu(1, 2, 2, 0, [tb(0, -1, 0, 0, [step(0, "rrc", "i", 1, "o", 1)]),
                         tb(1, -1, -1, 0, [step(0, "cpy", "i", 0, "o", 0)])]),
    ])
    report = verify_program(program)
    wrong = [e.message for e in report.errors if "GPU 1 output[1]" in e.message]
    assert wrong == ["GPU 1 output[1] holds sum(chunk(0, 0), chunk(1, 1)) after GPU 1 tb 0 step 0 wrote it, but "
                     "allreduce needs sum(chunk(0, 1), chunk(1, 1)) there (missing chunk(0, 1); with chunk(0, 0) "
                     "that does not belong)"]


# --- ordering through another GPU -----------------------------------------------------------------

def round_trip(dependency: bool) -> str:
    """GPU 0 tb 0 sends s[0] to GPU 1; GPU 1 tb 0 receives it, tb 1 then sends GPU 1's
    chunk back; GPU 0 tb 1 receives that into s[0]. GPU 0's two accesses to s[0] are
    ordered only through GPU 1, and there only by tb 1's dependency on tb 0."""
    dep = dict(depid=0, deps=0) if dependency else {}
    return render(algo("allgather", 2, 2, [
        gpu(0, 1, 2, 1, [tb(0, 1, -1, 0, [step(0, "cpy", "i", 0, "s", 0), step(1, "s", "s", 0, "s", 0),
                                          step(2, "cpy", "i", 0, "o", 0)]),
                         tb(1, -1, 1, 0, [step(0, "r", "s", 0, "s", 0), step(1, "cpy", "s", 0, "o", 1)])]),
        gpu(1, 1, 2, 1, [tb(0, -1, 0, 0, [step(0, "r", "i", 0, "o", 0, hasdep=1)]),
                         tb(1, 0, -1, 0, [step(0, "s", "i", 0, "i", 0, **dep), step(1, "cpy", "i", 0, "o", 1)])]),
    ]))


def test_accesses_ordered_through_another_gpu_do_not_race():
    report = verify_text(round_trip(dependency=True))
    assert report.ok, report.render()


def test_without_the_remote_dependency_gpu_0_races():
    report = verify_text(round_trip(dependency=False))
    races = [e.message for e in report.errors]
    assert races == [
        "race on scratch[0] of GPU 0: GPU 0 tb 1 step 0 writes it and GPU 0 tb 0 step 0 writes it, and no "
        "dependency or message orders the two",
    ]


def search_reuse(answer_dependency: bool = True) -> str:
    """GPU 0 tb 0 fills s[0..3] and then sends to GPU 1, which answers on two channels.
    GPU 0 tb 2 reads s[2] before its answer arrives (a race: the search finds nothing and
    is kept) and s[3] after it (ordered, through GPU 1: found from the kept search). Without
    GPU 1 tb 2's dependency the answer is not ordered after GPU 0's send, and s[3] races too
    (the kept search, extended, finds nothing)."""
    fill = [step(k, "cpy", "i", 0, "s", k) for k in range(4)]
    return render(algo("allgather", 2, 2, [
        gpu(0, 1, 2, 8, [tb(0, 1, -1, 0, fill + [step(4, "s", "s", 0, "s", 0), step(5, "cpy", "i", 0, "o", 0)]),
                         tb(1, -1, 1, 0, [step(0, "r", "s", 0, "o", 1), step(1, "cpy", "s", 0, "s", 4)]),
                         tb(2, -1, 1, 1, [step(0, "cpy", "s", 2, "s", 5), step(1, "r", "s", 0, "s", 6),
                                          step(2, "cpy", "s", 3, "s", 7)])]),
        gpu(1, 1, 2, 1, [tb(0, -1, 0, 0, [step(0, "r", "i", 0, "o", 0, hasdep=1)]),
                         tb(1, 0, -1, 0, [step(0, "s", "i", 0, "i", 0, depid=0, deps=0),
                                          step(1, "cpy", "i", 0, "o", 1)]),
                         tb(2, 0, -1, 1, [step(0, "s", "i", 0, "i", 0,
                                               **(dict(depid=0, deps=0) if answer_dependency else {}))])]),
    ], nchannels=2))


def test_a_kept_search_answers_later_questions_of_its_threadblock():
    report = verify_text(search_reuse())
    assert [e.message for e in report.errors] == [
        "race on scratch[2] of GPU 0: GPU 0 tb 2 step 0 reads it and GPU 0 tb 0 step 2 writes it, and no "
        "dependency or message orders the two",
    ]


def test_a_kept_search_also_says_no():
    report = verify_text(search_reuse(answer_dependency=False))
    assert [e.message for e in report.errors] == [
        "race on scratch[2] of GPU 0: GPU 0 tb 2 step 0 reads it and GPU 0 tb 0 step 2 writes it, and no "
        "dependency or message orders the two",
        "race on scratch[3] of GPU 0: GPU 0 tb 2 step 2 reads it and GPU 0 tb 0 step 3 writes it, and no "
        "dependency or message orders the two",
    ]
