"""Every transfer and collective time of a pipeline step, from collc.analysis.

Activations (and their gradients) between two stages take the alpha-beta time of the
path collc's simulator routes between the two GPUs: the path's latency plus the bytes
over its bottleneck. The data-parallel gradient collective of a stage runs among the
GPUs holding that stage's replicas; it is timed as `collc compile` times any
collective, on the topology reduced to those GPUs (switches and NICs kept; GPUs do not
forward data in collc's model, so the others play no part): once with the standard
library's ring algorithm (NCCL's choice) and once with collc's synthesized schedule.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from collc import frontend
from collc.analysis.simulate import Router
from collc.api import time_collective
from collc.diagnostics import CollcError
from collc.ir.topology import Topology
from collc.ir.pipeline import GradientCollective, PipelineJob
from collc.native_output import native_stdout_to_stderr
from collc.pipeline.schedules import ScheduleOrder
from collc.pipeline.timeline import StageCosts


def transfer_s(router: Router, src_rank: int, dst_rank: int, nbytes: int) -> float:
    """Alpha-beta time of `nbytes` from one GPU to another on the simulator's default path."""
    if src_rank == dst_rank or nbytes == 0:
        return 0.0
    path = router.path_between(src_rank, dst_rank)
    if path is None:
        topo = router.topology
        raise CollcError(f"no path from {topo.gpu(src_rank).name} to {topo.gpu(dst_rank).name} crosses only "
                         "switches and NICs")
    return path.latency + nbytes / path.bottleneck


@dataclass(frozen=True)
class CollectiveTimes:
    """One stage's gradient collective: seconds with the ring baseline and synthesized."""

    baseline_s: float
    synthesized_s: float | None  # None when synthesis was not asked for
    parts: tuple[str, ...]  # the collectives run, in order


_PARTS = {
    GradientCollective.ALLREDUCE: ("allreduce",),
    GradientCollective.REDUCESCATTER_ALLGATHER: ("reducescatter", "allgather"),
}


@functools.lru_cache(maxsize=256)
def _collective_s(topology: Topology, kind: str, nbytes: int, synthesized: bool) -> float:
    collective = frontend.resolve_collective(kind, topology.num_ranks)
    if not synthesized:
        return time_collective(topology, collective, nbytes, algorithm="ring").time_s
    with native_stdout_to_stderr():
        return time_collective(topology, collective, nbytes, pipeline="synthesize").time_s


def gradient_times(job: PipelineJob, synthesize: bool) -> tuple[CollectiveTimes, ...]:
    """Per pipeline rank; zero without data parallelism or gradients."""
    parts = _PARTS[job.gradient_collective]
    out = []
    for r, gpus in enumerate(job.stage_gpus):
        nbytes = job.gradient_bytes[r]
        if len(gpus) < 2 or nbytes == 0:
            out.append(CollectiveTimes(0.0, 0.0 if synthesize else None, parts))
            continue
        # Named after the GPUs (`dgx1[g[0],g[4]]`), as the error below shows it.
        shown = ",".join(job.topology.gpu(g).name for g in gpus)
        sub = job.topology.restricted_to(gpus, name=f"{job.topology.name}[{shown}]")
        try:
            base = sum(_collective_s(sub, k, nbytes, False) for k in parts)
            synth = sum(_collective_s(sub, k, nbytes, True) for k in parts) if synthesize else None
        except CollcError as err:
            raise CollcError(f"cannot time the gradient {'+'.join(parts)} of stage {r} on "
                             f"{sub.name}: {err.message}", job.span_of("gradients"), err.notes) from None
        out.append(CollectiveTimes(base, synth, parts))
    return tuple(out)


def stage_costs(job: PipelineJob, order: ScheduleOrder, gradient_s: tuple[float, ...]) -> StageCosts:
    """The job's compute costs spread over the order's virtual stages, transfers timed on
    the topology (between data-parallel replica 0's GPUs: the replicas are alike)."""
    v = order.chunks
    rank_of = order.stage_rank
    fwd = tuple(job.forward_s[rank_of[s]] / v for s in range(order.stages))
    bwd = tuple(job.backward_s[rank_of[s]] / v for s in range(order.stages))
    wgt = tuple(job.backward_weight_s[rank_of[s]] / v for s in range(order.stages))
    router = Router(job.topology)
    try:
        sends = tuple(max(transfer_s(router, job.stage_gpus[rank_of[s]][j], job.stage_gpus[rank_of[s + 1]][j],
                                     job.activation_bytes) for j in range(job.data_parallel))
                      for s in range(order.stages - 1))
        backs = tuple(max(transfer_s(router, job.stage_gpus[rank_of[s + 1]][j], job.stage_gpus[rank_of[s]][j],
                                     job.activation_bytes) for j in range(job.data_parallel))
                      for s in range(order.stages - 1))
    except CollcError as err:
        raise CollcError(f"cannot send activations between stages: {err.message}", job.span_of("gpus")) from None
    return StageCosts(fwd, bwd, tuple(b - w for b, w in zip(bwd, wgt)), wgt, sends, backs, gradient_s)

