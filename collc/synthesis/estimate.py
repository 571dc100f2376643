"""How big a time-expanded model will be, and how long HiGHS will likely take on it.

Methods lp, milp and rounds call `announce` before they solve: it says on stderr, when
the likely time passes WARN_SECONDS, how large the model is (epochs x routes x chunks,
variables, rows), how long it should take and which method would answer faster. The
estimate is a power law in the model's nonzeros fitted to solves measured on the
development machine (see SIMPLEX_SECONDS); it is a guide, never a limit.
"""

from __future__ import annotations

from dataclasses import dataclass

from collc.synthesis.progress import Progress

# Seconds of one dual simplex solve of a time-expanded LP with `nnz` nonzeros:
# a * (nnz / 1e5) ** b, per formulation. Fitted to HiGHS's CPU time (one thread,
# time.process_time, so the machine's load does not enter; a busy machine's wall time
# is several times more) on method lp's models:
# - "copies" (TE-CCL's model with copies, like chunks pooled): ndv2(chassis=2)
#   AllGather 64 MiB at 4, 8 and 16 chunks per rank, 127,000 nonzeros in 0.50 s,
#   261,000 in 1.36 s, 510,000 in 4.0 s;
# - "fluid" (unicast groups with store and forward, AllToAll): dgx1 AllToAll 64 MiB at
#   1 and 2 chunks, 13,400 nonzeros in 0.09 s, 41,200 in 0.49 s, and ndv2(chassis=2)
#   AllToAll 64 MiB at 1 chunk on 32 coarse epochs, 353,000 nonzeros unsolved after
#   27.6 s (stopped): a steeper power (the law gives 0.06, 0.49 and 29 s).
SIMPLEX_SECONDS = {"copies": (0.35, 1.5), "fluid": (2.65, 1.9)}
# A MILP over the same grid does at least one LP solve and usually many more: its
# likely time is this many LP solves (TE-CCL's AllToAll LPs with Gurobi took 70-2,084 s).
MILP_LP_SOLVES = 10.0
# Say so on stderr above this many likely seconds.
WARN_SECONDS = 3.0
# Nonzeros per variable of the time-expanded models (flow rows, holding rows,
# capacity rows over their windows): 3.47-3.49 on the models with copies, 2.7-3.0 on
# the fluid ones.
NONZEROS_PER_VARIABLE = 3.5


@dataclass(frozen=True)
class ModelSize:
    """One time-expanded model, counted (or bounded) before it is solved."""

    method: str
    epochs: int
    routes: int
    chunks: int  # commodities of the model (chunks, or groups of like chunks)
    variables: int
    rows: int
    nonzeros: int
    solves: int = 1  # rounds: one model per round
    formulation: str = "copies"  # a key of SIMPLEX_SECONDS

    @property
    def seconds(self) -> float:
        """Likely seconds on this machine, idle (a shared machine takes longer)."""
        a, b = SIMPLEX_SECONDS[self.formulation]
        one = a * (max(1, self.nonzeros) / 1e5) ** b
        if self.method == "milp":
            one *= MILP_LP_SOLVES
        return one * self.solves

    def describe(self) -> str:
        per = f"{self.solves} models of " if self.solves > 1 else ""
        return (f"{per}{self.epochs} epochs x {self.routes} routes x {self.chunks} chunks "
                f"({self.variables:,} variables, {self.rows:,} rows)")


def bounded(method: str, epochs: int, routes: int, chunks: int, ranks: int, solves: int = 1,
            formulation: str = "copies") -> ModelSize:
    """An upper bound on a model not built yet: a flow per chunk, route and epoch and a
    holding per chunk, rank and epoch; a row per holding and per flow."""
    variables = chunks * epochs * (routes + ranks)
    return ModelSize(method, epochs, routes, chunks, variables, variables,
                     int(variables * NONZEROS_PER_VARIABLE), solves, formulation)


FASTER = {
    "lp": "method=steady (the rate LP, pipelined; what the default method=auto runs first) "
          "answers in seconds",
    "milp": "method=lp or method=rounds answer sooner; method=steady (the default auto's first try) in seconds",
    "rounds": "method=steady (the default auto's first try) answers in seconds",
}


def announce(progress: Progress, size: ModelSize) -> None:
    """Say on stderr what a model costs, when it is likely to take more than WARN_SECONDS
    (once per run: a horizon search announces only its first large model); the live
    progress line shows the likely time beside the time taken."""
    progress.note(likely=_seconds(size.seconds))
    if size.seconds < WARN_SECONDS or progress.said(size.method):
        return
    progress.say(f"synthesize method={size.method}: {size.describe()}, likely about "
                 f"{_seconds(size.seconds)} on this machine (more while it is busy); "
                 f"{FASTER[size.method]}")


def _seconds(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min"
