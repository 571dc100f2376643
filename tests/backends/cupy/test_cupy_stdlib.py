"""Executors of the stdlib's hand-written algorithms, as the front end instantiates them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cupy_executor_helpers import load_executor, run_executor, run_ranks_in_threads, table_rows

from collc.backends import BackendOptions
from collc.backends.cupy.generate import emit
from collc.passes.base import CompileUnit
from collc.verify import verify

from collc import frontend


@pytest.mark.parametrize("topology", ["switch(n=4)", "dgx1"])
@pytest.mark.parametrize("kind", ["allgather", "reducescatter", "allreduce", "broadcast"])
def test_stdlib_algorithms_run_correctly_per_rank(tmp_path: Path, topology: str, kind: str):
    topo = frontend.resolve_topology(topology)
    coll = frontend.resolve_collective(f"{kind}(chunks=2)", topo.num_ranks)
    algorithm = frontend.algorithms_for(kind)[0]
    schedule = frontend.instantiate_algorithm(algorithm, topo, coll)
    verify(schedule, topo)
    (path,) = emit(CompileUnit(topo, coll, 1 << 16, schedule=schedule), tmp_path / f"{kind}.py", BackendOptions())
    module = load_executor(path)
    options = module.RunOptions(sizes=(1 << 12,), dtype=np.dtype(np.float16), iters=1, warmup=0, check=True)
    results, _ = run_ranks_in_threads(module, options)
    assert results[0][0].wrong == 0
    if topology == "dgx1" and kind == "allreduce":  # and once the whole way, as a program
        done = run_executor(path, "--device", "cpu", "--check", "-n", "1", "-w", "0")
        assert done.returncode == 0, done.stderr
        assert [row[8] for row in table_rows(done.stdout)] == ["0"]
