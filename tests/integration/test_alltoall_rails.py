"""An AllToAll compiled to MSCCL XML for GPUs whose resident threadblocks are fewer than a
direct AllToAll's peers: synthesis routes it over the rails (collc.synthesis.rail_alltoall),
and the file fits the threadblock limit and passes `collc verify`."""

from __future__ import annotations

from collc import driver
from collc.backends.msccl_xml.limits import resident_threadblocks
from collc.backends.msccl_xml.reader import read_xml
from collc.backends.msccl_xml.verify import verify_file
from collc.ir.collective import alltoall
from rail_topologies import quad


def test_alltoall_over_rails_lowers_within_the_threadblock_limit_and_verifies(tmp_path):
    sms = 8  # 6 threadblocks resident; a direct AllToAll on 5 nodes of 4 has 4 + 3 peers
    topo = quad(tmp_path, 5, sms)
    out = tmp_path / "a2a.xml"
    job = driver.CompileJob(topo, alltoall(topo.num_ranks), 1 << 30)
    result = driver.compile_job(job, "msccl-xml", out, with_baselines=False)
    assert result.report["solver"]["method"] == "rails"
    assert result.report["solver"]["backend_peer_limit"] == resident_threadblocks(sms) < 7
    assert result.report["ratio_to_lower_bound"] <= 1.05
    algo = read_xml(out)
    assert max(len(gpu.tbs) for gpu in algo.gpus) <= resident_threadblocks(sms)
    report = verify_file(out, sms=sms)
    assert report.ok, report.render()
