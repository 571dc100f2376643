"""The front end at thousands of GPUs: `check` of a large cluster answers in seconds.

Checking a file instantiates the collective of each compile request at its rank count
and checks that every chunk can reach the ranks that need it. Interpreting the
AllGather postcondition at 2,000 ranks took minutes (4 million evaluations), as did a
search from every GPU for reachability.
"""

from __future__ import annotations

import time

import collc.frontend as fe
from collc.diagnostics import CollcError

BIG = """
topology big {
    gpu g[2000];
    switch s;
    for i in 0..2000 { link g[i] <-> s bw 100 GB/s; }
}
compile allgather on big() size 1 MiB;
"""


def test_check_of_a_2000_gpu_topology_with_a_request_takes_seconds(tmp_path):
    path = tmp_path / "big.coll"
    path.write_text(BIG)
    t0 = time.process_time()
    summary = fe.check_file(path)
    elapsed = time.process_time() - t0  # CPU time: the machine may be shared
    assert "big: 2000 GPUs, 2001 nodes, 4000 links" in str(summary)
    (request,) = summary.requests
    assert request.collective.ranks == 2000 and request.collective.kind.value == "allgather"
    assert request.collective.outputs[1999][1234] == frozenset({(1234, 0)})
    assert elapsed < 20, f"check took {elapsed:.1f} s of CPU"


def test_unreachable_ranks_are_still_found_in_a_large_split_cluster(tmp_path):
    path = tmp_path / "split.coll"
    path.write_text("""
topology split {
    gpu g[600];
    switch a; switch b;
    for i in 0..300 { link g[i] <-> a bw 100 GB/s; }
    for i in 300..600 { link g[i] <-> b bw 100 GB/s; }
    link g[599] -> a bw 1 GB/s;
}
compile allgather on split() size 1 MiB;
""")
    try:
        fe.check_file(path)
    except CollcError as err:
        # rank 0's chunk cannot reach the second half (links there lead only into `a`).
        assert "chunk(0, 0)" in err.message and "300" in err.message, err.message
    else:
        raise AssertionError("a split cluster was accepted")
