"""The GPU path (CupyDevices) on a stand-in for CuPy whose streams really run out of
order: every step's waits must hold, copies must name the right devices."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cupy_executor_helpers import collective_schedules as cs
from cupy_executor_helpers import load_executor, write_executor
from fake_cupy import make_fake_cupy


def _run(module, cupy, devices: int, step_sync: str = "event", inplace: bool = False, dtype=np.float32):
    gpus = module.CupyDevices(cupy, range(devices), step_sync)
    placement = module.place_ranks(gpus.device_ids)
    runner = module.SingleProcessRunner(gpus, placement, np.dtype(dtype), inplace)
    options = module.RunOptions(sizes=(1 << 10, 1 << 13), dtype=np.dtype(dtype), iters=2, warmup=1, check=True,
                                inplace=inplace)
    return module.benchmark(runner, options)


@pytest.mark.parametrize("kind,chunks,devices", [
    ("allgather", 2, 3), ("reducescatter", 1, 3), ("allreduce", 2, 3), ("alltoall", 1, 3), ("broadcast", 3, 3),
    ("allreduce", 1, 8), ("alltoall", 2, 8), ("reducescatter", 2, 1)])
def test_gpu_path_is_correct_with_streams_out_of_order(tmp_path: Path, kind: str, chunks: int, devices: int):
    module = load_executor(write_executor(cs.BUILDERS[kind](8, chunks), tmp_path / f"{kind}.py"))
    for seed in range(2):
        cupy = make_fake_cupy(devices, seed)
        assert [r.wrong for r in _run(module, cupy, devices)] == [0, 0]
        if devices > 1:
            assert len(cupy.gpus.peer_enabled) == devices * (devices - 1)


def test_host_step_sync_and_in_place(tmp_path: Path):
    module = load_executor(write_executor(cs.ring_allreduce(4, 2), tmp_path / "ar.py"))
    assert [r.wrong for r in _run(module, make_fake_cupy(2, 5), 2, step_sync="host")] == [0, 0]
    assert [r.wrong for r in _run(module, make_fake_cupy(4, 6), 4, inplace=True, dtype=np.float16)] == [0, 0]


def test_without_waits_between_steps_the_stand_in_catches_races(tmp_path: Path):
    # The stand-in is only worth its salt if a missing wait shows: drop the waits.
    module = load_executor(write_executor(cs.ring_allreduce(4), tmp_path / "ar.py"))
    module.CupyDevices.wait_for_previous_step = lambda self, device: None
    wrong = [sum(r.wrong for r in _run(module, make_fake_cupy(4, seed), 4)) for seed in range(4)]
    assert any(wrong)


def test_gpus_option_and_dtype_check(tmp_path: Path, monkeypatch, capsys):
    module = load_executor(write_executor(cs.ring_allgather(4), tmp_path / "ag.py"))
    cupy = make_fake_cupy(2, 0)
    monkeypatch.setitem(__import__("sys").modules, "cupy", cupy)
    import io

    out = io.StringIO()
    assert module.main(["--device", "gpu", "--gpus", "2", "--check", "--size", "4K", "-n", "1"], {}, out) == 0
    text = out.getvalue()
    assert "2 device(s)" in text and "Fake GPU 1" in text
    assert module.main(["--device", "gpu", "--gpus", "3", "--size", "4K"], {}, io.StringIO()) == 2
    assert "there are 2 GPUs" in capsys.readouterr().err


def _shift_schedule():
    """One rank; output = (c0, c0, c1): in place, the copy input[0..2] -> output[1..3]
    reads slots it overwrites, so it must go through staging."""
    from collc.ir import Buffer, ChunkId, Collective, CollectiveKind, Loc, Op, OpKind, Schedule
    from collc.verify import verify

    def v(i: int) -> frozenset:
        return frozenset({ChunkId(0, i)})

    coll = Collective("shift", CollectiveKind.CUSTOM, 1, 3, ((v(0), v(1), v(2)),), ((v(0), v(0), v(1)),))
    ops = (Op(0, OpKind.COPY, Loc(0, Buffer.INPUT, 0), Loc(0, Buffer.OUTPUT, 0)),
           Op(1, OpKind.COPY, Loc(0, Buffer.INPUT, 0), Loc(0, Buffer.OUTPUT, 1), count=2))
    schedule = Schedule("shift", coll, "one", ops)
    verify(schedule)
    return schedule


@pytest.mark.parametrize("inplace", [False, True])
def test_overlapping_copies_in_place_go_through_staging(tmp_path: Path, inplace: bool):
    module = load_executor(write_executor(_shift_schedule(), tmp_path / "shift.py"))
    cupy = make_fake_cupy(1, 0)  # refuses overlapping device copies
    assert [r.wrong for r in _run(module, cupy, 1, inplace=inplace)] == [0, 0]
    assert module.busbw_factor() == 1.0  # a custom collective: no nccl-tests factor
