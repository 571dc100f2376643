"""The model's placement and banding, and the nccl-tests commands (no synthesis here)."""

import pytest

from collc import frontend
from collc.diagnostics import CollcError
from collc.profile.model import Placer, make_bands
from collc.profile.replay import command_for


def test_placer_rank_map_and_errors():
    topo = frontend.resolve_topology("switch(n=4)")
    placer = Placer(topo, [3, 2, 1, 0])
    assert placer.place((0, 1)).gpus == (3, 2)
    assert placer.place((0, 1)) is placer.place((0, 1))
    with pytest.raises(CollcError, match="rank map names 4 ranks"):
        placer.place((4,))
    with pytest.raises(CollcError, match="has 4 GPUs"):
        Placer(topo, None).place((0, 7))


def test_bands_split_by_ratio_and_cover_95_percent():
    sizes = {1024: 1.0, 2048: 1.0, 1 << 20: 50.0, 3 << 20: 46.0, 1 << 30: 2.0}
    bands = make_bands(sizes, "allreduce", 8)
    assert [b.sizes for b in bands] == [[1024, 2048], [1 << 20, 3 << 20], [1 << 30]]
    assert [b.covered for b in bands] == [False, True, False]


def test_nccl_tests_command_lines():
    assert command_for("allreduce", 8, "bfloat16", 1024, 4096) == \
        "./build/all_reduce_perf -b 1024 -e 4096 -f 2 -d bfloat16 -o sum -g 8"
    assert command_for("allgather", 16, "float32", 1, 2) == \
        "mpirun -np 16 ./build/all_gather_perf -b 1 -e 2 -f 2 -d float -g 1"
    assert command_for("send", 2, "float16", 8, 8).startswith("./build/sendrecv_perf")


def test_model_per_iteration_with_a_sub_communicator():
    from collc.profile.mix import build_mix
    from collc.profile.model import model_mix
    from collc.traces.records import CollectiveCall

    calls = []
    for it in range(3):  # 3 iterations: a world AllReduce, then an AllGather on ranks 2 and 3
        for r in range(4):
            calls.append(CollectiveCall("f", "l", "allreduce", rank=r, communicator="world", nranks=4,
                                        bytes=64 << 20, duration_us=900.0, start_us=it * 10.0))
        for r in (2, 3):
            calls.append(CollectiveCall("f", "l", "allgather", rank=r, communicator="tp", nranks=2,
                                        group_ranks=(2, 3), bytes=1 << 20, duration_us=50.0,
                                        start_us=it * 10.0 + 5))
    mix = build_mix(calls, world_size=4)
    assert mix.iterations.count == 3
    topo = frontend.resolve_topology("dgx1")
    result = model_mix(mix, topo, rank_map=[0, 1, 2, 3], seconds=0.5)
    by_coll = {t.collective: t for t in result.timings}
    assert by_coll["allreduce"].calls_per_iteration == 1.0
    assert by_coll["allgather"].placement.gpus == (2, 3)
    assert [g.name for g in by_coll["allgather"].placement.topology.gpus] == ["g[2]", "g[3]"]
    base, collc, bound = (result.total(w) for w in ("baseline", "collc", "bound"))
    assert bound <= collc <= base
    assert base == pytest.approx(sum(t.baseline_s for t in result.timings))
    # Only links among the used GPUs carry bytes.
    used = {n for (a, b), (byts, _) in result.link_load("baseline").items() if byts > 0 for n in (a, b)}
    assert used <= {"g[0]", "g[1]", "g[2]", "g[3]"}


def test_a_baseline_that_does_not_fit_the_cluster_says_why():
    # dgx1 is a GPU mesh: the direct AllToAll has no switch path between g[0] and g[5].
    from collc.profile.model import _baseline

    fe = frontend

    with pytest.raises(CollcError, match=r"no standard-library algorithm for alltoall runs on dgx1 \(direct: "):
        _baseline(fe.resolve_topology("dgx1"), fe.resolve_collective("alltoall", 8), 1 << 20)
    name, t, sim = _baseline(fe.resolve_topology("hgx_h100"), fe.resolve_collective("alltoall", 8), 256 << 20)
    assert name == "direct" and sim.time_s == pytest.approx(t)  # the simulation the time came from


def test_a_send_of_a_rank_to_itself_is_left_out_with_a_note():
    from collc.profile.mix import build_mix
    from collc.profile.model import demand
    from collc.traces.records import CollectiveCall

    calls = [CollectiveCall("f", "l", kind, rank=1, peer=peer, communicator="p2p", bytes=1 << 20,
                            duration_us=10.0, start_us=float(i))
             for i, (kind, peer) in enumerate((("send", 1), ("recv", 1), ("send", 2), ("recv", 0)))]
    mix = build_mix(calls, world_size=4)
    wanted, notes = demand(mix, Placer(frontend.resolve_topology("dgx1"), None))
    assert all(len(set(ranks)) == len(ranks) for _, ranks, _ in wanted)
    assert any("Send/Recv of a rank with itself" in n for n in notes)


def _two_band_mix():
    from collc.profile.mix import build_mix
    from collc.traces.records import CollectiveCall

    calls = []
    for it in range(2):      # two sizes far apart: two bands, two independent syntheses
        for r in range(4):
            for size in (64 << 20, 16 << 10):
                calls.append(CollectiveCall("f", "l", "allreduce", rank=r, communicator="world", nranks=4,
                                            bytes=size, duration_us=900.0, start_us=it * 10.0))
    return build_mix(calls, world_size=4)


def _bands(result):
    return [(b.collective, b.sizes, b.schedule is not None, b.error,
             None if b.schedule is None else len(b.schedule.ops)) for b in result.bands]


def test_bands_synthesized_in_worker_processes_as_in_one():
    """Size bands are independent: two worker processes give each the schedule one process
    gives it (the solver finishes these well within its time limit)."""
    from collc.profile.model import model_mix

    topo = frontend.resolve_topology("dgx1")
    one = model_mix(_two_band_mix(), topo, rank_map=[0, 1, 2, 3], seconds=5, workers=1)
    two = model_mix(_two_band_mix(), topo, rank_map=[0, 1, 2, 3], seconds=5, workers=2)
    assert sum(b.schedule is not None for b in one.bands) == 2
    assert _bands(one) == _bands(two)
    assert one.total("collc") == pytest.approx(two.total("collc"))


@pytest.mark.dask
def test_bands_synthesized_on_a_dask_cluster_as_here():
    distributed = pytest.importorskip("distributed")
    from collc.profile.model import model_mix

    topo = frontend.resolve_topology("dgx1")
    one = model_mix(_two_band_mix(), topo, rank_map=[0, 1, 2, 3], seconds=5, workers=1)
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None,
                                  silence_logs=50) as cluster, distributed.Client(cluster) as client:
        dask = model_mix(_two_band_mix(), topo, rank_map=[0, 1, 2, 3], seconds=5, scheduler=client)
    assert _bands(one) == _bands(dask)
