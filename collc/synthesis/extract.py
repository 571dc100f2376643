"""Plans to schedules for collectives without reductions.

Each rank keeps a chunk in one place: its input slot if it starts with it, else its
first output slot for that chunk if it needs it, else a scratch slot. A transfer copies
from the sender's place to the receiver's and depends on the op that filled the
sender's place; extra output slots (and a rank's own chunk) are filled by local copies.
A rank that would receive a chunk twice keeps the first arrival only.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import NamedTuple

from collc.diagnostics import SolverError
from collc.ir.schedule import Buffer, Loc, Op, OpFields, OpKind, picker
from collc.synthesis.ahead import Steps, finish
from collc.synthesis.plan import Plan


class _Held(NamedTuple):
    loc: Loc
    op: int | None  # the op that put it there (None: it was there from the start)
    step: int  # the step of that op (-1: from the start)


_NEW_TUPLE = tuple.__new__


@dataclass(frozen=True)
class OpList:
    ops: tuple[Op, ...]
    scratch: tuple[int, ...]


_TRANSFER_ORDER = attrgetter("step", "commodity", "route")
# Transfers between two yields of `copy_ops_steps`: about 10 ms of work on the README's
# main job (28,672 transfers), so that work begun on an incumbent that a newer one
# replaces stops soon (collc.synthesis.ahead).
TRANSFERS_PER_STEP = 2048


def copy_ops(plan: Plan) -> OpList:
    return finish(copy_ops_steps(plan))


def copy_ops_steps(plan: Plan) -> Steps[OpList]:
    """`copy_ops` in steps of TRANSFERS_PER_STEP transfers, for work begun ahead of a
    solve's end."""
    fields, scratch = yield from copy_fields_steps(plan)
    return OpList(tuple(fields.ops()), scratch)


def copy_fields_steps(plan: Plan) -> Steps[tuple[OpFields, tuple[int, ...]]]:
    """`copy_ops_steps`'s ops as fields (not yet `Op`s) and its scratch slots per rank:
    for the list scheduler, which makes the final ops itself."""
    problem = plan.problem
    net = problem.network
    ranks = problem.ranks
    scratch = [0] * ranks
    held: list[dict[int, _Held]] = []
    for c in problem.commodities:
        h: dict[int, _Held] = {}
        for loc in c.sources:
            h.setdefault(loc.rank, _Held(loc, None, -1))
        held.append(h)
    targets_at = [{} for _ in problem.commodities]  # type: list[dict[int, Loc]]
    for k, c in enumerate(problem.commodities):
        for loc in c.targets:
            targets_at[k].setdefault(loc.rank, loc)

    # The ops' fields, one list each (op id = position here), put in (step, id) order
    # at the end.
    srcs: list[Loc] = []
    dsts: list[Loc] = []
    deps: list[tuple[int, ...]] = []
    steps: list[int] = []
    routes_of: list[tuple[str, ...]] = []
    # Bound once: called for every transfer.
    add_src, add_dst, add_deps, add_step, add_route = (
        srcs.append, dsts.append, deps.append, steps.append, routes_of.append)
    # Each route's (source rank, destination rank, nodes), looked up once per transfer.
    ends = [(r.src, r.dst, r.nodes) for r in net.routes]
    transfers = plan.transfers
    # A pipelined plan's steps are its order already (and unique): no sort needed.
    if any(a.step >= b.step for a, b in zip(transfers, transfers[1:])):
        transfers = sorted(transfers, key=_TRANSFER_ORDER)
    for first in range(0, len(transfers), TRANSFERS_PER_STEP):
        if first:
            yield
        for commodity, route_index, step in transfers[first:first + TRANSFERS_PER_STEP]:
            src_rank, dst_rank, nodes = ends[route_index]
            h = held[commodity]
            src = h.get(src_rank)
            if src is None or src[2] >= step:
                raise RuntimeError(f"plan sends commodity {commodity} from rank {src_rank} at step {step} "
                                   "before it arrives there")
            if dst_rank in h:
                continue  # a second arrival adds nothing
            dst = targets_at[commodity].get(dst_rank)
            if dst is None:
                dst = Loc(dst_rank, Buffer.SCRATCH, scratch[dst_rank])
                scratch[dst_rank] += 1
            op_id = len(srcs)
            add_src(src[0])
            add_dst(dst)
            from_op = src[1]
            add_deps(() if from_op is None else (from_op,))
            add_step(step)
            add_route(nodes)
            h[dst_rank] = _NEW_TUPLE(_Held, (dst, op_id, step))  # _Held(...) without its Python-level __new__

    for k, c in enumerate(problem.commodities):
        h = held[k]
        for loc in c.targets:
            have = h.get(loc.rank)
            if have is None:
                raise SolverError(f"the {plan.method} plan leaves {loc} without {c.chunk}")
            if have.loc == loc:
                continue
            srcs.append(have.loc)
            dsts.append(loc)
            deps.append(() if have.op is None else (have.op,))
            steps.append(have.step + 1)
            routes_of.append(())
    n = len(srcs)
    # (step, id) order: ids grow with position, so a stable sort by step is that order.
    order = sorted(range(n), key=steps.__getitem__)
    pick = picker(order)
    fields = OpFields(order, [OpKind.COPY] * n, pick(srcs), pick(dsts), [1] * n, pick(deps), pick(steps),
                        pick(routes_of), [None] * n)
    return fields, tuple(scratch) if any(scratch) else ()


@dataclass(frozen=True)
class Edge:
    """A chunk's first arrival at a rank: the tree edge it came over."""

    src: int
    dst: int
    route: int
    step: int


def arrival_trees(plan: Plan) -> list[list[Edge]]:
    """Per commodity, the transfers that first bring it to each rank (parents first)."""
    net = plan.problem.network
    trees: list[list[Edge]] = [[] for _ in plan.problem.commodities]
    arrived: list[dict[int, int]] = [{r: -1 for r in c.holders} for c in plan.problem.commodities]
    for t in sorted(plan.transfers, key=lambda t: (t.step, t.commodity, t.route)):
        r = net.routes[t.route]
        have = arrived[t.commodity]
        if r.dst in have:
            continue
        if r.src not in have or have[r.src] >= t.step:
            raise RuntimeError(f"plan sends commodity {t.commodity} from rank {r.src} before it arrives there")
        have[r.dst] = t.step
        trees[t.commodity].append(Edge(r.src, r.dst, t.route, t.step))
    return trees
