"""`collc profile TRACE...`: the collective mix of a job, and what collc would do with it.

Everything is computed before anything is written; outputs are written atomically (the
library verified whole before any file of it is installed), so a failure leaves no partial file.
"""

from __future__ import annotations

import argparse
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from collc.commands.args import finite_float, output_path
from collc.diagnostics import CollcError, UsageError
from collc.io import check_input_file
from collc.traces.urls import is_url

DEFAULT_ROWS = 25


def add_commands(subparsers) -> None:
    c = subparsers.add_parser("profile", help="the collective mix of a job's traces (NCCL logs, Kineto, Chakra, "
                                              "NCCL profiler dumps)")
    c.add_argument("traces", nargs="+", metavar="TRACE", help="trace files, or directories of per-rank files; "
                   "URLs (s3://bucket/job/, gs://..., file://...) where fsspec is installed")
    c.add_argument("--json", metavar="OUT", type=output_path, help="write the whole result as JSON")
    c.add_argument("--plot", metavar="DIR", help="write pictures (PNG and SVG) into DIR")
    c.add_argument("--topology", metavar="T", help='map the job onto a cluster: a stdlib topology ("dgx1", '
                                                   '"ndv2(chassis=2)") or FILE.coll[:name(args)]')
    c.add_argument("--rank-map", metavar="G0,G1,...", dest="rank_map",
                   help="global rank i runs on the topology's GPU Gi (default: launch order, i on GPU i)")
    c.add_argument("--library", metavar="DIR", help="write an MSCCL XML algorithm directory for the sizes that "
                                                    "matter (needs --topology)")
    c.add_argument("--time-limit", type=finite_float(0, lo_open=True), default=None, dest="time_limit", metavar="S",
                   help="solver seconds per synthesized size band (default 2)")
    c.add_argument("--nccl-tests", action="store_true", dest="nccl_tests",
                   help="print nccl-tests commands that replay the mix")
    c.add_argument("--demands", metavar="DIR", help="write the demand matrix (bytes, for collc compile --demand) "
                   "of every all_to_all whose record_param_comms has split sizes")
    c.add_argument("--rows", type=int, default=DEFAULT_ROWS, help=f"table rows to print (default {DEFAULT_ROWS})")
    c.add_argument("--workers", type=int, default=None, metavar="N",
                   help="processes that read per-rank files in parallel (default: one per usable CPU; 1: "
                        "read them in this process)")
    c.add_argument("--scheduler", metavar="ADDRESS",
                   help="read the files (and synthesize --library bands) on a running Dask cluster "
                        "(tcp://host:8786; needs pip install \"collc[dask]\"); the workers must see the paths: "
                        "shared ones, or URLs of a shared store")
    c.add_argument("-q", "--quiet", action="store_true", help="print nothing (outputs are still written)")
    c.set_defaults(func=cmd_profile)


def _check_outputs(args: argparse.Namespace) -> None:
    """Refuse outputs that cannot be written before any work is done."""
    if args.library and not args.topology:
        raise UsageError("--library needs --topology (the cluster the schedules are for)")
    if args.rank_map and not args.topology:
        raise UsageError("--rank-map needs --topology")
    if args.time_limit is not None and args.time_limit <= 0:
        raise UsageError("--time-limit must be positive")
    if args.workers is not None and args.workers < 1:
        raise UsageError("--workers must be at least 1")
    if args.scheduler:
        try:
            import distributed  # noqa: F401  (only whether the optional extra is installed)
        except ImportError:
            raise UsageError('--scheduler needs Dask: pip install "collc[dask]"') from None
    if args.json:
        out = Path(args.json)
        if out.is_dir():
            raise CollcError(f"--json {out}: is a directory; give a file name")
        _check_parent(out, "--json")
    for flag, value in (("--plot", args.plot), ("--library", args.library)):
        if value:
            p = Path(value)
            if p.exists() and not p.is_dir():
                raise CollcError(f"{flag} {p}: is a file, not a directory")
            _check_parent(p, flag)


def _check_parent(path: Path, flag: str) -> None:
    for parent in path.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise CollcError(f"{flag} {path}: {parent} is a file, not a directory")
            return


def cmd_profile(args: argparse.Namespace) -> int:
    from collc.memory import reuse_freed_memory

    # Before NumPy's first import: the columns' arrays are made and dropped by the dozen.
    reuse_freed_memory()
    from collc.io import atomic_write
    from collc.profile.mix import build_mix
    from collc.traces.sources import read_traces

    _check_outputs(args)
    for t in args.traces:
        if not is_url(t) and not Path(t).is_dir():
            check_input_file(t, "trace")
    with _progress_bar(args, "reading trace files") as progress:
        traces = read_traces(args.traces, workers=args.workers, scheduler=args.scheduler, progress=progress)
    if not traces.call_count:
        _no_calls(traces, args)
    mix = build_mix(traces.columns, traces.world_size, traces.communicators, traces.notes)
    result: dict[str, Any] = {"sources": [s.to_json() for s in traces.sources], **mix.to_json()}

    model = _model(args, mix) if args.topology else None
    replay = None
    if args.nccl_tests:
        from collc.profile.replay import replay_commands

        replay = replay_commands(mix)
        result["nccl_tests"] = [r.to_json() for r in replay]

    files = []
    if args.library:
        from collc.profile.library import write_library

        files = write_library(model, Path(args.library))
        saved = sum(f.band.saving_s for f in files)
        result["library"] = {"directory": args.library, "files": [f.to_json() for f in files],
                             "saving_per_iteration_us": saved * 1e6}
    if model is not None:  # after the library, which may withdraw a band the executor cannot run
        result["model"] = model.to_json()
    plots: list[Path] = []
    if args.plot:
        from collc.profile.plots import write_plots

        plots = write_plots(mix, Path(args.plot), model)
        result["plots"] = [str(p) for p in plots]
    if args.demands:
        from collc.profile.demands import write_demands

        calls = write_demands(args.traces, Path(args.demands))
        result["demands"] = {"directory": args.demands, "calls": [
            {"file": c.file_name() if c.consistent else None, "group": c.group, "index": c.index,
             "bytes": float(c.matrix.sum()), "missing_rows": c.missing_rows} for c in calls]}
    if args.json:
        atomic_write(args.json, json.dumps(result, indent=2) + "\n")
    if not args.quiet:
        _print(mix, traces, model, replay, files, args, plots)
    return 0


@contextmanager
def _progress_bar(args: argparse.Namespace, what: str) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar (rich) for `what` on the terminal only (never in a pipe or a file,
    never with -q): a callback taking (done, total)."""
    from rich.console import Console

    console = Console(stderr=True)
    if args.quiet or not console.is_terminal:
        yield None
        return
    # Imported only for a terminal: about 10 ms of start-up that a command run in a pipe does without.
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    # No refresh thread: a process with threads cannot fork its file readers safely.
    with Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, auto_refresh=False, transient=True) as bar:
        task = bar.add_task(what, total=None)

        def advance(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)
            bar.refresh()

        yield advance


# The subsystems that log one line per call: COLL is not among NCCL's defaults (INIT,
# BOOTSTRAP, ENV), so `NCCL_DEBUG=INFO` alone gives logs with no call in them.
NCCL_SUBSYS_HINT = ("set NCCL_DEBUG_SUBSYS=INIT,COLL,TUNING (with NCCL_DEBUG=INFO) and run again: NCCL logs "
                    "one COLL line per call only with the COLL subsystem, and TUNING adds each call's "
                    "algorithm and protocol")


def _no_calls(traces, args: argparse.Namespace) -> None:
    """Traces with no call record: print what they do tell (for NCCL logs: the version,
    communicators and TUNING output), then fail with what to set to get calls.

    The exit status is 1, and no output file is written: the command was asked for the
    collective mix and there is none, so a script that goes on to read `--json` must
    stop here. What the logs tell is printed first (stdout), the error and the remedy
    after it (stderr)."""
    from collc.traces.detect import TraceSource
    from collc.traces.nccl_log.facts import log_facts

    logs = [s for s in traces.sources if s.format == "nccl-log"]
    if not args.quiet:
        for s in logs:
            _print_facts(s.path, log_facts(TraceSource.file(s.path)))
    what = "; ".join(f"{s.path}: {s.format}, {s.records} records" for s in traces.sources)
    message = "no collective calls in " + ", ".join(args.traces) + f" ({what})"
    notes = (NCCL_SUBSYS_HINT,) if logs else ()
    raise CollcError(message, notes=notes)


def _print_facts(path: str, facts) -> None:
    from rich.console import Console

    console = Console(highlight=False, emoji=False, soft_wrap=True)   # table rows are wider than terminals
    console.print(f"{path}: no COLL line (INIT/TUNING output only)")
    console.print(f"  NCCL version: {', '.join(facts.versions) or 'not logged'}")
    for c in facts.communicators.values():
        ranks = _ranks(sorted(c.ranks))
        console.print(f"  communicator {c.id}: {c.nranks} ranks (ranks {ranks} seen in this log), "
                      f"{len(c.hosts)} node(s): {', '.join(sorted(c.hosts)[:8])}")
    if facts.tunings:
        console.print("  TUNING lines (collective, size -> algorithm/protocol, lines):")
        for (op, nbytes, algo, proto), n in sorted(facts.tunings.items()):
            console.print(f"    {op or '?'} {nbytes} B -> {algo}/{proto}  x{n}")
    if facts.table:
        console.print("  TUNING table (NCCL's model at init):")
        for row in facts.table:
            console.print(f"    {row}")


def _model(args: argparse.Namespace, mix):
    from collc import frontend
    from collc.profile.model import SYNTH_SECONDS, model_mix, parse_rank_map

    from collc.parallel import local_workers

    topology = frontend.resolve_topology(args.topology)
    rank_map = parse_rank_map(args.rank_map) if args.rank_map else None
    # The size bands are independent syntheses: run in parallel like the file reads.
    workers = args.workers if args.workers is not None else local_workers()
    with _progress_bar(args, "synthesizing size bands") as progress:
        return model_mix(mix, topology, rank_map, seconds=args.time_limit or SYNTH_SECONDS, workers=workers,
                         scheduler=args.scheduler, progress=progress)


# --- the terminal ---------------------------------------------------------------------

def _time(us: float | None) -> str:
    if us is None:
        return "-"
    if us >= 1e6:
        return f"{us / 1e6:,.2f} s"
    if us >= 1e3:
        return f"{us / 1e3:,.2f} ms"
    return f"{us:,.1f} us"


def _pct(share: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.0%}" for k, v in list(share.items())[:6])


def _print(mix, traces, model, replay, files, args, plots) -> None:
    from rich.console import Console
    from rich.table import Table

    from collc.profile.mix import human_bytes

    console = Console(highlight=False, emoji=False)
    # The mix table has a dozen columns: below 140 characters they would be cut to "…".
    console.width = max(console.width, 140)
    what = "time" if mix.timed else "bytes"
    console.print(f"[bold]{traces.call_count}[/] call records from {len(traces.sources)} file(s) "
                  f"({', '.join(sorted({s.format for s in traces.sources}))}); world size "
                  f"{mix.world_size or '?'}; {mix.job_call_count} job calls")
    if mix.iterations:
        it = mix.iterations
        console.print(f"iterations: {it.count} of {it.calls_per_iteration} calls"
                      + (f" after {it.warmup_calls} warm-up calls" if it.warmup_calls else ""))
    else:
        console.print("iterations: none detected")
    console.print(f"share of {what} by collective: {_pct(mix.shares(lambda r: r.collective))}")
    console.print(f"share of {what} by communicator: {_pct(mix.shares(lambda r: r.communicator))}")
    for c in list(mix.communicators.values())[:8]:
        members = f" ranks {_ranks(c.ranks)}" if c.ranks else ""
        console.print(f"  communicator {c.id}: {c.nranks or '?'} ranks{members}, {c.role} ({c.role_reason})")
    console.print(f"ranks combined: {mix.combined}")

    table = Table(title=f"Collective mix, biggest {what} first", title_justify="left")
    for col, just in (("collective", "left"), ("comm", "left"), ("n", "right"), ("dtype", "left"),
                      ("size", "right"), ("calls", "right"), ("job calls", "right"), ("ranks", "right"),
                      ("time", "right"), ("latency", "right"), ("straggler", "right"), ("busbw GB/s", "right")):
        table.add_column(col, justify=just)
    rows = mix.sorted_rows()
    for r in rows[:args.rows]:
        j = r.to_json()
        named = ("*" if r.named_by.get("launch-op") else "") + ("+" if r.named_by.get("kernel-name") else "")
        table.add_row(r.collective + named, _short(r.communicator), str(r.nranks or "?"), r.dtype or "?",
                      human_bytes(r.bytes), str(r.calls), str(r.job_calls), str(len(r.ranks)),
                      _time(r.time_us), _time(j["latency_us"]), _time(r.straggler_us),
                      "-" if r.busbw_GBps is None else f"{r.busbw_GBps:.2f}")
    console.print(table)
    if len(rows) > args.rows:
        console.print(f"... {len(rows) - args.rows} more rows (--rows N, or --json)")
    if any(r.named_by.get("launch-op") for r in rows):
        console.print("* named by the nccl:* operator that launched the kernel (no collective metadata)")
    if any(r.named_by.get("kernel-name") for r in rows):
        console.print("+ named by the NCCL kernel's name alone (no metadata, no launching op: size unknown)")
    for note in mix.notes:
        console.print(f"note: {note}")
    if model is not None:
        _print_model(console, model)
    if files:
        saved = sum(f.band.saving_s for f in files)
        console.print(f"library: {len(files)} file(s) in {args.library}, all verified; predicted saving "
                      f"{_time(saved * 1e6)} per iteration")
        for f in files:
            console.print(f"  {f.path.name}: {f.band.collective} on {f.band.nranks} GPUs, "
                          f"{f.min_bytes}..{f.max_bytes} B, saves {_time(f.band.saving_s * 1e6)}/iter")
    elif args.library:
        console.print(f"library: no file written to {args.library}: the model finds NCCL's algorithms as fast "
                      "at every size that matters")
    if replay:
        console.print("nccl-tests commands (run from the nccl-tests checkout):")
        for r in replay:
            console.print(f"  {r.command}    # {r.collective}, {r.nranks} ranks, {r.calls} job calls")
    for p in plots:
        if p.suffix == ".png":
            console.print(f"plot: {p}")


def _print_model(console, model) -> None:
    from rich.table import Table

    base, collc, bound = (model.total(w) * 1e6 for w in ("baseline", "collc", "bound"))
    table = Table(title=f"Per iteration on {model.topology} (collc's model)", title_justify="left")
    table.add_column("schedules")
    table.add_column("time", justify="right")
    table.add_column("vs baseline", justify="right")
    table.add_row("NCCL-style baseline (best stdlib algorithm)", _time(base), "1.00x")
    table.add_row("collc's synthesized schedules", _time(collc), f"{base / collc:.2f}x" if collc else "-")
    table.add_row("lower bound", _time(bound), f"{base / bound:.2f}x" if bound else "-")
    console.print(table)
    for which, title in (("baseline", "baseline"), ("collc", "collc's schedules")):
        hot = model.hottest_links(which, 3)
        if hot:
            console.print(f"hottest links under {title}: " + "; ".join(
                f"{h['link']} {h['bytes'] / 2**20:,.1f} MiB, {h['utilization']:.0%} busy" for h in hot))
    for note in model.notes:
        console.print(f"note: {note}")


def _short(comm: str) -> str:
    return comm if len(comm) <= 14 else comm[:6] + ".." + comm[-6:]


def _ranks(ranks) -> str:
    ranks = list(ranks)
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}..{ranks[-1]}"
    return ",".join(map(str, ranks[:16])) + (",..." if len(ranks) > 16 else "")
