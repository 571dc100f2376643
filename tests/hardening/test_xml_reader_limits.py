"""MSCCL XML with absurd numbers is refused at its element, at once."""

from __future__ import annotations

import time

from hardening_inputs import write

HEAD = '<algo name="x" proto="Simple" nchannels="1" coll="allgather" inplace="0" '
GPU = '<gpu id="0" i_chunks="1" o_chunks="2" s_chunks="0"></gpu></algo>'


def test_attribute_of_100000_digits(collc, tmp_path):
    write(tmp_path / "d.xml", HEAD + f'nchunksperloop="{"9" * 100_000}" ngpus="2">' + GPU)
    run = collc("verify", "d.xml")
    assert run.status == 1 and "100,000 digits" in run.err and "d.xml:1:1" in run.err
    assert len(run.err) < 2000  # the line is shown as a window, not 100 kB


def test_xml_claiming_a_billion_gpus(collc, tmp_path):
    write(tmp_path / "g.xml", HEAD + 'nchunksperloop="2" ngpus="1000000000">' + GPU)
    start = time.perf_counter()
    run = collc("verify", "g.xml")
    assert run.status == 1 and "COLLC_LIMIT_RANKS" in run.err
    assert time.perf_counter() - start < 5
