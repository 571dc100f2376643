"""Requirements come in one order, by size and then by sorted chunks, whatever the
collective: the bounds (and their witnesses) read them in that order."""

from __future__ import annotations

import pytest

import collc.frontend as fe
from collc.analysis.demand import requirements


@pytest.mark.parametrize("spec", ["alltoall", "alltoall(chunks=3)", "allreduce(chunks=2)", "allgather",
                                  "reducescatter", "broadcast(root=2)", "reduce(root=1)"])
def test_requirements_by_size_then_sorted_chunks(spec):
    reqs = requirements(fe.resolve_collective(spec, 8))
    keys = [(len(r.value), tuple(sorted(r.value))) for r in reqs]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    assert all(r.chunks == tuple(sorted(r.value)) for r in reqs)
