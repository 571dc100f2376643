"""The lower bounds' near-linear paths give the figures of the direct definitions."""

from __future__ import annotations

import itertools
import random

import networkx as nx
import numpy as np
import pytest

import collc.frontend as fe
from collc.analysis import bounds
from collc.analysis.bounds import _latency_distances, _minimal_sets, lower_bounds
from collc.analysis.demand import disjoint_requirements, requirements
from collc.ir.collective import standard

SIZE = 256 << 20

# Figures of the pairwise/all-pairs versions of these bounds (before the near-linear
# ones), as repr strings: they must stay the same to the last bit.
PINNED = {
    ("ring(64)", "allgather"): ("0.00528482304", "8.388608e-05", "0.00528482304", "2.24e-05"),
    ("ring(64)", "allreduce"): ("0.00536870912", "0.00536870912", "0.00536870912", "2.24e-05"),
    ("ring(64)", "alltoall"): ("0.00528482304", "0.00528482304", "0.08589934592", "2.24e-05"),
    ("dgx1", "allreduce"): ("0.0017895697066666666", "0.0017895697066666666", "0.0017895697066666666", "1.4e-06"),
    ("dgx2(chassis=2)", "allgather"): ("0.002080374784", "6.7108864e-05", "0.002080374784", "4e-06"),
    ("dgx2(chassis=2)", "alltoall"): ("0.002080374784", "0.002080374784", "0.02147483648", "4e-06"),
    ("dgx_h100(nodes=8)", "allreduce"): ("0.0005222479688715954", "0.0005222479688715954", "0.00067108864",
                                         "3.3e-06"),
}


@pytest.mark.parametrize("topo_spec, coll", sorted(PINNED))
def test_bounds_keep_their_figures_to_the_bit(topo_spec, coll):
    topo = fe.resolve_topology(topo_spec)
    lb = lower_bounds(topo, fe.resolve_collective(coll, topo.num_ranks), SIZE)
    assert tuple(repr(x) for x in (lb.ingress_s, lb.egress_s, lb.cut_s, lb.latency_s)) == PINNED[(topo_spec, coll)]


def _minimal_by_definition(sets) -> list[frozenset]:
    uniq = sorted(set(sets), key=lambda s: (len(s), sorted(s)))
    return [s for s in uniq if not any(k < s for k in uniq)]


def test_minimal_sets_equal_the_pairwise_definition():
    rng = random.Random(7)
    for _ in range(200):
        family = [frozenset(rng.sample(range(8), rng.randint(1, 4))) for _ in range(rng.randint(1, 12))]
        assert _minimal_sets(family) == _minimal_by_definition(family)
        assert _minimal_sets(tuple(family)) == _minimal_by_definition(family)  # remembered: same answer
    assert _minimal_sets([frozenset({1, 2}), frozenset(), frozenset({3})]) == [frozenset()]


@pytest.mark.parametrize("topo_spec", ["dgx1", "dgx2(chassis=2)", "dgx_h100(nodes=2)", "ring(9)"])
def test_latency_distances_are_networkx_dijkstra_to_the_bit(topo_spec):
    topo = fe.resolve_topology(topo_spec)
    g = topo.to_networkx()
    dist = _latency_distances(topo)
    for a in topo.gpus:
        expected = nx.single_source_dijkstra_path_length(g, a.name, weight="latency")
        for b in topo.gpus:
            want = expected.get(b.name, np.inf)
            assert dist[a.rank, b.rank] == want and type(float(dist[a.rank, b.rank])) is float


def test_cut_groups_survive_many_distinct_holder_families():
    # An AllGather on 80 ranks has 80 holder families, more than the minimal-set memo
    # keeps; every group must still name its own holders (ids of dropped lists recur).
    topo = fe.resolve_topology("ring(80)")
    family = disjoint_requirements(requirements(standard("allgather", 80)))
    model = bounds._CutModel(topo, family, 1.0)
    node = model.gpu_nodes
    want: dict = {}
    for req in family:
        options = tuple(tuple(sorted(node[r] for r in hs)) for hs in _minimal_by_definition(req.holders))
        key = (options, tuple(sorted(node[r] for r in req.needers)))
        want[key] = want.get(key, 0.0) + 1.0
    assert model.groups == [(o, n, w) for (o, n), w in sorted(want.items())]


def test_requirements_share_holder_sets():
    reqs = requirements(standard("allreduce", 16))
    assert len(reqs) == 16
    for a, b in itertools.combinations(reqs, 2):
        assert all(x is y for x, y in zip(a.holders, b.holders))  # one object per distinct set


@pytest.mark.parametrize("topo_spec, coll", [("ring(16)", "allgather"), ("ring(16)", "allreduce"),
                                             ("dgx1", "allgather"), ("dgx2(chassis=2)", "allreduce"),
                                             ("ring(9)", "broadcast(root=2)")])
def test_sparse_flips_equal_the_matrix_form_to_the_bit(topo_spec, coll):
    topo = fe.resolve_topology(topo_spec)
    model = bounds._CutModel(topo, disjoint_requirements(requirements(fe.resolve_collective(coll, topo.num_ranks))),
                             1e6)
    rng = np.random.default_rng(1)
    used = 0
    for _ in range(100):
        x = rng.random(len(model.names)) < rng.random()
        inside = x.astype(float)
        args = (inside, 1.0 - inside, np.where(x, 1.0, -1.0))
        sparse = model._flipped_groups_sparse(*args)
        if sparse is not None:
            used += 1
            assert np.array_equal(sparse, model._flipped_groups(*args))
    assert used > 50
