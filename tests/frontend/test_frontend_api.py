"""The front end's public API: specs, requests, catalog, checking files."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import pytest

import collc.frontend as fe
from collc.diagnostics import CollcError
from collc.ir.collective import CollectiveKind, standard
from collc.passes import base as passes_base
from collc.verify import verify


def test_resolve_topology_forms(tmp_path):
    assert fe.resolve_topology("dgx1").num_ranks == 8
    assert fe.resolve_topology("ndv2(chassis=3)").num_ranks == 24
    assert fe.resolve_topology("ring(4, speed = 50 GB/s)").link("g[0]", "g[1]").bandwidth == 50e9
    (tmp_path / "mine.coll").write_text(
        "import topologies.dgx1;\n"
        "topology two(k = 2) { part b[k] = dgx1(); link b[0].g[0] <-> b[1].g[0] bw 1 GB/s; }\n")
    assert fe.resolve_topology("mine.coll", base_dir=tmp_path).name == "two(k=2)"
    assert fe.resolve_topology("mine.coll:two(k=2)", base_dir=tmp_path).num_ranks == 16
    assert fe.resolve_topology(f"{tmp_path}/mine.coll:two").num_ranks == 16


def test_a_file_with_several_definitions_needs_a_name(tmp_path):
    (tmp_path / "two.coll").write_text("topology a { gpu g; }\ntopology b { gpu g; }\n")
    with pytest.raises(CollcError) as info:
        fe.resolve_topology("two.coll", base_dir=tmp_path)
    assert "defines 2 topologies (a, b)" in info.value.message


def test_resolve_collective_matches_the_ir_builders():
    assert fe.resolve_collective("allgather", 4) == standard("allgather", 4)
    assert fe.resolve_collective("allgather(chunks=4)", 3) == standard("allgather", 3, 4)
    assert fe.resolve_collective("broadcast(root=2)", 4) == standard("broadcast", 4, 1, 2)
    with pytest.raises(CollcError) as info:
        fe.resolve_collective("alltoal", 4)
    assert info.value.span.file == "<--collective>" and "did you mean 'alltoall'" in info.value.message


def test_instantiate_algorithm_returns_a_verified_schedule():
    topo = fe.resolve_topology("dgx1")
    coll = fe.resolve_collective("allreduce(chunks=2)", 8)
    sched = fe.instantiate_algorithm("ring", topo, coll)
    verify(sched, topo)
    assert sched.collective == coll and sched.topology == "dgx1"
    assert sched.meta["algorithm"] == "ring" and sched.meta["ring"] == [0, 1, 3, 2, 6, 7, 5, 4]
    assert sched.num_steps == 2 * (8 - 1) + 1  # seeding copies, then 2 (n - 1) ring steps
    with pytest.raises(CollcError) as info:
        fe.instantiate_algorithm("ring", topo, fe.resolve_collective("alltoall", 8))
    assert "does not implement alltoall" in info.value.message


def test_algorithms_for():
    assert fe.algorithms_for("allgather") == ["ring"]
    assert fe.algorithms_for("allreduce") == ["ring"]
    assert fe.algorithms_for("broadcast") == ["tree"]
    assert fe.algorithms_for("alltoall") == ["direct"]
    assert fe.algorithms_for("gather") == []


@dataclasses.dataclass(frozen=True)
class _StandInSynthesis(passes_base.Pass):
    """Stands in for the synthesis pass when it is not installed."""

    name: ClassVar[str] = "synthesize"
    method: str = "auto"
    chunks: int = 1


def test_load_requests(tmp_path, monkeypatch):
    if "synthesize" not in passes_base.registered_passes():
        monkeypatch.setitem(passes_base._REGISTRY, "synthesize", _StandInSynthesis)
    (tmp_path / "req.coll").write_text("""import topologies.ndv2;
import topologies.dgx1;
let big = 1 GiB;
compile allgather(chunks = 2) on ndv2(chassis = 2) size big using ring;
compile alltoall on dgx1 size 64 MiB using synthesize(method = "lp", chunks = 4);
compile reduce(root = 1) on dgx1;
""")
    ring, synth, default = fe.load_requests(tmp_path / "req.coll")
    assert ring.topology.name == "ndv2(chassis=2)" and ring.collective == standard("allgather", 16, 2)
    assert ring.size_bytes == 2 ** 30 and ring.algorithm == "ring" and ring.pipeline is None
    assert len(ring.schedule.ops) == 16 * 2 + 15 * 16 * 2
    assert ring.span.line == 4 and ring.span.column == 1
    assert synth.algorithm is None and synth.schedule is None
    assert synth.pipeline == "synthesize{method=lp chunks=4}" and synth.size_bytes == 64 * 2 ** 20
    assert default.pipeline == "synthesize" and default.size_bytes is None
    assert default.collective.kind is CollectiveKind.REDUCE and default.collective.root == 1


def test_check_file_summarizes_and_checks(tmp_path):
    (tmp_path / "f.coll").write_text("""import topologies.switch;
topology line(n = 3) { gpu g[n]; for i in 0..n - 1 { link g[i] <-> g[i + 1] bw 1 GB/s; } }
algorithm pairwise for allgather {
    require ranks % 2 == 0;
    for r in 0..ranks { for d in 0..ranks { copy in[r][0] -> out[d][r]; } }
}
compile allgather on switch(4) using pairwise;
""")
    summary = fe.check_file(tmp_path / "f.coll")
    text = str(summary)
    assert "\n" not in text
    assert "1 topology (line(n=3): 3 GPUs, 3 nodes, 4 links)" in text
    assert "pairwise for allgather: verified at ranks 2, 4, 8" in text  # 3 is rejected by its `require`
    assert "1 request (allgather on switch(n=4, speed=125 GB/s, latency=0.35 us): 4 ranks, using pairwise)" in text


def test_stdlib_catalog():
    cat = fe.stdlib_catalog()
    topos = {t["name"]: t for t in cat["topologies"]}
    assert {"ring", "switch", "torus2d", "hypercube", "dgx1", "ndv2", "dgx2", "dgx_h100", "mi250"} <= set(topos)
    assert topos["ndv2"]["params"] == [{"name": "chassis", "default": "2"}]
    assert topos["ndv2"]["module"] == "topologies.ndv2" and "TE-CCL" in topos["ndv2"]["description"]
    assert {c["name"] for c in cat["collectives"]} == {k.value for k in CollectiveKind} - {"custom"}
    algs = {a["name"]: a for a in cat["algorithms"]}
    assert algs["ring"]["implements"] == ["allgather", "allreduce", "reducescatter"]
    assert algs["tree"]["implements"] == ["broadcast", "reduce"]


def test_defined_names_and_show_file(tmp_path):
    (tmp_path / "f.coll").write_text("""import topologies.ring;
topology pair { gpu g[2]; link g[0] <-> g[1] bw 1 GB/s; }
collective first { post out[0][0] = chunk(1, 0); }
algorithm mine for allgather { for r in 0..ranks { for d in 0..ranks { copy in[r][0] -> out[d][r]; } } }
compile allgather on ring(3) size 1 MiB using mine;
""")
    assert fe.defined_names(tmp_path / "f.coll") == {"pair", "first", "mine"}
    shown = fe.show_file(tmp_path / "f.coll")
    assert [t["name"] for t in shown["topologies"]] == ["pair", "ring(n=3, speed=25 GB/s, latency=0.7 us)"]
    assert [(c["name"], c["ranks"]) for c in shown["collectives"]] == [("allgather", 3), ("first", 4)]
    assert shown["algorithms"] == [{"name": "mine", "for": "allgather"}]
    assert shown["requests"] == ["allgather on ring(n=3, speed=25 GB/s, latency=0.7 us): 3 ranks, 1 MiB, using mine"]
