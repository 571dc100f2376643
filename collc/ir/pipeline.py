"""The pipeline job IR (collc.pipeline times it): what one pipeline-parallel training step is.

Times are in seconds and sizes in bytes (SI, as everywhere in collc's IR). Per-stage
values are tuples indexed by pipeline rank (a "stage" of the language is a pipeline
rank; with interleaving it holds `chunks` model chunks, the virtual stages).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from collc.diagnostics import Span
from collc.ir.topology import Topology


class ScheduleKind(str, Enum):
    """Built-in schedules; the values are what the language's `schedule = "..."` takes."""

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"
    ZB_H1 = "zb-h1"
    CSV = "csv"


class GradientCollective(str, Enum):
    """How the data-parallel replicas combine gradients at the end of the step."""

    ALLREDUCE = "allreduce"
    REDUCESCATTER_ALLGATHER = "reducescatter+allgather"


@dataclass(frozen=True)
class MemoryModel:
    """Device memory and what the trainer keeps on each pipeline rank.

    Static bytes (weights, gradients, optimizer state) are held all step; every
    micro-batch whose forward has started on a rank and whose backward (its weight
    part, for split backwards) has not finished keeps `activation_bytes / chunks` per
    model chunk.
    """

    device_bytes: int
    weights_bytes: tuple[int, ...]
    gradients_bytes: tuple[int, ...]
    optimizer_bytes: tuple[int, ...]
    activation_bytes: tuple[int, ...]  # per in-flight micro-batch, whole rank (all chunks)

    def static_bytes(self, rank: int) -> int:
        return self.weights_bytes[rank] + self.gradients_bytes[rank] + self.optimizer_bytes[rank]


@dataclass(frozen=True)
class PipelineJob:
    name: str
    topology: Topology
    # stage_gpus[r][j]: the GPU rank (topology rank) holding pipeline rank r in
    # data-parallel replica j. Every stage has the same number of replicas.
    stage_gpus: tuple[tuple[int, ...], ...]
    microbatches: int
    schedule: ScheduleKind
    chunks: int  # model chunks per rank (interleaved: v; CSV: found in the file)
    forward_s: tuple[float, ...]  # per rank, all chunks together
    backward_s: tuple[float, ...]  # full backward (input + weight gradients) per rank
    backward_weight_s: tuple[float, ...]  # the weight-gradient part of backward_s
    activation_bytes: int  # sent from one stage to the next per micro-batch (and back as gradients)
    gradient_bytes: tuple[int, ...]  # per rank, combined over the data-parallel replicas
    gradient_collective: GradientCollective = GradientCollective.ALLREDUCE
    memory: MemoryModel | None = None
    csv_path: Path | None = None  # the schedule file when schedule is CSV
    span: Span | None = None
    # Where each setting was written, for errors found after evaluation.
    setting_spans: dict[str, Span] = field(default_factory=dict, compare=False, repr=False)

    @property
    def stages(self) -> int:
        return len(self.stage_gpus)

    @property
    def data_parallel(self) -> int:
        return len(self.stage_gpus[0])

    def span_of(self, setting: str) -> Span | None:
        return self.setting_spans.get(setting, self.span)

    def describe(self) -> str:
        sched = self.schedule.value + (f" (v={self.chunks})" if self.chunks > 1 else "")
        return (f"{self.name} on {self.topology.name}: {self.stages} stages x {self.data_parallel} data-parallel, "
                f"{self.microbatches} micro-batches, {sched}")
