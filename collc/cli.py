"""The `collc` command line.

User errors print `FILE:LINE:COL: error: MESSAGE` with the source line and a caret and
exit 1; usage errors exit 2 (argparse's convention). No traceback for bad input.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import sys
import threading
from pathlib import Path
from typing import Any, Sequence

from collc import __version__
from collc.diagnostics import CollcError, Span, format_error, printable

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """A command line that does not make sense (exit 2)."""


# --- argument types: argparse reports a bad value as a usage error (exit 2) ----------------

def _int_at_least(lo: int, hi: int | None = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
        if value < lo or (hi is not None and value > hi):
            bound = f"at least {lo}" if hi is None else f"between {lo} and {hi:,}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value
    parse.__name__ = "whole number"
    return parse


def _finite_float(lo: float, hi: float | None = None, lo_open: bool = False):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
        if not math.isfinite(value) or value < lo or (lo_open and value == lo) or (hi is not None and value > hi):
            bound = f"greater than {lo:g}" if lo_open else f"at least {lo:g}"
            bound += "" if hi is None else f" and at most {hi:g}"
            raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got {text}")
        return value
    parse.__name__ = "number"
    return parse


def _path_text(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path names no file")
    return text


def _spec_sources() -> dict[str, str]:
    """Command-line specs (`<--topology>` ...) as sources, so their errors get a caret."""
    try:
        from collc import frontend

        return frontend.spec_sources()
    except ImportError:
        return {}


def _out(text: str = "") -> None:
    sys.stdout.write(text + "\n")


def _json_out(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


# --- check / list / show --------------------------------------------------------------

def cmd_check(args: argparse.Namespace) -> int:
    from collc import frontend

    failed = 0
    for path in args.files:
        try:
            summary = frontend.check_file(path)
        except CollcError as err:
            sys.stderr.write(format_error(err) + "\n")
            failed += 1
            continue
        _out(printable(f"{path}: ok: {summary}"))
    return EXIT_ERROR if failed else EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    from collc import frontend

    catalog = frontend.stdlib_catalog()
    if args.json:
        _json_out(catalog)
        return EXIT_OK
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(highlight=False, emoji=False)
    for section, title in (("topologies", "Topologies"), ("collectives", "Collectives"),
                           ("algorithms", "Algorithms")):
        table = Table(title=title, title_justify="left")
        table.add_column("name")
        table.add_column("parameters" if section != "algorithms" else "implements")
        table.add_column("description")
        for item in catalog.get(section, []):
            if section == "algorithms":
                second = ", ".join(item.get("implements", []))
            else:
                second = ", ".join(f"{p['name']}={p['default']}" if p.get("default") is not None else p["name"]
                                   for p in item.get("params", []))
            table.add_row(*(escape(printable(cell)) for cell in
                            (item["name"], second, _first_sentence(item.get("description", "")))))
        console.print(table)
    return EXIT_OK


def _first_sentence(text: str) -> str:
    flat = " ".join(text.split())
    end = flat.find(". ")
    return flat if end < 0 else flat[: end + 1]


def cmd_show(args: argparse.Namespace) -> int:
    from collc import frontend

    if args.file and _is_json(args.file):
        data = _read_schedule_json(args.file)
    elif args.file:
        data = frontend.show_file(args.file)
    elif args.topology:
        topo = frontend.resolve_topology(args.topology)
        data = {"topology": topo.to_json()}
    elif args.collective:
        coll = frontend.resolve_collective(args.collective, args.ranks)
        data = {"collective": coll.to_json()}
    else:
        raise UsageError("show needs FILE, --topology T or --collective C")
    if args.json:
        _json_out(data)
    else:
        _out(_describe(data))
    return EXIT_OK


def _is_json(path: str) -> bool:
    """A file collc wrote with `--backend json` (rather than a .coll program)."""
    if path.endswith(".json"):
        return True
    try:
        with open(path, "rb") as f:
            return f.read(64).lstrip().startswith(b"{")
    except OSError:
        return False


def _read_schedule_json(path: str) -> dict[str, Any]:
    """A compiled schedule (`--backend json`) in the form `_describe` shows."""
    from collc.ir.schedule import Schedule
    from collc.ir.topology import Topology

    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
    except OSError as exc:
        raise CollcError(f"cannot read '{path}': {exc.strerror or exc}") from None
    except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
        line, col = getattr(exc, "lineno", 1), getattr(exc, "colno", 1)
        raise CollcError(f"not valid JSON: {getattr(exc, 'msg', exc)}", Span(path, line, col)) from None
    if not isinstance(doc, dict) or doc.get("format") != "collc-schedule":
        raise CollcError("not a schedule collc wrote (`--backend json` files have \"format\": "
                         "\"collc-schedule\")", Span(path, 1, 1))
    try:
        schedule = Schedule.from_json(doc["schedule"])
        topology = Topology.from_json(doc["topology"])
        return {"topology": topology.to_json(), "collectives": [schedule.collective.to_json()],
                "schedules": [{"for": f"{schedule.collective.name} on {schedule.topology}, "
                               f"{doc.get('size_bytes'):,} bytes", "schedule": doc["schedule"]}]}
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise CollcError(f"this collc schedule is damaged: {type(exc).__name__} {exc}", Span(path, 1, 1)) from None


# Ops and ranks `collc show` lists before it says how many more there are.
SHOW_OPS = 64
SHOW_RANK_LINES = 32
# A collective's postcondition has ranks x slots entries: beyond this it is no view.
SHOW_MAX_RANKS = 256


def _describe_schedule(item: dict[str, Any]) -> list[str]:
    from collc.ir.schedule import Op

    sched = item["schedule"]
    ops = [Op.from_json(o) for o in sched["ops"]]
    steps = 1 + max((op.step for op in ops), default=-1)
    lines = [f"schedule {sched['name']} for {item['for']}: {len(ops)} ops in {steps} steps"]
    for op in ops[:SHOW_OPS]:
        count = f" x{op.count}" if op.count != 1 else ""
        deps = f" after {', '.join(map(str, op.deps))}" if op.deps else ""
        lines.append(f"  step {op.step}: op {op.id} {op.kind.value} {op.src} -> {op.dst}{count}{deps}")
    if len(ops) > SHOW_OPS:
        lines.append(f"  ... {len(ops) - SHOW_OPS} more ops (--json shows all)")
    return lines


def _describe(data: dict[str, Any]) -> str:
    """A short human-readable view of the JSON form."""
    lines: list[str] = []
    for topo in ([data["topology"]] if "topology" in data else data.get("topologies", [])):
        gpus = [n for n in topo["nodes"] if n["kind"] == "gpu"]
        others = [n for n in topo["nodes"] if n["kind"] != "gpu"]
        lines.append(f"topology {topo['name']}: {len(gpus)} GPUs, {len(others)} switches/NICs, "
                     f"{len(topo['links'])} directed links")
        if topo.get("description"):
            lines.extend(f"  {line}" for line in topo["description"].splitlines())
        for l in topo["links"]:
            mult = f" x{l['multiplicity']}" if l["multiplicity"] != 1 else ""
            lines.append(f"  {l['src']} -> {l['dst']}: {l['bandwidth'] / 1e9:g} GB/s{mult}, "
                         f"{l['latency'] * 1e6:g} us")
    for coll in ([data["collective"]] if "collective" in data else data.get("collectives", [])):
        lines.append(f"collective {coll['name']} ({coll['kind']}): {coll['ranks']} ranks, "
                     f"{coll['chunks']} chunk(s) per rank")
        for r, buf in enumerate(coll["outputs"][:SHOW_RANK_LINES]):
            want = ", ".join("-" if v is None else "+".join(f"c{a}.{b}" for a, b in v) for v in buf[:SHOW_OPS])
            more = f", ... {len(buf) - SHOW_OPS} more" if len(buf) > SHOW_OPS else ""
            lines.append(f"  rank {r} output: [{want}{more}]")
        if len(coll["outputs"]) > SHOW_RANK_LINES:
            lines.append(f"  ... {len(coll['outputs']) - SHOW_RANK_LINES} more ranks (--json shows all)")
    for item in data.get("schedules", []):
        lines.extend(_describe_schedule(item))
    for req in data.get("requests", []):
        lines.append(f"compile {req}")
    return printable("\n".join(lines)) if lines else "(nothing to show)"


# --- compile ------------------------------------------------------------------------

def _parse_sizes(text: str) -> list[int]:
    from collc import frontend

    sizes, column = [], 1
    for part in text.split(","):
        lead = len(part) - len(part.lstrip())
        if part.strip():
            sizes.append(frontend.parse_size(part.strip(), Span("<--size>", 1, column + lead)))
        column += len(part) + 1
    return sizes


def _parse_size_range(text: str) -> tuple[int, int]:
    from collc import frontend

    if ":" not in text:
        raise UsageError("--size-range takes MIN:MAX (e.g. 0:1MiB; MAX 0 means no limit)")
    lo, hi = text.split(":", 1)
    return (frontend.parse_size(lo or "0", Span("<--size-range>", 1, 1)),
            frontend.parse_size(hi or "0", Span("<--size-range>", 1, len(lo) + 2)))


def _synth_pipeline(args: argparse.Namespace, base: str | None) -> str:
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


def _jobs(args: argparse.Namespace) -> list:
    from collc import frontend
    from collc.driver import CompileJob

    sizes = _parse_sizes(args.size) if args.size else []
    if args.demand:  # an AllToAllv from a demand matrix (collc.frontend.demand)
        from collc.driver import demand_job

        if args.file or args.collective or args.algorithm or not args.topology or len(sizes) > 1:
            raise UsageError("--demand M.csv goes with --topology and at most one --size (the matrix is the collective)")
        return [demand_job(args.topology, args.demand, sizes[0] if sizes else None, args.backend,
                           _synth_pipeline(args, None))]
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
        if override and _defines(args.file, override):
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
                    pipeline=_synth_pipeline(args, req.pipeline), span=req.span, base_dir=base))
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
        not args.topology.endswith(".coll") and _defines(args.file, args.topology) else args.topology
    topo = frontend.resolve_topology(topo_spec, base)
    coll_spec = f"{args.file}:{args.collective}" if args.file and _defines(args.file, args.collective) \
        else args.collective
    coll = frontend.resolve_collective(coll_spec, topo.num_ranks, base)
    algorithm = args.algorithm
    if algorithm and args.file and _defines(args.file, algorithm):
        algorithm = f"{args.file}:{algorithm}"
    for size in sizes:
        jobs.append(CompileJob(topology=topo, collective=coll, size_bytes=size, algorithm=algorithm,
                               pipeline=_synth_pipeline(args, None), base_dir=base))
    return jobs


def _defines(path: str, spec: str) -> bool:
    """Whether the user's file defines the name a spec starts with (it then wins over the stdlib)."""
    from collc import frontend

    name = spec.split("(", 1)[0].strip()
    return name in frontend.defined_names(path)


def _backend_options(args: argparse.Namespace):
    from collc.backends import BackendOptions

    return BackendOptions(
        inplace=args.inplace, proto=args.proto, instances=args.instances,
        size_range=_parse_size_range(args.size_range) if args.size_range else None,
        max_steps_per_tb=args.max_steps, extra={"channels": args.channels} if args.channels else {})


def _names_directory(text: str) -> bool:
    """`-o out/` always names a directory; `-o out` one only when it is an existing one."""
    return text.endswith(("/", os.sep)) or os.path.isdir(text)


def _output_path(out: Path, job, backend, directory: bool, taken: set[Path]) -> Path:
    if not directory:
        return out
    route = job.algorithm.rsplit(":", 1)[-1] if job.algorithm else "synthesized"
    stem = _safe_filename(f"{job.collective.name}-{job.topology.name}-{job.size_bytes}B-{route}")
    path, n = out / f"{stem}{backend.suffix}", 2
    while path in taken:  # two requests alike in all of the above still get a file each
        path, n = out / f"{stem}-{n}{backend.suffix}", n + 1
    taken.add(path)
    return path


def _safe_filename(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_.=" else "_" for ch in name)


def _check_outputs(args: argparse.Namespace, jobs: list, directory: bool) -> None:
    """Everything about the outputs that can fail, checked before any solve (which may
    take minutes): the kind of path, writability, and -o and --report apart."""
    from collc.io import check_output_path

    if len(jobs) > 1 and not directory:
        raise UsageError(f"{len(jobs)} schedules are compiled, so -o must name a directory: write it with a "
                         f"trailing slash ('{args.output}/')")
    check_output_path(Path(args.output), directory=directory, what="output")
    if args.report:
        if not directory and os.path.abspath(args.report) == os.path.abspath(args.output):
            raise UsageError(f"--report and -o name the same file ({args.report}): the report would overwrite "
                             "the schedule")
        if directory and os.path.abspath(args.report) == os.path.abspath(args.output.rstrip("/" + os.sep)):
            raise UsageError(f"--report names the output directory {args.output}; give it a file name")
        check_output_path(Path(args.report), what="report")


def _one_request_many_sizes(jobs: list) -> bool:
    """Whether the jobs are one request at several sizes (an MSCCL XML size-band
    library); several requests get a file each instead."""
    if len(jobs) < 2 or len({job.size_bytes for job in jobs}) != len(jobs):
        return False
    first = jobs[0]
    return all(job.collective is first.collective and (job.topology.name, job.algorithm, job.pipeline, job.span)
               == (first.topology.name, first.algorithm, first.pipeline, first.span) for job in jobs)


def cmd_compile(args: argparse.Namespace) -> int:
    from collc.backends import get_backend
    from collc.driver import check_job, compile_job
    from collc.io import all_or_nothing, atomic_write

    backend = get_backend(args.backend)
    options = _backend_options(args)
    jobs = _jobs(args)
    out = Path(args.output)
    library = args.backend == "msccl-xml" and _one_request_many_sizes(jobs)
    directory = _names_directory(args.output)
    _check_outputs(args, jobs, directory)
    for job in jobs:  # before the first solve, so a late request cannot waste an early one's time
        check_job(job, backend, options)
    reports = []
    # Every file of this command (schedules, report) is renamed into place together at
    # the end, or none is: a failure in any request leaves no output of another.
    with all_or_nothing():
        if library:
            from collc.backends.msccl_xml.backend import write_library
            from collc.driver import make_report, schedule_for_backend

            units = []
            for job in jobs:
                unit, solver = schedule_for_backend(job, backend, options)
                units.append((job, unit, solver))
            paths = write_library([u for _, u, _ in units], [j.size_bytes for j, _, _ in units], out, options)
            for (job, unit, solver), path in zip(units, paths):
                reports.append(make_report(job, unit, solver, args.backend, [path], not args.no_baselines))
        else:
            taken: set[Path] = set()
            for job in jobs:
                result = compile_job(job, args.backend, _output_path(out, job, backend, directory, taken), options,
                                     with_baselines=not args.no_baselines)
                reports.append(result.report)
        if args.report:
            atomic_write(args.report, json.dumps(reports[0] if len(reports) == 1 else reports, indent=2) + "\n")
    if not args.quiet:
        from collc.ir.heap import few_collections

        # The schedules are still alive here (millions of objects at 1,024 ranks), and
        # every collection the printing's imports set off would walk all of them; they
        # hold no cycles worth finding before the process exits.
        with few_collections():
            for rep in reports:
                _print_report(rep)
    return EXIT_OK


def _fmt_time(us: float | None) -> str:
    if us is None:
        return "-"
    if us >= 1e4:
        return f"{us / 1e3:,.2f} ms"
    return f"{us:,.2f} us"


def _print_report(rep: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    def safe(text: str) -> str:
        # User text (names, parameters, messages, paths) may hold `[...]` or control
        # characters: escaped, it is shown as written and neither markup nor terminal codes.
        return escape(printable(text))

    console = Console(highlight=False, emoji=False)
    solver = rep.get("solver") or {}
    title = safe(f"{rep['collective']} on {rep['topology']} ({rep['ranks']} ranks), {rep['size_bytes']:,} bytes")
    table = Table(title=title, title_justify="left", show_header=False)
    table.add_column("what", no_wrap=True)
    table.add_column("value", justify="right", overflow="fold")  # long paths wrap, never cut

    def row(what: str, value: str) -> None:
        table.add_row(safe(what), safe(value))

    row("schedule time", _fmt_time(rep["time_us"]))
    ratio = rep.get("ratio_to_lower_bound")
    row("lower bound", f"{_fmt_time(rep['lower_bound_us'])}" + (f"  (time / bound = {ratio:.3f})" if ratio else ""))
    if rep.get("lower_bound_with_latency_us"):
        row("with latency", f"{_fmt_time(rep['lower_bound_with_latency_us'])}  "
            f"(time / bound = {rep['ratio_to_bound_with_latency']:.3f})")
    row("algbw / busbw", f"{rep['algbw_GBps']:.2f} / {rep['busbw_GBps']:.2f} GB/s")
    if rep.get("demand"):
        d = rep["demand"]
        row("demand", f"{d['entries']} blocks, {d['bytes']:,.0f} bytes; moves {d['extra_share']:+.2%}"
            + (" (padded to equal blocks)" if d["padded"] else " (whole slots)"))
    for name, b in rep.get("baselines", {}).items():
        if b.get("time_us") is None:
            row(f"baseline {name}", f"n/a ({b.get('error')})")
        else:
            row(f"baseline {name}", f"{_fmt_time(b['time_us'])}  (speedup {b['speedup']:.2f}x)")
    status = rep.get("optimality") or solver.get("status", "-")
    if solver.get("optimal") is False:
        status += " (not proven optimal)"
    method = solver.get("method", "-")
    nodes = solver.get("over_nodes")
    if isinstance(nodes, dict):
        method += f" over {nodes.get('nodes')} nodes"
    if solver.get("allreduce") == "direct":
        method += " (direct AllReduce)"
    row("method", f"{method}: {status}, {solver.get('seconds', 0):.2f} s")
    sched = rep.get("schedule", {})
    row("schedule", f"{sched.get('ops')} ops, {sched.get('steps')} steps, "
        f"{sched.get('chunks_per_rank')} chunk(s)/rank, verified")
    for path in rep.get("outputs", []):
        row("wrote", path)
    console.print(table)


# --- verify / passes ----------------------------------------------------------------

def cmd_verify(args: argparse.Namespace) -> int:
    from collc.backends.msccl_xml.verify import verify_files

    reports = verify_files([Path(p) for p in args.files], max_steps=args.max_steps, strict=args.strict,
                           fifo_capacity=args.fifo_capacity, runtime=args.runtime, sms=args.sms)
    if args.json:
        _json_out([{"file": r.source, "ok": r.ok, "summary": r.summary(),
                    "errors": [str(e) for e in r.errors], "warnings": [str(w) for w in r.warnings]}
                   for r in reports])
    else:
        for r in reports:
            (sys.stdout if r.ok else sys.stderr).write(printable(r.render()) + "\n")
    return EXIT_OK if all(r.ok for r in reports) else EXIT_ERROR


def cmd_passes(args: argparse.Namespace) -> int:
    from collc.passes.base import registered_passes

    for name, cls in registered_passes().items():
        opts = " ".join(f"{k}:{getattr(t, '__name__', t)}" for k, t in cls.options().items())
        _out(f"{name:24} {cls.summary}" + (f"  [{opts}]" if opts else ""))
    return EXIT_OK


# --- entry point ----------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="collc", description="Compile GPU collectives into verified schedules.")
    p.add_argument("--version", action="version", version=f"collc {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    c = sub.add_parser("check", help="parse and check .coll files")
    c.add_argument("files", nargs="+", metavar="FILE", help=".coll files")
    c.set_defaults(func=cmd_check)

    c = sub.add_parser("list", help="what the standard library offers")
    c.add_argument("--json", action="store_true", help="as JSON")
    c.set_defaults(func=cmd_list)

    c = sub.add_parser("show", help="print the IR of a file, a topology or a collective")
    c.add_argument("file", nargs="?", metavar="FILE", help="a .coll file, or a schedule collc wrote as JSON")
    c.add_argument("--topology", metavar="T", help='e.g. "ndv2(chassis=2)"')
    c.add_argument("--collective", metavar="C", help='e.g. "allgather(chunks=2)"')
    c.add_argument("--ranks", type=_int_at_least(1, SHOW_MAX_RANKS), default=8,
                   help=f"ranks for --collective (default 8, at most {SHOW_MAX_RANKS})")
    c.add_argument("--json", action="store_true", help="as JSON")
    c.set_defaults(func=cmd_show)

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
    route.add_argument("--chunks", type=_int_at_least(1), metavar="N",
                       help="chunks per rank for synthesis (default: chosen)")
    route.add_argument("--time-limit", type=_finite_float(0, lo_open=True), dest="time_limit", metavar="SECONDS",
                       help="solver seconds, a safety net: the search is bounded by work, so the same input "
                            "gives the same schedule on any machine unless this fires (default 600)")
    route.add_argument("--tolerance", type=_finite_float(0, 1), metavar="F",
                       help="synthesis stops within this fraction of the lower bound (default 0.01)")
    route.add_argument("--mip-gap", type=_finite_float(0, 1), dest="mip_gap", metavar="GAP",
                       help="relative MILP gap at which the solver stops, 0 to 1 (default: the solver's)")
    route.add_argument("--threads", type=_int_at_least(1), metavar="N",
                       help="solver threads (default: the solver's choice)")
    route.add_argument("--seed", type=_int_at_least(0), metavar="N",
                       help="solver random seed, 0 or more (default: the solver's)")
    out = c.add_argument_group("output")
    out.add_argument("--backend", default="json", choices=_backend_names(),
                     help="what to write (default json)")
    out.add_argument("-o", "--output", required=True, metavar="OUT", type=_path_text,
                     help="the output file; a directory (a trailing slash, or an existing directory) gets one "
                          "file per schedule")
    out.add_argument("--report", metavar="FILE.json", type=_path_text,
                     help="also write the report (times, bounds, baselines) as JSON")
    out.add_argument("--inplace", action="store_true", help="msccl-xml/cupy: in-place variant")
    out.add_argument("--proto", default="Simple", choices=["Simple", "LL", "LL128"], help="msccl-xml: protocol")
    out.add_argument("--instances", type=_int_at_least(1), default=1, metavar="N",
                     help="msccl-xml: copies on separate channels")
    out.add_argument("--size-range", metavar="MIN:MAX", help="msccl-xml: byte range the file claims")
    out.add_argument("--max-steps", type=_int_at_least(1), default=64, metavar="N",
                     help="msccl-xml: steps per threadblock limit")
    out.add_argument("--channels", type=_int_at_least(0), default=0, metavar="N",
                     help="msccl-xml: channels to use (default: fewest that fit)")
    out.add_argument("--no-baselines", action="store_true", help="skip timing the stdlib baselines")
    out.add_argument("-q", "--quiet", action="store_true", help="print no report table and no solver progress")
    c.set_defaults(func=cmd_compile)

    c = sub.add_parser("verify", help="verify MSCCL XML files symbolically")
    c.add_argument("files", nargs="+", metavar="FILE.xml", help="MSCCL XML files")
    c.add_argument("--max-steps", type=_int_at_least(1), default=None, metavar="N",
                   help="steps per threadblock limit (default: the runtime's, 64 current, 256 legacy)")
    c.add_argument("--runtime", choices=["current", "legacy"], default="current",
                   help="judge against the current MSCCL executor (default: a file it would skip, e.g. one "
                        "without minBytes/maxBytes/outofplace, fails) or the older runtime (legacy)")
    c.add_argument("--sms", type=_int_at_least(1), default=None, metavar="N",
                   help="SMs per GPU: fail a GPU with more threadblocks than can be resident at once (N - 2)")
    c.add_argument("--strict", action="store_true",
                   help="with --runtime legacy: treat what makes the current executor skip a file as errors")
    c.add_argument("--fifo-capacity", type=_int_at_least(1), default=None, metavar="N",
                   help="messages a connection buffers (default: unbounded; Simple buffers 2)")
    c.add_argument("--json", action="store_true", help="as JSON")
    c.set_defaults(func=cmd_verify)

    c = sub.add_parser("passes", help="list the registered passes and their options")
    c.set_defaults(func=cmd_passes)

    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).add_commands(sub)
    return p


# Commands that live beside the compiler (profiling, pipelines, harvesting) each keep
# their argument parsing in their own package: a module here exposes
# `add_commands(subparsers)`, registering subcommands whose `func` returns an exit code
# and raises CollcError (exit 1) or UsageError (exit 2) like the commands above.
COMMAND_MODULES: tuple[str, ...] = ("collc.profile.cli", "collc.pipeline.cli", "collc.harvest.cli")


def _backend_names() -> list[str]:
    from collc.backends import backend_names

    return backend_names()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except UsageError as exc:
        parser.print_usage(sys.stderr)
        sys.stderr.write(f"collc {args.command}: error: {exc}\n")
        return EXIT_USAGE
    except CollcError as err:
        sys.stderr.write(format_error(err, _spec_sources()) + "\n")
        return EXIT_ERROR
    except RecursionError:
        # The parser bounds nesting; this is the last guard for what slips past it.
        sys.stderr.write("collc: error: the input is nested too deeply to process\n")
        return EXIT_ERROR
    except KeyboardInterrupt:
        sys.stderr.write("collc: interrupted\n")
        return 130
    except BrokenPipeError:
        return EXIT_OK


def run() -> None:
    """The `collc` command: main(), then exit without tearing the heap down object by
    object. A compile of a few hundred ranks leaves millions of objects (schedules,
    cached collectives and bounds), and the interpreter's own teardown spent 1.1 s of a
    5 s ring(256) compile freeing them. Where a child process or another thread is
    still running, or a profiler or tracer (cProfile, coverage) waits to write its
    results at exit, the normal exit is kept."""
    code = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (BrokenPipeError, OSError):
        pass  # the reader went away (a closed pipe): nothing more can reach it
    if (threading.active_count() == 1 and not _children_alive() and sys.getprofile() is None
            and sys.gettrace() is None):
        os._exit(code)
    sys.exit(code)


def _children_alive() -> bool:
    mp = sys.modules.get("multiprocessing")  # only a command that used it can have children
    return mp is not None and bool(mp.active_children())


if __name__ == "__main__":
    run()
