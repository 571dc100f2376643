"""Schedules as CSV, the format of torch.distributed.pipelining and torchtitan
(`--parallelism.pipeline_parallel_schedule_csv`): one row per rank, one action per cell
in execution order, an empty cell for an idle slot. An action is
`<stage><kind><micro-batch>` with kind F, B, I, W, BW (B and W fused), UNSHARD,
RESHARD, SEND_F, RECV_F, SEND_B or RECV_B; `(0F7;7B3)OVERLAP_F_B` runs a forward and a
backward overlapped.

`parse_rows`/`format_rows` read and write the cells exactly (a file read and written
back is byte-identical); `read_schedule` turns a file into a `ScheduleOrder` (its
compute actions; transfers are timed by collc's model, so SEND/RECV cells only say
where PyTorch's runtime posts them), and `format_order` writes collc's schedules. A B is the full backward unless a W follows
for the same stage and micro-batch: then it is the input-gradient half (older files
write I so), and BW is a fused full backward.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from collc.diagnostics import CollcError, Span
from collc.io import read_input_bytes
from collc.limits import exceeded, int_limit
from collc.pipeline.schedules import Action, Kind, ScheduleOrder

_ACTION = re.compile(r"(\d+)(F|I|B|W|BW|UNSHARD|RESHARD|SEND_F|RECV_F|SEND_B|RECV_B)(\d*)")
_OVERLAP = re.compile(r"\((.*)\)OVERLAP_F_B")
_CELL_MARK = re.compile(r"[,()]")
_BOM = "\ufeff"
COMPUTE_KINDS = {"F": Kind.F, "B": Kind.B, "I": Kind.I, "W": Kind.W, "BW": Kind.B}


class ScheduleFileError(CollcError):
    """A schedule CSV that cannot be read; the span's line is the row (rank + 1), its
    column the character offset of the cell in that row plus one."""


@dataclass(frozen=True)
class CsvAction:
    stage: int
    kind: str
    microbatch: int | None

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{'' if self.microbatch is None else self.microbatch}"


@dataclass(frozen=True)
class Overlap:
    actions: tuple[CsvAction, ...]

    def __str__(self) -> str:
        return "(" + ";".join(map(str, self.actions)) + ")OVERLAP_F_B"


Cell = CsvAction | Overlap | None


@dataclass(frozen=True)
class CsvSchedule:
    rows: tuple[tuple[Cell, ...], ...]
    newline: str = "\n"
    final_newline: bool = True


def _action(text: str, span: Span) -> CsvAction:
    m = _ACTION.fullmatch(text)
    if m is None:
        raise ScheduleFileError(f"cannot read '{text}' as a pipeline action such as 2F0, 0B1, 1W3 or "
                                "(0F7;7B3)OVERLAP_F_B", span)
    stage, kind, mb = m.groups()
    if kind in COMPUTE_KINDS and not mb:
        raise ScheduleFileError(f"action '{text}' names no micro-batch", span)
    for digits in (stage, mb):
        if len(digits.lstrip("0")) > int_limit("int_digits"):
            raise ScheduleFileError(f"action '{text[:40]}...' holds a number of {len(digits):,} digits"
                                    + exceeded("int_digits"), span)
    return CsvAction(int(stage), kind, int(mb) if mb else None)


def _cell(text: str, span: Span) -> Cell:
    if text == "":
        return None
    m = _OVERLAP.fullmatch(text)
    if m is not None:
        parts = m.group(1).split(";")
        return Overlap(tuple(_action(p, span) for p in parts))
    return _action(text, span)


def split_cells(line: str) -> list[str]:
    """The cells of a row: split on commas outside parentheses (an overlap cell holds
    `;`, never `,`, but be safe), in one pass over the line."""
    cells, start, depth = [], 0, 0
    for m in _CELL_MARK.finditer(line):
        ch = m.group()
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(depth - 1, 0)
        elif depth == 0:
            cells.append(line[start:m.start()])
            start = m.end()
    cells.append(line[start:])
    return cells


def _check_cells(text: str, filename: str) -> None:
    cells = text.count(",") + text.count("\n") + 1
    if cells > int_limit("csv_cells"):
        raise ScheduleFileError(f"the schedule file has about {cells:,} cells" + exceeded("csv_cells"),
                                Span(filename, 1, 1))


def parse_rows(text: str, filename: str) -> CsvSchedule:
    text = text.removeprefix(_BOM)  # spreadsheet programs write one; it is no cell
    _check_cells(text, filename)
    newline = "\r\n" if "\r\n" in text else "\n"
    final = text.endswith(newline)
    body = text[: -len(newline)] if final else text
    rows = []
    for line_no, line in enumerate(body.split(newline) if body else [], start=1):
        if '"' in line:
            raise ScheduleFileError("quoted cells are not pipeline actions", Span(filename, line_no, line.index('"') + 1))
        cells, col = [], 1
        for raw in split_cells(line):
            cells.append(_cell(raw.strip(), Span(filename, line_no, col, line_no, col + max(1, len(raw)))))
            col += len(raw) + 1
        rows.append(tuple(cells))
    return CsvSchedule(tuple(rows), newline, final)


def format_rows(schedule: CsvSchedule) -> str:
    text = schedule.newline.join(",".join("" if c is None else str(c) for c in row) for row in schedule.rows)
    return text + (schedule.newline if schedule.final_newline and schedule.rows else "")


def read_csv(path: str | Path) -> CsvSchedule:
    path = Path(path)
    data = read_input_bytes(path, "schedule file", int_limit("csv_cells") * 64)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScheduleFileError(f"cannot read schedule file '{path}': it is not UTF-8 (byte 0x{data[exc.start]:02X} at "
                                f"byte offset {exc.start})", Span(str(path), 1, 1)) from None
    return parse_rows(text, str(path))


def _check_numbers(a: CsvAction, most_stages: int, most_mb: int, span: Span) -> None:
    if a.stage >= most_stages:
        raise ScheduleFileError(f"action {a} names stage {a.stage:,}, more than the rows' ranks can hold"
                                + exceeded("model_chunks"), span)
    assert a.microbatch is not None
    if a.microbatch >= most_mb:
        raise ScheduleFileError(f"action {a} names micro-batch {a.microbatch:,}" + exceeded("microbatches"), span)


def to_order(schedule: CsvSchedule, filename: str, name: str, microbatches: int | None = None,
             ranks: int | None = None, span: Span | None = None) -> ScheduleOrder:
    """The compute actions of a CSV schedule. Stages must be 0..S-1, each on one rank,
    S a multiple of the ranks; micro-batches 0..m-1."""
    rows = schedule.rows
    if not rows:
        raise ScheduleFileError("the schedule file has no rows", Span(filename, 1, 1))
    if ranks is not None and len(rows) != ranks:
        raise CollcError(f"{filename} has {len(rows)} rows (ranks) but the pipeline has {ranks} stages", span)
    stage_rank: dict[int, int] = {}
    actions: list[list[Action]] = []
    top_mb = -1
    most_stages = len(rows) * int_limit("model_chunks")
    most_mb = int_limit("microbatches")
    for r, row in enumerate(rows):
        seq: list[Action] = []
        for cell in row:
            parts = () if cell is None else (cell.actions if isinstance(cell, Overlap) else (cell,))
            for a in parts:
                if a.kind not in COMPUTE_KINDS:
                    continue
                _check_numbers(a, most_stages, most_mb, Span(filename, r + 1, 1))
                owner = stage_rank.setdefault(a.stage, r)
                if owner != r:
                    raise ScheduleFileError(f"stage {a.stage} appears on rank {owner} and rank {r}",
                                            Span(filename, r + 1, 1))
                assert a.microbatch is not None
                top_mb = max(top_mb, a.microbatch)
                seq.append(Action(a.stage, COMPUTE_KINDS[a.kind], a.microbatch))
        actions.append(seq)
    # Older PyTorch files (the zero-bubble ones) write the input-gradient half as B when a
    # W follows for the same stage and micro-batch: read that B as I.
    split = {(a.stage, a.microbatch) for seq in actions for a in seq if a.kind is Kind.W}
    actions = [[Action(a.stage, Kind.I, a.microbatch) if a.kind is Kind.B and (a.stage, a.microbatch) in split
                else a for a in seq] for seq in actions]
    if not stage_rank:
        raise ScheduleFileError("the schedule file has no compute actions (F, B, I, W or BW): nothing to time",
                                Span(filename, 1, 1))
    stages = max(stage_rank) + 1
    missing = sorted(set(range(stages)) - set(stage_rank))
    if missing:
        raise ScheduleFileError(f"stage {missing[0]} never runs (stages run: 0..{stages - 1} but not "
                                f"{', '.join(map(str, missing))})", Span(filename, 1, 1))
    if stages % len(rows):
        raise ScheduleFileError(f"{stages} stages cannot be spread evenly over {len(rows)} ranks", Span(filename, 1, 1))
    m = top_mb + 1
    if microbatches is not None and microbatches != m:
        raise CollcError(f"{filename} runs {m} micro-batches but the pipeline has {microbatches}", span)
    return ScheduleOrder.of_actions(name, len(rows), stages, m, tuple(stage_rank[s] for s in range(stages)), actions)


def read_schedule(path: str | Path, microbatches: int | None = None, ranks: int | None = None,
                  span: Span | None = None) -> ScheduleOrder:
    path = Path(path)
    return to_order(read_csv(path), str(path), path.stem, microbatches, ranks, span)


def format_order(order: ScheduleOrder) -> str:
    """collc's schedule as PyTorch's CSV (compute actions only; B for a full backward)."""
    rows = tuple(tuple(CsvAction(a.stage, a.kind.value, a.microbatch) for a in acts) for acts in order.actions)
    return format_rows(CsvSchedule(rows))
