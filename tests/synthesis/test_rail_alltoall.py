"""AllToAll over the rails of identical nodes (collc.synthesis.rail_alltoall): where the
runtime takes fewer peers per GPU than a direct flow needs, a node pair's blocks cross
one rail together, gathered and scattered over NVLink."""

from __future__ import annotations

import pytest
from rail_topologies import quad

from collc.analysis.bounds import lower_bounds
from collc.ir.collective import alltoall
from collc.ir.schedule import rank_peers
from collc.synthesis.core import synthesize
from collc.synthesis.options import SynthesisOptions
from collc.synthesis.rail_alltoall import RailPlan, choose_plan, wanted

GIB = 1 << 30


def test_on_128_dgx_nodes_one_rail_per_node_pair_keeps_39_peers_at_0_8_percent_over_the_mean_load():
    plan = choose_plan(128, 8, 130)
    assert plan == RailPlan(128, 8, 1)
    assert plan.peers == 7 + 32 and plan.rounds == 16
    assert plan.rail_load_over_mean == pytest.approx(16 / (127 / 8))
    # Every block on its destination's rail (PXN) would need 134 peers.
    assert RailPlan(128, 8, 8).peers == 134


def test_every_round_of_a_rail_is_a_permutation_of_the_nodes():
    plan = RailPlan(16, 8, 2)
    seen: dict[tuple[int, int], list[int]] = {}
    for d in range(1, 16):
        for k in range(2):
            seen.setdefault((plan.rail(d, k), plan.round(d, k)), []).append(d)
    assert all(len(offsets) == 1 for offsets in seen.values())  # one offset per rail and round
    assert sorted(d for offsets in seen.values() for d in offsets) == sorted(list(range(1, 16)) * 2)


def test_a_pair_is_split_over_more_rails_only_where_that_balances_them_and_the_peers_fit():
    # 15 other nodes over 8 rails: one rail per pair loads the busiest rail 2 / 1.875;
    # a pair on all 8 rails balances them, at 22 peers.
    assert choose_plan(16, 8, 130).units == 8
    assert choose_plan(16, 8, 16).units == 1
    assert choose_plan(16, 8, 8) is None


def test_the_alltoall_keeps_within_a_peer_limit_below_the_direct_flows_and_near_the_bound(tmp_path):
    topo = quad(tmp_path, 9, 12)  # direct: 8 rail peers + 3 in the node = 11 per GPU
    coll = alltoall(topo.num_ranks)
    result = synthesize(topo, coll, GIB, SynthesisOptions(progress=False, max_peers=32, peer_limit=10))
    assert result.method == "rails"  # synthesize verified it against the postcondition
    sends, recvs = rank_peers(result.schedule)
    assert max(len(sends[r] | recvs[r]) for r in range(topo.num_ranks)) == 7 <= 10
    assert result.estimate_s / lower_bounds(topo, coll, GIB).best_s <= 1.05


def test_without_a_binding_peer_limit_the_flow_is_kept(tmp_path):
    topo = quad(tmp_path, 3, 12)  # direct: 2 + 3 peers
    coll = alltoall(topo.num_ranks)
    assert wanted(topo, coll, SynthesisOptions(max_peers=32, peer_limit=10)) is None
    assert wanted(topo, coll, SynthesisOptions(max_peers=32, peer_limit=4)) is None  # and no plan fits 4
    assert wanted(topo, coll, SynthesisOptions()) is None  # no runtime limit
