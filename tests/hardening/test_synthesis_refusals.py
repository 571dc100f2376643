"""Inputs synthesis has nothing to do for are refused before it runs, at the request."""

from __future__ import annotations

from hardening_inputs import TWO_GPUS, write


def test_one_gpu_topology_is_refused_before_synthesis(collc, tmp_path):
    write(tmp_path / "one.coll", "topology one() { gpu g[1]; }\ncompile allgather on one() size 1 MiB;\n")
    run = collc("compile", "one.coll", "-o", "o.json", "-q")
    assert run.status == 1
    assert "one.coll:2:1: error:" in run.err and "one GPU" in run.err
    assert not (tmp_path / "o.json").exists()


def test_collective_where_nothing_moves_is_refused_before_synthesis(collc, tmp_path):
    write(tmp_path / "local.coll", f"topology t() {{ {TWO_GPUS} }}\n"
          "collective local { input 1; output 1; for r in 0..ranks { post out[r][0] = chunk(r, 0); } }\n"
          "compile local on t() size 1 MiB;\n")
    run = collc("compile", "local.coll", "-o", "o.json", "-q")
    assert run.status == 1, run.err
    assert "local.coll:3:1: error:" in run.err and "nothing to synthesize" in run.err
