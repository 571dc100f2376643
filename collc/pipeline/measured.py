"""Bubbles of a job that ran, from its ranks' Kineto (PyTorch profiler) traces.

A rank's compute stream is the union of its GPU's non-NCCL kernels over all streams
(NCCL kernels include their waiting, so gaps between them undercount bubbles; the
gaps in compute are what a side task could use). Its idle intervals longer than a
threshold are its bubbles, with:
- the collective or transfer it was waiting on: the NCCL kernel overlapping the gap
  most (its `Collective name` argument where the trace records it, else the kernel's
  name); the cause is `transfer` for send/recv and all-to-all kernels, `gradient` for
  the reducing and gathering collectives, when NCCL kernels cover most of the gap, and
  `unknown` otherwise;
- free memory: the GPU's total memory (`deviceProperties`) less the most the caching
  allocator had reserved (`[memory]` events' `Total Reserved`) during the gap, where
  the trace records both; else null.

Times are from the start of the step: the earliest kernel of any rank (Kineto's
timestamps share the host clock across a job's ranks). Traces are streamed with
collc.profile's reader, so large files are never loaded whole.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collc.diagnostics import CollcError, Span
from collc.io import check_input_file
from collc.limits import int_limit
from collc.pipeline.render import Interval, Lane
from collc.traces.chrome import ChromeTrace, event_interval

_TRANSFER_WORDS = ("sendrecv", "send", "recv", "all_to_all", "alltoall")


@dataclass
class RankTrace:
    path: Path
    rank: int | None
    device: int
    compute: list[tuple[float, float]] = field(default_factory=list)  # merged, us
    nccl: list[tuple[float, float, str]] = field(default_factory=list)  # start, end, collective
    memory: list[tuple[float, int]] = field(default_factory=list)  # ts, total reserved
    total_memory: int | None = None

    @property
    def start(self) -> float:
        return min([s for s, _ in self.compute] + [s for s, _, _ in self.nccl])

    @property
    def end(self) -> float:
        return max([e for _, e in self.compute] + [e for _, e, _ in self.nccl])


def _merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def _collective_name(event: dict[str, Any]) -> str:
    args = event.get("args")
    name = args.get("Collective name") if isinstance(args, dict) else None
    return str(name) if name else str(event.get("name", "nccl"))


def read_rank_traces(path: Path, notes: list[str] | None = None) -> list[RankTrace]:
    """One RankTrace per GPU the trace has kernels on (normally one). Events whose
    figures no profiler writes (a negative or day-long duration, a timestamp past any
    clock, a device number that is not one) are left out and counted in `notes`."""
    check_input_file(path, "trace")
    try:
        return _read(path, notes if notes is not None else [])
    except OSError as exc:
        raise CollcError(f"cannot read trace '{path}': {exc.strerror or exc}", Span(str(path), 1, 1)) from None


def _as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _device(value: Any) -> int | None:
    """A device number as Kineto writes it (an integer, or a string of one), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and value.strip().isdigit() and len(value.strip()) <= 6:
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and 0 <= value < int_limit("ranks"):
        return value
    return None


class _Skipped:
    """Events left out, by reason, for the report's notes."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, reason: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1

    def notes(self, path: Path) -> list[str]:
        return [f"{path}: {n:,} kernel or memory event{'s' if n != 1 else ''} left out ({reason})"
                for reason, n in sorted(self.counts.items())]


def _read(path: Path, notes: list[str]) -> list[RankTrace]:
    trace = ChromeTrace(path)
    kernels: dict[int, list[tuple[float, float]]] = {}
    nccl: dict[int, list[tuple[float, float, str]]] = {}
    memory: dict[int, list[tuple[float, int]]] = {}
    skipped = _Skipped()
    for ev in trace.events():
        cat, name = ev.get("cat"), ev.get("name")
        if cat == "kernel" and ev.get("ph") == "X":
            if "ts" not in ev or not isinstance(ev["ts"], (int, float)):
                raise CollcError(f"kernel event '{str(name)[:80]}' at {trace.location()} has no numeric ts",
                                 Span(str(path), 1, 1))
            times = event_interval(ev["ts"], ev.get("dur", 0.0))
            device = _device(_as_dict(ev.get("args")).get("device", 0))
            if isinstance(times, str) or device is None:
                skipped.add(times if isinstance(times, str) else "device is not a device number")
                continue
            if str(name).lower().startswith("nccl"):
                nccl.setdefault(device, []).append((*times, _collective_name(ev)))
            else:
                kernels.setdefault(device, []).append(times)
        elif name == "[memory]":
            args = _as_dict(ev.get("args"))
            if args.get("Device Type") == 1 and "Total Reserved" in args:
                entry = _memory_entry(ev, args)
                if entry is None:
                    skipped.add("memory figures out of range")
                    continue
                memory.setdefault(entry[0], []).append(entry[1])
    notes.extend(skipped.notes(path))
    meta = trace.metadata
    rank = _as_dict(meta.get("distributedInfo")).get("rank")
    props = meta.get("deviceProperties")
    totals = {}
    for i, d in enumerate(props if isinstance(props, list) else []):
        d = _as_dict(d)
        dev, total = _device(d.get("id", i)), d.get("totalGlobalMem")
        if dev is not None and isinstance(total, int) and 0 < total <= int_limit("size_bytes"):
            totals[dev] = total
    devices = sorted(set(kernels) | set(nccl))
    if not devices:
        raise CollcError("the trace has no GPU kernels (is it a Kineto trace with CUDA activities?)",
                         Span(str(path), 1, 1))
    out = []
    for d in devices:
        out.append(RankTrace(path, rank if isinstance(rank, int) and 0 <= rank < int_limit("ranks") else None, d,
                             _merge(kernels.get(d, [])), sorted(nccl.get(d, [])), sorted(memory.get(d, [])),
                             totals.get(d)))
    return out


def _memory_entry(ev: dict[str, Any], args: dict[str, Any]) -> tuple[int, tuple[float, int]] | None:
    device, reserved, ts = _device(args.get("Device Id", 0)), args.get("Total Reserved"), ev.get("ts")
    times = event_interval(ts, 0)
    if device is None or isinstance(times, str) or not isinstance(reserved, int) \
            or not 0 <= reserved <= int_limit("size_bytes"):
        return None
    return device, (times[0], reserved)


def _free_bytes(rt: RankTrace, start: float, end: float) -> int | None:
    if rt.total_memory is None or not rt.memory:
        return None
    times = [t for t, _ in rt.memory]
    i = bisect.bisect_right(times, start) - 1
    j = bisect.bisect_right(times, end)
    window = rt.memory[max(i, 0):j]
    if i < 0 and not window:
        return None
    return rt.total_memory - max(r for _, r in window)


def _waiting_on(rt: RankTrace, start: float, end: float) -> tuple[str | None, float]:
    """The NCCL collective overlapping the gap most, and how much of the gap NCCL covers."""
    best, best_overlap = None, 0.0
    covered = _merge([(max(s, start), min(e, end)) for s, e, _ in rt.nccl if s < end and e > start])
    for s, e, name in rt.nccl:
        if s >= end:
            break
        overlap = min(e, end) - max(s, start)
        if overlap > best_overlap:
            best, best_overlap = name, overlap
    return best, sum(e - s for s, e in covered)


def _cause(name: str | None, covered: float, gap: float) -> str:
    if name is None or covered < gap / 2:
        return "unknown"
    low = name.lower()
    return "transfer" if any(w in low for w in _TRANSFER_WORDS) else "gradient"


@dataclass(frozen=True)
class Measurement:
    report: dict[str, Any]
    lanes: list[Lane]


def measure(paths: list[Path], threshold_us: float = 100.0) -> Measurement:
    """Bubbles longer than `threshold_us` microseconds (Kineto's unit, kept exact)."""
    notes: list[str] = []
    ranks = [rt for p in paths for rt in read_rank_traces(p, notes)]
    t0 = min(rt.start for rt in ranks)
    t1 = max(rt.end for rt in ranks)
    step = t1 - t0
    stages, lanes = [], []
    for i, rt in enumerate(ranks):
        edges = [(t0, t0)] + rt.compute + [(t1, t1)]
        busy = sum(e - s for s, e in rt.compute)
        bubbles = []
        for (_, prev_end), (nxt, _) in zip(edges, edges[1:]):
            gap = nxt - prev_end
            if gap > threshold_us and gap > 0:
                name, covered = _waiting_on(rt, prev_end, nxt)
                bubbles.append({"start_us": prev_end - t0, "end_us": nxt - t0, "duration_us": gap,
                                "cause": _cause(name, covered, gap), "free_bytes": _free_bytes(rt, prev_end, nxt),
                                "waiting_on": name, "nccl_covered_us": covered})
        who = rt.rank if rt.rank is not None else i
        stages.append({"stage": i, "ranks": [who], "trace": str(rt.path), "device": rt.device,
                       "busy_us": busy, "idle_us": step - busy,
                       "bubble_fraction": (step - busy) / step if step > 0 else 0.0,
                       "bubble_fraction_of_ideal": (step - busy) / busy if busy > 0 else None,
                       "device_bytes": rt.total_memory, "bubbles": bubbles})
        lane = Lane(f"rank {who} (GPU {rt.device})")
        lane.compute = [Interval(s - t0, e - s, "compute", "compute") for s, e in rt.compute]
        lane.transfers = [Interval(s - t0, e - s, "transfer", n) for s, e, n in rt.nccl]
        lane.bubbles = bubbles
        lanes.append(lane)
    idle = sum(s["idle_us"] for s in stages)
    busy_all = sum(s["busy_us"] for s in stages)
    report = {"kind": "measured", "traces": [str(p) for p in paths], "threshold_us": threshold_us,
              "step_us": step,
              "bubble_fraction": idle / (step * len(stages)) if step > 0 else 0.0,
              "bubble_fraction_of_ideal": idle / busy_all if busy_all > 0 else None,
              "stages": stages, "notes": notes}
    return Measurement(report, lanes)
