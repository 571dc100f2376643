"""`collc profile --demands DIR`: the demand matrix of each all_to_all in Kineto traces.

The public traces at hand (../shared/data/traces) record all_to_all with empty split
sizes ("[]": even splits). The traces here are written to the documented fields of
PyTorch's record_param_comms ("In split size", "Out split size", "In msg nelems",
"Group size", "dtype", "Process Group Name", "Process Group Ranks"; distributedInfo's
rank): synthetic, one file per rank, as a profiled 4-rank MoE layer writes them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from collc.frontend.demand import read_demand
from collc.profile.demands import demand_calls, split_calls

# Elements rank i sends rank j in two all_to_all calls (float32: 4 bytes each).
CALLS = [np.array([[0, 10, 0, 30], [5, 0, 5, 0], [0, 0, 0, 0], [1, 2, 3, 0]]),
         np.array([[2, 2, 2, 2], [0, 0, 0, 8], [4, 0, 0, 4], [0, 6, 0, 0]])]


def _event(rank: int, k: int, sent: list[int], received: list[int], even: bool = False) -> dict:
    return {"name": "record_param_comms", "cat": "cpu_op", "ph": "X", "ts": 1000.0 * (k + 1), "dur": 5.0,
            "pid": rank, "tid": 1,
            "args": {"Collective name": "all_to_allv" if not even else "all_to_all", "dtype": "Float",
                     "In msg nelems": sum(sent), "Out msg nelems": sum(received), "Group size": 4,
                     "In split size": "[]" if even else json.dumps(sent),
                     "Out split size": "[]" if even else json.dumps(received),
                     "Process Group Name": "0", "Process Group Ranks": "[0, 1, 2, 3]"}}


def write_traces(directory: Path, calls=CALLS) -> None:
    directory.mkdir()
    for r in range(4):
        events = [_event(r, k, m[r].tolist(), m[:, r].tolist()) for k, m in enumerate(calls)]
        events.append({"name": "record_param_comms", "cat": "cpu_op", "ph": "X", "ts": 9000.0, "dur": 1.0,
                       "pid": r, "tid": 1, "args": {"Collective name": "allreduce", "dtype": "Float",
                                                    "In msg nelems": 8, "Group size": 4}})
        doc = {"distributedInfo": {"backend": "nccl", "rank": r, "world_size": 4}, "traceEvents": events}
        (directory / f"rank{r}.json").write_text(json.dumps(doc))


def test_calls_are_matched_across_ranks_in_order(tmp_path):
    write_traces(tmp_path / "trace")
    calls = demand_calls(split_calls(p) for p in sorted((tmp_path / "trace").iterdir()))
    assert [(c.group, c.index, c.consistent) for c in calls] == [("0", 0, True), ("0", 1, True)]
    for call, m in zip(calls, CALLS):
        assert call.matrix.tolist() == (m * 4).tolist()


def test_disagreeing_out_splits_are_not_written(tmp_path):
    write_traces(tmp_path / "trace")
    doc = json.loads((tmp_path / "trace" / "rank1.json").read_text())
    doc["traceEvents"][0]["args"]["Out split size"] = "[9, 9, 9, 9]"
    (tmp_path / "trace" / "rank1.json").write_text(json.dumps(doc))
    calls = demand_calls(split_calls(p) for p in sorted((tmp_path / "trace").iterdir()))
    assert [c.consistent for c in calls] == [False, True]


def test_even_split(tmp_path):
    (tmp_path / "t").mkdir()
    for r in range(4):
        doc = {"distributedInfo": {"rank": r, "world_size": 4},
               "traceEvents": [_event(r, 0, [8] * 4, [8] * 4, even=True)]}
        (tmp_path / "t" / f"r{r}.json").write_text(json.dumps(doc))
    (call,) = demand_calls(split_calls(p) for p in sorted((tmp_path / "t").iterdir()))
    assert call.matrix.tolist() == np.full((4, 4), 32.0).tolist()


def test_profile_writes_matrices_that_compile_reads(tmp_path):
    write_traces(tmp_path / "trace")
    run = subprocess.run([sys.executable, "-m", "collc", "profile", "trace", "--demands", "dem", "-q"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    files = sorted(p.name for p in (tmp_path / "dem").iterdir())
    assert files == ["alltoall-0-0.csv", "alltoall-0-1.csv"]
    m = read_demand(tmp_path / "dem" / "alltoall-0-0.csv", 4)
    assert m.tolist() == (CALLS[0] * 4).tolist()
    run = subprocess.run([sys.executable, "-m", "collc", "compile", "--topology", "switch(4)", "--demand",
                          "dem/alltoall-0-0.csv", "-o", "a.json", "-q"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
