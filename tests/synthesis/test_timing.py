"""A list schedule made in steps (`sequence_steps`, for work begun ahead of a solve's
end) is the one `sequence` makes at once."""

from __future__ import annotations

from test_extract import _dgx1_allgather_plan, _steps_taken

from collc.synthesis import timing
from collc.synthesis.extract import copy_ops


def test_a_timeline_made_in_steps_is_the_timeline_made_at_once(monkeypatch):
    plan = _dgx1_allgather_plan()
    ops = copy_ops(plan).ops
    network, slot = plan.problem.network, plan.problem.slot_bytes
    whole = timing.sequence(ops, network, slot)
    monkeypatch.setattr(timing, "INSTANTS_PER_STEP", 4)
    taken, stepped = _steps_taken(timing.sequence_steps(ops, network, slot))
    assert taken > 4
    assert stepped.seconds == whole.seconds and stepped.ops == whole.ops


def _random_copies(seed: int, net, n: int) -> list:
    """`n` copies between random ranks of `net` that it routes between (three in ten
    local), each depending on up to two earlier ones, with random steps: a list the
    scheduler reorders."""
    import random

    from collc.ir.schedule import Buffer, Loc, Op, OpKind

    rng = random.Random(seed)
    pairs = sorted(net.pair_routes)
    ops = []
    for i in range(n):
        src, dst = rng.choice(pairs)
        if rng.random() < 0.3:
            dst = src
        deps = tuple(sorted(rng.sample(range(i), min(i, rng.randrange(3)))))
        ops.append(Op.make(i, OpKind.COPY, Loc(src, Buffer.INPUT, i), Loc(dst, Buffer.SCRATCH, i), rng.randrange(1, 3),
                           deps, rng.randrange(8), (), None))
    return ops


def test_steps_found_by_passes_over_the_rules_are_those_found_op_by_op(monkeypatch):
    """The timeline's steps solved on arrays (`_least_steps`) are those found op by op in
    start order (what a chain too long for STEP_PASSES falls back to), and keep every
    rule: one more than each dependency's, no less than the previous op's on each link."""
    import topos

    from collc.synthesis.network import Network

    # Slots of 1 kB: latency dominates, so a link's next transfer often starts within the
    # quantum (the shortest duration) and a raised step raises the link's next one; local
    # copies (no duration) raise their successors'.
    for seed, topo in enumerate([topos.switch(4), topos.ring(5), topos.two_chassis()]):
        net = Network(topo)
        ops = _random_copies(seed, net, 300)
        by_passes = timing.sequence(ops, net, 1e3).ops
        with monkeypatch.context() as m:
            m.setattr(timing, "STEP_PASSES", 0)
            assert timing.sequence(ops, net, 1e3).ops == by_passes
        costs = timing.op_costs(by_passes, net, 1e3)
        last_on: dict[int, int] = {}
        for op, cost in zip(by_passes, costs):
            assert all(op.step >= by_passes[d].step + 1 for d in op.deps)
            assert all(op.step >= last_on.get(link, 0) for link in cost.links)
            last_on.update(dict.fromkeys(cost.links, op.step))
