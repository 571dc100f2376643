"""Where the MSCCL XML backend spends its time: CPU seconds of each lowering pass, the
re-verification of the merged schedule, and writing the file, for one problem.

The schedule is produced first (a hand-written algorithm or synthesis, as `collc
compile` would) and is not timed; the stages then run as the driver runs them, in one
process with the driver's garbage-collector setting, the lowering holding the only
reference to the schedule, and the pass manager's re-verification after a pass that
changed the schedule (`collc.verify.regrouped.verify_rewritten`). After each stage the
process's resident and peak memory (VmRSS, VmHWM) are printed beside its CPU seconds.

    python3 bench/lowering_stages.py "ring(256)" allreduce --algorithm ring
    python3 bench/lowering_stages.py "dgx_h100(nodes=16)" allgather

Synthesis of a large cluster takes longer than its lowering; `--save FILE` keeps the
schedule (a pickle, with its topology) and `--load FILE` times the lowering of a kept
one, so that two versions of the lowering can be compared on the same schedule:

    python3 bench/lowering_stages.py "dgx_h100(nodes=128)" allgather --save h128.pkl
    python3 bench/lowering_stages.py --load h128.pkl
"""

from __future__ import annotations

import argparse
import pickle
import resource
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from collc import frontend
from collc.backends import BackendOptions, get_backend
from collc.backends.msccl_xml.program import coll_token
from collc.driver import CompileJob, produce_schedule
from collc.ir.collective import CollectiveKind, standard
from collc.ir.heap import few_collections
from collc.ir.schedule import Schedule
from collc.passes.base import CompileUnit, parse_pipeline
from collc.verify.regrouped import verify_rewritten


def schedule_unit(topology: str, collective: str, algorithm: str | None, size: int,
                  max_peers: int | None = None) -> CompileUnit:
    """The schedule `collc compile` would lower (synthesized with the backend's op budget
    where no algorithm is given, and at most `max_peers` peers per GPU where given: what
    the driver asks for after the runtime refused a schedule with too many)."""
    topo = frontend.resolve_topology(topology, None)
    coll = frontend.resolve_collective(collective, topo.num_ranks, None)
    budget = None if algorithm else get_backend("msccl-xml").op_budget(coll.ranks)
    unit, _ = produce_schedule(CompileJob(topo, coll, size, algorithm=algorithm), budget, max_peers)
    return unit


def with_standard_collective(schedule: Schedule) -> Schedule:
    """The schedule with its collective replaced by the standard object of the same
    kind and size, as the front end makes it. Unpickling copies the collective, and
    checks that compare collectives (the executor's label, the verifier's
    postcondition) then compare n^3 chunk symbols where they compared identities: at
    1,024 ranks, minutes. A custom collective is kept; the re-verification after
    msccl-merge still checks the postcondition either way."""
    coll = schedule.collective
    if coll.kind is CollectiveKind.CUSTOM:
        return schedule
    same = standard(coll.kind, coll.ranks, coll.chunks, coll.root or 0)
    if (same.name, same.inputs and len(same.inputs), same.outputs and len(same.outputs)) != (
            coll.name, coll.inputs and len(coll.inputs), coll.outputs and len(coll.outputs)):
        return schedule
    return replace(schedule, collective=same)


def memory_mib() -> tuple[int, int]:
    """(resident now, peak so far) of this process in MiB, from /proc/self/status (Linux;
    elsewhere the peak from getrusage twice). Sampled after each stage: tracemalloc
    snapshots take minutes at a million halves."""
    try:
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f if line.startswith(("VmRSS", "VmHWM")))
        return int(fields["VmRSS"].split()[0]) // 1024, int(fields["VmHWM"].split()[0]) // 1024
    except (OSError, KeyError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        return peak, peak


Row = tuple[str, float, int, int]  # stage, CPU s, resident MiB after it, peak MiB so far


def stages(units: list[CompileUnit], keep: Path | None = None) -> list[Row]:
    """Time the lowering of the unit in `units` (a list, emptied here: the lowering
    holds the only reference to the schedule, as in the driver, so that what a pass
    replaces is freed). `keep`: where to leave the XML file (else it is deleted)."""
    unit = units.pop()
    back = get_backend("msccl-xml")
    coll_token(unit.schedule.collective)  # the driver checks the collective before solving, as here
    options = BackendOptions()
    out: list[Row] = [("schedule ops", float(len(unit.schedule.ops)), *memory_mib())]
    for p in parse_pipeline(back.lowering(options)):
        before, verified_before = unit.schedule, unit.verified
        t0 = time.process_time()
        unit = p.run(unit)
        out.append((p.name, time.process_time() - t0, *memory_mib()))
        if unit.schedule is not before:  # the pass manager re-verifies a changed schedule, so here
            t0 = time.process_time()
            verify_rewritten(before if verified_before else None, unit.schedule, unit.topology)
            unit = unit.with_verified(unit.schedule)
            out.append((f"re-verify after {p.name}", time.process_time() - t0, *memory_mib()))
        before = None
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.process_time()
        back.emit(unit, keep or Path(tmp) / "out.xml", options)
        out.append(("write XML", time.process_time() - t0, *memory_mib()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("topology", nargs="?")
    ap.add_argument("collective", nargs="?")
    ap.add_argument("--algorithm", default=None)
    ap.add_argument("--size", type=int, default=1 << 30)
    ap.add_argument("--max-peers", type=int, default=None,
                    help="synthesize with at most this many peers per GPU (dgx_h100(nodes=128) needs 32)")
    ap.add_argument("--save", type=Path, help="keep the schedule in this file (a pickle) before timing")
    ap.add_argument("--load", type=Path, help="time the lowering of a schedule kept with --save")
    ap.add_argument("--xml", type=Path, help="keep the MSCCL XML file written here")
    args = ap.parse_args()
    if args.load is None and (args.topology is None or args.collective is None):
        ap.error("give a topology and a collective, or --load FILE")
    with few_collections():
        if args.load is not None:
            with open(args.load, "rb") as f:
                schedule, topology, size = pickle.load(f)
            schedule = with_standard_collective(schedule)
            units = [CompileUnit(topology, schedule.collective, size, schedule)]
            del schedule
        else:
            units = [schedule_unit(args.topology, args.collective, args.algorithm, args.size, args.max_peers)]
            if args.save is not None:
                with open(args.save, "wb") as f:
                    unit = units[0]
                    pickle.dump((unit.schedule, unit.topology, unit.size_bytes), f, protocol=pickle.HIGHEST_PROTOCOL)
                    del unit
        rows = stages(units, args.xml)
    print("| stage | CPU s | resident MiB after | peak MiB so far |\n|---|---|---|---|")
    total = 0.0
    for name, value, rss, peak in rows:
        if name == "schedule ops":
            print(f"| ({int(value):,} ops) | | {rss:,} | {peak:,} |")
            continue
        total += value
        print(f"| `{name}` | {value:.2f} | {rss:,} | {peak:,} |")
    print(f"| all of the above | {total:.2f} | | |")
    print(f"\npeak memory {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB (schedule included)")


if __name__ == "__main__":
    main()
