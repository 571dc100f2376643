"""The multi-process path without NCCL: per-rank decomposition run by threads through a
stand-in transport, launcher detection, and the rendezvous between real processes."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cupy_executor_helpers import collective_schedules as cs
from cupy_executor_helpers import load_executor, run_ranks_in_threads, write_executor

SHAPES = [("allgather", 4, 2), ("reducescatter", 4, 1), ("allreduce", 3, 2), ("alltoall", 4, 1),
          ("broadcast", 5, 2)]


@pytest.mark.parametrize("kind,ranks,chunks", SHAPES)
def test_rank_programs_split_every_op_between_its_ranks(tmp_path: Path, kind: str, ranks: int, chunks: int):
    m = load_executor(write_executor(cs.BUILDERS[kind](ranks, chunks), tmp_path / "x.py"))
    local, sends, recvs = [], [], []
    for rank in range(ranks):
        for step in m.rank_program(rank):
            assert step.local or step.sends or step.recvs  # idle steps are left out
            assert all(op[2] == op[5] == rank for op in step.local)
            assert all(op[2] == rank != op[5] for op in step.sends)
            assert all(op[5] == rank != op[2] for op in step.recvs)
            ops_of_step = m.STEPS[step.step]
            assert all(op in ops_of_step for op in step.local + step.sends + step.recvs)
            local += step.local
            sends += step.sends
            recvs += step.recvs
    every = [op for ops in m.STEPS for op in ops]
    assert sorted(local + sends) == sorted(every)
    assert sorted(sends) == sorted(recvs) == sorted(op for op in every if op[2] != op[5])


@pytest.mark.parametrize("kind,ranks,chunks", SHAPES)
@pytest.mark.parametrize("inplace", [False, True])
def test_ranks_in_threads_compute_the_collective(tmp_path: Path, kind: str, ranks: int, chunks: int, inplace: bool):
    if inplace and kind == "alltoall":
        pytest.skip("direct AllToAll is not an in-place schedule")
    m = load_executor(write_executor(cs.BUILDERS[kind](ranks, chunks), tmp_path / "x.py"))
    options = m.RunOptions(sizes=(1 << 10, 1 << 14), dtype=np.dtype(np.float32), iters=2, warmup=1, check=True,
                           inplace=inplace)
    out = io.StringIO()
    results, world = run_ranks_in_threads(m, options, out)
    for rank_results in results:  # every rank sees the sums over all ranks
        assert [r.wrong for r in rank_results] == [0, 0]
        assert [r.size_bytes for r in rank_results] == [r.size_bytes for r in results[0]]
    table = [line for line in out.getvalue().splitlines() if line and not line.startswith("#")]
    assert len(table) == 2 and all(line.split()[8] == "0" for line in table)
    # The bytes sent are exactly the schedule's transfers, once per run.
    runs = options.warmup + options.iters + 1
    per_elem = sum(op[8] for ops in m.STEPS for op in ops if op[2] != op[5]) * 4
    assert sum(world.bytes_sent) == runs * per_elem * sum(m.slot_elements(s, 4) for s in options.sizes)
    groups_per_run = sum(1 for r in range(ranks) for s in m.rank_program(r) if s.sends or s.recvs)
    assert sum(world.groups) == runs * groups_per_run * len(options.sizes)


def test_ranks_in_threads_catch_a_corrupted_schedule(tmp_path: Path):
    m = load_executor(write_executor(cs.ring_reducescatter(4), tmp_path / "rs.py"))
    steps = [list(ops) for ops in m.STEPS]
    victim = steps[2][0]
    steps[2][0] = victim[:1] + (0,) + victim[2:]  # a reduction becomes a copy
    m.STEPS = tuple(tuple(ops) for ops in steps)
    options = m.RunOptions(sizes=(4096,), dtype=np.dtype(np.int32), iters=1, warmup=0, check=True)
    results, _ = run_ranks_in_threads(m, options)
    assert results[0][0].wrong > 0


def test_mismatched_transfers_are_noticed(tmp_path: Path):
    # A receive for a different slot count than its send is an error NCCL would hang or
    # fail on; the stand-in refuses it, so the per-rank split is held to NCCL's rule.
    m = load_executor(write_executor(cs.ring_allgather(3, chunks=2), tmp_path / "ag.py"))
    steps = [list(ops) for ops in m.STEPS]
    row = steps[1][0]
    steps[1][0] = row[:8] + (1,)  # the sender now sends one slot of the two
    m.STEPS = tuple(tuple(ops) for ops in steps)
    original = m.rank_program

    def skewed(rank: int):
        program = original(rank)
        if rank == row[5]:  # the receiving rank keeps the old two-slot receive
            return [s if s.step != 1 else m.RankStep(s.step, s.local, s.sends, (row,) + s.recvs[1:])
                    for s in program]
        return program

    m.rank_program = skewed
    options = m.RunOptions(sizes=(4096,), dtype=np.dtype(np.float32), iters=1, warmup=0)
    with pytest.raises(AssertionError, match="receives"):
        run_ranks_in_threads(m, options)


# --- launchers ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def m(tmp_path_factory):
    return load_executor(write_executor(cs.ring_allgather(4), tmp_path_factory.mktemp("ag") / "ag.py"))


def test_detect_launch(m):
    assert m.detect_launch({}) is None
    assert m.detect_launch({"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}) == m.Launch(2, 4, 1, "torchrun")
    assert m.detect_launch({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4"}) == \
        m.Launch(3, 4, None, "Open MPI")
    assert m.detect_launch({"PMI_RANK": "0", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0"}).launcher == "MPICH/Intel MPI"
    assert m.detect_launch({"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "4", "SLURM_LOCALID": "1"}).rank == 1
    # a batch script has SLURM_NTASKS but is one process: not a multi-process launch
    assert m.detect_launch({"SLURM_PROCID": "0", "SLURM_NTASKS": "4"}) is None
    with pytest.raises(m.UsageError, match="not an integer"):
        m.detect_launch({"RANK": "one", "WORLD_SIZE": "4"})
    with pytest.raises(m.UsageError, match="do not make sense"):
        m.detect_launch({"RANK": "4", "WORLD_SIZE": "4"})


def test_choose_mode(m):
    launch = m.Launch(0, 4, 0, "torchrun")
    assert m.choose_mode("auto", None) == "single"
    assert m.choose_mode("auto", launch) == "multi"
    assert m.choose_mode("auto", m.Launch(0, 1, 0, "torchrun")) == "single"
    assert m.choose_mode("single", launch) == "single"
    with pytest.raises(m.UsageError):
        m.choose_mode("multi", None)


def test_multi_process_usage_errors(m, capsys):
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    assert m.main(["--size", "1K"], env, io.StringIO()) == 2
    assert "the schedule has 4 ranks, but torchrun started 2" in capsys.readouterr().err
    env["WORLD_SIZE"] = "4"
    assert m.main(["--size", "1K", "--device", "cpu"], env, io.StringIO()) == 2
    assert "need --device gpu" in capsys.readouterr().err


def test_place_ranks(m):
    assert m.place_ranks((0,), 4) == [0, 0, 0, 0]
    assert m.place_ranks((0, 1), 4) == [0, 0, 1, 1]
    assert m.place_ranks(tuple(range(8)), 4) == [0, 2, 4, 6]
    assert m.place_ranks((0, 1, 2), 4) == [0, 0, 1, 2]


def test_parse_rendezvous(m):
    env = {"MASTER_ADDR": "node7", "MASTER_PORT": "29500"}
    assert m.parse_rendezvous(None, env) == m.TcpRendezvous("node7", 29500)
    assert m.parse_rendezvous(None, {**env, "TORCHELASTIC_USE_AGENT_STORE": "True"}).port == 29501
    assert m.parse_rendezvous("tcp://10.1.2.3:1234", {}) == m.TcpRendezvous("10.1.2.3", 1234)
    assert m.parse_rendezvous("tcp://[::1]:1234", {}) == m.TcpRendezvous("::1", 1234)
    assert m.parse_rendezvous("file:/shared/id", {}) == m.FileRendezvous(Path("/shared/id"))
    for bad in ("tcp://host", "tcp://host:99999", "udp://x:1", "file:"):
        with pytest.raises(m.UsageError):
            m.parse_rendezvous(bad, {})
    with pytest.raises(m.UsageError, match="MASTER_ADDR"):
        m.parse_rendezvous(None, {})


def test_nccl_id_bytes_round_trip(m):
    uid = tuple(range(-128, 0)) + tuple(range(0, 128))
    data = m.nccl_id_to_bytes(uid[:128])
    assert len(data) == 128 and m.nccl_id_from_bytes(data) == uid[:128]
    assert all(-128 <= b < 128 for b in m.nccl_id_from_bytes(bytes(range(256))))


# --- the rendezvous between processes ----------------------------------------------------------

SHARE = """
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("executor", sys.argv[1])
m = sys.modules["executor"] = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
launch = m.detect_launch(os.environ)
rdv = m.parse_rendezvous(sys.argv[2] if len(sys.argv) > 2 else None, os.environ)
try:
    uid = m.share_unique_id(rdv, launch.rank, launch.world_size, lambda: os.urandom(128), float(os.environ["T"]),
                            m.job_key(os.environ))
except m.RendezvousError as exc:
    print("error:", exc); sys.exit(3)
print(uid.hex(), flush=True)
if launch.rank == 0 and "GO" in os.environ:  # stands for NCCL's init, which every rank joins
    import time
    while not os.path.exists(os.environ["GO"]):
        time.sleep(0.02)
m.finish_rendezvous(rdv, launch.rank)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_ranks(executors: list[Path], extra: list[str], env: dict[str, str]) -> list[subprocess.Popen]:
    procs = []
    for rank, path in enumerate(executors):
        rank_env = {**os.environ, "T": "20", **env, "RANK": str(rank), "WORLD_SIZE": str(len(executors))}
        procs.append(subprocess.Popen([sys.executable, "-c", SHARE, str(path), *extra], env=rank_env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def _finish(procs: list[subprocess.Popen]) -> list[tuple[int, str]]:
    results = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        results.append((p.returncode, out.strip() + err.strip()))
    return results


def test_tcp_rendezvous_between_processes(tmp_path: Path):
    path = write_executor(cs.ring_allgather(4), tmp_path / "ag.py")
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    results = _finish(_start_ranks([path] * 4, [], env))
    assert [code for code, _ in results] == [0] * 4, results
    ids = {out for _, out in results}
    assert len(ids) == 1 and len(bytes.fromhex(ids.pop())) == 128


def test_file_rendezvous_between_processes(tmp_path: Path):
    path = write_executor(cs.ring_allgather(3), tmp_path / "ag.py")
    rdv = tmp_path / "shared" / "nccl-id"
    rdv.parent.mkdir()
    go = tmp_path / "go"
    procs = _start_ranks([path] * 3, [f"file:{rdv}"], {"SLURM_JOB_ID": "42", "GO": str(go)})
    others = _finish(procs[1:])
    assert rdv.exists()
    go.touch()
    results = _finish(procs[:1]) + others
    assert [code for code, _ in results] == [0] * 3, results
    assert len({out for _, out in results}) == 1
    assert not rdv.exists()  # rank 0 removed it once everyone had it


def test_file_rendezvous_ignores_another_jobs_file(tmp_path: Path):
    m = load_executor(write_executor(cs.ring_allgather(2), tmp_path / "ag.py"))
    rdv = m.FileRendezvous(tmp_path / "nccl-id")
    uid = os.urandom(128)
    assert m.share_unique_id(rdv, 0, 2, lambda: uid, 1.0, "SLURM_JOB_ID=1") == uid
    with pytest.raises(m.RendezvousError, match="no rendezvous file"):
        m.share_unique_id(rdv, 1, 2, os.urandom, 0.3, "SLURM_JOB_ID=2")
    with pytest.raises(m.RendezvousError):  # nor one for another world size
        m.share_unique_id(rdv, 1, 3, os.urandom, 0.3, "SLURM_JOB_ID=1")
    assert m.share_unique_id(rdv, 1, 2, os.urandom, 1.0, "SLURM_JOB_ID=1") == uid


def test_ranks_running_different_schedules_do_not_meet(tmp_path: Path):
    a = write_executor(cs.ring_allgather(2), tmp_path / "a.py")
    b = write_executor(cs.direct_alltoall(2), tmp_path / "b.py")
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "T": "1"}
    results = _finish(_start_ranks([a, b], [], env))
    assert results[1][0] == 3 and "another schedule" in results[1][1]
    assert results[0][0] == 3 and "only 0 of 1 ranks" in results[0][1]
