"""Every kind of user error is a CollcError located at line and column."""

from __future__ import annotations

from pathlib import Path

import pytest

from collc.diagnostics import CollcError, ScheduleError, format_error
from collc.frontend import RequirementError, load_module, load_requests, resolve_topology, spec_sources


def _error(tmp_path: Path, text: str, name: str = "t.coll") -> CollcError:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(CollcError) as info:
        load_requests(path)
    return info.value


def _at(err: CollcError, line: int, column: int, file: str = "t.coll") -> None:
    assert err.span is not None, err
    assert (Path(err.span.file).name, err.span.line, err.span.column) == (file, line, column), str(err)


def test_unknown_name(tmp_path):
    err = _error(tmp_path, "topology t(chassis = 2) {\n    gpu g[chasis];\n}\n")
    _at(err, 2, 11)
    assert err.message == "unknown name 'chasis'; did you mean 'chassis'?"


def test_unknown_topology_suggests_the_stdlib_import(tmp_path):
    err = _error(tmp_path, "compile allgather on dgx1 size 1 MiB;\n")
    _at(err, 1, 22)
    assert "did you mean `import topologies.dgx1;`?" in err.message


def test_misspelled_topology_suggests_the_close_name(tmp_path):
    err = _error(tmp_path, "import topologies.ndv2;\ncompile allgather on ndv3;\n")
    _at(err, 2, 22)
    assert "did you mean 'ndv2'" in err.message


def test_too_many_arguments(tmp_path):
    err = _error(tmp_path, "import topologies.ndv2;\ncompile allgather on ndv2(2, 3);\n")
    _at(err, 2, 30)
    assert "takes at most 1 argument (chassis), got 2" in err.message


def test_unknown_keyword_argument(tmp_path):
    err = _error(tmp_path, "import topologies.ndv2;\ncompile allgather on ndv2(chasis = 3);\n")
    _at(err, 2, 27)
    assert "no parameter 'chasis'; did you mean 'chassis'?" in err.message


def test_missing_argument(tmp_path):
    err = _error(tmp_path, "topology t(n) { gpu g[n]; }\ncompile allgather on t;\n")
    _at(err, 2, 22)
    assert "needs a value for parameter 'n'" in err.message


def test_link_to_a_node_that_is_not_declared(tmp_path):
    err = _error(tmp_path, "topology t {\n    gpu g[2];\n    link g[0] -> h[1] bw 1 GB/s;\n}\n")
    _at(err, 3, 18)
    assert "no node or part named 'h'" in err.message


def test_link_to_a_node_index_out_of_range(tmp_path):
    err = _error(tmp_path, "topology t {\n    gpu g[2];\n    link g[0] <-> g[2] bw 1 GB/s;\n}\n"
                           "compile allgather on t;\n")
    _at(err, 3, 21)
    assert "index 2 is out of range for 'g', which has 2 nodes (0 to 1)" in err.message


def test_link_to_a_node_of_a_part_that_does_not_exist(tmp_path):
    err = _error(tmp_path, "import topologies.dgx1;\ntopology t {\n    part box = dgx1();\n"
                           "    link box.g[0] -> box.q bw 1 GB/s;\n}\ncompile allgather on t;\n")
    _at(err, 4, 22)
    assert "no node named 'q' in that part" in err.message


def test_link_to_a_group_without_index(tmp_path):
    err = _error(tmp_path, "topology t {\n    gpu g[2];\n    switch s;\n    link g -> s bw 1 GB/s;\n}\n"
                           "compile allgather on t;\n")
    _at(err, 4, 10)
    assert "'g' is a group of 2 nodes; pick one with g[INDEX]" in err.message


@pytest.mark.parametrize("bw, what", [("0 GB/s", "must be positive, got 0 GB/s"),
                                      ("-5 GB/s", "must be positive, got -5 GB/s")])
def test_non_positive_bandwidth(tmp_path, bw, what):
    err = _error(tmp_path, f"topology t {{\n    gpu g[2];\n    link g[0] <-> g[1] bw {bw};\n}}\n"
                           "compile allgather on t;\n")
    _at(err, 3, 27)
    assert what in err.message


def test_negative_latency(tmp_path):
    err = _error(tmp_path, "topology t {\n    gpu g[2];\n    link g[0] <-> g[1] bw 1 GB/s lat -2 ns;\n}\n"
                           "compile allgather on t;\n")
    _at(err, 3, 38)
    assert "latency cannot be negative" in err.message


def test_wrong_unit_dimension_names_what_was_expected(tmp_path):
    err = _error(tmp_path, "topology t {\n    gpu g[2];\n    link g[0] <-> g[1] bw 5 us;\n}\n"
                           "compile allgather on t;\n")
    _at(err, 3, 27)
    assert err.message == "a link's bandwidth must be a bandwidth such as `25 GB/s`, got a time (5 us)"


def test_latency_given_a_bandwidth(tmp_path):
    err = _error(tmp_path, "topology t {\n    gpu g[2];\n    link g[0] <-> g[1] bw 1 GB/s lat 1 GB/s;\n}\n"
                           "compile allgather on t;\n")
    _at(err, 3, 38)
    assert "latency must be a time" in err.message


def test_adding_different_dimensions(tmp_path):
    err = _error(tmp_path, "let a = 1;\nlet b = 1 GB/s + 2 us;\n")
    _at(err, 2, 9)
    assert err.message == "cannot add a bandwidth and a time"


def test_duplicate_node_name(tmp_path):
    err = _error(tmp_path, "topology t {\n    gpu g[2];\n    switch g;\n}\ncompile allgather on t;\n")
    _at(err, 3, 5)
    assert "duplicate node name 'g'" in err.message and "t.coll:2:5" in err.message


def test_parallel_links_must_agree(tmp_path):
    err = _error(tmp_path, "topology t {\n    gpu g[2];\n    link g[0] -> g[1] bw 1 GB/s;\n"
                           "    link g[0] -> g[1] bw 2 GB/s;\n}\ncompile allgather on t;\n")
    _at(err, 4, 5)
    assert "declared again with bandwidth 2 GB/s" in err.message and "t.coll:3:5 has 1 GB/s" in err.message


def test_self_link(tmp_path):
    err = _error(tmp_path, "topology t {\n    gpu g[2];\n    link g[1] -> g[1] bw 1 GB/s;\n}\n"
                           "compile allgather on t;\n")
    _at(err, 3, 5)
    assert "two different nodes" in err.message


def test_collective_on_a_topology_whose_gpus_cannot_reach_each_other(tmp_path):
    err = _error(tmp_path, "topology t {\n    gpu g[3];\n    link g[0] <-> g[1] bw 1 GB/s;\n"
                           "    link g[1] -> g[2] bw 1 GB/s;\n}\ncompile allgather on t;\n")
    _at(err, 6, 22)
    assert "no path of links leads from g[2] to g[0]" in err.message


def test_index_of_a_set_out_of_range(tmp_path):
    err = _error(tmp_path, "topology t {\n    let s = {1, 2};\n    gpu g[s[2]];\n}\ncompile allgather on t;\n")
    _at(err, 3, 13)
    assert "index 2 is out of range" in err.message


def test_fractional_index_suggests_integer_division(tmp_path):
    err = _error(tmp_path, "topology t(n = 3) {\n    gpu g[n];\n    link g[n / 2] -> g[0] bw 1 GB/s;\n}\n"
                           "compile allgather on t;\n")
    _at(err, 3, 12)
    assert "whole number, got 1.5 (use // for integer division)" in err.message


def test_root_out_of_range(tmp_path):
    err = _error(tmp_path, "import topologies.ring;\ncompile broadcast(root = 9) on ring(4);\n")
    _at(err, 2, 19)
    assert "root 9 is out of range: there are 4 ranks (0 to 3)" in err.message


def test_statement_in_the_wrong_kind_of_body(tmp_path):
    err = _error(tmp_path, "topology t {\n    gpu g[2];\n    copy in[0][0] -> out[0][0];\n}\n")
    _at(err, 3, 5)
    assert "`copy` and `reduce` statements belong in an algorithm, not in a topology" in err.message


def test_redefining_a_name(tmp_path):
    err = _error(tmp_path, "topology t(n = 3) {\n    let n = 2;\n}\n")
    _at(err, 2, 5)
    assert "'n' is already defined" in err.message


def test_failed_requirement_points_at_the_require_and_notes_the_use(tmp_path):
    err = _error(tmp_path, "import topologies.ring;\ncompile allgather on ring(1);\n")
    assert isinstance(err, RequirementError)
    assert Path(err.span.file).name == "ring.coll"
    assert "a ring needs at least 2 GPUs" in err.message
    assert any("t.coll:2:22" in n for n in err.notes)


# --- algorithms ------------------------------------------------------------------------

SHIFTED = """import topologies.switch;
algorithm shifted for allgather {
    for r in 0..ranks {
        for s in 0..ranks {
            copy in[s][0] -> out[r][(s + 1) % ranks];
        }
    }
}
compile allgather on switch(4) using shifted;
"""


def test_broken_algorithm_names_rank_slot_and_what_it_holds(tmp_path):
    err = _error(tmp_path, SHIFTED)
    assert isinstance(err, ScheduleError)
    _at(err, 5, 13)  # the copy that wrote the wrong chunk
    assert err.message == ("postcondition of allgather fails: rank 0 output[0] must hold chunk(0, 0) "
                           "but holds chunk(3, 0)")


def test_unwritten_slot_points_at_the_algorithm_header(tmp_path):
    err = _error(tmp_path, "import topologies.ring;\nalgorithm partial for allgather {\n"
                           "    for r in 0..ranks {\n        copy in[r][0] -> out[r][r];\n    }\n}\n"
                           "compile allgather on ring(4) using partial;\n")
    _at(err, 2, 1)
    assert "rank 0 output[1] must hold chunk(1, 0) but holds nothing" in err.message
    assert any("no statement of this algorithm writes that slot" in n for n in err.notes)


def test_algorithm_used_for_a_collective_it_does_not_implement(tmp_path):
    err = _error(tmp_path, "import topologies.ring;\ncompile alltoall on ring(4) using ring;\n")
    _at(err, 2, 35)
    assert "algorithm 'ring' does not implement alltoall (it implements allgather, allreduce, reducescatter)" \
        in err.message


def test_algorithm_slot_out_of_range(tmp_path):
    err = _error(tmp_path, "import topologies.ring;\nalgorithm bad for allgather {\n"
                           "    copy in[0][0] -> out[1][7];\n}\ncompile allgather on ring(4) using bad;\n")
    _at(err, 3, 29)
    assert "out[1][7] is out of range: rank 1 has 4 output slots" in err.message


def test_root_in_an_algorithm_for_a_collective_without_root(tmp_path):
    err = _error(tmp_path, "algorithm bad for allgather {\n    copy in[root][0] -> out[0][0];\n}\n")
    _at(err, 2, 13)
    assert "collective allgather has no root parameter" in err.message


def test_unknown_using_name(tmp_path):
    err = _error(tmp_path, "import topologies.ring;\ncompile alltoall on ring(4) using rung;\n")
    _at(err, 2, 35)
    assert "'rung' is neither an algorithm nor a pass" in err.message


# --- imports ---------------------------------------------------------------------------

def test_unknown_stdlib_module(tmp_path):
    err = _error(tmp_path, "\nimport topologies.dgx3;\n")
    _at(err, 2, 1)
    assert "did you mean `import topologies.dgx2;`?" in err.message


def test_import_file_not_found(tmp_path):
    err = _error(tmp_path, "import \"nope.coll\";\n")
    _at(err, 1, 1)
    assert "cannot find 'nope.coll'" in err.message


def test_import_cycle(tmp_path):
    (tmp_path / "a.coll").write_text("import \"b.coll\";\n")
    (tmp_path / "b.coll").write_text("let x = 1;\nimport \"a.coll\";\n")
    with pytest.raises(CollcError) as info:
        load_module(tmp_path / "a.coll")
    err = info.value
    _at(err, 2, 1, file="b.coll")
    assert err.message == "import cycle: a.coll imports b.coll imports a.coll"


def test_imported_names_are_visible_and_not_re_exported(tmp_path):
    (tmp_path / "cluster.coll").write_text("import topologies.dgx1;\ntopology mine { part b = dgx1(); }\n")
    (tmp_path / "use.coll").write_text("import \"cluster.coll\";\ncompile allgather on mine;\n"
                                       "compile allgather on dgx1;\n")
    with pytest.raises(CollcError) as info:
        load_module(tmp_path / "use.coll")
    _at(info.value, 3, 22, file="use.coll")


# --- command-line specs -----------------------------------------------------------------

def test_spec_error_columns_in_a_pseudo_file():
    with pytest.raises(CollcError) as info:
        resolve_topology("ndv2(chassis=2, bogus=1)")
    err = info.value
    assert (err.span.file, err.span.line, err.span.column) == ("<--topology>", 1, 17)
    shown = format_error(err, spec_sources())
    assert "ndv2(chassis=2, bogus=1)\n" in shown and "^~~~~~~" in shown


def test_spec_error_columns_after_a_file_name(tmp_path):
    (tmp_path / "c.coll").write_text("topology t(n = 2) { gpu g[n]; switch s; link g[0] <-> s bw 1 GB/s;"
                                     " link g[1] <-> s bw 1 GB/s; }\n")
    spec = "c.coll:t(m=3)"
    with pytest.raises(CollcError) as info:
        resolve_topology(spec, base_dir=tmp_path)
    assert (info.value.span.file, info.value.span.column) == ("<--topology>", 10)
