"""Size and time estimates of the time-expanded models, and what the user is told."""

import io

import pytest

from collc.analysis.bounds import lower_bounds
from collc.frontend import resolve_topology
from collc.ir.collective import standard
from collc.synthesis.candidates import problem_for
from collc.synthesis.core import synthesize
from collc.synthesis.estimate import WARN_SECONDS, ModelSize, announce, bounded
from collc.synthesis.lp import COARSE_EPOCHS, lp_grid
from collc.synthesis.network import Network
from collc.synthesis.options import Method, SynthesisOptions
from collc.synthesis.progress import Progress


def test_a_bound_counts_flows_and_holdings_per_chunk_and_epoch():
    size = bounded("lp", epochs=10, routes=6, chunks=4, ranks=3)
    assert size.variables == 4 * 10 * (6 + 3)
    assert size.describe().startswith("10 epochs x 6 routes x 4 chunks (360 variables")


def test_likely_time_grows_faster_than_the_model_and_a_milp_costs_more_than_its_lp():
    small, large = bounded("lp", 10, 66, 16, 16), bounded("lp", 100, 66, 16, 16)
    assert large.seconds > 10 * small.seconds
    assert bounded("milp", 10, 66, 16, 16).seconds > small.seconds
    assert bounded("lp", 10, 66, 16, 16, formulation="fluid").seconds > small.seconds
    assert bounded("rounds", 10, 66, 16, 16, solves=5).seconds == pytest.approx(5 * small.seconds)


def _said(size: ModelSize) -> str:
    out = io.StringIO()
    announce(Progress(True, stream=out), size)
    return out.getvalue()


def test_only_a_model_likely_to_take_a_while_is_announced_and_a_faster_method_named():
    quick = bounded("lp", 4, 6, 2, 4)
    slow = bounded("lp", 256, 66, 240, 16)
    assert quick.seconds < WARN_SECONDS < slow.seconds
    assert _said(quick) == ""
    text = _said(slow)
    assert "method=lp: 256 epochs x 66 routes x 240 chunks" in text and "method=steady" in text
    out = io.StringIO()
    announce(Progress(False, stream=out), slow)  # progress=False: nothing at all
    assert out.getvalue() == ""


def test_a_slow_milp_says_its_size_and_likely_time_before_solving_within_a_small_budget():
    # ndv2(chassis=2): InfiniBand at 12.5 GB/s beside NVLink; TE-CCL's MILP over the fine
    # grid needs over a hundred epochs of 64 chunks. Two seconds: it stops at its limit
    # with the greedy schedule, but says first what it would have cost.
    topo = resolve_topology("ndv2(chassis=2)")
    out = io.StringIO()
    opts = SynthesisOptions(method=Method.MILP, chunks=4, time_limit=2.0)
    res = synthesize(topo, standard("allgather", 16), 64 << 20, opts, Progress(True, stream=out))
    text = out.getvalue()
    assert text.count("collc: synthesize method=milp:") == 1
    assert "x 66 routes x 64 chunks" in text and "method=lp or method=rounds answer sooner" in text
    likely = text.split("likely about ")[1].split(" ")
    assert float(likely[0]) >= WARN_SECONDS or likely[1].startswith("min")
    assert res.status.value == "time_limit"


def test_lp_on_two_ndv2_chassis_uses_long_epochs_and_lands_near_the_bound():
    # The coarse grid: epochs of one InfiniBand chunk, NVLink carrying several in one.
    topo = resolve_topology("ndv2(chassis=2)")
    opts = SynthesisOptions(method=Method.LP, chunks=4, progress=False)
    res = synthesize(topo, standard("allgather", 16), 64 << 20, opts)
    assert res.facts["epoch_seconds"] == pytest.approx(85.186e-6, rel=1e-3)
    assert res.facts["relaxation_epochs"] == 32  # the bound, 2,684 us, in 85 us epochs
    assert res.estimate_s <= 2684.35456e-6 * 1.10


def test_lp_epochs_are_at_least_the_bound_over_32_where_slow_links_carry_hundreds_of_chunks():
    topo = resolve_topology("ndv2(chassis=2)")
    problem = problem_for(Network(topo), standard("alltoall", 16), 64 << 20, 4)
    bound = lower_bounds(topo, problem.collective, 64 << 20).best_s
    grid, coarse = lp_grid(problem, bound)
    assert coarse and grid.tau == pytest.approx(bound / COARSE_EPOCHS)
    assert grid.max_lag == 1 and max(grid.hold.values()) < 1  # several chunks per epoch
