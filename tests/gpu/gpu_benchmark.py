"""Benchmark collc's generated executors on this machine (run by tests/gpu/run.sh).

For each standard collective it compiles the stdlib's algorithm with `collc compile
--backend cupy` (ring AllGather, ReduceScatter and AllReduce, tree Broadcast, on a
switch), or builds a schedule with the IR where the stdlib has none (direct AllToAll) or
the command line fails; runs the executor with --check over a size sweep (one process
for all ranks; also one process per GPU over NCCL when there are enough GPUs); measures
a copy-bandwidth reference on the same device in the same run; and writes a markdown
report: the executors' nccl-tests-style tables, and bus bandwidth as a fraction of what
a plain device copy reaches.

`--device cpu` runs the same path on NumPy (small sizes), so it is tested without a GPU.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from collective_schedules import BUILDERS, full_mesh  # noqa: E402

from collc.backends import BackendOptions  # noqa: E402
from collc.backends.cupy.generate import emit  # noqa: E402
from collc.io import atomic_write  # noqa: E402
from collc.passes.base import CompileUnit  # noqa: E402
from collc.verify import verify  # noqa: E402

REPO = HERE.parents[1]


@dataclass(frozen=True)
class Row:
    size: int
    count: int
    dtype: str
    time_us: float
    algbw: float
    busbw: float
    wrong: int | None


@dataclass
class Run:
    collective: str
    schedule: str
    mode: str
    returncode: int
    stdout: str
    stderr: str
    rows: list[Row] = field(default_factory=list)
    ranks_per_device: float = 1.0  # ranks sharing one device (single process, fewer devices than ranks)

    @property
    def wrong(self) -> int:
        return sum(r.wrong or 0 for r in self.rows)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and bool(self.rows) and not self.wrong


def parse_table(stdout: str) -> list[Row]:
    """Rows of an executor's table: size count type redop root time algbw busbw #wrong."""
    rows = []
    for line in stdout.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        f = line.split()
        if len(f) != 9:
            continue
        rows.append(Row(int(f[0]), int(f[1]), f[2], float(f[5]), float(f[6]), float(f[7]),
                        None if f[8] == "N/A" else int(f[8])))
    return rows


# --- the machine -------------------------------------------------------------------------

def gpu_facts() -> dict[str, str]:
    import cupy

    rt = cupy.cuda.runtime
    count = rt.getDeviceCount()
    name = rt.getDeviceProperties(0)["name"]
    facts = {
        "device": name.decode() if isinstance(name, bytes) else str(name),
        "GPUs": str(count),
        "CuPy": cupy.__version__,
        "CUDA runtime": str(rt.runtimeGetVersion()),
        "CUDA driver": str(rt.driverGetVersion()),
    }
    try:
        from cupy.cuda import nccl

        facts["NCCL"] = str(nccl.get_version()) if nccl.available else "not available"
    except ImportError:
        facts["NCCL"] = "not available"
    return facts


def cpu_facts() -> dict[str, str]:
    import numpy

    return {"device": f"cpu ({platform.processor() or platform.machine()})", "cores": str(os.cpu_count()),
            "NumPy": numpy.__version__}


def copy_bandwidth(device: str, nbytes: int, iters: int = 10) -> float:
    """GB/s of copying one buffer into another on the device (bytes copied per second;
    the memory moves twice that, a read and a write)."""
    if device == "gpu":
        import cupy

        a = cupy.ones(nbytes, dtype=cupy.uint8)
        b = cupy.empty_like(a)
        cupy.copyto(b, a)
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(iters):
            cupy.copyto(b, a)
        end.record()
        end.synchronize()
        seconds = cupy.cuda.get_elapsed_time(start, end) / 1e3
    else:
        import numpy

        a = numpy.ones(nbytes, dtype=numpy.uint8)
        b = numpy.empty_like(a)
        numpy.copyto(b, a)
        t0 = time.perf_counter()
        for _ in range(iters):
            numpy.copyto(b, a)
        seconds = time.perf_counter() - t0
    return nbytes * iters / seconds / 1e9


def peer_bandwidth(nbytes: int, iters: int = 10) -> float | None:
    """GB/s of GPU 0 -> GPU 1 copies (peer access enabled where possible); None with one GPU."""
    import cupy

    rt = cupy.cuda.runtime
    if rt.getDeviceCount() < 2:
        return None
    with cupy.cuda.Device(1):
        dst = cupy.empty(nbytes, dtype=cupy.uint8)
    with cupy.cuda.Device(0):
        if rt.deviceCanAccessPeer(0, 1):
            try:
                rt.deviceEnablePeerAccess(1)
            except rt.CUDARuntimeError:
                pass
        src = cupy.ones(nbytes, dtype=cupy.uint8)
        stream = cupy.cuda.Stream(non_blocking=True)
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        rt.memcpyPeerAsync(dst.data.ptr, 1, src.data.ptr, 0, nbytes, stream.ptr)
        start.record(stream)
        for _ in range(iters):
            rt.memcpyPeerAsync(dst.data.ptr, 1, src.data.ptr, 0, nbytes, stream.ptr)
        end.record(stream)
        end.synchronize()
        seconds = cupy.cuda.get_elapsed_time(start, end) / 1e3
    return nbytes * iters / seconds / 1e9


# --- executors ---------------------------------------------------------------------------

# The stdlib's hand-written algorithms, compiled through `collc compile` (no AllToAll there).
STDLIB_ALGORITHMS = {"allgather": "ring", "reducescatter": "ring", "allreduce": "ring", "broadcast": "tree"}


def compile_with_cli(kind: str, ranks: int, chunks: int, path: Path) -> str | None:
    """The executor of the stdlib algorithm on a switch of `ranks` GPUs, made by the
    command line; the algorithm's name, or None where that does not work."""
    algorithm = STDLIB_ALGORITHMS.get(kind)
    if algorithm is None:
        return None
    collective = kind if chunks == 1 else f"{kind}(chunks={chunks})"
    done = subprocess.run([sys.executable, "-m", "collc", "compile", "--topology", f"switch(n={ranks})",
                           "--collective", collective, "--algorithm", algorithm, "--size", "1MiB",
                           "--backend", "cupy", "-o", str(path), "-q", "--no-baselines"],
                          capture_output=True, text=True, timeout=600)
    return algorithm if done.returncode == 0 and path.exists() else None


def build_with_ir(kind: str, ranks: int, chunks: int, path: Path) -> str:
    schedule = BUILDERS[kind](ranks, chunks)
    topology = full_mesh(ranks, schedule.topology)
    verify(schedule, topology)
    unit = CompileUnit(topology, schedule.collective, 1 << 20, schedule=schedule)
    emit(unit, path, BackendOptions())
    return schedule.name


def make_executor(kind: str, ranks: int, chunks: int, directory: Path, source: str) -> tuple[Path, str]:
    """(executor, description of its schedule): from `collc compile` and the stdlib where
    `source` allows and it works, else from the IR builders."""
    path = directory / f"{kind}-{ranks}.py"
    if source in ("auto", "stdlib"):
        algorithm = compile_with_cli(kind, ranks, chunks, path)
        if algorithm is not None:
            return path, f"{algorithm} (stdlib, collc compile)"
        if source == "stdlib":
            raise SystemExit(f"collc compile has no working stdlib algorithm for {kind}")
    return path, f"{build_with_ir(kind, ranks, chunks, path)} (IR builder)"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_single(executor: Path, args: list[str], timeout: float) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, str(executor), *args], capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def run_multi(executor: Path, ranks: int, args: list[str], timeout: float) -> tuple[int, str, str]:
    """One process per rank, started as torchrun starts them (RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR, MASTER_PORT); rank 0's output, the worst exit status."""
    port = free_port()
    procs = []
    for rank in range(ranks):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(ranks), "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen([sys.executable, str(executor), "--mode", "multi", *args], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = []
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            outputs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            outputs.append(p.communicate())
    codes = [p.returncode for p in procs]
    stderr = "".join(f"[rank {r}] {e}" for r, (_, e) in enumerate(outputs) if e)
    return max(codes, key=lambda c: c != 0), outputs[0][0], stderr


# --- the report ----------------------------------------------------------------------------

def report(facts: dict[str, str], copy_gbps: float, peer_gbps: float | None, runs: list[Run],
           settings: dict[str, str]) -> str:
    lines = [f"# collc executors on {facts['device']}", ""]
    lines.append(f"Measured {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC on "
                 f"`{socket.gethostname()}` by `tests/gpu/run.sh`.")
    lines.append("")
    for key, value in {**facts, **settings}.items():
        lines.append(f"- {key}: {value}")
    lines.append(f"- copy reference (one buffer into another on one device): **{copy_gbps:.1f} GB/s**")
    if peer_gbps is not None:
        lines.append(f"- peer copy reference (GPU 0 -> GPU 1): **{peer_gbps:.1f} GB/s**")
    lines += ["", "## Summary", "",
              "busbw at the largest size, and busbw x ranks per device as a fraction of the copy reference "
              "(ranks that share a device share its bandwidth; a reduction also reads its destination, so "
              "it moves more memory than a copy of the same bytes).", "",
              "| collective | schedule | mode | size (B) | time (us) | busbw (GB/s) | ranks/device | "
              "busbw x ranks/device / copy | #wrong | status |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for run in runs:
        status = "ok" if run.ok else f"FAILED (exit {run.returncode})"
        if run.rows:
            top = run.rows[-1]
            lines.append(f"| {run.collective} | {run.schedule} | {run.mode} | {top.size} | {top.time_us:.1f} | "
                         f"{top.busbw:.2f} | {run.ranks_per_device:g} | "
                         f"{top.busbw * run.ranks_per_device / copy_gbps:.3f} | {run.wrong} | {status} |")
        else:
            lines.append(f"| {run.collective} | {run.schedule} | {run.mode} | - | - | - | - | - | - | {status} |")
    for run in runs:
        lines += ["", f"## {run.collective}: {run.schedule}, {run.mode}", "", "```text",
                  run.stdout.rstrip() or "(no output)", "```"]
        if run.stderr.strip():
            lines += ["", "stderr:", "", "```text", run.stderr.rstrip()[-4000:], "```"]
    return "\n".join(lines) + "\n"


def default_output(facts: dict[str, str]) -> Path:
    slug = "".join(ch if ch.isalnum() else "-" for ch in facts["device"].lower()).strip("-")
    while "--" in slug:
        slug = slug.replace("--", "-")
    return REPO / "bench" / "results" / f"gpu-{slug}.md"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output", type=Path, help="markdown report (default bench/results/gpu-<device>.md)")
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--chunks", type=int, default=1, help="chunks per rank of each schedule")
    p.add_argument("--collectives", default=",".join(BUILDERS), help="comma list (default: all)")
    p.add_argument("--sizes", default="-b 1M -e 512M -f 8", help="the executors' size options")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--copy-bytes", type=int, default=1 << 30, help="buffer of the copy reference")
    p.add_argument("--multi", choices=("auto", "never", "always"), default="auto",
                   help="also run one process per GPU over NCCL (auto: when there are enough GPUs)")
    p.add_argument("--timeout", type=float, default=900, help="seconds per executor run")
    p.add_argument("--schedules", choices=("auto", "stdlib", "ir"), default="auto",
                   help="stdlib: the stdlib's algorithms through collc compile; ir: tests/gpu's builders; "
                        "auto: stdlib where it has one")
    args = p.parse_args(argv)

    facts = gpu_facts() if args.device == "gpu" else cpu_facts()
    copy_gbps = copy_bandwidth(args.device, args.copy_bytes)
    peer_gbps = peer_bandwidth(args.copy_bytes) if args.device == "gpu" else None
    gpus = int(facts.get("GPUs", "0"))
    multi = args.multi == "always" or (args.multi == "auto" and args.device == "gpu" and gpus >= args.ranks)
    common = [*shlex.split(args.sizes), "--dtype", args.dtype, "--iters", str(args.iters),
              "--warmup", str(args.warmup), "--check", "--device", args.device]
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="collc-executors-") as tmp:
        for kind in [k.strip() for k in args.collectives.split(",") if k.strip()]:
            if kind not in BUILDERS:
                p.error(f"unknown collective {kind!r} (known: {', '.join(BUILDERS)})")
            executor, schedule = make_executor(kind, args.ranks, args.chunks, Path(tmp), args.schedules)
            shared = args.ranks / min(args.ranks, gpus) if gpus else float(args.ranks)
            modes = [("single process", shared, lambda: run_single(executor, common, args.timeout))]
            if multi:
                modes.append((f"{args.ranks} processes, NCCL", 1.0,
                              lambda: run_multi(executor, args.ranks, common, args.timeout)))
            for mode, ranks_per_device, start in modes:
                code, stdout, stderr = start()
                run = Run(kind, schedule, mode, code, stdout, stderr, parse_table(stdout), ranks_per_device)
                runs.append(run)
                print(f"{kind:14} {schedule:30} {mode:22} {'ok' if run.ok else 'FAILED'}"
                      + (f"  busbw {run.rows[-1].busbw:.2f} GB/s at {run.rows[-1].size} B" if run.rows else ""),
                      flush=True)
    settings = {"ranks": str(args.ranks), "chunks per rank": str(args.chunks), "dtype": args.dtype,
                "sizes": args.sizes, "iterations": f"{args.iters} after {args.warmup} warmup"}
    output = args.output or default_output(facts)
    atomic_write(output, report(facts, copy_gbps, peer_gbps, runs, settings))
    print(f"wrote {output}")
    return 0 if all(run.ok for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
