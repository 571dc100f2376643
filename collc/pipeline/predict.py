"""A pipeline job's predicted step: schedule, timeline, checks, bubbles, report."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from collc.diagnostics import CollcError
from collc.pipeline import bubbles as bubbles_mod
from collc.pipeline import network, schedules
from collc.pipeline.checks import check_timeline
from collc.ir.heap import few_collections
from collc.ir.pipeline import PipelineJob, ScheduleKind
from collc.pipeline.schedules import ScheduleOrder
from collc.pipeline.timeline import Timeline, build_timeline


@dataclass(frozen=True)
class Prediction:
    job: PipelineJob
    order: ScheduleOrder
    timeline: Timeline
    gradient: tuple[network.CollectiveTimes, ...]
    used: str  # which gradient collective the timeline runs: "baseline" or "synthesized"
    report: dict[str, Any]


def schedule_order(job: PipelineJob) -> ScheduleOrder:
    if job.schedule is ScheduleKind.CSV:
        from collc.pipeline.csv_format import read_schedule

        assert job.csv_path is not None
        order = read_schedule(job.csv_path, microbatches=job.microbatches, ranks=job.stages,
                              span=job.span_of("schedule"))
        return order
    return schedules.build(job.schedule.value, job.stages, job.microbatches, job.chunks, job.span_of("schedule"))


def _check_memory(job: PipelineJob, tl: Timeline) -> None:
    mem = job.memory
    if mem is None:
        return
    for r, peak in enumerate(bubbles_mod.peaks_in_flight(tl)):
        act = peak * mem.activation_bytes[r] // tl.order.chunks
        need = mem.static_bytes(r) + act
        if need > mem.device_bytes:
            raise CollcError(
                f"stage {r} needs {need / 2**30:.2f} GiB (weights, gradients and optimizer state "
                f"{mem.static_bytes(r) / 2**30:.2f} GiB + activations of {peak / tl.order.chunks:g} micro-batches in "
                f"flight {act / 2**30:.2f} GiB) but the device has {mem.device_bytes / 2**30:.2f} GiB",
                job.span_of("device_memory"))


def predict(job: PipelineJob, use: str = "baseline", synthesize: bool = True, min_bubble_s: float = 0.0) -> Prediction:
    """`use`: which gradient collective the reported timeline runs ("baseline", the
    NCCL-style ring, or "synthesized"); both steps are reported when `synthesize`."""
    if use == "synthesized" and not synthesize:
        raise CollcError("the synthesized gradient collective was asked for without synthesis")
    # Millions of actions, events and bubbles, and no reference cycles among them: each
    # collection would walk them all (a third of the checks' and the bubbles' time).
    with few_collections():
        return _predict(job, use, synthesize, min_bubble_s)


def _predict(job: PipelineJob, use: str, synthesize: bool, min_bubble_s: float) -> Prediction:
    order = schedule_order(job)
    grads = network.gradient_times(job, synthesize)
    chosen = tuple(g.synthesized_s if use == "synthesized" else g.baseline_s for g in grads)
    costs = network.stage_costs(job, order, chosen)  # type: ignore[arg-type]
    tl = build_timeline(order, costs, job.span_of("schedule"))
    check_timeline(tl, job.span_of("schedule"))
    _check_memory(job, tl)
    stages = bubbles_mod.stage_reports(tl, [list(g) for g in job.stage_gpus], job.memory, min_bubble_s)
    step_us = tl.step_s * 1e6
    last = [tl.last_end(r) for r in range(job.stages)]

    def step_with(times: list[float]) -> float:
        return max(l + t for l, t in zip(last, times)) * 1e6

    gradient: dict[str, Any] = {
        "collective": job.gradient_collective.value, "data_parallel": job.data_parallel,
        "bytes": list(job.gradient_bytes), "used": use,
        "baseline_us": [g.baseline_s * 1e6 for g in grads],
        "step_us_with_baseline": step_with([g.baseline_s for g in grads]),
    }
    if synthesize:
        gradient["synthesized_us"] = [g.synthesized_s * 1e6 for g in grads]  # type: ignore[operator]
        gradient["step_us_with_synthesized"] = step_with([g.synthesized_s for g in grads])  # type: ignore[misc]
    report: dict[str, Any] = {
        "kind": "predicted",
        "job": job.name,
        "topology": job.topology.name,
        "schedule": order.name,
        "pipeline_ranks": job.stages,
        "virtual_stages": order.stages,
        "chunks": order.chunks,
        "microbatches": job.microbatches,
        "step_us": step_us,
        **bubbles_mod.overall(stages, step_us),
        "textbook_bubble_fraction": bubbles_mod.textbook_fraction(job.schedule.value, job.stages,
                                                                   job.microbatches, order.chunks),
        "activation_transfer_us": max(max(tl.costs.send_forward_s, default=0.0),
                                      max(tl.costs.send_backward_s, default=0.0)) * 1e6,
        "gradient": gradient,
        "stages": stages,
    }
    return Prediction(job, order, tl, grads, use, report)
