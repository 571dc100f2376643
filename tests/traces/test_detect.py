"""Formats are detected from content, whatever the file is called."""

import gzip
import shutil

import pytest

from collc.diagnostics import CollcError
from collc.traces.detect import detect
from collc.traces.sources import read_traces
from trace_samples import LOGS, TRACES, sample


@pytest.mark.parametrize("name,folder,fmt", [
    ("hta__trace_filter__sampled_rank-0.json.gz", TRACES, "kineto"),
    ("nccl-tests__Timez-zx_all_reduce_perf_2xA100_nccl-2.27.7.log", LOGS, "nccl-log"),
    ("nccl-profiler__pha-Z-nccl_example-profiler_p2p_sendrecv_trace.json.txt", TRACES, "nccl-profiler"),
    ("chakra__feeder_tests_trace.tar.gz", TRACES, "tar"),
])
def test_renamed_files_keep_their_format(tmp_path, name, folder, fmt):
    src = sample(name, folder)
    renamed = tmp_path / "data.bin"
    shutil.copy(src, renamed)
    assert detect(renamed) == fmt
    assert detect(src) == fmt


def test_gzipped_log_named_json(tmp_path):
    p = tmp_path / "trace.json"
    p.write_bytes(gzip.compress(sample("nccl-tests__Timez-zx_all_reduce_perf_2xA100_nccl-2.27.7.log",
                                       LOGS).read_bytes()))
    assert detect(p) == "nccl-log"
    assert len(read_traces([p]).calls) == 990


def test_log_whose_nccl_lines_come_late(tmp_path):
    p = tmp_path / "train.out"
    p.write_text("epoch 0 loss 1.0\n" * 20000 +
                 "h:1:1 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x1 recvbuff 0x1 count 4 "
                 "datatype 7 op 0 root 0 comm 0x2 [nranks=2] stream 0x3\n")
    assert detect(p) == "nccl-log"


def test_unknown_content_is_a_located_error(tmp_path):
    p = tmp_path / "notes.txt"
    p.write_text("nothing to see here\n")
    with pytest.raises(CollcError) as e:
        read_traces([p])
    assert e.value.span.file == str(p)
    with pytest.raises(CollcError):
        read_traces([tmp_path / "missing.json"])


def test_directory_of_mixed_traces(tmp_path):
    shutil.copy(sample("hta__trace_filter__sampled_rank-0.json.gz"), tmp_path / "a")
    shutil.copy(sample("nccl-tests__Timez-zx_all_reduce_perf_2xA100_nccl-2.27.7.log", LOGS), tmp_path / "b")
    (tmp_path / "MANIFEST.tsv").write_text("file\tsource\n")
    ts = read_traces([tmp_path])
    assert [s.format for s in ts.sources] == ["kineto", "nccl-log"]
    assert len(ts.calls) == 1000 and ts.world_size == 128
