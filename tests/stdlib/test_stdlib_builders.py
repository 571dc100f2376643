"""The stdlib's ring algorithms run by Python builders equal the interpreted ring.coll:
the same ops in the same order, the same dependencies, steps, scratch and origins."""

from __future__ import annotations

import time

import pytest

import collc.frontend as fe
from collc.frontend.eval.algorithm import instantiate
from collc.diagnostics import CollcError
from collc.frontend.stdlib_builders import builder_for


def both(coll: str, topo_spec: str, chunks: int):
    topo = fe.resolve_topology(topo_spec)
    collective = fe.resolve_collective(f"{coll}(chunks={chunks})", topo.num_ranks)
    entry = fe.stdlib_view().lookup_algorithm("ring", coll, None)
    built = instantiate(entry, topo, collective, [], None)
    interpreted = instantiate(entry, topo, collective, [], None, interpret=True)
    return entry, built, interpreted


@pytest.mark.parametrize("coll", ["allgather", "reducescatter", "allreduce"])
@pytest.mark.parametrize("topo_spec, chunks", [("ring(n=2)", 1), ("ring(n=3)", 2), ("ring(n=5)", 1),
                                               ("dgx1", 2), ("switch(n=1)", 2)])
def test_built_ring_equals_interpreted_ring(coll, topo_spec, chunks):
    entry, built, interpreted = both(coll, topo_spec, chunks)
    assert builder_for(entry.module.stdlib_name, entry.defn) is not None
    assert built == interpreted  # name, collective, ops (ids, kinds, slots, deps, steps), scratch
    assert [op.origin for op in built.ops] == [op.origin for op in interpreted.ops]
    assert built.meta == interpreted.meta


def test_user_algorithms_are_interpreted(tmp_path):
    path = tmp_path / "mine.coll"
    path.write_text((fe.stdlib_root() / "algorithms" / "ring.coll").read_text())  # a copy of the stdlib's
    module_entry = fe.load_module(path).algorithms["ring"]["allgather"]
    assert module_entry.module.stdlib_name is None
    assert builder_for(module_entry.module.stdlib_name, module_entry.defn) is None


def test_the_stdlib_ring_is_built_not_interpreted(monkeypatch):
    from collc.frontend.eval import algorithm as front

    def refuse(*args, **kw):
        raise AssertionError("the stdlib's ring was interpreted")

    monkeypatch.setattr(front._AlgorithmRunner, "run", refuse)
    topo = fe.resolve_topology("ring(64)")
    t0 = time.process_time()
    sched = fe.instantiate_algorithm("ring", topo, fe.resolve_collective("allreduce", 64))  # built and verified
    assert time.process_time() - t0 < 20
    assert len(sched.ops) == 3 * 64 * 63


def test_emitter_derives_the_dependencies_and_steps_of_program_add():
    """The builders' `_Emitter` against `_Program.add` on random one-slot op sequences
    (slots reused, sources equal to destinations, all three buffers)."""
    import random

    from collc.frontend.eval.algorithm import _Program
    from collc.frontend.stdlib_builders import _BUFFER_ORDER, _Emitter
    from collc.ir.collective import standard
    from collc.ir.schedule import Loc, OpKind

    coll = standard("allreduce", 3, 2)
    rng = random.Random(3)
    for _ in range(50):
        reference, fast = _Program(coll), _Program(coll)
        emit = _Emitter(fast, coll, scratch=4)
        for _ in range(rng.randint(1, 40)):
            kind = rng.choice([OpKind.COPY, OpKind.REDUCE])
            src, dst = ((rng.randrange(3), rng.randrange(3), rng.randrange(4)) for _ in range(2))
            reference.add(kind, Loc(src[0], _BUFFER_ORDER[src[1]], src[2]),
                          Loc(dst[0], _BUFFER_ORDER[dst[1]], dst[2]), 1, None)
            emit.add(kind, emit.slot(*src), emit.slot(*dst), None)
        assert fast.ops == reference.ops
        locs = {id(op.src) for op in fast.ops} | {id(op.dst) for op in fast.ops}
        assert len(locs) == len({op.src for op in fast.ops} | {op.dst for op in fast.ops})  # one Loc per slot


@pytest.mark.parametrize("coll", ["allgather", "allreduce"])
@pytest.mark.parametrize("topo_spec, chunks", [("ring(n=7)", 3), ("dgx1", 2), ("ndv2(chassis=2)", 1)])
def test_batched_builders_equal_the_one_op_at_a_time_rule(coll, topo_spec, chunks):
    """The numpy builders (`_Batches`) against the same loops run through `_Emitter`, one
    op at a time, on rings that are not in rank order (dgx1, ndv2) and several chunks."""
    from collc.frontend.eval.algorithm import _Program
    from collc.frontend.rings import find_ring
    from collc.frontend.stdlib_builders import COPY, REDUCE, _Emitter

    topo = fe.resolve_topology(topo_spec)
    collective = fe.resolve_collective(f"{coll}(chunks={chunks})", topo.num_ranks)
    ring = find_ring(topo)
    entry = fe.stdlib_view().lookup_algorithm("ring", coll, None)
    build, stmts = builder_for(entry.module.stdlib_name, entry.defn)
    fast = _Program(collective)
    build(fast, collective, ring, stmts)
    slow = _Program(collective)
    out = _Emitter(slow, collective)
    n, c = collective.ranks, collective.chunks
    inp, outp, _ = out.bases(n)
    spans = [s.span for s in stmts]
    if coll == "allgather":
        for r in range(n):
            for i in range(c):
                out.add(COPY, inp[r] + i, outp[r] + r * c + i, spans[0])
        for s in range(n - 1):
            for p in range(n):
                src, dst, owner = ring[p], ring[(p + 1) % n], ring[(p - s) % n]
                for i in range(c):
                    j = owner * c + i
                    if s == 0:
                        out.add(COPY, inp[src] + i, outp[dst] + j, spans[1])
                    else:
                        out.add(COPY, outp[src] + j, outp[dst] + j, spans[2])
    else:
        for s in range(n - 1):
            for p in range(n):
                src, dst, b = ring[p], ring[(p + 1) % n], ring[(p - 1 - s) % n]
                for i in range(c):
                    j = b * c + i
                    out.add(COPY, inp[dst] + j, outp[dst] + j, spans[1])
                    out.add(REDUCE, (inp if s == 0 else outp)[src] + j, outp[dst] + j,
                            spans[2] if s == 0 else spans[3])
        for s in range(n - 1):
            for p in range(n):
                src, dst, b = ring[p], ring[(p + 1) % n], ring[(p - s) % n]
                for i in range(c):
                    out.add(COPY, outp[src] + b * c + i, outp[dst] + b * c + i, spans[4])
    assert fast.ops == slow.ops
    assert [op.origin for op in fast.ops] == [op.origin for op in slow.ops]


@pytest.mark.parametrize("coll", ["allgather", "allreduce"])
def test_builder_columns_are_the_ops_columns(coll):
    """The verifier reads a built schedule's columns from its builder instead of its
    ops: they must be what reading the ops gives."""
    import numpy as np

    from collc.verify.columns import OpColumns, columns_of

    topo = fe.resolve_topology("dgx1")
    sched = fe.instantiate_algorithm("ring", topo, fe.resolve_collective(f"{coll}(chunks=3)", 8))
    given, read = columns_of(sched), OpColumns(sched.ops, {})
    assert given is columns_of(sched)  # the builder's, recorded
    for name in ("ids", "step", "count", "kind_route", "src_rb", "src_idx", "dst_rb", "dst_idx", "ndeps", "deps"):
        assert np.array_equal(getattr(given, name), getattr(read, name)), name


def test_batches_follow_program_add_on_random_conflict_free_batches():
    """`_Batches` against `_Program.add`: random batches of ops (no two of a batch
    touching a slot one of them writes, so a batch's ops are independent), batches in
    id order; the same dependencies and steps, slots reused across batches."""
    import random

    import numpy as np

    from collc.frontend.eval.algorithm import _Program
    from collc.frontend.stdlib_builders import _BUFFER_ORDER, _Batches
    from collc.ir.collective import standard
    from collc.ir.schedule import Loc, OpKind

    coll = standard("allreduce", 3, 2)
    rng = random.Random(5)
    for _ in range(60):
        reference, fast = _Program(coll), _Program(coll)
        batches: list[list[tuple]] = []
        total = 0
        for _ in range(rng.randint(1, 12)):
            taken_dst: set = set()
            taken_src: set = set()
            batch = []
            for _ in range(rng.randint(1, 5)):
                src = (rng.randrange(3), rng.randrange(3), rng.randrange(4))
                dst = (rng.randrange(3), rng.randrange(1, 3), rng.randrange(4))
                if dst in taken_dst or dst in taken_src or src in taken_dst or src == dst:
                    continue
                taken_dst.add(dst)
                taken_src.add(src)
                batch.append((total, src, dst))
                total += 1
            batches.append(batch)
        emit = _Batches(fast, coll, total, scratch=4)
        kind_of = {}
        for batch in batches:
            if not batch:
                continue
            kind = rng.choice([OpKind.COPY, OpKind.REDUCE])
            for op_id, src, dst in batch:
                kind_of[op_id] = kind
            emit.add(np.array([b[0] for b in batch]), kind, np.array([emit_slot(emit, *b[1]) for b in batch]),
                     np.array([emit_slot(emit, *b[2]) for b in batch]), None)
        for batch in batches:
            for op_id, src, dst in batch:
                reference.add(kind_of[op_id], Loc(src[0], _BUFFER_ORDER[src[1]], src[2]),
                              Loc(dst[0], _BUFFER_ORDER[dst[1]], dst[2]), 1, None)
        if total:
            emit.finish()
        assert fast.ops == reference.ops


def emit_slot(emit, rank: int, buffer: int, index: int) -> int:
    return (rank * 3 + buffer) * emit.width + index


@pytest.mark.parametrize("topo_spec, chunks", [("switch(n=1)", 1), ("switch(n=4)", 2), ("ring(n=4)", 1), ("dgx1", 1)])
def test_built_direct_alltoall_equals_interpreted(topo_spec, chunks):
    topo = fe.resolve_topology(topo_spec)
    collective = fe.resolve_collective(f"alltoall(chunks={chunks})", topo.num_ranks)
    entry = fe.stdlib_view().lookup_algorithm("direct", "alltoall", None)
    assert builder_for(entry.module.stdlib_name, entry.defn) is not None

    def made(interpret: bool):
        try:
            return instantiate(entry, topo, collective, [], None, interpret=interpret)
        except CollcError as err:  # refused: the same error both ways
            return (err.message, err.span, err.notes)

    built, interpreted = made(False), made(True)
    assert built == interpreted
    if not isinstance(built, tuple):
        assert [op.origin for op in built.ops] == [op.origin for op in interpreted.ops]
        assert built.meta == interpreted.meta


def test_direct_alltoall_refused_on_a_rail_cluster_at_its_first_cross_rail_op():
    """On dgx_h100 the direct AllToAll (the baseline of every AllToAll compile) is
    refused: node[0].g[0] has no switch path to node[1].g[1]. The built schedule gets
    the interpreter's error, op number included."""
    topo = fe.resolve_topology("dgx_h100(nodes=2)")
    collective = fe.resolve_collective("alltoall", topo.num_ranks)
    entry = fe.stdlib_view().lookup_algorithm("direct", "alltoall", None)
    errors = []
    for interpret in (False, True):
        with pytest.raises(CollcError) as err:
            instantiate(entry, topo, collective, [], None, interpret=interpret)
        errors.append((err.value.message, err.value.span, err.value.notes))
    assert errors[0] == errors[1]
    assert errors[0][0].startswith("op 9 sends from node[0].g[0] to node[1].g[1]")
