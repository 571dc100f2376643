"""Benchmark: a pipeline stage's trainer with side tasks harvesting its bubbles, against
the trainer alone and against the same side tasks simply co-located.

One run, modes interleaved round by round (so the shared machine's noise falls on every
mode alike):
  alone       the trainer on its device, side tasks frozen (SIGSTOP)
  harvest     the trainer reports its bubbles (`HarvestClient.bubble`); the manager runs
              the side tasks inside them
  harvest-ahead  the same, but the bubbles come from the pipeline report, placed at
              each step's start (`HarvestClient.step_started`)
  co-located  the same side tasks as ordinary processes on the same device, no manager
The trainer follows one stage of a predicted pipeline timeline
(bench/data/harvest_pipeline_report.json, written by
`collc pipeline bench/data/harvest_pipeline.coll --report ... --no-synthesis`): busy intervals run real compute (an MLP stage's forward and backward, NumPy or
CuPy), bubbles are waits for the neighbouring stages. Side tasks: a small model trained
with SGD, PageRank on a generated graph, an image filter (imperative, signal-paused).

    python bench/bench_harvest.py --rounds 6           # CPU: one core stands in for a GPU
    python bench/bench_harvest.py --device cuda:0      # GPU (CuPy)

Writes bench/results/harvest.json and harvest.md (and a timeline PNG of one harvest
step) unless --out says otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before NumPy: one core each
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import multiprocessing  # noqa: E402

import numpy as np  # noqa: E402

from collc.harvest import HarvestClient, ManagerHandle, TaskSpec, pin_trainer  # noqa: E402
from collc.harvest.report import load_report  # noqa: E402

ROOT = Path(__file__).resolve().parent
SIDE_TASKS = [  # (target, kwargs, memory need)
    ("collc.harvest.workloads:SmallModelTraining", {"hidden": 512, "batch": 256}, 256 << 20),
    ("collc.harvest.workloads:PageRank", {"nodes": 100_000}, 512 << 20),
    ("collc.harvest.workloads:ImageFilterLoop", {"size": 384}, 256 << 20),
]


# --- the trainer's compute -------------------------------------------------------------

class StageCompute:
    """One pipeline stage: forward and backward of a 4-layer MLP on a micro-batch."""

    def __init__(self, xp: Any, width: int = 512, batch: int = 128, layers: int = 4):
        rng = np.random.default_rng(0)
        self.xp = xp
        self.w = [xp.asarray(rng.standard_normal((width, width)).astype(np.float32) * 0.04)
                  for _ in range(layers)]
        self.x = xp.asarray(rng.standard_normal((batch, width)).astype(np.float32))

    def unit(self) -> None:
        xp, acts = self.xp, [self.x]
        for w in self.w:
            acts.append(xp.tanh(acts[-1] @ w))
        grad = acts[-1]
        for w, a_in, a_out in zip(reversed(self.w), reversed(acts[:-1]), reversed(acts[1:])):
            grad = grad * (1 - a_out * a_out)
            _ = a_in.T @ grad
            grad = grad @ w.T
        if xp is not np:
            xp.cuda.Device().synchronize()

    def calibrate(self, seconds: float = 1.0) -> float:
        """Seconds per unit, measured alone (the median of short batches)."""
        for _ in range(5):
            self.unit()
        samples = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t = time.perf_counter()
            for _ in range(5):
                self.unit()
            samples.append((time.perf_counter() - t) / 5)
        return statistics.median(samples)


def segments(report_path: Path, stage: int) -> tuple[list[tuple[str, float]], float]:
    """The stage's step as ("busy" | "bubble", seconds) in order, and the step length."""
    report = load_report(report_path)
    out: list[tuple[str, float]] = []
    cursor = 0.0
    for b in report.stage(stage).bubbles:
        if b.start_s > cursor:
            out.append(("busy", b.start_s - cursor))
        out.append(("bubble", b.duration_s))
        cursor = b.end_s
    if cursor < report.step_s:
        out.append(("busy", report.step_s - cursor))
    return out, report.step_s


def run_step(compute: StageCompute, plan: list[tuple[str, int | float]],
             client: HarvestClient | None, ahead: bool = False) -> float:
    """One training step. With a client: its bubbles are reported as they happen, or
    (ahead) only the step's start is, and the manager follows the report."""
    start = time.perf_counter()
    if client is not None and ahead:
        client.step_started()
    for i, (kind, amount) in enumerate(plan):
        if kind == "busy":
            for _ in range(int(amount)):
                compute.unit()
        elif client is not None and not ahead:
            with client.bubble(f"b{i}", expected_s=float(amount)):
                time.sleep(float(amount))
        else:
            time.sleep(float(amount))
    return time.perf_counter() - start


class Harvester:
    """A manager with its own copies of the side tasks, and the trainer's client."""

    def __init__(self, mode: str, runtime_dir: Path, device: str, report: Path | None,
                 stage: int):
        self.mode, self.device = mode, device
        self.ahead = report is not None
        self.manager = ManagerHandle.start(runtime_dir, [f"{device}=64G"], report=report,
                                           stages=[stage] if report else None)
        self.ids = {target.rsplit(":", 1)[1]: self.manager.submit(
            TaskSpec(target, kwargs, memory_bytes=memory))
            for target, kwargs, memory in SIDE_TASKS}
        self.client = HarvestClient(runtime_dir, device)

    def wait_ready(self) -> None:
        for task_id in self.ids.values():
            self.manager.wait_for(task_id, ("paused", "stopped"), timeout_s=300)

    def progress(self) -> dict[str, float]:
        tasks = {t["name"]: t for t in self.manager.status()["tasks"]}
        return {n: tasks[n]["progress"] for n in self.ids}

    def kill(self) -> None:
        if self.manager.proc is not None and self.manager.proc.poll() is None:
            self.manager.proc.kill()


# --- co-located side tasks: ordinary processes, no manager ---------------------------------

def colocated_main(target: str, kwargs: dict, device: str, progress: Any) -> None:
    import importlib

    from collc.harvest.limits import parse_device, pin_to_core
    from collc.harvest.tasks import ImperativeTask, TaskContext
    kind, index = parse_device(device)
    if kind == "cpu":
        pin_to_core(index)
        xp: Any = np
    else:
        import cupy as xp  # noqa: F811
        xp.cuda.Device(index).use()
    module, _, name = target.partition(":")
    cls = getattr(importlib.import_module(module), name)
    ctx = TaskContext(device, xp, None, progress)
    task = cls(ctx, **kwargs)
    if isinstance(task, ImperativeTask):
        task.run()
        return
    task.to_device()
    while True:
        task.step()
        ctx.synchronize()
        progress.value = task.progress()


# --- the run ------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default=None, help="cpu:N (default: the last core) or cuda:N")
    ap.add_argument("--report", default=str(ROOT / "data" / "harvest_pipeline_report.json"))
    ap.add_argument("--stage", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps-per-round", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "results"))
    args = ap.parse_args(argv)
    device = args.device or f"cpu:{max(os.sched_getaffinity(0))}"
    on_gpu = device.startswith("cuda")
    if on_gpu:
        import cupy
        xp: Any = cupy
        cupy.cuda.Device(int(device.split(":")[1])).use()
    else:
        xp = np
    pin_trainer(device)

    seg, step_s = segments(Path(args.report), args.stage)
    compute = StageCompute(xp)
    unit_s = compute.calibrate()
    plan = [(k, max(1, round(d / unit_s)) if k == "busy" else d) for k, d in seg]
    bubble_s = sum(d for k, d in seg if k == "bubble")
    print(f"timeline: stage {args.stage} of {args.report}: step {step_s:.2f} s, "
          f"{sum(k == 'bubble' for k, _ in seg)} bubbles, {bubble_s:.2f} s "
          f"({100 * bubble_s / step_s:.0f}%); compute unit {unit_s * 1e3:.2f} ms")

    mp = multiprocessing.get_context("spawn")
    harvesters: list[Harvester] = []
    colocated: list[tuple[str, Any, Any]] = []
    try:
        harvesters.append(Harvester("harvest", Path(tempfile.mkdtemp(prefix="collc-harvest-")),
                                    device, None, args.stage))
        harvesters.append(Harvester("harvest-ahead",
                                    Path(tempfile.mkdtemp(prefix="collc-harvest-")),
                                    device, Path(args.report), args.stage))
        for h in harvesters:
            h.wait_ready()
        # The co-located copies start once the harvested ones are paused (they would
        # starve the idle-priority ones' set-up), run until each has done some work,
        # and are frozen until their mode's turn.
        for target, kwargs, _ in SIDE_TASKS:
            cell = mp.RawValue("d", 0.0)
            proc = mp.Process(target=colocated_main, args=(target, kwargs, device, cell),
                              daemon=True)
            proc.start()
            colocated.append((target.rsplit(":", 1)[1], proc, cell))
        deadline = time.monotonic() + 300
        while any(cell.value == 0 for _, _, cell in colocated) and time.monotonic() < deadline:
            time.sleep(0.1)
        for _, proc, _ in colocated:
            os.kill(proc.pid, signal.SIGSTOP)
        result = measure(args, compute, plan, harvesters, colocated)
        logs = {h.mode: h.manager.shutdown() for h in harvesters}
    finally:
        for _, proc, _ in colocated:
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGKILL)
        for h in harvesters:
            h.kill()
    result.update(describe(args, device, step_s, bubble_s, unit_s, logs))
    write_results(result, logs, Path(args.out))
    return 0


MODES = ("alone", "harvest", "harvest-ahead", "co-located")


def measure(args: argparse.Namespace, compute: StageCompute, plan: list,
            harvesters: list[Harvester], colocated: list) -> dict[str, Any]:
    steps: dict[str, list[float]] = {m: [] for m in MODES}
    seconds = {m: 0.0 for m in MODES}
    names = [n for n, _, _ in colocated]
    work: dict[str, dict[str, float]] = {m: {n: 0.0 for n in names} for m in MODES}
    by_mode = {h.mode: h for h in harvesters}

    def colocated_progress() -> dict[str, float]:
        return {n: cell.value for n, _, cell in colocated}

    run_step(compute, plan, None)   # warm-up, not counted
    for r in range(args.rounds):
        for mode in MODES:
            h = by_mode.get(mode)
            if mode == "co-located":
                for _, proc, _ in colocated:
                    os.kill(proc.pid, signal.SIGCONT)
            before = h.progress() if h else colocated_progress()
            began = time.perf_counter()
            for _ in range(args.steps_per_round):
                steps[mode].append(run_step(compute, plan, h.client if h else None,
                                            ahead=h.ahead if h else False))
            seconds[mode] += time.perf_counter() - began
            if mode == "co-located":
                for _, proc, _ in colocated:
                    os.kill(proc.pid, signal.SIGSTOP)
                after = colocated_progress()
            elif h is not None:
                time.sleep(0.05)    # the manager records the last bubble's runs
                after = h.progress()
            else:
                after = before
            for n in names:
                work[mode][n] += after[n] - before[n]
        k = args.steps_per_round
        print(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"{m} {statistics.fmean(steps[m][-k:]):.3f} s" for m in MODES), flush=True)
    return {"steps": steps, "seconds": seconds, "work": work}


def describe(args: argparse.Namespace, device: str, step_s: float, bubble_s: float,
             unit_s: float, logs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"device": device, "report": os.path.relpath(args.report, ROOT.parent),
            "stage": args.stage, "timeline_step_s": step_s, "timeline_bubble_s": bubble_s,
            "compute_unit_s": unit_s, "rounds": args.rounds,
            "steps_per_round": args.steps_per_round,
            "harvest_device": {m: log["devices"][device] for m, log in logs.items()},
            "incidents": {m: log["incidents"] for m, log in logs.items()},
            "machine": {"cpus": os.cpu_count(), "load_avg": os.getloadavg(),
                        "python": platform.python_version(), "numpy": np.__version__}}


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Per mode: step times, and the overhead against the trainer alone.

    The overhead is paired by round (each round's mean step in the mode over the same
    round's mean step alone): the machine's load drifts between rounds, and pairing
    takes the drift out. The median over rounds is the figure; min and max show the
    spread.
    """
    steps, k = result["steps"], result["steps_per_round"]

    def round_means(times: list[float]) -> list[float]:
        return [statistics.fmean(times[i:i + k]) for i in range(0, len(times), k)]

    alone = round_means(steps["alone"])
    out: dict[str, Any] = {}
    for mode, times in steps.items():
        paired = [100 * (m / a - 1) for m, a in zip(round_means(times), alone)]
        per_hour = {n: v / result["seconds"][mode] * 3600 for n, v in result["work"][mode].items()}
        out[mode] = {"median_step_s": statistics.median(times),
                     "mean_step_s": statistics.fmean(times),
                     "min_step_s": min(times), "max_step_s": max(times), "steps": len(times),
                     "overhead_pct": statistics.median(paired),
                     "overhead_pct_min": min(paired), "overhead_pct_max": max(paired),
                     "overhead_of_medians_pct": 100 * (statistics.median(times)
                                                       / statistics.median(steps["alone"]) - 1),
                     "work_per_hour": per_hour}
    return out


def write_results(result: dict[str, Any], logs: dict[str, dict[str, Any]],
                  out_dir: Path) -> None:
    from collc.io import atomic_write
    result["summary"] = summarize(result)
    s = result["summary"]
    devs = result["harvest_device"]
    units = {t["name"]: t["progress_unit"] for t in logs["harvest"]["tasks"]}
    h, c = s["harvest"]["overhead_pct"], s["co-located"]["overhead_pct"]
    result["goals"] = {
        "harvest_overhead_below_2pct": h < 2.0,
        "at_least_5x_lower_than_colocation": c > 0 and (h <= 0 or c / h >= 5),
        # Time the side tasks held the device inside bubbles. On a shared CPU the CPU
        # time they got is lower (other processes outrank SCHED_IDLE): reported beside it.
        "over_50pct_of_bubble_time_harvested": devs["harvest"]["harvested_share"] > 0.5,
    }
    load = ", ".join(f"{x:.2f}" for x in result["machine"]["load_avg"])
    lines = [
        "# Harvesting benchmark",
        "",
        f"Trainer: stage {result['stage']} of `{result['report']}` "
        f"({result['timeline_step_s']:.2f} s step, {result['timeline_bubble_s']:.2f} s of "
        f"bubbles), device `{result['device']}`; {result['rounds']} rounds x "
        f"{result['steps_per_round']} step(s) per mode, modes interleaved. "
        f"Load average at the end: {load} on {result['machine']['cpus']} CPUs (shared "
        f"machine). harvest: bubbles reported by the trainer as they happen; harvest-ahead: "
        f"bubbles from the report, placed at each step's start.",
        "",
        "| mode | median step (s) | overhead vs alone (median; range over rounds) | "
        + " | ".join(f"{n} ({units[n]}/h)" for n in units) + " |",
        "|---|---|---|" + "---|" * len(units),
    ]
    for mode in MODES:
        m = s[mode]
        lines.append(f"| {mode} | {m['median_step_s']:.3f} | {m['overhead_pct']:+.2f}% "
                     f"({m['overhead_pct_min']:+.1f}..{m['overhead_pct_max']:+.1f}) | "
                     + " | ".join(f"{m['work_per_hour'][n]:.3g}" for n in units) + " |")
    alone = s["alone"]
    spread = 100 * statistics.pstdev(result["steps"]["alone"]) / alone["mean_step_s"]
    lines += ["", f"Noise: the trainer alone varied by {spread:.1f}% (standard deviation of "
              f"its step times, {alone['min_step_s']:.2f}-{alone['max_step_s']:.2f} s) "
              "between rounds; overheads smaller than that are not resolved by this run."]
    result["alone_step_spread_pct"] = spread
    lines += ["", "| harvesting | bubble time harvested | CPU time the tasks got | task runs "
              "| max overrun (ms) | p99 overrun (ms) |", "|---|---|---|---|---|---|"]
    for mode, dev in devs.items():
        lines.append(f"| {mode} | {100 * dev['harvested_share']:.1f}% | "
                     f"{100 * dev['cpu_share']:.1f}% | {dev['runs']} | "
                     f"{dev['max_overrun_s'] * 1e3:.2f} | {dev['p99_overrun_s'] * 1e3:.2f} |")
    lines += [
        "",
        "Bubble time harvested: time the side tasks held the device inside bubbles. CPU "
        "time: what they got of it; on this shared core other processes outrank their "
        "SCHED_IDLE. Co-location overhead / harvesting overhead: "
        + (f"{c / h:.0f}x." if h > 0 else "harvesting overhead not above zero."),
        "",
        "Goals: " + ", ".join(f"{k.replace('_', ' ')}: {'yes' if v else 'NO'}"
                              for k, v in result["goals"].items()) + ".",
    ]
    incidents = [(m, i) for m, incs in result["incidents"].items() for i in incs]
    if incidents:
        lines += ["", "Incidents:"] + [f"- {m}: {i['what']}: {i['message']}"
                                       for m, i in incidents]
    atomic_write(out_dir / "harvest.json", json.dumps(result, indent=1))
    atomic_write(out_dir / "harvest.md", "\n".join(lines) + "\n")
    atomic_write(out_dir / "harvest_log.json", json.dumps(logs["harvest"]))
    plot(result, logs["harvest"], out_dir)
    print("\n".join(lines))


def plot(result: dict[str, Any], log: dict[str, Any], out_dir: Path) -> None:
    """A Chrome trace of the harvest mode's run, and a PNG of its last step."""
    from collc.harvest.trace import chrome_trace, timeline_figure
    from collc.io import atomic_write
    atomic_write(out_dir / "harvest_trace.json", json.dumps(chrome_trace(log)))
    if not log["bubbles"]:
        return
    # The manager logs only bubbles long enough to harvest: find the last step by time.
    end = log["bubbles"][-1]["end"]
    step = result["summary"]["harvest"]["median_step_s"]
    fig = timeline_figure(log, "harvest mode: side tasks in the bubbles of the last "
                          "harvested step", (end - 1.1 * step, end + 0.2))
    fig.savefig(out_dir / "harvest_timeline.png", dpi=110)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--replot"]:
        # Redraw from saved results: python bench/bench_harvest.py --replot [DIR]
        out = Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / "results"
        plot(json.loads((out / "harvest.json").read_text()),
             json.loads((out / "harvest_log.json").read_text()), out)
        sys.exit(0)
    sys.exit(main())
