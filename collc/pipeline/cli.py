"""`collc pipeline` (a predicted step) and `collc bubbles` (measured steps)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from collc.diagnostics import UsageError
from collc.io import atomic_write

EXIT_OK = 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pipeline", help="time a pipeline-parallel step and find its bubbles",
                       description="Lay out a pipeline-parallel step declared in a .coll file on its topology: "
                                   "compute, activation transfers and the data-parallel gradient collective; report "
                                   "every bubble with its cause and free memory.")
    p.add_argument("file", help="FILE.coll (its only pipeline) or FILE.coll:NAME(ARGS)")
    p.add_argument("--report", type=Path, help="write the bubble report (JSON) here")
    p.add_argument("--trace", type=Path, help="write the step as a Chrome trace (JSON) here")
    p.add_argument("--plot", type=Path, help="draw the pipeline diagram (.png or .svg) here")
    p.add_argument("--schedule-csv", type=Path,
                   help="also write the schedule as a torch.distributed.pipelining CSV here")
    p.add_argument("--gradient", choices=("baseline", "synthesized"), default="baseline",
                   help="which gradient collective the timeline runs (both steps are reported)")
    p.add_argument("--no-synthesis", action="store_true",
                   help="time the gradient collective with the ring baseline only")
    p.add_argument("--min-bubble-us", type=float, default=0.0, help="leave out shorter bubbles")
    p.add_argument("--json", action="store_true", help="print the report instead of the summary")
    p.set_defaults(func=cmd_pipeline)

    b = sub.add_parser("bubbles", help="find the bubbles of a job's steps in Kineto traces",
                       description="Idle intervals of each rank's compute stream in PyTorch profiler (Kineto) "
                                   "traces, one trace per rank.")
    b.add_argument("traces", nargs="+", type=Path, help="Kineto traces (.json or .json.gz), one per rank")
    b.add_argument("--threshold-us", type=float, default=100.0, help="shortest idle interval reported (default 100)")
    b.add_argument("--report", type=Path, help="write the bubble report (JSON) here")
    b.add_argument("--trace", type=Path, help="write the compute streams and bubbles as a Chrome trace here")
    b.add_argument("--plot", type=Path, help="draw the streams and bubbles (.png or .svg) here")
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
    return lines


def _write_outputs(args: argparse.Namespace, report: dict[str, Any], lanes, title: str) -> None:
    from collc.pipeline import render

    # Everything is computed before anything is written; each file is written atomically.
    if args.report:
        atomic_write(args.report, json.dumps(report, indent=1) + "\n")
    if args.trace:
        render.write_trace(args.trace, lanes, title)
    if args.plot:
        render.write_plot(args.plot, lanes, title, report["step_us"])


def cmd_pipeline(args: argparse.Namespace) -> int:
    from collc.frontend.specs import resolve_pipeline
    from collc.pipeline import render
    from collc.pipeline.csv_format import format_order
    from collc.pipeline.predict import predict

    if args.gradient == "synthesized" and args.no_synthesis:
        raise UsageError("--gradient synthesized needs synthesis (drop --no-synthesis)")
    if args.plot and args.plot.suffix.lower() not in (".png", ".svg"):
        raise UsageError(f"--plot must name a .png or .svg file, got '{args.plot}'")
    job = resolve_pipeline(args.file)
    pred = predict(job, use=args.gradient, synthesize=not args.no_synthesis, min_bubble_s=args.min_bubble_us * 1e-6)
    lanes = render.lanes_from_prediction(pred.timeline, pred.report)
    title = f"{job.name}: {pred.order.name}, {job.microbatches} micro-batches (predicted)"
    csv_text = format_order(pred.order) if args.schedule_csv else None
    _write_outputs(args, pred.report, lanes, title)
    if csv_text is not None:
        atomic_write(args.schedule_csv, csv_text)
    if args.json:
        sys.stdout.write(json.dumps(pred.report, indent=1) + "\n")
    else:
        sys.stdout.write(job.describe() + "\n" + "\n".join(_summary(pred.report)) + "\n")
    return EXIT_OK


def cmd_bubbles(args: argparse.Namespace) -> int:
    from collc.pipeline.measured import measure

    if args.threshold_us < 0:
        raise UsageError("--threshold-us must not be negative")
    if args.plot and args.plot.suffix.lower() not in (".png", ".svg"):
        raise UsageError(f"--plot must name a .png or .svg file, got '{args.plot}'")
    result = measure(args.traces, threshold_us=args.threshold_us)
    title = f"measured: {', '.join(p.name for p in args.traces)}"
    _write_outputs(args, result.report, result.lanes, title)
    if args.json:
        sys.stdout.write(json.dumps(result.report, indent=1) + "\n")
    else:
        sys.stdout.write("\n".join(_summary(result.report)) + "\n")
    return EXIT_OK
