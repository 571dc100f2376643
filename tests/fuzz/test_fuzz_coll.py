"""Property: any .coll program, valid or mutated, under any of the commands, ends with
exit status 0, 1 or 2, without a traceback, within the deadline, leaving no file behind
when it fails."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fuzz_inputs import coll_command, coll_program, mutated, run_case, seed_programs

SEEDS = seed_programs()


@given(program=coll_program(), argv=coll_command())
def test_generated_programs(program, argv):
    run_case("coll-generated", {"p.coll": program.encode(), "plain": b""}, argv)


@given(data=st.data(), argv=coll_command())
def test_mutated_programs(data, argv):
    seed = data.draw(st.sampled_from(SEEDS))
    program = data.draw(mutated(seed))
    run_case("coll-mutated", {"p.coll": program, "plain": b""}, argv)


@given(data=st.data(), argv=coll_command())
def test_mutated_generated_programs(data, argv):
    program = data.draw(mutated(data.draw(coll_program()).encode()))
    run_case("coll-generated-mutated", {"p.coll": program, "plain": b""}, argv)
