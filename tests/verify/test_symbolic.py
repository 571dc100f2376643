"""The symbolic verifier: it accepts a correct schedule and names what is wrong in others."""

import random
from dataclasses import replace

import pytest

from collc.diagnostics import ScheduleError
from collc.ir import Buffer, Loc, Op, OpKind, Schedule
from collc.ir.collective import allreduce
from collc.verify import unreachable_pairs, verify
from collc.verify.symbolic import _Order
from schedules import ring_allgather, ring_topology


def _with_ops(sched, ops):
    return replace(sched, ops=tuple(ops))


def test_ring_allgather_verifies_for_several_sizes():
    for n in (2, 3, 5, 8):
        verify(ring_allgather(n), ring_topology(n))


def test_missing_op_names_rank_slot_and_content():
    sched = ring_allgather(4)
    with pytest.raises(ScheduleError, match=r"rank 0 output\[1\] must hold chunk\(1, 0\) but holds nothing"):
        verify(_with_ops(sched, sched.ops[:-1]))


def test_wrong_chunk_is_named():
    sched = ring_allgather(3)
    ops = list(sched.ops)
    last = ops[-1]
    ops[-1] = replace(last, src=Loc(last.src.rank, Buffer.OUTPUT, (last.src.index + 1) % 3),
                      deps=tuple(o.id for o in ops[:-1] if o.step < last.step))
    with pytest.raises(ScheduleError, match=r"must hold chunk\(\d, 0\) but holds chunk\(\d, 0\)"):
        verify(_with_ops(sched, ops))


def test_missing_dependency_is_a_race():
    sched = ring_allgather(4)
    ops = [replace(o, deps=()) if o.id == 6 else o for o in sched.ops]
    with pytest.raises(ScheduleError, match=r"op 6 reads rank 2 output\[2\], written by op 2, without depending"):
        verify(_with_ops(sched, ops))


def test_dependency_inside_one_step_is_rejected():
    sched = ring_allgather(3)
    ops = [replace(o, step=0) if o.id == 3 else o for o in sched.ops]
    with pytest.raises(ScheduleError, match="a dependency must be at an earlier step"):
        verify(_with_ops(sched, ops))


def test_out_of_range_slot():
    sched = ring_allgather(3)
    ops = list(sched.ops) + [Op(99, OpKind.COPY, Loc(0, Buffer.INPUT, 0), Loc(1, Buffer.OUTPUT, 7), step=9)]
    with pytest.raises(ScheduleError, match=r"output\[7\], but that buffer has 3 slots"):
        verify(_with_ops(sched, ops))


def _reduce_pair(double: bool) -> Schedule:
    # 2-rank allreduce: each rank reduces the other's input into its own copy.
    coll = allreduce(2)
    ops = [
        Op(0, OpKind.COPY, Loc(0, Buffer.INPUT, 0), Loc(0, Buffer.OUTPUT, 0), step=0),
        Op(1, OpKind.COPY, Loc(0, Buffer.INPUT, 1), Loc(0, Buffer.OUTPUT, 1), step=0),
        Op(2, OpKind.COPY, Loc(1, Buffer.INPUT, 0), Loc(1, Buffer.OUTPUT, 0), step=0),
        Op(3, OpKind.COPY, Loc(1, Buffer.INPUT, 1), Loc(1, Buffer.OUTPUT, 1), step=0),
        Op(4, OpKind.REDUCE, Loc(1, Buffer.INPUT, 0), Loc(0, Buffer.OUTPUT, 0), deps=(0,), step=1),
        Op(5, OpKind.REDUCE, Loc(1, Buffer.INPUT, 1), Loc(0, Buffer.OUTPUT, 1), deps=(1,), step=1),
        Op(6, OpKind.REDUCE, Loc(0, Buffer.INPUT, 0), Loc(1, Buffer.OUTPUT, 0), deps=(2,), step=1),
        Op(7, OpKind.REDUCE, Loc(0, Buffer.INPUT, 1), Loc(1, Buffer.OUTPUT, 1), deps=(3,), step=1),
    ]
    if double:
        ops.append(Op(8, OpKind.REDUCE, Loc(1, Buffer.INPUT, 1), Loc(0, Buffer.OUTPUT, 1), deps=(5,), step=2))
    return Schedule("pair", coll, "ring2", tuple(ops))


def test_reduction_verifies_and_double_count_is_named():
    verify(_reduce_pair(False))
    with pytest.raises(ScheduleError, match=r"chunk\(1, 1\) would be counted twice"):
        verify(_reduce_pair(True))


def test_missing_contribution_is_named():
    sched = _reduce_pair(False)
    with pytest.raises(ScheduleError, match=r"missing chunk\(0, 1\)"):
        verify(_with_ops(sched, [o for o in sched.ops if o.id != 7]))


def test_route_must_follow_links():
    topo = ring_topology(4)
    sched = ring_allgather(4)
    assert (sched.ops[4].src.rank, sched.ops[4].dst.rank) == (0, 1)
    wrong_end = [replace(o, route=("g0", "g2")) if o.id == 4 else o for o in sched.ops]
    with pytest.raises(ScheduleError, match="routed g0 -> g2, which does not run from g0 to g1"):
        verify(_with_ops(sched, wrong_end), topo)
    through_gpu = [replace(o, route=("g0", "g3", "g2", "g1")) if o.id == 4 else o for o in sched.ops]
    with pytest.raises(ScheduleError, match="passes through GPU g3 without storing"):
        verify(_with_ops(sched, through_gpu), topo)
    no_link = [replace(o, route=("g0", "g2", "g1")) if o.id == 4 else o for o in sched.ops]
    with pytest.raises(ScheduleError, match="routed over g0 -> g2, which is not a link"):
        verify(_with_ops(sched, no_link), topo)


def test_unreachable_pairs_on_a_split_topology():
    from collc.ir import Link, Node, NodeKind, Topology

    nodes = tuple(Node(f"g{i}", NodeKind.GPU, i) for i in range(3))
    topo = Topology("split", nodes, (Link("g0", "g1", 1e9, 1e-6), Link("g1", "g0", 1e9, 1e-6)))
    assert unreachable_pairs(topo) == [(0, 2), (1, 2), (2, 0), (2, 1)]


def test_inputs_are_read_only():
    sched = ring_allgather(3)
    ops = list(sched.ops) + [Op(99, OpKind.COPY, Loc(0, Buffer.OUTPUT, 0), Loc(0, Buffer.INPUT, 0),
                                deps=tuple(o.id for o in sched.ops), step=9)]
    with pytest.raises(ScheduleError, match=r"op 99 writes rank 0 input\[0\]: input buffers are read-only"):
        verify(_with_ops(sched, ops))


def test_non_root_output_of_reduce_is_unavailable():
    from collc.ir.collective import reduce

    coll = reduce(2, root=0)
    ops = (Op(0, OpKind.COPY, Loc(0, Buffer.INPUT, 0), Loc(0, Buffer.OUTPUT, 0), step=0),
           Op(1, OpKind.COPY, Loc(1, Buffer.INPUT, 0), Loc(1, Buffer.OUTPUT, 0), step=0),
           Op(2, OpKind.REDUCE, Loc(1, Buffer.OUTPUT, 0), Loc(0, Buffer.OUTPUT, 0), deps=(0, 1), step=1))
    with pytest.raises(ScheduleError, match="leaves rank 1's output unused"):
        verify(Schedule("bad-reduce", coll, "ring2", ops))
    fixed = (ops[0], Op(1, OpKind.REDUCE, Loc(1, Buffer.INPUT, 0), Loc(0, Buffer.OUTPUT, 0), deps=(0,), step=1))
    verify(Schedule("reduce", coll, "ring2", fixed))


def test_transfer_without_a_path_through_switches_must_relay():
    # On a 4-ring, rank 0 and rank 2 are joined only through another GPU.
    sched = ring_allgather(4)
    extra = Op(99, OpKind.COPY, Loc(0, Buffer.INPUT, 0), Loc(2, Buffer.SCRATCH, 0), step=9,
               deps=tuple(o.id for o in sched.ops))
    bad = replace(sched, ops=sched.ops + (extra,), scratch=(1, 1, 1, 1))
    verify(bad)  # without a topology only the schedule itself is checked
    with pytest.raises(ScheduleError, match="op 99 sends from g0 to g2, but no path joins them"):
        verify(bad, ring_topology(4))


def _two_writers(second_deps: tuple[int, ...], second_step: int, read_first: bool) -> Schedule:
    """Rank 0's chunk copied to rank 1's output[0] (op 0), maybe read from there (op 1),
    then overwritten by a copy of the same chunk (op 2) with the given dependencies."""
    sched = ring_allgather(2)
    a = Op(0, OpKind.COPY, Loc(0, Buffer.INPUT, 0), Loc(1, Buffer.OUTPUT, 0), step=0)
    ops = [a]
    if read_first:
        ops.append(Op(1, OpKind.COPY, Loc(1, Buffer.OUTPUT, 0), Loc(0, Buffer.OUTPUT, 0), deps=(0,), step=1))
    ops.append(Op(2, OpKind.COPY, Loc(0, Buffer.INPUT, 0), Loc(1, Buffer.OUTPUT, 0), deps=second_deps,
                  step=second_step))
    return _with_ops(sched, ops)


def test_two_unordered_writers_are_a_race():
    with pytest.raises(ScheduleError, match=r"op 2 writes rank 1 output\[0\], also written by op 0, without "
                                            r"depending on it \(a race\)"):
        verify(_two_writers((), 1, read_first=False), check_races=True)


def test_overwrite_while_a_reader_may_still_read_is_a_race():
    with pytest.raises(ScheduleError, match=r"op 2 overwrites rank 1 output\[0\] while op 1 may still be "
                                            r"reading it \(a race\)"):
        verify(_two_writers((0,), 2, read_first=True), check_races=True)


def test_an_order_through_the_dag_is_no_race():
    # op 2 depends on op 1 only, which depends on op 0: ordered, though not directly.
    with pytest.raises(ScheduleError, match="postcondition"):  # the race check passes; the values do not
        verify(_two_writers((1,), 2, read_first=True), check_races=True)


def test_ids_need_not_be_positions_but_must_be_unique_and_ordered():
    sched = ring_allgather(4)
    shifted = [replace(o, id=o.id + 10, deps=tuple(d + 10 for d in o.deps)) for o in sched.ops]
    verify(_with_ops(sched, shifted), ring_topology(4))
    twice = list(sched.ops) + [replace(sched.ops[-1], step=sched.ops[-1].step + 1)]
    with pytest.raises(ScheduleError, match=rf"op {sched.ops[-1].id} appears twice"):
        verify(_with_ops(sched, twice))
    ahead = [replace(o, deps=(o.id + 1,)) if o.id == 5 else o for o in sched.ops]
    with pytest.raises(ScheduleError, match=r"op 5 depends on op 6, which does not come before it"):
        verify(_with_ops(sched, ahead))
    with pytest.raises(ScheduleError, match=r"op 15 depends on op 16, which does not come before it"):
        verify(_with_ops(sched, [replace(o, deps=(o.id + 1,)) if o.id == 15 else o for o in shifted]))


def test_verify_runs_the_check_at_every_call(monkeypatch):
    """`verify` keeps no memory of the schedules it accepted: whether a schedule was
    verified is the compile unit's to know (tests/passes/test_pass_manager.py). The same
    object verified twice runs twice, and a broken copy is rejected."""
    import collc.verify.arrays as arrays
    import collc.verify.symbolic as symbolic
    from collc import frontend

    runs = []
    real = symbolic.verify_op_by_op
    monkeypatch.setattr(arrays, "verify_on_arrays", lambda schedule, topology: False)
    monkeypatch.setattr(symbolic, "verify_op_by_op", lambda *args, **kw: (runs.append(1), real(*args, **kw)))
    topo = frontend.resolve_topology("ring(4)")
    sched = frontend.instantiate_algorithm("ring", topo, frontend.resolve_collective("allgather", 4))
    runs.clear()  # the front end verified it when it built it
    verify(sched, topo)
    verify(sched, topo)
    assert len(runs) == 2
    with pytest.raises(ScheduleError):
        verify(replace(sched, ops=sched.ops[:-1]), topo)


def _random_dag(rng: random.Random, most: int):
    """A random dependency DAG of 2..most copy ops (up to 3 dependencies each, pointing
    back): (n, each op's dependencies, the ops, each op's ancestors)."""
    n = rng.randint(2, most)
    deps = [tuple(sorted(rng.sample(range(i), min(i, rng.randint(0, 3))))) for i in range(n)]
    ops = tuple(Op(i, OpKind.COPY, Loc(0, Buffer.INPUT, 0), Loc(0, Buffer.OUTPUT, 0), deps=deps[i])
                for i in range(n))
    ancestors: list[set[int]] = []
    for i in range(n):
        ancestors.append(set(deps[i]).union(*(ancestors[d] for d in deps[i])))
    return n, deps, ops, ancestors


def test_one_search_finds_exactly_the_ancestors_among_the_candidates():
    """The race check's batched search (pruned by list position and level) against
    plain reachability, on random dependency DAGs."""
    for seed in range(30):
        rng = random.Random(seed)
        n, deps, ops, ancestors = _random_dag(rng, 40)
        order = _Order(ops)
        for b in range(n):
            candidates = rng.sample(range(n), rng.randint(0, min(n, 6)))
            assert order.ancestors_among(b, candidates) == ancestors[b] & set(candidates)
            assert all(order.before(a, b) == (a in ancestors[b]) for a in candidates)


def test_chains_answer_only_what_the_dag_says():
    """The chains the symbolic run reports (`_Order.follows`: each op after one of its
    direct dependencies, or after none) answer yes only for true ancestors, and with
    them the race check's search finds exactly the ancestors among the candidates."""
    for seed in range(30):
        rng = random.Random(seed)
        n, deps, ops, ancestors = _random_dag(rng, 60)
        order = _Order(ops)
        for i in range(n):
            order.follows(i, rng.choice(deps[i]) if deps[i] and rng.random() < 0.9 else None)
        shown = 0
        for b in range(n):
            for a in range(n):
                if order.on_chains(a, b):
                    assert a in ancestors[b]
                    shown += 1
            candidates = rng.sample(range(n), rng.randint(0, min(n, 6)))
            assert order.ancestors_among(b, candidates) == ancestors[b] & set(candidates)
        assert shown or n < 3 or not any(deps)


def test_a_slot_overwritten_after_a_trip_around_the_ring_is_proved_by_chains(monkeypatch):
    """Rank 0's slot is read by the first hop of a trip around the ring and overwritten
    by its last: the hops order them, and the chains prove it with no search."""
    from collc.ir.collective import allgather
    from collc.verify.symbolic import execute

    n = 6
    ops = [Op(0, OpKind.COPY, Loc(0, Buffer.INPUT, 0), Loc(0, Buffer.OUTPUT, 0), step=0)]
    for r in range(n):
        ops.append(Op(len(ops), OpKind.COPY, Loc(r, Buffer.OUTPUT, 0), Loc((r + 1) % n, Buffer.OUTPUT, 0),
                      deps=(len(ops) - 1,), step=r + 1))
    sched = Schedule("trip", allgather(n), f"ring{n}", tuple(ops))
    searched, proved = [], []
    monkeypatch.setattr(_Order, "level", property(lambda self: searched.append(1) or {}))
    real = _Order.on_chains
    monkeypatch.setattr(_Order, "on_chains", lambda self, a, b: proved.append((a, b, real(self, a, b))) or proved[-1][2])
    execute(sched)
    assert sorted(proved) == [(0, n, True), (1, n, True)] and not searched
    # Without the last hop's dependency the overwrite races with the first hop's read
    # (the chains do not show it, the search decides).
    monkeypatch.undo()
    with pytest.raises(ScheduleError, match="race"):
        execute(replace(sched, ops=(*ops[:-1], replace(ops[-1], deps=()))))
