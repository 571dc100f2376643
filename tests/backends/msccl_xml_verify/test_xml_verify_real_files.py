"""Every real MSCCL XML file in shared/data/msccl-xml verifies, and broken copies do not."""

from __future__ import annotations

import csv
import re

import pytest

from collc.backends.msccl_xml.verify import IN_PLACE, OUT_OF_PLACE, verify_file, verify_files
from xml_verify_programs import SHARED_XML, line_of, verify_text

pytestmark = pytest.mark.skipif(not SHARED_XML.is_dir(), reason="shared/data is not beside this checkout")


def manifest_rows() -> list[dict[str, str]]:
    if not SHARED_XML.is_dir():
        return []
    with open(SHARED_XML / "MANIFEST.tsv", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


ROWS = manifest_rows()


def for_older_runtime(row: dict[str, str]) -> bool:
    """A file without the current executor's attributes (it skips such a file)."""
    return row["outofplace"] == ""


@pytest.mark.parametrize("row", ROWS, ids=[r["file"] for r in ROWS])
def test_real_file_verifies(row):
    # Files for the older runtime verify against it; the rest against the current one.
    report = verify_file(SHARED_XML / row["file"], runtime="legacy" if for_older_runtime(row) else "current")
    assert report.ok, report.render()
    stats = report.stats
    assert (stats.coll, stats.gpus) == (row["coll"], int(row["ngpus"]))
    expected_modes = []
    if row["inplace"] == "1":
        expected_modes.append(IN_PLACE)
    # The file without outofplace is for the older runtime: not in place means out of place.
    if row["outofplace"] == "1" or (row["outofplace"] == "" and row["inplace"] == "0"):
        expected_modes.append(OUT_OF_PLACE)
    assert list(stats.modes) == expected_modes
    assert report.summary() == f"ok ({row['coll']}, {row['ngpus']} GPUs, {stats.tbs} tbs, {stats.steps} steps)"


def test_every_xml_file_is_in_the_manifest():
    assert sorted(p.name for p in SHARED_XML.glob("*.xml")) == sorted(r["file"] for r in ROWS)


def test_only_the_file_for_the_older_runtime_fails_against_the_current_one():
    failing = sorted(r["file"] for r in ROWS if not verify_file(SHARED_XML / r["file"]).ok)
    assert failing == sorted(r["file"] for r in ROWS if for_older_runtime(r)) == [
        "rccl__all-to-all-2d-hierarchical-simple-n2g32.xml"]


def test_file_for_the_older_runtime_fails_by_default_and_passes_as_legacy():
    path = SHARED_XML / "rccl__all-to-all-2d-hierarchical-simple-n2g32.xml"
    report = verify_file(path)
    assert not report.ok
    assert [re.search(r"has no (\w+)", e.message).group(1) for e in report.errors] == [
        "minBytes", "maxBytes", "outofplace"]
    assert all(e.kind == "missing-attribute" and "silently skips this file" in e.message for e in report.errors)
    assert all(e.span.line == 3 for e in report.errors)  # the <algo> line, after two comment lines
    legacy = verify_file(path, runtime="legacy")
    assert legacy.ok
    missing = [w for w in legacy.warnings if "silently skips this file" in w.message]
    assert [re.search(r"has no (\w+)", w.message).group(1) for w in missing] == ["minBytes", "maxBytes", "outofplace"]
    strict = verify_file(path, runtime="legacy", strict=True)
    assert not strict.ok and len(strict.errors) == 3


def test_ignored_teccl_copy_elements_are_reported():
    report = verify_file(SHARED_XML / "teccl__amd_32.xml")
    assert report.ok
    assert [w.message for w in report.warnings] == [
        "64 <copy> elements inside <gpu> are ignored by the executor (the first is here)"]


def test_the_claimed_buffer_arrangement_matters():
    # An in-place AllGather only reads and writes the output buffer, relying on the
    # input being rank r's window of it; out of place that window starts empty.
    text = (SHARED_XML / "gen-mscclang__ag_ring_8.xml").read_text()
    report = verify_text(text.replace('inplace="1" outofplace="0"', 'inplace="0" outofplace="1"'))
    assert not report.ok
    first = report.errors[0]
    assert "GPU 0 tb 0 step 0 reads output[0] of GPU 0, which nothing has written" in first.message
    # An out-of-place AllToAll run in place has copies overwrite what other threadblocks still send.
    text = (SHARED_XML / "rccl__alltoall-8n-0-1kb.xml").read_text()
    report = verify_text(text.replace('inplace="0" outofplace="1"', 'inplace="1" outofplace="0"'))
    assert not report.ok and report.errors[0].kind == "race"


def test_wrong_source_offset_in_a_real_file():
    text = (SHARED_XML / "gen-mscclang__ag_ring_8.xml").read_text()
    line = line_of(text, 3, 0, 0)
    lines = text.splitlines(keepends=True)
    assert 'type="s" srcbuf="o" srcoff="3"' in lines[line - 1]
    lines[line - 1] = lines[line - 1].replace('srcoff="3"', 'srcoff="4"')
    report = verify_text("".join(lines))
    err = report.errors[0]
    assert (err.where.gpu, err.where.tb, err.where.s) == (3, 0, 0) and err.span.line == line
    assert "reads output[4] of GPU 3, which nothing has written before this step" in err.message


def test_dropped_dependency_in_a_real_allreduce_is_a_race():
    text = (SHARED_XML / "rccl__allreduce_1step_mccl_4_2_2048_LL.xml").read_text()
    # Drop the dependencies of GPU 0 tb 0 (its nops and the re steps they guard).
    gpu0_tb0 = text[text.index('<tb id="0"'):text.index("</tb>")]
    unguarded = re.sub(r'depid="\d+" deps="\d+"', 'depid="-1" deps="-1"', gpu0_tb0)
    report = verify_text(text.replace(gpu0_tb0, unguarded, 1), max_errors=200)
    # tb 0 now reduces scratch before the receives land (an unwritten read in this
    # interleaving), and in every interleaving nothing orders it against them (races).
    assert [e.kind for e in report.errors[:3]] == ["unwritten-read"] * 3
    assert report.errors[0].message.startswith("GPU 0 tb 0 step 4 reads scratch[0] of GPU 0")
    races = [e for e in report.errors if e.kind == "race"]
    assert len(races) == 4 and all(e.where.gpu == 0 and "GPU 0 tb 0 step" in e.message for e in races)
    assert "race on scratch[0] of GPU 0: GPU 0 tb 2 step 1 writes it and GPU 0 tb 0 step 4 reads it" in [
        e.message for e in races][1]


def test_verify_files_reports_unreadable_files(tmp_path):
    bad = tmp_path / "bad.xml"
    bad.write_text("<algo>\n  <gpu>\n</algo>\n")
    good = SHARED_XML / "gen-mscclang__ag_ring_8.xml"
    reports = verify_files([good, bad])
    assert [r.ok for r in reports] == [True, False]
    assert reports[1].stats is None and reports[1].errors[0].span.line == 3
    assert reports[1].render().startswith(f"{bad}: FAILED (1 error)\n{bad}:3:")
