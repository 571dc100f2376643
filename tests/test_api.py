"""collc.api: a collective timed on a topology as `collc compile` times it, and its
baselines; and the layer it sits in."""

import ast
from pathlib import Path

import pytest

from collc import api, frontend
from collc.analysis.bounds import lower_bounds
from collc.analysis.simulate import simulate
from collc.diagnostics import CollcError
from collc.driver import CompileJob, baselines_for, compile_job

PACKAGE = Path(api.__file__).resolve().parent
# What may import collc.api: the tools that time collectives, the commands and the driver.
ABOVE_THE_TOOLS = {"profile", "pipeline", "harvest", "commands", "cli.py", "driver.py", "api.py", "__main__.py"}


def test_an_algorithm_is_timed_as_instantiated_and_simulated():
    topo = frontend.resolve_topology("ring(n=4)")
    coll = frontend.resolve_collective("allreduce", 4)
    run = api.time_collective(topo, coll, 1 << 20, algorithm="ring")
    direct = frontend.instantiate_algorithm("ring", topo, coll)
    assert run.schedule.ops == direct.ops
    assert run.time_s == simulate(direct, topo, 1 << 20).time_s
    assert run.solver["status"] == "hand-written"


def test_a_synthesized_schedule_is_what_collc_compile_reports():
    topo = frontend.resolve_topology("switch(n=4)")
    coll = frontend.resolve_collective("allgather", 4)
    run = api.time_collective(topo, coll, 1 << 20, pipeline="synthesize{progress=false}")
    report = compile_job(CompileJob(topo, coll, 1 << 20, pipeline="synthesize{progress=false}")).report
    assert run.unit.notes["verify"]["ok"]
    assert run.solver is not None and run.solver["method"]
    assert run.time_s >= lower_bounds(topo, coll, 1 << 20).best_s * (1 - 1e-9)
    assert run.time_s * 1e6 == pytest.approx(report["time_us"])


def test_max_ops_caps_the_synthesized_schedule():
    topo = frontend.resolve_topology("ring(n=4)")
    coll = frontend.resolve_collective("allgather", 4)
    free = api.time_collective(topo, coll, 1 << 24, pipeline="synthesize{progress=false}")
    capped = api.time_collective(topo, coll, 1 << 24, pipeline="synthesize{progress=false}", max_ops=64)
    assert len(capped.schedule.ops) <= 64 < len(free.schedule.ops)
    # Fewer pieces pipeline less: the capped schedule is no faster.
    assert capped.time_s >= free.time_s


def test_an_algorithm_that_does_not_fit_is_a_collc_error():
    topo = frontend.resolve_topology("dgx1")
    coll = frontend.resolve_collective("alltoall", 8)
    with pytest.raises(CollcError):
        api.time_collective(topo, coll, 1 << 20, algorithm="direct")


def test_baselines_are_the_driver_s():
    topo = frontend.resolve_topology("dgx1")
    coll = frontend.resolve_collective("allreduce", 8)
    mine = api.baselines(topo, coll, 1 << 26)
    assert mine == baselines_for(CompileJob(topo, coll, 1 << 26))
    assert "ring" in {b.name for b in mine}
    assert all(b.time_s is not None and b.time_s > 0 for b in mine if b.error is None)


def _imports_api(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module == "collc.api":
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "collc" and any(a.name == "api" for a in node.names):
            return True
        if isinstance(node, ast.Import) and any(a.name == "collc.api" for a in node.names):
            return True
    return False


def test_nothing_below_the_tools_imports_the_api():
    below = [p.relative_to(PACKAGE) for p in PACKAGE.rglob("*.py")
             if p.relative_to(PACKAGE).parts[0] not in ABOVE_THE_TOOLS and _imports_api(p)]
    assert below == []
    assert _imports_api(PACKAGE / "pipeline" / "network.py") and _imports_api(PACKAGE / "profile" / "model.py")
