"""Running a schedule in place: input and output share one buffer.

A schedule is written for separate buffers. In place, the executor aliases them (see
`program.unified_buffer`), so slots that were distinct may now be one: a copy from a
rank's input chunk to its own output slot becomes a copy onto itself (dropped), and an
op may now overwrite an input chunk another op still has to read. `in_place_ops` maps
every op to the aliased slots and re-runs the symbolic executor on the result, so such a
schedule is rejected with the verifier's own message instead of being miscompiled.
"""

from __future__ import annotations

from dataclasses import replace

from collc.backends.msccl_xml.program import inplace_offset, unified_buffer
from collc.diagnostics import CollcError, ScheduleError
from collc.ir.collective import ChunkId, Collective, Value, value_str
from collc.ir.schedule import Buffer, Loc, Op, OpKind, Schedule
from collc.verify import check_structure, execute


def aliased(collective: Collective, loc: Loc) -> Loc:
    """Where `loc` lives when the collective runs in place."""
    if loc.buffer is Buffer.SCRATCH:
        return loc
    base = inplace_offset(collective, loc.rank, loc.buffer)
    return Loc(loc.rank, unified_buffer(collective.kind), base + loc.index)


def in_place_ops(schedule: Schedule) -> tuple[Op, ...]:
    """The schedule's ops on aliased slots, without the copies that became no-ops (their
    dependents inherit their dependencies). Raises CollcError when the aliased schedule
    is wrong: it reads a chunk after overwriting it, or races."""
    coll = schedule.collective
    inherited: dict[int, tuple[int, ...]] = {}  # dropped op -> the deps that stand in for it
    ops: list[Op] = []
    for op in schedule.ops:
        deps: list[int] = []
        for d in op.deps:
            for x in inherited.get(d, (d,)):
                if x not in deps:
                    deps.append(x)
        src, dst = aliased(coll, op.src), aliased(coll, op.dst)
        if op.kind is OpKind.COPY and src == dst:
            inherited[op.id] = tuple(deps)
            continue
        ops.append(replace(op, src=src, dst=dst, deps=tuple(deps)))
    _check(schedule, tuple(ops))
    return tuple(ops)


def _check(schedule: Schedule, ops: tuple[Op, ...]) -> None:
    """Execute the aliased ops symbolically and compare with the postcondition.

    The verifier starts from the input buffer, so the unified buffer is presented to it
    as the input buffer: it holds each rank's input chunks where they alias, and a
    distinct placeholder value everywhere else (a slot whose old content is garbage)."""
    coll = schedule.collective
    unified = unified_buffer(coll.kind)
    size = [max(len(coll.inputs[r]), inplace_offset(coll, r, Buffer.OUTPUT) + len(coll.outputs[r]),
                inplace_offset(coll, r, Buffer.INPUT) + len(coll.inputs[r])) for r in range(coll.ranks)]
    garbage = {r: [frozenset({ChunkId(-1 - r, j)}) for j in range(size[r])] for r in range(coll.ranks)}
    start = {r: list(garbage[r]) for r in range(coll.ranks)}
    for r, buf in enumerate(coll.inputs):
        base = inplace_offset(coll, r, Buffer.INPUT)
        for i, v in enumerate(buf):
            start[r][base + i] = v
    pseudo_coll = Collective(coll.name, coll.kind, coll.ranks, coll.chunks,
                             tuple(tuple(start[r]) for r in range(coll.ranks)),
                             tuple(() for _ in range(coll.ranks)), coll.root)
    as_input = tuple(replace(op, src=_as_input(op.src, unified), dst=_as_input(op.dst, unified)) for op in ops)
    pseudo = Schedule(schedule.name, pseudo_coll, schedule.topology, as_input, schedule.scratch)
    try:
        check_structure(pseudo, in_place=True)
        state = execute(pseudo, check_races=True)
    except ScheduleError as err:
        raise CollcError(f"schedule '{schedule.name}' cannot run in place: with the output buffer aliasing the "
                         f"input, {err.message}", err.span) from None
    for r, buf in enumerate(coll.outputs):
        base = inplace_offset(coll, r, Buffer.OUTPUT)
        for j, want in enumerate(buf):
            if want is None:
                continue
            got: Value | None = state.get(Loc(r, Buffer.INPUT, base + j))
            if got != want:
                shown = "garbage" if got is not None and any(c.rank < 0 for c in got) else value_str(got)
                raise CollcError(
                    f"schedule '{schedule.name}' cannot run in place: rank {r} output[{j}] must hold "
                    f"{value_str(want)} but would hold {shown} (with the output buffer aliasing the input, "
                    "an op overwrites what the postcondition needs)")


def _as_input(loc: Loc, unified: Buffer) -> Loc:
    return Loc(loc.rank, Buffer.INPUT, loc.index) if loc.buffer is unified else loc
