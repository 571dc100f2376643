"""Synthesis from a topology, a collective and a message size to a verified schedule.

`synthesize` is what the `synthesize` pass calls. It refines standard collectives into
more chunks where that helps, composes collectives with reductions from copy-only ones
(collc.synthesis.compose), runs the requested method, or for `auto` the candidates that
fit the problem, times every candidate under the alpha-beta model and keeps the fastest.

The top of collc.synthesis: it imports the methods; they import the shared types from
below it (collc.synthesis.options, collc.synthesis.candidates).
"""

from __future__ import annotations

from dataclasses import replace

from collc.diagnostics import CollcError, SolverError
from collc.ir.collective import Collective, CollectiveKind
from collc.ir.topology import Topology
from collc.synthesis.auto import synthesize_copies
from collc.synthesis.candidates import Result
from collc.synthesis.compose import synthesize_with_reductions
from collc.synthesis.network import Network
from collc.synthesis.options import SynthesisOptions
from collc.synthesis.progress import Progress
from collc.synthesis.rail_alltoall import synthesize_rails, wanted as rails_wanted
from collc.synthesis.signals import MethodDoesNotFit, NoRails
from collc.synthesis.solver import Deadline
from collc.verify import verify


# The share of the time limit kept for building and verifying the schedule.
FINISHING_SHARE = 0.1


def synthesize(topology: Topology, collective: Collective, size_bytes: int,
               options: SynthesisOptions = SynthesisOptions(), progress: Progress | None = None,
               verified: bool = True) -> Result:
    """The fastest schedule found, verified on `topology` (races checked); with
    `verified` False, not verified here: the caller verifies it before it is used
    (`collc compile` does while its output is being written)."""
    if size_bytes <= 0:
        raise CollcError(f"cannot synthesize '{collective.name}' for {size_bytes} bytes: the size must be positive")
    if options.nodes == "on" and collective.kind not in (CollectiveKind.ALLREDUCE, CollectiveKind.REDUCESCATTER):
        raise CollcError(f"cannot compose '{collective.name}' over nodes (nodes=on): only an AllReduce or a "
                         f"ReduceScatter is, and this is a {collective.kind.value}")
    own_progress = progress is None
    progress = progress if progress is not None else Progress(options.progress)
    # Solvers stop a little early: turning their answer into a verified schedule takes time too.
    deadline = Deadline(options.time_limit * (1 - FINISHING_SHARE))
    try:
        if collective.has_reduction:
            result = synthesize_with_reductions(topology, collective, size_bytes, options, deadline, progress)
        else:
            result = _copies(topology, collective, size_bytes, options, deadline, progress)
    except MethodDoesNotFit as signal:
        # Only a method the user named ends here (auto tries the next one): say why.
        raise SolverError(signal.message) from None
    finally:
        if own_progress:
            progress.close()
    if verified:
        verify(result.schedule, topology)
    # The work done goes into the note and the schedule's meta: two runs that differ
    # can be told apart by it (and a fired safety net shows).
    work = deadline.work.to_json()
    schedule = replace(result.schedule, meta={**result.schedule.meta, "work": work})
    # The same ops, collective and scratch as the schedule just verified: the synthesize
    # pass marks it verified on its compile unit, and nothing runs the check again.
    return replace(result, schedule=schedule, facts={**result.facts, **work})


def _copies(topology: Topology, collective: Collective, size_bytes: int, options: SynthesisOptions,
            deadline: Deadline, progress: Progress) -> Result:
    """A collective without reductions: an AllToAll over the rails where the runtime's
    peer limit is below the direct flow's peers (collc.synthesis.rail_alltoall), else
    the methods of collc.synthesis.auto."""
    rails = rails_wanted(topology, collective, options)
    if rails is not None:
        try:
            return synthesize_rails(topology, collective, size_bytes, *rails, options, deadline, progress)
        except NoRails:
            pass  # a node or rail not joined directly: the flow below relays through GPUs
    return synthesize_copies(Network(topology), collective, size_bytes, options, deadline, progress)
