"""Synthesis of schedules by optimization on HiGHS (TE-CCL and a steady-state method).

    from collc.synthesis import synthesize, SynthesisOptions, Method
    result = synthesize(topology, collective, size_bytes, SynthesisOptions(method=Method.AUTO))
    result.schedule  # verified; result.note() is what the `synthesize` pass records

Modules: network (GPU-to-GPU routes), problem (commodities, refinement), timexp (the
time-expanded TE-CCL model and a greedy schedule on it), milp, lp, rounds, steady
(rate LP + pipelining), arborescence (Chu-Liu/Edmonds), extract (plans to ops), compose
(ReduceScatter, Reduce, AllReduce), nodes and rail_ring (AllReduce over identical
nodes), timing (alpha-beta timing and step assignment), auto (method choice), solver
(HiGHS), progress (terminal display).
"""

from collc.synthesis.core import Method, Result, SynthesisOptions, synthesize

__all__ = ["Method", "Result", "SynthesisOptions", "synthesize"]
