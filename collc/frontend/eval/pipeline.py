"""`pipeline` declarations: evaluation into a `PipelineJob` (the static checks are `check.py`'s).

    pipeline gpt(microbatches = 8) on dgx1 {
        stages = 4;
        data_parallel = 2;              // or gpus = {{0, 4}, {1, 5}, {2, 6}, {3, 7}};
        microbatches = microbatches;
        schedule = "1f1b";              // "gpipe", "1f1b", "interleaved", "zb-h1", or "file.csv"
        forward = 1.2 ms;               // one value, or a set literal with one per stage
        backward = 2.4 ms;
        activations = 16 MiB;
        gradients = 1 GiB;
        device_memory = 32 GiB;
    }

Every setting's value is an expression over the declaration's parameters and the
module's constants. Errors are located at the setting (or the element of a set literal)
that is wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from collc.diagnostics import CollcError, Span
from collc.frontend import ast
from collc.frontend.eval import topology as topology_mod
from collc.frontend.evaluate import Evaluator, as_int, suggest
from collc.frontend.module import Module
from collc.frontend.runner import bind_args, called_from, evaluate_args, instance_name
from collc.frontend.values import NUMBER, SIZE, TIME, Quantity, dim_of, format_value, type_word
from collc.ir.pipeline import GradientCollective, MemoryModel, PipelineJob, ScheduleKind
from collc.ir.topology import NodeKind, Topology
from collc.io import InputError, check_input_file
from collc.limits import exceeded, int_limit, limit


# --- evaluation ------------------------------------------------------------------------

@dataclass
class _Values:
    values: dict[str, Any]
    settings: dict[str, ast.PipelineSetting]

    def has(self, name: str) -> bool:
        return name in self.values

    def span(self, name: str) -> Span:
        return self.settings[name].value.span

    def item_span(self, name: str, index: int) -> Span:
        """The span of element `index` of a set-literal setting, else the whole value."""
        expr = self.settings[name].value
        if isinstance(expr, ast.SetLiteral) and index < len(expr.items):
            return expr.items[index].span
        return expr.span


def _count(v: _Values, name: str, default: int | None, minimum: int) -> int:
    if not v.has(name):
        assert default is not None
        return default
    n = as_int(v.values[name], v.span(name), f"`{name}`")
    if n < minimum:
        raise CollcError(f"`{name}` must be at least {minimum}, got {n}", v.span(name))
    return n


def _magnitude(value: Any, dim: tuple[int, int], span: Span, name: str) -> float:
    got = dim_of(value)
    if got != dim and not (dim == SIZE and got == NUMBER):
        example = "1.5 ms" if dim == TIME else "64 MiB"
        shown = type_word(value) if got is None else f"{type_word(value)} ({format_value(value)})"
        raise CollcError(f"`{name}` must be {'a time' if dim == TIME else 'a size'} such as `{example}`, got {shown}",
                         span)
    x = float(value.value if isinstance(value, Quantity) else value)
    if x < 0:
        raise CollcError(f"`{name}` must not be negative, got {format_value(value)}", span)
    # The language's limits hold for what a pipeline says too: a time past a day or a
    # size past any GPU's memory is a typo, and would print figures of hundreds of digits.
    bound = "duration" if dim == TIME else "size_bytes"
    if not x <= limit(bound):
        raise CollcError(f"`{name}` is {format_value(value)}" + exceeded(bound), span)
    return x


def _per_stage(v: _Values, name: str, dim: tuple[int, int], stages: int,
               default: Callable[[int], float] | None = None) -> tuple[float, ...]:
    """One value for every stage, or a set literal with one per stage."""
    if not v.has(name):
        assert default is not None
        return tuple(default(r) for r in range(stages))
    value = v.values[name]
    if isinstance(value, tuple):
        if len(value) != stages:
            raise CollcError(f"`{name}` lists {len(value)} values but the pipeline has {stages} stages", v.span(name))
        return tuple(_magnitude(x, dim, v.item_span(name, i), name) for i, x in enumerate(value))
    return (_magnitude(value, dim, v.span(name), name),) * stages


def _bytes(values: tuple[float, ...], v: _Values, name: str) -> tuple[int, ...]:
    for i, x in enumerate(values):
        if not float(x).is_integer():
            raise CollcError(f"`{name}` must be a whole number of bytes, got {x:g}", v.item_span(name, i))
    return tuple(int(x) for x in values)


def _gpu_rank(topology: Topology, value: Any, span: Span) -> int:
    if isinstance(value, str):
        if not topology.has_node(value) or topology.node(value).kind is not NodeKind.GPU:
            gpus = [n.name for n in topology.gpus]
            hint = suggest(value, gpus)
            raise CollcError(f"topology {topology.name} has no GPU named '{value}'"
                             + (f"; did you mean '{hint}'?" if hint else ""), span)
        return topology.node(value).rank  # type: ignore[return-value]
    rank = as_int(value, span, "a GPU")
    if not 0 <= rank < topology.num_ranks:
        raise CollcError(f"topology {topology.name} has no GPU {rank} (it has GPUs 0..{topology.num_ranks - 1})",
                         span)
    return rank


def _placement(v: _Values, topology: Topology) -> tuple[tuple[int, ...], ...]:
    if v.has("gpus"):
        raw = v.values["gpus"]
        if not isinstance(raw, tuple) or not raw:
            raise CollcError("`gpus` is a set with one entry per stage: `{{0, 4}, {1, 5}}` (or `{0, 1}` without "
                             "data parallelism)", v.span("gpus"))
        expr = v.settings["gpus"].value
        out = []
        for r, entry in enumerate(raw):
            entry_expr = expr.items[r] if isinstance(expr, ast.SetLiteral) else expr
            items = entry if isinstance(entry, tuple) else (entry,)
            spans = [entry_expr.items[j].span if isinstance(entry_expr, ast.SetLiteral) and j < len(entry_expr.items)
                     else entry_expr.span for j in range(len(items))]
            out.append(tuple(_gpu_rank(topology, g, s) for g, s in zip(items, spans)))
        widths = {len(g) for g in out}
        if len(widths) != 1 or 0 in widths:
            raise CollcError("every stage needs the same number of GPUs (one per data-parallel replica); got "
                             + ", ".join(str(len(g)) for g in out), v.span("gpus"))
        used: dict[int, int] = {}
        for r, gs in enumerate(out):
            for j, g in enumerate(gs):
                if g in used:
                    raise CollcError(f"GPU {g} ({topology.gpu(g).name}) holds both stage {used[g]} and stage {r}",
                                     v.span("gpus"))
                used[g] = r
        if v.has("stages") and _count(v, "stages", None, 1) != len(out):
            raise CollcError(f"`stages` is {v.values['stages']} but `gpus` places {len(out)} stages", v.span("stages"))
        if v.has("data_parallel") and _count(v, "data_parallel", None, 1) != len(out[0]):
            raise CollcError(f"`data_parallel` is {v.values['data_parallel']} but `gpus` gives each stage "
                             f"{len(out[0])} GPUs", v.span("data_parallel"))
        return tuple(out)
    stages = _count(v, "stages", None, 1)
    dp = _count(v, "data_parallel", 1, 1)
    if stages * dp > topology.num_ranks:
        where = "stages" if dp == 1 else "data_parallel"
        raise CollcError(f"{stages} stages x {dp} data-parallel replicas need {stages * dp} GPUs but topology "
                         f"{topology.name} has {topology.num_ranks}", v.span(where))
    # Replica j holds stages on GPUs j*stages .. (j+1)*stages-1: neighbouring stages on neighbouring GPUs.
    return tuple(tuple(j * stages + r for j in range(dp)) for r in range(stages))


def _choice(v: _Values, name: str, options: list[str], default: str) -> str:
    if not v.has(name):
        return default
    value = v.values[name]
    if not isinstance(value, str):
        raise CollcError(f"`{name}` must be a string, one of {', '.join(map(repr, options))}", v.span(name))
    return value


def evaluate_pipeline(module: Module, defn: ast.PipelineDef, args: list[tuple[str | None, Any, Span]],
                      call_span: Span | None) -> PipelineJob:
    ev = Evaluator()
    bound = bind_args(defn, args, call_span, module.constants, ev)  # type: ignore[arg-type]
    scope = module.constants.child()
    for p in defn.params:
        scope.define(p.name, bound.values[p.name], p.span)
    with called_from(f"pipeline {defn.name}", call_span):
        entry = module.lookup_topology(defn.topology.name, defn.topology.name_span)
        topology = topology_mod.instantiate(entry, evaluate_args(defn.topology.args, scope, ev), defn.topology.span)
        settings = {s.name: s for s in defn.settings}
        v = _Values({n: ev.eval(s.value, scope) for n, s in settings.items()}, settings)
        return _build_job(module, defn, bound, topology, v)


def _build_job(module: Module, defn: ast.PipelineDef, bound, topology: Topology, v: _Values) -> PipelineJob:
    gpus = _placement(v, topology)
    p = len(gpus)
    microbatches = _count(v, "microbatches", None, 1)
    sched_text = _choice(v, "schedule", [k.value for k in ScheduleKind if k is not ScheduleKind.CSV], "")
    csv_path = None
    if sched_text.endswith(".csv"):
        kind = ScheduleKind.CSV
        csv_path = Path(sched_text)
        if not csv_path.is_absolute():
            csv_path = module.path.parent / csv_path
        try:
            check_input_file(csv_path, "schedule file")
        except InputError as err:  # located at the setting, which names the file
            raise CollcError(err.message, v.span("schedule")) from None
    else:
        names = [k.value for k in ScheduleKind if k is not ScheduleKind.CSV]
        if sched_text not in names:
            hint = suggest(sched_text, names)
            raise CollcError(f"unknown schedule '{sched_text}' (expected {', '.join(names)}, or a .csv file)"
                             + (f"; did you mean '{hint}'?" if hint else ""), v.span("schedule"))
        kind = ScheduleKind(sched_text)
    chunks = _count(v, "chunks", 1, 1)
    _check_size(v, p, microbatches, chunks)
    if chunks > 1 and kind is not ScheduleKind.INTERLEAVED:
        raise CollcError(f"`chunks` applies to the interleaved schedule, not to {sched_text}", v.span("chunks"))
    forward = _per_stage(v, "forward", TIME, p)
    backward = _per_stage(v, "backward", TIME, p)
    weight = _per_stage(v, "backward_weight", TIME, p, lambda r: backward[r] / 2)
    for r in range(p):
        if weight[r] > backward[r]:
            raise CollcError(f"the weight-gradient part of stage {r}'s backward ({weight[r] * 1e3:g} ms) is longer "
                             f"than the backward ({backward[r] * 1e3:g} ms)", v.item_span("backward_weight", r))
    activations = _bytes(_per_stage(v, "activations", SIZE, 1, lambda r: 0), v, "activations")[0]
    gradients = _bytes(_per_stage(v, "gradients", SIZE, p, lambda r: 0), v, "gradients")
    coll_text = _choice(v, "gradient_collective", [g.value for g in GradientCollective], "allreduce")
    try:
        gcoll = GradientCollective(coll_text)
    except ValueError:
        raise CollcError(f"unknown gradient collective '{coll_text}' (expected "
                         f"{', '.join(g.value for g in GradientCollective)})", v.span("gradient_collective")) from None
    memory = _memory(v, p, gradients)
    spans = {n: s.value.span for n, s in v.settings.items()}
    name = instance_name(defn, bound)  # type: ignore[arg-type]
    return PipelineJob(name, topology, gpus, microbatches, kind, chunks, forward, backward, weight, activations,
                       gradients, gcoll, memory, csv_path, defn.span, spans)


def _check_size(v: _Values, stages: int, microbatches: int, chunks: int) -> None:
    """Micro-batches, chunks and their product with the stages within collc's limits:
    the timeline holds every (stage, micro-batch) of every chunk."""
    if microbatches > int_limit("microbatches"):
        raise CollcError(f"{microbatches:,} micro-batches" + exceeded("microbatches"), v.span("microbatches"))
    if chunks > int_limit("model_chunks"):
        raise CollcError(f"{chunks:,} model chunks per stage" + exceeded("model_chunks"), v.span("chunks"))
    pairs = stages * microbatches * chunks
    if pairs > int_limit("pipeline_actions"):
        raise CollcError(f"{stages:,} stages x {microbatches:,} micro-batches x {chunks} chunks is too large a step"
                         + exceeded("pipeline_actions", f"{pairs:,}"), v.span("microbatches"))


def _memory(v: _Values, p: int, gradients: tuple[int, ...]) -> MemoryModel | None:
    memory_settings = ("weights", "optimizer", "activation_memory")
    if not v.has("device_memory"):
        for n in memory_settings:
            if v.has(n):
                raise CollcError(f"`{n}` is part of the memory model, which needs `device_memory = ...;`", v.span(n))
        return None
    device = _bytes(_per_stage(v, "device_memory", SIZE, 1), v, "device_memory")[0]
    weights = _bytes(_per_stage(v, "weights", SIZE, p, lambda r: 0), v, "weights")
    optimizer = _bytes(_per_stage(v, "optimizer", SIZE, p, lambda r: 0), v, "optimizer")
    acts = _bytes(_per_stage(v, "activation_memory", SIZE, p, lambda r: 0), v, "activation_memory")
    mem = MemoryModel(device, weights, gradients, optimizer, acts)
    for r in range(p):
        static = mem.static_bytes(r)
        if static + acts[r] > device:
            raise CollcError(f"stage {r} needs {static / 2**30:.2f} GiB for weights, gradients and optimizer state and "
                             f"{acts[r] / 2**30:.2f} GiB per micro-batch in flight, more than the device's "
                             f"{device / 2**30:.2f} GiB", v.span("device_memory"))
    return mem
