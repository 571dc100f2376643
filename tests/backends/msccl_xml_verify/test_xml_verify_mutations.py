"""Broken programs are rejected with messages that name the GPU, threadblock and step."""

from __future__ import annotations

import pytest

from collc.backends.msccl_xml.reader import read_xml_bytes
from collc.backends.msccl_xml.verify import IN_PLACE, OUT_OF_PLACE, verify_algo
from collc.diagnostics import CollcError
from xml_verify_programs import (
    algo,
    chain_broadcast,
    gpu,
    line_of,
    pair_allreduce,
    pair_reducescatter_in_place,
    render,
    renumber,
    ring_allgather,
    step,
    steps_of,
    tb,
    tb_of,
    verify_program,
)


def only_error(report):
    assert len(report.errors) == 1, report.render()
    return report.errors[0]


def at(err, text, gpu_id, tb_id, s):
    assert (err.where.gpu, err.where.tb, err.where.s) == (gpu_id, tb_id, s)
    assert err.span.line == line_of(text, gpu_id, tb_id, s)
    assert f"GPU {gpu_id} tb {tb_id} step {s}" in err.message
    return True


@pytest.mark.parametrize("make", [ring_allgather, lambda: ring_allgather(in_place=True), pair_allreduce,
                                  pair_reducescatter_in_place, chain_broadcast])
def test_base_programs_verify(make):
    report = verify_program(make())
    assert report.ok, report.render()


def test_wrong_offset():
    program = ring_allgather(4)
    steps_of(program, 2, 0)[3]["dstoff"] = 1  # the second forward overwrites the first
    report = verify_program(program)
    text = render(program)
    assert [e.kind for e in report.errors] == ["postcondition", "postcondition"]
    overwritten = next(e for e in report.errors if "output[1]" in e.message)
    assert overwritten.message.startswith("GPU 2 output[1] holds chunk(0, 0) after GPU 2 tb 0 step 3 wrote it, "
                                          "but allgather needs chunk(1, 0) there")
    assert at(overwritten, text, 2, 0, 3)
    never = next(e for e in report.errors if "output[0]" in e.message)
    assert never.message == "GPU 2 output[0] is never written; allgather needs chunk(0, 0) there"
    assert never.span.line == line_of(text, 2, 0, 0) - 2  # the <gpu> line


def test_out_of_range_offset():
    program = ring_allgather(4)
    steps_of(program, 1, 0)[3]["dstoff"] = 4
    text = render(program)
    err = only_error(verify_program(program))
    assert at(err, text, 1, 0, 3)
    assert "(rcs) writes output[4], outside o_chunks=4 of GPU 1" in err.message


def test_dropped_step():
    program = ring_allgather(4)
    steps = steps_of(program, 3, 0)
    del steps[2]  # GPU 3 receives and forwards one message fewer
    renumber(steps)
    text = render(program)
    report = verify_program(program)
    assert [e.message for e in report.errors] == [
        "GPU 2 tb 0 step 3 sends message 3 to GPU 3 on channel 0, but GPU 3 tb 0 receives only 2",
        "GPU 0 tb 0 step 4 receives message 3 from GPU 3 on channel 0, but GPU 3 tb 0 sends only 2",
    ]
    assert at(report.errors[0], text, 2, 0, 3) and at(report.errors[1], text, 0, 0, 4)


def test_dropped_local_copy():
    program = ring_allgather(4)
    steps = steps_of(program, 1, 0)
    del steps[0]
    renumber(steps)
    text = render(program)
    err = verify_program(program).errors[0]
    assert at(err, text, 1, 0, 0)
    assert "reads output[1] of GPU 1, which nothing has written before this step" in err.message


def test_missing_attribute():
    program = ring_allgather(4)
    del steps_of(program, 3, 0)[1]["dstbuf"]
    text = render(program)
    with pytest.raises(CollcError) as exc:
        read_xml_bytes(text, "t.xml")
    assert exc.value.message == "<step> lacks the attribute 'dstbuf'"
    assert exc.value.span.line == line_of(text, 3, 0, 1)


def test_missing_executor_attribute_fails_for_the_current_runtime_and_warns_for_legacy():
    program = ring_allgather(4)
    del program["algo"]["maxBytes"]
    current = verify_program(program)
    assert not current.ok
    (err,) = current.errors
    assert err.kind == "missing-attribute" and err.span.line == 1
    assert err.message.startswith("<algo> has no maxBytes; the current executor requires it")
    legacy = verify_program(program, runtime="legacy")
    assert legacy.ok
    (w,) = legacy.warnings
    assert w.message.startswith("<algo> has no maxBytes; the current executor requires it") and w.span.line == 1
    strict = verify_program(program, runtime="legacy", strict=True)
    assert not strict.ok and strict.errors[0].kind == "missing-attribute"


def test_cyclic_dependency_deadlocks():
    program = pair_allreduce()
    # GPU 1's send now waits for its own reduction, which waits for the send.
    steps_of(program, 1, 0)[0].update(depid=2, deps=2)
    steps_of(program, 1, 2)[2]["hasdep"] = 1
    text = render(program)
    err = only_error(verify_program(program))
    assert err.kind == "deadlock"
    assert err.message.startswith("deadlock: 4 threadblock(s) can never finish; ")
    assert "wait cycle: GPU 1 tb 0 -> GPU 1 tb 2 -> GPU 1 tb 0" in err.notes
    assert err.where.gpu == 1 and err.where.tb in (0, 2)
    assert err.span.line == line_of(text, 1, err.where.tb, err.where.s)
    assert ("GPU 1 tb 0 step 0 waits for GPU 1 tb 2 to finish step 2, but tb 2 is blocked at step 1 "
            "(before publishing any step)") in err.notes
    assert any(n.startswith("GPU 0 tb 1 step 0 waits for a message from GPU 1 on channel 0, which GPU 1 tb 0 "
                            "sends; that threadblock is blocked at step 0") for n in err.notes)


def test_dependency_on_a_step_that_publishes_nothing():
    program = pair_allreduce()
    steps_of(program, 0, 1)[0]["hasdep"] = 0
    text = render(program)
    report = verify_program(program)
    dep = next(e for e in report.errors if e.kind == "dependency")
    assert at(dep, text, 0, 2, 1)
    assert "depends on GPU 0 tb 1 step 0, which has hasdep=\"0\"" in dep.message
    # The executor would wait for progress tb 1 never publishes.
    assert any(e.kind == "deadlock" for e in report.errors)


def test_nop_without_a_following_dependency_is_rejected_as_the_executor_does():
    program = pair_allreduce()
    steps_of(program, 0, 2)[1].update(depid=-1, deps=-1)
    text = render(program)
    report = verify_program(program)
    rejected = next(e for e in report.errors if e.kind == "executor-rejects")
    assert at(rejected, text, 0, 2, 1)
    assert any(e.kind == "race" for e in report.errors)


def test_peer_mismatch():
    program = ring_allgather(4)
    tb_of(program, 1, 0)["attrs"]["send"] = 3  # GPU 1 sends past its right neighbour
    text = render(program)
    report = verify_program(program)
    messages = [e.message for e in report.errors]
    assert "GPU 1 tb 0 step 1 sends message 1 to GPU 3 on channel 0, but no threadblock of GPU 3 receives from " \
           "GPU 1 on channel 0" in messages
    assert "GPU 2 tb 0 step 2 receives message 1 from GPU 1 on channel 0, but no threadblock of GPU 1 sends to " \
           "GPU 2 on channel 0" in messages
    assert all(e.span.line == line_of(text, e.where.gpu, e.where.tb, e.where.s) for e in report.errors)


def test_peer_is_the_gpu_itself_or_out_of_range():
    program = ring_allgather(4)
    tb_of(program, 2, 0)["attrs"]["recv"] = 2
    tb_of(program, 3, 0)["attrs"]["send"] = 4
    messages = [e.message for e in verify_program(program).errors]
    assert 'GPU 2 tb 0 has recv="2", its own GPU; a peer must be another GPU' in messages
    assert 'GPU 3 tb 0 has send="4", but ngpus=4' in messages


def test_duplicate_peer_and_channel():
    program = ring_allgather(4)
    # A second threadblock on GPU 0 that also sends to GPU 1 on channel 0.
    program["gpus"][0]["tbs"].append(tb(1, 1, -1, 0, [step(0, "s", "i", 0, "o", 0)]))
    text = render(program)
    err = only_error(verify_program(program))
    assert at(err, text, 0, 1, 0)
    assert err.message.startswith("GPU 0 tb 1 step 0 sends to GPU 1 on channel 0, as tb 0 of GPU 0 does; one "
                                  "connection cannot carry two threadblocks' messages")
    # On another channel it is a connection of its own (and then an unmatched one).
    tb_of(program, 0, 1)["attrs"]["chan"] = 1
    program["algo"]["nchannels"] = 2
    err = only_error(verify_program(program))
    assert err.kind == "unmatched-send" and "no threadblock of GPU 1 receives from GPU 0 on channel 1" in err.message


def test_count_mismatch_between_paired_send_and_receive():
    program = ring_allgather(4)
    steps_of(program, 0, 0)[1]["cnt"] = 2
    text = render(program)
    err = only_error(verify_program(program))
    assert at(err, text, 1, 0, 2)
    assert err.message == ("GPU 1 tb 0 step 2 receives 1 chunk(s) as message 1 from GPU 0 on channel 0, but "
                           "GPU 0 tb 0 step 1 sends 2")


def test_structure_rules():
    program = ring_allgather(4)
    tb_of(program, 0, 0)["attrs"]["id"] = 1  # ids must start at 0
    steps_of(program, 1, 0)[2]["s"] = 5  # s must count 0, 1, 2, ...
    steps_of(program, 2, 0)[0]["cnt"] = 72
    tb_of(program, 3, 0)["attrs"]["chan"] = 1  # beyond nchannels=1
    report = verify_program(program)
    kinds = {e.kind for e in report.errors}
    assert {"tb-id", "step-number", "limit", "channel"} <= kinds
    text = render(program)
    numbering = next(e for e in report.errors if e.kind == "step-number")
    assert numbering.where.s == 5 and numbering.span.line == line_of(text, 1, 0, 5)
    assert "cnt=72; the executor needs cnt < 72" in next(e.message for e in report.errors if e.kind == "limit")


def test_step_limit_is_configurable():
    program = ring_allgather(4)
    steps = steps_of(program, 0, 0)
    steps[1:1] = [step(0, "cpy", "i", 0, "o", 0) for _ in range(62)]
    renumber(steps)
    err = only_error(verify_program(program))
    assert err.message == ("GPU 0 tb 0 has 67 steps; the current executor's limit is 64 per threadblock (the older "
                           "runtime allowed 256: --runtime legacy)")
    assert verify_program(program, max_steps=256).ok
    assert verify_program(program, runtime="legacy").ok


def test_gpu_list_must_match_ngpus():
    program = ring_allgather(4)
    program["algo"]["ngpus"] = 5
    report = verify_program(program)
    assert [e.message for e in report.errors][-1] == "ngpus=5 but the file has no <gpu> for rank 4"


def test_buffer_larger_than_the_collective_passes():
    program = ring_allgather(4)
    program["gpus"][2]["attrs"]["i_chunks"] = 2
    err = only_error(verify_program(program))
    assert err.message.startswith("GPU 2 declares i_chunks=2, but the allgather input buffer holds 1 chunks")


def test_in_place_reducescatter_aliases_output_into_the_input():
    program = pair_reducescatter_in_place()
    report = verify_program(program)
    assert report.ok and report.stats.modes == (IN_PLACE,)
    program["algo"].update(inplace=0, outofplace=1)
    report = verify_program(program)
    assert not report.ok
    assert report.errors[0].message.startswith("GPU 0 output[0] is never written; reducescatter needs sum(")
    program["algo"].update(inplace=1, outofplace=1)  # claims both: fails out of place only
    report = verify_program(program)
    assert report.errors[0].message.startswith(f"{OUT_OF_PLACE}: GPU 0 output[0] is never written")


def test_root_is_inferred_or_read():
    inferred = verify_program(chain_broadcast(root=2))
    assert inferred.ok and inferred.stats.root == 2
    assert inferred.warnings[0].message == ("<algo> names no root; broadcast is checked with root 2, the rank for "
                                            "which the postcondition holds")
    named = verify_program(_with_root(chain_broadcast(root=2), 2))
    assert named.ok and named.warnings == [] and named.stats.root == 2
    wrong = verify_program(_with_root(chain_broadcast(root=2), 0))
    assert not wrong.ok
    assert wrong.errors[0].message.startswith("GPU 0 output[0] holds chunk(2, 0) after GPU 0 tb 0 step 0 wrote it, "
                                              "but broadcast needs chunk(0, 0) there")


def _with_root(program, root):
    program["algo"]["root"] = root
    return program


def test_reduce_to_a_root():
    gpus = [gpu(0, 1, 1, 0, [tb(0, -1, 1, 0, [step(0, "rrc", "i", 0, "o", 0)])]),
            gpu(1, 1, 1, 0, [tb(0, 0, -1, 0, [step(0, "s", "i", 0, "o", 0)])])]
    report = verify_program(algo("reduce", 2, 1, gpus))
    assert report.ok and report.stats.root == 0


def test_collectives_without_a_postcondition_are_still_executed():
    program = ring_allgather(4)
    program["algo"]["coll"] = "custom"
    # The current executor skips a file with the older runtime's name; the older runs it.
    assert [e.kind for e in verify_program(program).errors] == ["old-collective"]
    report = verify_program(program, runtime="legacy")
    assert report.ok
    assert {w.kind for w in report.warnings} == {"old-collective", "no-postcondition"}
    steps_of(program, 0, 0)[0]["srcoff"] = 0
    steps_of(program, 0, 0)[1]["srcoff"] = 2  # sends a slot nothing wrote
    assert verify_program(program, runtime="legacy").errors[0].kind == "unwritten-read"
    program["algo"]["coll"] = "allscatter"
    assert verify_program(program).errors[0].message.startswith('coll="allscatter" is not a collective')


def test_reducescatter_old_spelling_is_understood():
    program = pair_reducescatter_in_place()
    program["algo"]["coll"] = "reduce_scatter"
    assert [e.kind for e in verify_program(program).errors] == ["old-collective"]
    report = verify_program(program, runtime="legacy")
    assert report.ok and report.stats.coll == "reducescatter"
    assert "older runtime's spelling" in report.warnings[0].message


def test_verify_algo_on_a_program_built_in_memory():
    parsed = read_xml_bytes(render(ring_allgather(3))).algo
    for g in parsed.gpus:
        for t in g.tbs:
            for s in t.steps:
                s.line = None
    report = verify_algo(parsed)
    assert report.ok and report.stats.steps == 12
    parsed.gpus[1].tbs[0].steps[2].dstoff = 1
    report = verify_algo(parsed, source="memory")
    assert not report.ok and report.errors[0].span.file == "memory"


def _gather(in_place: bool) -> dict:
    """Gather to root 0 over three GPUs; out of place the root also copies its own chunk."""
    root_tbs = [tb(0, -1, 1, 0, [step(0, "r", "i", 0, "o", 1)]), tb(1, -1, 2, 0, [step(0, "r", "i", 0, "o", 2)])]
    if not in_place:
        root_tbs.append(tb(2, -1, -1, 0, [step(0, "cpy", "i", 0, "o", 0)]))
    gpus = [gpu(0, 1, 3, 0, root_tbs)] + [gpu(r, 1, 0, 0, [tb(0, 0, -1, 0, [step(0, "s", "i", 0, "o", 0)])])
                                          for r in (1, 2)]
    return algo("gather", 3, 1, gpus, inplace=int(in_place), outofplace=int(not in_place))


def test_gather_in_place_and_out_of_place():
    for in_place in (True, False):
        report = verify_program(_gather(in_place))
        assert report.ok and report.stats.root == 0, report.render()
    no_copy = _gather(True)
    no_copy["algo"].update(inplace=0, outofplace=1)  # out of place the root's own chunk is missing
    err = only_error(verify_program(no_copy))
    assert err.message == "GPU 0 output[0] is never written; gather needs chunk(0, 0) there"


def test_scatter_in_place_puts_each_output_inside_the_input():
    # Root 1 sends input[r] to rank r; in place rank r's output is its own input[r].
    root_tbs = [tb(0, 0, -1, 0, [step(0, "s", "i", 0, "o", 0)]), tb(1, 2, -1, 0, [step(0, "s", "i", 2, "o", 0)])]
    gpus = [gpu(0, 0, 1, 0, [tb(0, -1, 1, 0, [step(0, "r", "i", 0, "o", 0)])]),
            gpu(1, 3, 0, 0, root_tbs),
            gpu(2, 0, 1, 0, [tb(0, -1, 1, 0, [step(0, "r", "i", 0, "o", 0)])])]
    program = algo("scatter", 3, 1, gpus, inplace=1, outofplace=0, root=1)
    report = verify_program(program)
    assert report.ok and report.stats.root == 1, report.render()
    program["algo"].update(inplace=0, outofplace=1)
    err = only_error(verify_program(program))
    assert err.message == "GPU 1 output[0] is never written; scatter needs chunk(1, 1) there"
