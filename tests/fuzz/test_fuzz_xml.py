"""Property: `collc verify` on any MSCCL XML (compiled by collc, generated, or a mutated
real file) exits 0 or 1 (2 for bad options), without a traceback, within the deadline."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzz_inputs import mutated_xml, run_case, seed_xml_files, valid_or_generated_xml

SEEDS = seed_xml_files()
OPTIONS = st.sampled_from([[], ["--strict"], ["--json"], ["--fifo-capacity", "2"], ["--max-steps", "256"],
                           ["--max-steps", "-1"]])


@given(program=valid_or_generated_xml(), options=OPTIONS)
def test_generated_xml(program, options):
    run_case("xml-generated", {"f.xml": program}, ["verify", "{dir}/f.xml", *options])


@pytest.mark.skipif(not SEEDS, reason="../shared/data/msccl-xml is absent")
@given(data=st.data(), options=OPTIONS)
def test_mutated_real_xml(data, options):
    seed = data.draw(st.sampled_from(SEEDS))
    run_case("xml-mutated", {"f.xml": data.draw(mutated_xml(seed))}, ["verify", "{dir}/f.xml", *options])
