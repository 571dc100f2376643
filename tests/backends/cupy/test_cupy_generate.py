"""The generated executor module: its embedded data, its safety against hostile names,
and how the backend writes it."""

from __future__ import annotations

import ast
import dataclasses
import os
import stat
from pathlib import Path

import pytest

from cupy_executor_helpers import collective_schedules as cs
from cupy_executor_helpers import load_executor, run_executor, write_executor

from collc.backends import BackendOptions, get_backend
from collc.backends.cupy.generate import comment_text, python_literal, render_executor, steps_of
from collc.diagnostics import CollcError, ScheduleError
from collc.ir import Buffer, Loc, Op, OpKind
from collc.passes.base import CompileUnit

HOSTILE = 'x"""\'; import os  # \\ \n\r\x00\t\u2028é {{ 7*7 }} {% raw %}\'\'\'\\N{'


def test_python_literal_round_trips_hostile_strings_as_ascii():
    for text in (HOSTILE, "", "\\", '"', "'''", "\x7f\x1b", "\U0001f600"):
        source = python_literal(text)
        assert source.isascii()
        assert "\n" not in source and "\r" not in source
        assert ast.literal_eval(source) == text
    assert python_literal((1,)) == "(1,)"
    assert ast.literal_eval(python_literal(((1, 2), (), ("a\n", None, True)))) == ((1, 2), (), ("a\n", None, True))
    with pytest.raises(TypeError):
        python_literal(1.5)


def test_comment_text_stays_on_one_printable_ascii_line():
    text = comment_text(HOSTILE)
    assert text.isascii() and text.isprintable()
    assert "\\n" in text and "\\x00" in text  # escaped, not dropped: the name stays recognisable


def _hostile_schedule():
    schedule = cs.ring_allgather(3)
    coll = dataclasses.replace(schedule.collective, name=HOSTILE + "coll")
    return dataclasses.replace(schedule, name=HOSTILE + "sched", topology=HOSTILE + "topo", collective=coll)


def test_hostile_names_reach_the_module_only_as_string_constants(tmp_path: Path):
    benign = write_executor(cs.ring_allgather(3), tmp_path / "benign.py")
    hostile = write_executor(_hostile_schedule(), tmp_path / "hostile.py")
    source = hostile.read_text(encoding="utf-8")
    assert source.isascii() and "\x00" not in source

    module = load_executor(hostile)
    assert module.SCHEDULE_NAME == HOSTILE + "sched"
    assert module.TOPOLOGY_NAME == HOSTILE + "topo"
    assert module.COLLECTIVE_NAME == HOSTILE + "coll"

    # The names change string constants only: both modules have the same syntax tree
    # once those are blanked, so no name became code.
    def shape(path: Path) -> str:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                node.value = ""
        return ast.dump(tree)

    assert shape(benign) == shape(hostile)
    header = [line for line in source.splitlines()[:20] if line.startswith(("# schedule:", "# topology:"))]
    assert len(header) == 2 and all("import os" in line for line in header)


def test_hostile_names_run(tmp_path: Path):
    path = write_executor(_hostile_schedule(), tmp_path / "hostile.py")
    done = run_executor(path, "--device", "cpu", "--check", "--size", "1K", "-n", "1", "-w", "0")
    assert done.returncode == 0, done.stderr
    assert repr(HOSTILE + "sched") in done.stdout
    described = run_executor(path, "--describe")
    assert described.returncode == 0 and repr(HOSTILE + "topo") in described.stdout


def test_steps_are_embedded_grouped_and_in_order(tmp_path: Path):
    schedule = cs.tree_broadcast(5, chunks=2)
    module = load_executor(write_executor(schedule, tmp_path / "b.py"))
    assert module.STEP_NUMBERS == tuple(sorted({op.step for op in schedule.ops}))
    assert sum(len(ops) for ops in module.STEPS) == len(schedule.ops)
    by_id = {op.id: op for op in schedule.ops}
    for number, ops in zip(module.STEP_NUMBERS, module.STEPS):
        for row in ops:
            op = by_id[row[0]]
            assert op.step == number
            assert row == (op.id, 0, op.src.rank, 1 if op.src.buffer is Buffer.OUTPUT else 0, op.src.index,
                           op.dst.rank, 1, op.dst.index, op.count)
    assert (module.RANKS, module.ROOT, module.COLLECTIVE_KIND) == (5, 0, "broadcast")
    assert [s.number for s in steps_of(schedule)] == list(module.STEP_NUMBERS)


def test_collective_definition_is_embedded_once_per_value(tmp_path: Path):
    n, chunks = 4, 2
    module = load_executor(write_executor(cs.ring_allreduce(n, chunks), tmp_path / "ar.py"))
    assert module.IN_SLOTS == module.OUT_SLOTS == (n * chunks,) * n
    # n * n * chunks input chunks, plus one sum per output index shared by all ranks
    assert len(module.CHUNK_SETS) == n * n * chunks + n * chunks
    assert len(set(module.OUTPUT_VALUES)) == 1
    for j, k in enumerate(module.OUTPUT_VALUES[0]):
        assert sorted(module.chunk_set_pairs(k)) == [(r, j) for r in range(n)]
    for r, row in enumerate(module.INPUT_VALUES):
        assert [module.chunk_set_pairs(k) for k in row] == [[(r, i)] for i in range(n * chunks)]
    rs = load_executor(write_executor(cs.ring_reducescatter(n), tmp_path / "rs.py"))
    assert rs.SCRATCH_SLOTS == (n,) * n and rs.OUT_SLOTS == (1,) * n and rs.max_slots() == n


def test_emit_writes_one_executable_file_atomically(tmp_path: Path):
    backend = get_backend("cupy")
    assert backend.suffix == ".py" and backend.lowering(BackendOptions()) == ""
    schedule = cs.ring_allgather(2)
    unit = CompileUnit(cs.full_mesh(2), schedule.collective, 1 << 20, schedule=schedule)
    out = tmp_path / "deep" / "ag.py"
    assert backend.emit(unit, out, BackendOptions()) == [out]
    assert os.listdir(out.parent) == ["ag.py"]  # no temporary file left behind
    assert out.stat().st_mode & stat.S_IXUSR
    assert out.read_text().startswith("#!/usr/bin/env python3\n")
    assert load_executor(out).DEFAULT_SIZES == (1 << 20,)
    with pytest.raises(CollcError, match="is a directory"):
        backend.emit(unit, out.parent, BackendOptions())


def test_backend_options_shape_the_defaults(tmp_path: Path):
    schedule = cs.ring_allgather(2)
    path = write_executor(schedule, tmp_path / "ag.py",
                          options=BackendOptions(inplace=True, size_range=(1024, 8192)))
    module = load_executor(path)
    assert module.DEFAULT_SIZES == (1024, 2048, 4096, 8192)
    assert module.DEFAULT_INPLACE is True


def test_refuses_a_unit_without_schedule_or_with_a_broken_one():
    schedule = cs.ring_allgather(2)
    with pytest.raises(CollcError):
        render_executor(CompileUnit(cs.full_mesh(2), schedule.collective, 1024))
    bad = dataclasses.replace(schedule, ops=schedule.ops + (
        Op(99, OpKind.COPY, Loc(0, Buffer.INPUT, 0), Loc(1, Buffer.OUTPUT, 7), step=5),))
    with pytest.raises(ScheduleError, match="output"):
        render_executor(CompileUnit(cs.full_mesh(2), schedule.collective, 1024, schedule=bad))
