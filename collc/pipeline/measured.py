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
from collc.pipeline.render import Interval, Lane
from collc.traces.chrome import ChromeTrace

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
    args = event.get("args") or {}
    name = args.get("Collective name")
    return str(name) if name else str(event.get("name", "nccl"))


def read_rank_traces(path: Path) -> list[RankTrace]:
    """One RankTrace per GPU the trace has kernels on (normally one)."""
    if not Path(path).is_file():
        raise CollcError(f"cannot read trace '{path}': no such file", Span(str(path), 1, 1))
    try:
        return _read(path)
    except OSError as exc:
        raise CollcError(f"cannot read trace '{path}': {exc.strerror or exc}", Span(str(path), 1, 1)) from None


def _read(path: Path) -> list[RankTrace]:
    trace = ChromeTrace(path)
    kernels: dict[int, list[tuple[float, float]]] = {}
    nccl: dict[int, list[tuple[float, float, str]]] = {}
    memory: dict[int, list[tuple[float, int]]] = {}
    for ev in trace.events():
        cat, name = ev.get("cat"), ev.get("name")
        if cat == "kernel" and ev.get("ph") == "X":
            try:
                ts, dur = float(ev["ts"]), float(ev.get("dur", 0.0))
            except (KeyError, TypeError, ValueError):
                raise CollcError(f"kernel event '{name}' has no numeric ts/dur", Span(str(path), 1, 1)) from None
            device = int((ev.get("args") or {}).get("device", 0))
            if str(name).lower().startswith("nccl"):
                nccl.setdefault(device, []).append((ts, ts + dur, _collective_name(ev)))
            else:
                kernels.setdefault(device, []).append((ts, ts + dur))
        elif name == "[memory]":
            args = ev.get("args") or {}
            if args.get("Device Type") == 1 and "Total Reserved" in args:
                memory.setdefault(int(args.get("Device Id", 0)), []).append((float(ev["ts"]), int(args["Total Reserved"])))
    meta = trace.metadata
    rank = (meta.get("distributedInfo") or {}).get("rank")
    totals = {int(d.get("id", i)): d.get("totalGlobalMem") for i, d in enumerate(meta.get("deviceProperties") or [])}
    devices = sorted(set(kernels) | set(nccl))
    if not devices:
        raise CollcError("the trace has no GPU kernels (is it a Kineto trace with CUDA activities?)",
                         Span(str(path), 1, 1))
    out = []
    for d in devices:
        total = totals.get(d)
        out.append(RankTrace(path, rank if isinstance(rank, int) else None, d, _merge(kernels.get(d, [])),
                             sorted(nccl.get(d, [])), sorted(memory.get(d, [])),
                             int(total) if total is not None else None))
    return out


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
    ranks = [rt for p in paths for rt in read_rank_traces(p)]
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
              "stages": stages}
    return Measurement(report, lanes)
