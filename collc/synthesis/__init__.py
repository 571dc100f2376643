"""Synthesis of schedules by optimization on HiGHS (TE-CCL and a steady-state method).

    from collc.synthesis import synthesize, SynthesisOptions, Method
    result = synthesize(topology, collective, size_bytes, SynthesisOptions(method=Method.AUTO))
    result.schedule  # verified; result.note() is what the `synthesize` pass records

Modules, from the bottom up: network (GPU-to-GPU routes), problem (commodities,
refinement), solver (HiGHS), progress (terminal display), timing (alpha-beta timing and
step assignment), options (Method, SynthesisOptions), candidates (Candidate, Result),
symmetry (identical nodes and rails on a network), arborescence (Chu-Liu/Edmonds),
extract (plans to ops), halves (reductions and gatherings as ops); the methods: timexp
(the time-expanded TE-CCL model and a greedy schedule on it), milp, lp, rounds, steady/
(rate LPs + pipelining), auto (method choice, collectives without reductions), direct
(a direct AllReduce), nodes and rail_ring (AllReduce over identical nodes), compose
(ReduceScatter, Reduce, AllReduce); on top, core (the entry point).
"""

from collc.synthesis.candidates import Result
from collc.synthesis.core import synthesize
from collc.synthesis.options import Method, SynthesisOptions

__all__ = ["Method", "Result", "SynthesisOptions", "synthesize"]
