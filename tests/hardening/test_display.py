"""What collc prints shows user text as written: no markup, no terminal escapes, no
cut names; `collc show` shows each collective once, algorithms' ops, and compiled schedules."""

from __future__ import annotations

import json

from hardening_inputs import RING4, TWO_GPUS, write


def test_list_shows_brackets_in_descriptions(collc):
    run = collc("list")
    assert run.status == 0
    # stdlib descriptions name nodes such as `g[i]`; rich used to eat `[i]` as markup.
    assert "[i]" in run.out or "[k]" in run.out or "[0]" in run.out
    assert "g and g are" not in run.out


def test_report_title_with_markup_like_parameter(collc, tmp_path):
    write(tmp_path / "p.coll", 'topology t(name = "x[/b] [bold]") { ' + TWO_GPUS + " }\n"
          "compile allgather on t() size 1 MiB using ring;\n")
    run = collc("compile", "p.coll", "-o", "o.json", "--no-baselines")
    assert run.status == 0, run.err
    assert "x[/b] [bold]" in run.out


def test_long_output_names_are_not_cut(collc, tmp_path):
    write(tmp_path / "p.coll", RING4 + "compile allgather on t() size 1 MiB using ring;\n")
    name = "a_rather_long_output_directory_name_that_would_not_fit_in_a_narrow_table"
    run = collc("compile", "p.coll", "-o", f"{name}/", "--no-baselines")
    assert run.status == 0, run.err
    assert name in run.out.replace("\n", "").replace("│", "").replace(" ", "")


def test_ansi_escapes_in_source_are_not_sent_to_the_terminal(collc, tmp_path):
    write(tmp_path / "p.coll", 'topology t() { require false, "\x1b[31mred\x1b]0;title\x07"; ' + TWO_GPUS + " }\n"
          "compile allgather on t() size 1 MiB;\n")
    run = collc("check", "p.coll")
    assert run.status == 1
    assert "\x1b" not in run.err and "\x07" not in run.err
    assert "\\x1b[31mred" in run.err


def test_show_prints_each_collective_once_and_the_algorithms_ops(collc, tmp_path):
    write(tmp_path / "p.coll", RING4 + "algorithm direct for allgather {\n"
          "    for r in 0..ranks { for s in 0..ranks { copy in[s][0] -> out[r][s]; } }\n}\n"
          "compile allgather on t() size 1 MiB using direct;\ncompile allgather on t() size 2 MiB using ring;\n")
    run = collc("show", "p.coll")
    assert run.status == 0, run.err
    assert run.out.count("collective allgather") == 1
    assert "schedule direct" in run.out and "16 ops" in run.out
    assert "copy rank 1 input[0] -> rank 0 output[1]" in run.out


def test_show_reads_a_compiled_schedule(collc, tmp_path):
    write(tmp_path / "p.coll", RING4 + "compile allgather on t() size 1 MiB using ring;\n")
    assert collc("compile", "p.coll", "-o", "o.json", "-q").status == 0
    run = collc("show", "o.json")
    assert run.status == 0, run.err
    assert "topology t(n=4)" in run.out and "schedule ring" in run.out and "1,048,576 bytes" in run.out
    data = json.loads(collc("show", "o.json", "--json").out)
    assert len(data["schedules"][0]["schedule"]["ops"]) == 12 + 4


def test_show_of_broken_json_is_located(collc, tmp_path):
    write(tmp_path / "bad.json", '{"format": "collc-schedule",\n "schedule": }')
    run = collc("show", "bad.json")
    assert run.status == 1 and "bad.json:2:" in run.err


def test_show_of_a_damaged_schedule_is_an_error_not_a_traceback(collc, tmp_path):
    write(tmp_path / "p.coll", RING4 + "compile allgather on t() size 1 MiB using ring;\n")
    assert collc("compile", "p.coll", "-o", "o.json", "-q").status == 0
    doc = json.loads((tmp_path / "o.json").read_text())
    doc["topology"] = {"name": "t"}
    write(tmp_path / "d.json", json.dumps(doc))
    run = collc("show", "d.json")
    assert run.status == 1 and "damaged" in run.err
