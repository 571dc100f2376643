"""`pipeline` declarations: evaluation into a job, and located errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from collc.diagnostics import CollcError
from collc.frontend.load import clear_cache
from collc.frontend.specs import resolve_pipeline
from collc.ir.pipeline import GradientCollective, ScheduleKind
from collc.pipeline.predict import predict

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pipeline_dgx1.coll"

GOOD = """import topologies.dgx1;

pipeline job(m = 8) on dgx1 {
    stages = 4;
    data_parallel = 2;
    microbatches = m;
    schedule = "1f1b";
    forward = {1 ms, 1 ms, 1 ms, 1.5 ms};
    backward = 2 ms;
    activations = 4 MiB;
    gradients = 64 MB;
}
"""


def _write(tmp_path: Path, text: str, name: str = "p.coll") -> Path:
    clear_cache()
    path = tmp_path / name
    path.write_text(text)
    return path


def _error(tmp_path: Path, text: str, spec_suffix: str = "") -> CollcError:
    path = _write(tmp_path, text)
    with pytest.raises(CollcError) as err:
        job = resolve_pipeline(str(path) + spec_suffix)
        predict(job, synthesize=False)
    return err.value


def test_the_example_evaluates_into_a_job():
    job = resolve_pipeline(EXAMPLE)
    assert job.stage_gpus == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert job.schedule is ScheduleKind.ONE_F_ONE_B and job.microbatches == 8
    assert job.forward_s == pytest.approx((4e-3, 4e-3, 4e-3, 4.6e-3))
    assert job.backward_weight_s == pytest.approx((4e-3,) * 4)
    assert job.activation_bytes == 16 * 2 ** 20 and job.gradient_bytes == (650_000_000,) * 4
    assert job.gradient_collective is GradientCollective.ALLREDUCE
    assert job.memory is not None and job.memory.device_bytes == 32 * 2 ** 30


def test_arguments_and_default_placement(tmp_path):
    path = _write(tmp_path, GOOD)
    job = resolve_pipeline(f"{path}:job(m = 12)")
    assert job.microbatches == 12
    # Replica j holds stage s on GPU j * stages + s.
    assert job.stage_gpus == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert job.name == "job(m=12)"


def test_gpus_by_name_and_schedule_from_csv(tmp_path):
    (tmp_path / "s.csv").write_text("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n")
    text = GOOD.replace("stages = 4;\n    data_parallel = 2;", 'gpus = {"g[2]", "g[3]"};').replace(
        '"1f1b"', '"s.csv"').replace("{1 ms, 1 ms, 1 ms, 1.5 ms}", "1 ms")
    job = resolve_pipeline(f"{_write(tmp_path, text)}:job(m = 2)")
    assert job.stage_gpus == ((2,), (3,)) and job.schedule is ScheduleKind.CSV
    pred = predict(job, synthesize=False)
    assert pred.order.name == "s" and pred.report["stages"][1]["ranks"] == [3]


@pytest.mark.parametrize("change,message,line,col", [
    (("stages = 4;\n    data_parallel = 2;", "gpus = {{0, 4}, {1, 9}, {2, 6}, {3, 7}};"),
     "has no GPU 9", 4, 25),
    (("stages = 4;\n    data_parallel = 2;", "gpus = {{0, 4}, {1, 4}, {2, 6}, {3, 7}};"),
     "GPU 4 .* holds both stage 0 and stage 1", 4, 12),
    (("stages = 4;\n    data_parallel = 2;", 'gpus = {"g[0]", "gpu1", "g[2]", "g[3]"};'),
     "no GPU named 'gpu1'", 4, 21),
    (("data_parallel = 2;", "data_parallel = 3;"), "need 12 GPUs but topology dgx1 has 8", 5, 21),
    (("stages = 4;\n    data_parallel = 2;", "stages = 9;"), "need 9 GPUs", 4, 14),
    (("microbatches = m;", "microbatches = m - 8;"), "`microbatches` must be at least 1, got 0", 6, 20),
    (("{1 ms, 1 ms, 1 ms, 1.5 ms}", "{1 ms, 1 ms, 1.5 ms}"), "lists 3 values but the pipeline has 4 stages", 8, 15),
    (("backward = 2 ms;", "backward = 2 MiB;"), "`backward` must be a time", 9, 16),
    (('"1f1b"', '"1f1bb"'), "unknown schedule '1f1bb'.*did you mean '1f1b'", 7, 16),
    (('"1f1b"', '"missing.csv"'), "no such file", 7, 16),
    (("gradients = 64 MB;", "gradients = 64 MB;\n    device_memory = 1 GiB;\n    weights = 2 GiB;"),
     "exceed|more than the device", 12, 21),
    (("gradients = 64 MB;", "gradients = 64 MB;\n    chunks = 2;"), "applies to the interleaved schedule", 12, 14),
    (("backward = 2 ms;", "backward = 2 ms;\n    backward_weight = 3 ms;"), "longer than the backward", 10, 23),
])
def test_located_errors(tmp_path, change, message, line, col):
    err = _error(tmp_path, GOOD.replace(*change))
    assert err.span is not None
    assert (err.span.line, err.span.column) == (line, col), err
    import re

    assert re.search(message, err.message), err.message


def test_peak_activation_memory_past_the_device_is_an_error(tmp_path):
    text = GOOD.replace("gradients = 64 MB;", "gradients = 64 MB;\n    device_memory = 10 GiB;\n"
                        "    activation_memory = 3 GiB;")
    err = _error(tmp_path, text)
    # One micro-batch fits; 1F1B keeps 4 in flight on stage 0.
    assert "stage 0 needs" in err.message and "4 micro-batches in flight" in err.message
    assert err.span is not None and err.span.line == 12


@pytest.mark.parametrize("change,message", [
    (("activations = 4 MiB;", "activation = 4 MiB;"), "unknown pipeline setting 'activation'; did you mean 'activations'"),
    (("backward = 2 ms;", "backward = 2 ms;\n    backward = 3 ms;"), "setting 'backward' is given twice"),
    (("    microbatches = m;\n", ""), "needs `microbatches = ...;`"),
    (("backward = 2 ms;", "backward = 2 * q;"), "unknown name 'q'"),
    (("on dgx1", "on dgx2"), "unknown topology 'dgx2'"),
])
def test_static_errors_when_the_file_loads(tmp_path, change, message):
    err = _error(tmp_path, GOOD.replace(*change))
    assert message in err.message and err.span is not None


def test_naming_a_pipeline(tmp_path):
    text = GOOD + GOOD.replace("pipeline job", "pipeline other")
    path = _write(tmp_path, text)
    with pytest.raises(CollcError, match="declares 2 pipelines"):
        resolve_pipeline(path)
    with pytest.raises(CollcError, match="no pipeline 'jb'; did you mean 'job'"):
        resolve_pipeline(f"{path}:jb")
    assert resolve_pipeline(f"{path}:other").name == "other(m=8)"
    with pytest.raises(CollcError, match="defined twice"):
        resolve_pipeline(_write(tmp_path, GOOD + GOOD, "twice.coll"))


def test_check_evaluates_pipelines_and_locates_their_errors(tmp_path):
    from collc.frontend import check_file

    summary = check_file(_write(tmp_path, GOOD))
    assert summary.pipelines == ["job: 4 stages x 2 data-parallel, 8 micro-batches, 1f1b"]
    assert "1 pipeline (job: 4 stages" in str(summary)
    bad = GOOD.replace("data_parallel = 2;", "data_parallel = 3;")  # 12 GPUs on an 8-GPU DGX-1
    with pytest.raises(CollcError) as err:
        check_file(_write(tmp_path, bad))
    assert err.value.span is not None and err.value.span.line in (4, 5)
