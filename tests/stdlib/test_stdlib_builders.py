"""The stdlib's ring algorithms run by Python builders equal the interpreted ring.coll:
the same ops in the same order, the same dependencies, steps, scratch and origins."""

from __future__ import annotations

import time

import pytest

import collc.frontend as fe
from collc.frontend.algorithm import instantiate
from collc.frontend.stdlib_builders import builder_for


def both(coll: str, topo_spec: str, chunks: int):
    topo = fe.resolve_topology(topo_spec)
    collective = fe.resolve_collective(f"{coll}(chunks={chunks})", topo.num_ranks)
    entry = fe._stdlib_view().lookup_algorithm("ring", coll, None)
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
    module_entry = fe._load_module(path).algorithms["ring"]["allgather"]
    assert module_entry.module.stdlib_name is None
    assert builder_for(module_entry.module.stdlib_name, module_entry.defn) is None


def test_the_stdlib_ring_is_built_not_interpreted(monkeypatch):
    from collc.frontend import algorithm as front

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

    from collc.frontend.algorithm import _Program
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
