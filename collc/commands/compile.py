"""`collc compile`: a collective for a cluster, to a backend's files and a report."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Callable

from collc.commands.args import EXIT_OK, finite_float, int_at_least, path_text
from collc.commands.output_paths import check_outputs, names_directory, one_request_many_sizes, output_path
from collc.commands.report_table import load_table_modules, print_report
from collc import idle, units
from collc.diagnostics import CollcError, UsageError

# The front end, the driver and the backends are imported inside the functions below:
# `collc --help` builds this command's parser and should not load the solver to do it.


def parse_sizes(text: str) -> list[int]:
    """`--size 1KiB,1MiB`: the sizes in bytes; errors point at the column of the bad one.
    Each size is read as the language reads one (units, nccl-tests' `1M`, the size limit)."""
    from collc import frontend

    return units.parse_size_list(text, "<--size>", frontend.parse_size)


def parse_size_range(text: str) -> tuple[int, int]:
    from collc import frontend

    try:
        return units.parse_size_range(text, "<--size-range>", frontend.parse_size)
    except ValueError as err:  # no MIN:MAX at all: the command line is wrong, not a value
        raise UsageError(str(err)) from None


def synth_pipeline(args: argparse.Namespace, base: str | None) -> str:
    """The schedule-producing pipeline: --pipeline as given, or `synthesize{...}` from the
    routing options, merged into a request's own synthesize pass."""
    if args.pipeline:
        return args.pipeline
    opts = []
    if args.synthesize:
        opts.append(f"method={args.synthesize}")
    for flag, key in (("chunks", "chunks"), ("time_limit", "time_limit"), ("mip_gap", "mip_gap"),
                      ("threads", "threads"), ("seed", "seed"), ("tolerance", "tolerance")):
        val = getattr(args, flag)
        if val is not None:
            opts.append(f"{key}={val}")
    if args.quiet:
        opts.append("progress=false")
    if base and base != "synthesize" and not opts:
        return base
    if base and base.startswith("synthesize{") and opts:
        inner = base[len("synthesize{"):-1]
        return "synthesize{" + " ".join([inner] + opts).strip() + "}"
    return "synthesize{" + " ".join(opts) + "}" if opts else "synthesize"


def compile_jobs(args: argparse.Namespace) -> list:
    """What to compile: a FILE's requests, or --topology and --collective, at each size."""
    from collc import frontend
    from collc.driver import CompileJob

    sizes = parse_sizes(args.size) if args.size else []
    if args.demand:  # an AllToAllv from a demand matrix (collc.frontend.demand)
        from collc.driver import demand_job

        if args.file or args.collective or args.algorithm or not args.topology or len(sizes) > 1:
            raise UsageError("--demand M.csv goes with --topology and at most one --size (the matrix is the collective)")
        return [demand_job(args.topology, args.demand, sizes[0] if sizes else None, args.backend,
                           synth_pipeline(args, None))]
    if args.algorithm and (args.synthesize or args.pipeline):
        raise UsageError("--algorithm and --synthesize/--pipeline choose different routes: give one")
    jobs = []
    if args.file and not (args.topology or args.collective):
        base = Path(args.file).resolve().parent
        requests = frontend.load_requests(args.file, args.request)
        if not requests:
            raise UsageError(f"{args.file} has no compile request: add `compile ... on ... size ...;` "
                             "or pass --topology and --collective")
        override = args.algorithm
        if override and defines(args.file, override):
            override = f"{args.file}:{override}"
        for req in requests:
            req_sizes = sizes or ([req.size_bytes] if req.size_bytes else [])
            if not req_sizes:
                raise CollcError("this compile request has no size: add `size 1 MiB` or pass --size", req.span)
            algorithm = override or (None if (args.synthesize or args.pipeline) else req.algorithm)
            for size in req_sizes:
                jobs.append(CompileJob(
                    topology=req.topology, collective=req.collective, size_bytes=size, algorithm=algorithm,
                    schedule=req.schedule if algorithm == req.algorithm else None,
                    pipeline=synth_pipeline(args, req.pipeline), span=req.span, base_dir=base))
        return jobs
    if args.request is not None:
        raise UsageError("--request picks one of a FILE's compile requests; it does not go with --topology "
                         "and --collective")
    if not (args.topology and args.collective):
        raise UsageError("compile needs a FILE with compile requests, or --topology and --collective")
    if not sizes:
        raise UsageError("compile needs --size (e.g. --size 256MiB, or several: --size 1KiB,1MiB,64MiB)")
    base = Path(args.file).resolve().parent if args.file else None
    topo_spec = f"{args.file}:{args.topology}" if args.file and ":" not in args.topology and \
        not args.topology.endswith(".coll") and defines(args.file, args.topology) else args.topology
    topo = frontend.resolve_topology(topo_spec, base)
    coll_spec = f"{args.file}:{args.collective}" if args.file and defines(args.file, args.collective) \
        else args.collective
    coll = frontend.resolve_collective(coll_spec, topo.num_ranks, base)
    algorithm = args.algorithm
    if algorithm and args.file and defines(args.file, algorithm):
        algorithm = f"{args.file}:{algorithm}"
    for size in sizes:
        jobs.append(CompileJob(topology=topo, collective=coll, size_bytes=size, algorithm=algorithm,
                               pipeline=synth_pipeline(args, None), base_dir=base))
    return jobs


def defines(path: str, spec: str) -> bool:
    """Whether the user's file defines the name a spec starts with (it then wins over the stdlib)."""
    from collc import frontend

    name = spec.split("(", 1)[0].strip()
    return name in frontend.defined_names(path)


def backend_options(args: argparse.Namespace):
    from collc.backends import BackendOptions

    return BackendOptions(
        inplace=args.inplace, proto=args.proto, instances=args.instances,
        size_range=parse_size_range(args.size_range) if args.size_range else None,
        max_steps_per_tb=args.max_steps, extra={"channels": args.channels} if args.channels else {})


def cmd_compile(args: argparse.Namespace) -> int:
    # Work this command needs late (the table's modules, and the driver's own) is done
    # where the solver's thread runs and this one would wait (collc.idle).
    with idle.idle_queue():
        return compile_command(args)


def compile_command(args: argparse.Namespace) -> int:
    from collc.ir.heap import few_collections

    # The modules a compile loads (numpy, HiGHS, the synthesis), the standard library's
    # trees and the requests live until the process ends and hold no cycles: with the
    # collector on, its young collections walked them ~80 times (~30 ms of the README's
    # main job). The driver pauses it again for each request's own work.
    with few_collections():
        from collc.backends import get_backend
        from collc.driver import check_job, compile_job, compile_job_written_while_verified, prepare_job
        from collc.io import all_or_nothing, atomic_write

        if args.scheduler:
            try:
                import distributed  # noqa: F401  (only whether the optional extra is installed)
            except ImportError:
                raise UsageError('--scheduler needs Dask: pip install "collc[dask]"') from None
        backend = get_backend(args.backend)
        options = backend_options(args)
        jobs = compile_jobs(args)
    out = Path(args.output)
    library = backend.emit_library is not None and one_request_many_sizes(jobs)
    directory = names_directory(args.output)
    check_outputs(args, jobs, directory)
    for job in jobs:  # before the first solve, so a late request cannot waste an early one's time
        check_job(job, backend, options)
    here = not library and len(jobs) == 1 and not args.scheduler  # the one request solved in this process
    if here and not args.quiet:
        idle.defer(load_table_modules)  # (not queued where worker processes, forked, would inherit it)
    reports = []
    # Every file of this command (schedules, report) is renamed into place together at
    # the end, or none is: a failure in any request leaves no output of another.
    with all_or_nothing():
        if library:
            reports = compile_library(args, jobs, backend, options, out)
        elif here:
            # One request, here: its files are written while it is verified and reported.
            result = compile_job_written_while_verified(
                jobs[0], args.backend, output_path(out, jobs[0], backend, directory, set()), options,
                with_baselines=not args.no_baselines)
            reports.append(result.report)
        else:
            taken: set[Path] = set()
            prepared = in_parallel(args, prepare_job, [(job, args.backend, options, not args.no_baselines)
                                                       for job in jobs])
            for job, ready in zip(jobs, prepared):
                result = compile_job(job, args.backend, output_path(out, job, backend, directory, taken), options,
                                     with_baselines=not args.no_baselines, prepared=ready)
                reports.append(result.report)
        if args.report:
            atomic_write(args.report, json.dumps(reports[0] if len(reports) == 1 else reports, indent=2) + "\n")
    if not args.quiet:
        # The schedules are still alive here (millions of objects at 1,024 ranks), and
        # every collection the printing's imports set off would walk all of them; they
        # hold no cycles worth finding before the process exits.
        with few_collections():
            for rep in reports:
                print_report(rep)
    return EXIT_OK


def compile_library(args: argparse.Namespace, jobs: list, backend, options, out: Path) -> list[dict]:
    """One request at several sizes, for a backend that writes libraries: a size-band
    library in `out` (open-ended: the bands cover every size), one report per size."""
    from collc.driver import LibraryBand, emit_library, make_report, schedule_job

    scheduled = in_parallel(args, schedule_job, [(job, args.backend, options) for job in jobs])
    units = [(job, unit, solver) for job, (unit, solver) in zip(jobs, scheduled)]
    bands = [LibraryBand(unit.collective if unit.schedule is None else unit.schedule.collective, (job.size_bytes,),
                         unit) for job, unit, _ in units]
    library = emit_library(args.backend, bands, out, options, open_ended=True, verify=False)
    paths = {f.band: f.path for f in library.files}
    return [make_report(job, unit, solver, args.backend, [paths[i]], not args.no_baselines)
            for i, (job, unit, solver) in enumerate(units)]


def in_parallel(args: argparse.Namespace, function: Callable[..., Any], units: list[tuple]) -> list:
    """function(*unit) for every unit, in order. Requests are independent: several run
    in parallel (`collc.parallel`: --workers local processes, default one per usable
    CPU, or the Dask cluster of --scheduler); their schedules are those of one process,
    as the search is bounded by work, not time (unless --time-limit fires)."""
    from collc.parallel import local_workers, run_units

    workers = args.workers if args.workers is not None else local_workers()
    results: list = [None] * len(units)
    for i, result in run_units(function, units, workers, args.scheduler):
        results[i] = result
    return results


def backend_names() -> list[str]:
    from collc.backends import backend_names as names

    return names()


def add_commands(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("compile", help="compile a collective for a cluster")
    c.add_argument("file", nargs="?", metavar="FILE", help="a .coll file with compile requests or definitions")
    c.add_argument("--topology", metavar="T", help='a stdlib topology with arguments, e.g. "ndv2(chassis=2)"')
    c.add_argument("--collective", metavar="C", help='e.g. allgather or "broadcast(root=1)"')
    c.add_argument("--size", metavar="BYTES",
                   help="nccl-tests' size: 1MiB, 256MB, 1M (K/M/G/T are powers of 1024, as nccl-tests reads "
                        "them; KB/MB/GB powers of 1000), ...; a comma list for several")
    c.add_argument("--demand", metavar="M.csv", help="an N x N demand matrix (AllToAllv): bytes rank i sends "
                   "rank j, or shares of --size")
    c.add_argument("--request", metavar="LINE|NAME",
                   help="compile only the FILE's requests on this line, or naming this collective, topology "
                        "or algorithm")
    route = c.add_argument_group("routing")
    route.add_argument("--algorithm", metavar="A", help="a hand-written algorithm (e.g. ring, tree)")
    route.add_argument("--synthesize", metavar="METHOD", help="auto (default), milp, lp, rounds, ...")
    route.add_argument("--pipeline", metavar="TEXT", help='passes as text, e.g. "synthesize{method=lp chunks=4}"')
    route.add_argument("--chunks", type=int_at_least(1), metavar="N",
                       help="chunks per rank for synthesis (default: chosen)")
    route.add_argument("--time-limit", type=finite_float(0, lo_open=True), dest="time_limit", metavar="SECONDS",
                       help="solver seconds, a safety net: the search is bounded by work, so the same input "
                            "gives the same schedule on any machine unless this fires (default 600)")
    route.add_argument("--tolerance", type=finite_float(0, 1), metavar="F",
                       help="synthesis stops within this fraction of the lower bound (default 0.01)")
    route.add_argument("--mip-gap", type=finite_float(0, 1), dest="mip_gap", metavar="GAP",
                       help="relative MILP gap at which the solver stops, 0 to 1 (default: the solver's)")
    route.add_argument("--threads", type=int_at_least(1), metavar="N",
                       help="solver threads (default: the solver's choice)")
    route.add_argument("--seed", type=int_at_least(0), metavar="N",
                       help="solver random seed, 0 or more (default: the solver's)")
    par = c.add_argument_group("several requests (sizes, topologies)")
    par.add_argument("--workers", type=int_at_least(1), default=None, metavar="N",
                     help="processes that compile independent requests in parallel (default: one per usable "
                          "CPU; 1: one after another in this process)")
    par.add_argument("--scheduler", metavar="ADDRESS",
                     help="compile the requests on a running Dask cluster (tcp://host:8786; needs "
                          "pip install \"collc[dask]\")")
    out = c.add_argument_group("output")
    out.add_argument("--backend", default="json", choices=backend_names(),
                     help="what to write (default json)")
    out.add_argument("-o", "--output", required=True, metavar="OUT", type=path_text,
                     help="the output file; a directory (a trailing slash, or an existing directory) gets one "
                          "file per schedule")
    out.add_argument("--report", metavar="FILE.json", type=path_text,
                     help="also write the report (times, bounds, baselines) as JSON")
    out.add_argument("--inplace", action="store_true", help="msccl-xml/cupy: in-place variant")
    out.add_argument("--proto", default="Simple", choices=["Simple", "LL", "LL128"], help="msccl-xml: protocol")
    out.add_argument("--instances", type=int_at_least(1), default=1, metavar="N",
                     help="msccl-xml: copies on separate channels")
    out.add_argument("--size-range", metavar="MIN:MAX", help="msccl-xml: byte range the file claims")
    out.add_argument("--max-steps", type=int_at_least(1), default=64, metavar="N",
                     help="msccl-xml: steps per threadblock limit")
    out.add_argument("--channels", type=int_at_least(0), default=0, metavar="N",
                     help="msccl-xml: channels to use (default: fewest that fit)")
    out.add_argument("--no-baselines", action="store_true", help="skip timing the stdlib baselines")
    out.add_argument("-q", "--quiet", action="store_true", help="print no report table and no solver progress")
    c.set_defaults(func=cmd_compile)
