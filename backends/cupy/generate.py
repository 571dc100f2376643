"""The CuPy/NCCL executor: one standalone Python module per schedule.

The module embeds the schedule as rows of integers grouped by step, the collective's
definition (which input chunks every output slot must hold) and the names it came from,
and carries its own runtime (templates/executor.py.j2): NumPy or CuPy arrays, all ranks in
one process or one process per GPU over NCCL, nccl-tests-style output and `--check`. It
does not import collc, so it runs on GPU nodes without it.

Names from user programs reach the generated code only through the `py` filter (a
Python string literal, ASCII-only) or the `comment` filter (one line of printable ASCII),
never as identifiers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from collc import __version__
from collc.diagnostics import CollcError
from collc.io import atomic_write
from collc.ir.collective import Collective, Value
from collc.ir.schedule import Buffer, Op, OpKind, Schedule
from collc.verify import check_structure

from collc.backends import BackendOptions

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"
EXECUTOR_TEMPLATE = "executor.py.j2"

# The integer codes the executor's op rows use.
BUFFER_CODES = {Buffer.INPUT: 0, Buffer.OUTPUT: 1, Buffer.SCRATCH: 2}
KIND_CODES = {OpKind.COPY: 0, OpKind.REDUCE: 1}


def python_literal(value: Any) -> str:
    """`value` as Python source: strings as ASCII-only literals (quotes, backslashes,
    newlines and any other character escaped), tuples of such values, ints, None, bools."""
    if isinstance(value, str):
        return ascii(value)
    if value is None or isinstance(value, (bool, int)):
        return repr(value)
    if isinstance(value, (tuple, list)):
        items = [python_literal(v) for v in value]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    raise TypeError(f"no Python literal for {type(value).__name__}")


def comment_text(value: Any) -> str:
    """`value` as text that cannot leave a comment: printable ASCII, everything else
    (line breaks, control and non-ASCII characters) escaped as in a string literal."""
    text = str(value)
    return "".join(ch if " " <= ch <= "~" else ascii(ch)[1:-1] for ch in text)


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        autoescape=False,  # Python source, not HTML: the filters below do the escaping
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["py"] = python_literal
    env.filters["comment"] = comment_text
    return env


@dataclass(frozen=True)
class StepRows:
    number: int  # the schedule's step number
    ops: tuple[tuple[int, ...], ...]


def op_row(op: Op) -> tuple[int, ...]:
    return (op.id, KIND_CODES[op.kind], op.src.rank, BUFFER_CODES[op.src.buffer], op.src.index,
            op.dst.rank, BUFFER_CODES[op.dst.buffer], op.dst.index, op.count)


def steps_of(schedule: Schedule) -> list[StepRows]:
    """Ops grouped by step number, steps in increasing order, ops in schedule order."""
    by_step: dict[int, list[tuple[int, ...]]] = {}
    for op in schedule.ops:
        by_step.setdefault(op.step, []).append(op_row(op))
    return [StepRows(step, tuple(by_step[step])) for step in sorted(by_step)]


class ChunkSetTable:
    """Distinct values (sets of input chunks) and their positions, so that a value shared
    by many slots (an AllReduce result on every rank) is written once."""

    def __init__(self) -> None:
        self.index: dict[Value, int] = {}
        self.rows: list[tuple[int, ...]] = []

    def add(self, value: Value | None) -> int:
        if value is None:
            return -1
        if value not in self.index:
            self.index[value] = len(self.rows)
            self.rows.append(tuple(x for chunk in sorted(value) for x in (chunk.rank, chunk.index)))
        return self.index[value]


def default_sizes(unit: Any, options: BackendOptions) -> tuple[int, ...]:
    """What the executor runs without size options: the size range the user asked the
    backend for (doubling from its low end), else the size the schedule was compiled for."""
    if options.size_range is not None:
        low, high = options.size_range
        low = max(low, 1)
        if high <= low:
            return (low,)
        sizes = [low]
        while sizes[-1] * 2 <= high:
            sizes.append(sizes[-1] * 2)
        return tuple(sizes)
    return (max(int(unit.size_bytes), 1),)


def executor_context(unit: Any, options: BackendOptions) -> dict[str, Any]:
    schedule: Schedule = unit.schedule
    coll: Collective = schedule.collective
    table = ChunkSetTable()
    input_values = [tuple(table.add(v) for v in buf) for buf in coll.inputs]
    output_values = [tuple(table.add(v) for v in buf) for buf in coll.outputs]
    steps = steps_of(schedule)
    topology = getattr(unit, "topology", None)
    return {
        "version": __version__,
        "schedule_name": schedule.name,
        "topology_name": topology.name if topology is not None else schedule.topology,
        "collective_name": coll.name,
        "kind": coll.kind.value,
        "ranks": coll.ranks,
        "root": coll.root,
        "default_sizes": default_sizes(unit, options),
        "inplace": bool(options.inplace),
        "in_slots": tuple(len(buf) for buf in coll.inputs),
        "out_slots": tuple(len(buf) for buf in coll.outputs),
        "scratch_slots": tuple(schedule.scratch_slots(r) for r in range(coll.ranks)),
        "chunk_sets": table.rows,
        "input_values": input_values,
        "output_values": output_values,
        "step_numbers": tuple(s.number for s in steps),
        "steps": steps,
        "num_ops": len(schedule.ops),
    }


def render_executor(unit: Any, options: BackendOptions | None = None) -> str:
    """The executor module's source for a compiled unit (its schedule must be verified)."""
    options = options or BackendOptions()
    if unit.schedule is None:
        raise CollcError("the cupy backend needs a schedule: no pass produced one")
    check_structure(unit.schedule, getattr(unit, "topology", None))
    template = _environment().get_template(EXECUTOR_TEMPLATE)
    return template.render(**executor_context(unit, options))


def emit(unit: Any, output: Path, options: BackendOptions) -> list[Path]:
    """Write the executor to `output` (atomically) and make it executable."""
    if Path(output).is_dir():
        raise CollcError(f"{output} is a directory: give the executor's file name (e.g. {Path(output) / 'run.py'})")
    return [atomic_write(output, render_executor(unit, options), mode=0o755)]
