"""Signals between synthesis methods: "this method does not fit here, try another".

They are not user errors, so they are not `CollcError`s: a caller with another method to
try catches them (`auto` falls back from the steady state to the time-expanded models,
an AllReduce over nodes falls back to the flat composition). Where the user named the
method that does not fit (`method=steady`, `nodes=on`), the entry point
(`collc.synthesis.core.synthesize`) words the signal as a `SolverError` at that one
boundary, so the user still gets a clear message and exit status 1, never a traceback.
"""

from __future__ import annotations


class MethodDoesNotFit(Exception):
    """A synthesis method cannot answer this problem; another one may."""

    @property
    def message(self) -> str:
        return str(self)


class NotApplicable(MethodDoesNotFit):
    """The steady-state method does not fit this collective."""


class NotOverNodes(MethodDoesNotFit):
    """The cluster's nodes cannot carry an AllReduce composed over them: a rail forms no
    ring, or a node's own ReduceScatter or AllGather cannot be synthesized on its
    sub-topology."""


class NoRing(MethodDoesNotFit):
    """A rail whose GPUs cannot pass data around a ring without another GPU's help."""


class NoRails(MethodDoesNotFit):
    """Two GPUs an AllToAll over the rails joins (one node's, or one rail's) have no
    route without a third GPU in between."""
