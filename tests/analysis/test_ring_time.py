"""The ring AllReduce baseline on arrays against the ring's schedule simulated op by op."""

from __future__ import annotations

from collc import frontend
from collc.analysis.ring_time import ring_allreduce_time
from collc.driver import baseline_time
from collc.ir.collective import standard

# Two switches of four GPUs, joined by one link; GPUs with links of three speeds and
# latencies, so that hops of the ring take different times.
UNEVEN = """
topology uneven {
    gpu a[4];
    gpu b[4];
    switch s0;
    switch s1;
    link a[0] <-> s0 bw 10 GB/s lat 0.5 us;
    link a[1] <-> s0 bw 40 GB/s lat 0.3 us;
    link a[2] <-> s0 bw 40 GB/s lat 0.3 us;
    link a[3] <-> s0 bw 25 GB/s lat 0.7 us;
    for i in 0..4 { link b[i] <-> s1 bw 50 GB/s lat 0.2 us; }
    link s0 <-> s1 bw 12.5 GB/s lat 2 us;
    link a[1] <-> a[2] bw 90 GB/s lat 0.1 us;
}
"""


def _topologies(tmp_path):
    (tmp_path / "uneven.coll").write_text(UNEVEN)
    yield frontend.resolve_topology(str(tmp_path / "uneven.coll"))
    for spec in ("ring(2)", "ring(5)", "dgx_h100(nodes=2)", "ndv2(chassis=2)", "mi250_chassis", "torus2d(x=3, y=2)"):
        yield frontend.resolve_topology(spec)


def test_the_same_time_as_the_schedule_simulated(tmp_path):
    for topology in _topologies(tmp_path):
        coll = standard("allreduce", topology.num_ranks)
        ring = frontend.find_ring(topology)
        schedule = frontend.instantiate_algorithm("ring", topology, coll)
        for size in (1, 1000, 3 << 20, 3 * 10 ** 9 + 7):
            fast = ring_allreduce_time(topology, coll, size, ring)
            assert fast is not None, topology.name
            assert fast == baseline_time(schedule, topology, size), (topology.name, size)


def test_none_where_the_schedule_must_be_simulated(tmp_path):
    (tmp_path / "uneven.coll").write_text(UNEVEN)
    topology = frontend.resolve_topology(str(tmp_path / "uneven.coll"))
    n = topology.num_ranks
    ring = frontend.find_ring(topology)
    assert ring_allreduce_time(topology, standard("allreduce", n), 1 << 20, ring) is not None
    # Two chunks a rank: a rank sends two transfers a step (timed with fair sharing too).
    assert ring_allreduce_time(topology, standard("allreduce", n, chunks=2), 1 << 20, ring) is None
    assert ring_allreduce_time(topology, standard("allgather", n), 1 << 20, ring) is None
    # Back and forth between the switches: hops share the link between them.
    across = tuple(r for pair in zip(range(4), range(4, 8)) for r in pair)
    assert ring_allreduce_time(topology, standard("allreduce", n), 1 << 20, across) is None
