"""`collc pipeline` (a predicted step) and `collc bubbles` (measured steps)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

from collc.commands.args import finite_float, output_path, repeated_output
from collc.diagnostics import UsageError
from collc.io import all_or_nothing, atomic_write, check_input_file, check_output_path

EXIT_OK = 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pipeline", help="time a pipeline-parallel step and find its bubbles",
                       description="Lay out a pipeline-parallel step declared in a .coll file on its topology: "
                                   "compute, activation transfers and the data-parallel gradient collective; report "
                                   "every bubble with its cause and free memory.")
    p.add_argument("file", help="FILE.coll (its only pipeline) or FILE.coll:NAME(ARGS)")
    p.add_argument("--report", type=output_path, help="write the bubble report (JSON) here")
    p.add_argument("--trace", type=output_path, help="write the step as a Chrome trace (JSON) here")
    p.add_argument("--plot", type=output_path, help="draw the pipeline diagram (.png or .svg) here")
    p.add_argument("--schedule-csv", type=output_path,
                   help="also write the schedule as a torch.distributed.pipelining CSV here")
    p.add_argument("--gradient", choices=("baseline", "synthesized"), default="baseline",
                   help="which gradient collective the timeline runs (both steps are reported)")
    p.add_argument("--no-synthesis", action="store_true",
                   help="time the gradient collective with the ring baseline only")
    p.add_argument("--min-bubble-us", type=finite_float(0), default=0.0, help="leave out shorter bubbles")
    p.add_argument("--json", action="store_true", help="print the report instead of the summary")
    p.set_defaults(func=cmd_pipeline)

    b = sub.add_parser("bubbles", help="find the bubbles of a job's steps in Kineto traces",
                       description="Idle intervals of each rank's compute stream in PyTorch profiler (Kineto) "
                                   "traces, one trace per rank.")
    b.add_argument("traces", nargs="+", type=Path, help="Kineto traces (.json or .json.gz), one per rank")
    b.add_argument("--threshold-us", type=finite_float(0), default=100.0,
                   help="shortest idle interval reported (default 100)")
    b.add_argument("--report", type=output_path, help="write the bubble report (JSON) here")
    b.add_argument("--trace", type=output_path, help="write the compute streams and bubbles as a Chrome trace here")
    b.add_argument("--plot", type=output_path, help="draw the streams and bubbles (.png or .svg) here")
    b.add_argument("--json", action="store_true", help="print the report instead of the summary")
    b.set_defaults(func=cmd_bubbles)


def _human_us(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:.3f} s"
    if us >= 1e3:
        return f"{us / 1e3:.3f} ms"
    return f"{us:.1f} us"


def _summary(report: dict[str, Any]) -> list[str]:
    lines = [f"step {_human_us(report['step_us'])}, bubbles {report['bubble_fraction']:.1%} of the step"]
    if report.get("textbook_bubble_fraction") is not None:
        lines[0] += f" (textbook {report['textbook_bubble_fraction']:.1%} for uniform stages, free communication)"
    grad = report.get("gradient")
    if grad and grad.get("data_parallel", 1) > 1:
        line = (f"gradient {grad['collective']} over {grad['data_parallel']} replicas: step "
                f"{_human_us(grad['step_us_with_baseline'])} with the ring baseline")
        if "step_us_with_synthesized" in grad:
            line += f", {_human_us(grad['step_us_with_synthesized'])} with collc's synthesized schedule"
        lines.append(line)
    lines.append(f"{'stage':>5}  {'GPUs':<12} {'busy':>12} {'bubbles':>8} {'count':>5}  {'longest':>12}  "
                 f"{'min free':>10}")
    for s in report["stages"]:
        bubbles = s["bubbles"]
        longest = max((b["duration_us"] for b in bubbles), default=0.0)
        free = [b["free_bytes"] for b in bubbles if b["free_bytes"] is not None]
        free_text = f"{min(free) / 2**30:.1f} GiB" if free else "-"
        lines.append(f"{s['stage']:>5}  {','.join(map(str, s['ranks'])):<12} {_human_us(s['busy_us']):>12} "
                     f"{s['bubble_fraction']:>8.1%} {len(bubbles):>5}  {_human_us(longest):>12}  {free_text:>10}")
    lines += [f"note: {note}" for note in report.get("notes", ())]
    return lines


_OUTPUTS = (("--report", "report"), ("--trace", "trace"), ("--plot", "plot"), ("--schedule-csv", "schedule_csv"))


def check_outputs(args: argparse.Namespace) -> None:
    """Before any work: no two options name one file (usage error), every target can be
    written (checked as `compile` checks -o)."""
    named = [(option, getattr(args, attr, None)) for option, attr in _OUTPUTS]
    repeated = repeated_output(named)
    if repeated is not None:
        first, second, path = repeated
        raise UsageError(f"{first} and {second} name the same file ({path}): one output would overwrite the other")
    if args.plot and args.plot.suffix.lower() not in (".png", ".svg"):
        raise UsageError(f"--plot must name a .png or .svg file, got '{args.plot}'")
    for option, path in named:
        if path is not None:
            check_output_path(path, what=f"{option} output")


def _report_text(args: argparse.Namespace, report: dict[str, Any]) -> list[str]:
    """The report's JSON text in pieces (with its final newline), made once for --report
    and --json alike; none where neither asks for it."""
    from collc import jsontext  # here: this module is imported by every command's parser, orjson by few

    return [*jsontext.text_pieces(report), "\n"] if args.report or args.json else []


def _write_outputs(args: argparse.Namespace, report: dict[str, Any], text: list[str], lanes: Callable[[], list],
                   title: str, csv_text: str | None = None, trace: Callable[[Path], None] | None = None) -> None:
    """`trace`: writes the Chrome trace itself (else it is drawn from the lanes)."""
    from collc.pipeline import render

    # Everything is computed before anything is written, and the files are written all
    # or none: a target that fails at the last moment leaves none of the others behind.
    drawn = lanes() if (args.trace and trace is None) or args.plot else []
    with all_or_nothing():
        if args.report:
            atomic_write(args.report, text)
        if args.trace and trace is not None:
            trace(args.trace)
        elif args.trace:
            render.write_trace(args.trace, drawn, title)
        if args.plot:
            render.write_plot(args.plot, drawn, title, report["step_us"])
        if csv_text is not None:
            atomic_write(args.schedule_csv, csv_text)


def check_pipeline_file(spec: str) -> None:
    """FILE of FILE.coll or FILE.coll:NAME(ARGS) is a regular file: a device or FIFO read
    as a program would hang or say something about its bytes, not about what it is."""

    path = spec.split(":", 1)[0] if ".coll:" in spec else spec
    if path and (Path(path).exists() or Path(path).is_symlink()):
        check_input_file(path, "pipeline file")


def cmd_pipeline(args: argparse.Namespace) -> int:
    from collc.memory import reuse_freed_memory

    # Before NumPy's first import: a long pipeline's timeline is laid out in rounds of
    # array operations, each making and dropping arrays of every action.
    reuse_freed_memory()
    from collc.frontend.specs import resolve_pipeline
    from collc.pipeline import render
    from collc.pipeline.csv_format import format_order
    from collc.pipeline.predict import predict

    if args.gradient == "synthesized" and args.no_synthesis:
        raise UsageError("--gradient synthesized needs synthesis (drop --no-synthesis)")
    check_outputs(args)
    check_pipeline_file(args.file)
    job = resolve_pipeline(args.file)
    pred = predict(job, use=args.gradient, synthesize=not args.no_synthesis, min_bubble_s=args.min_bubble_us * 1e-6)
    title = f"{job.name}: {pred.order.name}, {job.microbatches} micro-batches (predicted)"
    csv_text = format_order(pred.order) if args.schedule_csv else None
    text = _report_text(args, pred.report)
    _write_outputs(args, pred.report, text, lambda: render.lanes_from_prediction(pred.timeline, pred.report), title,
                   csv_text, lambda path: render.write_prediction_trace(path, pred.timeline, pred.report, title))
    if args.json:
        sys.stdout.writelines(text)
    else:
        sys.stdout.write(job.describe() + "\n" + "\n".join(_summary(pred.report)) + "\n")
    return EXIT_OK


def cmd_bubbles(args: argparse.Namespace) -> int:
    from collc.pipeline.measured import measure

    check_outputs(args)
    result = measure(args.traces, threshold_us=args.threshold_us)
    title = f"measured: {', '.join(p.name for p in args.traces)}"
    text = _report_text(args, result.report)
    _write_outputs(args, result.report, text, lambda: result.lanes, title)
    if args.json:
        sys.stdout.writelines(text)
    else:
        sys.stdout.write("\n".join(_summary(result.report)) + "\n")
    return EXIT_OK
