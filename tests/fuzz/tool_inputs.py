"""Generated and mutated inputs for the newer commands' property tests: pipeline
declarations, schedule CSVs, Chrome/Kineto traces, NCCL log lines and the harvest
command line, drawn from the shapes users write and from the samples in
../shared/data (pipeline/, traces/, nccl-logs/), with the extremes that once broke them.
"""

from __future__ import annotations

import functools
import gzip
import json
import re
from pathlib import Path

from hypothesis import strategies as st

from fuzz_inputs import WEIRD_NUMBERS, mutated
from harvest_samples import harvest_log as sample_harvest_log

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"

# Values that broke the tools: too large, not finite, negative, the wrong type.
ODD_TIMES = ["1e300 s", "1e400 s", "-1 ms", "0 ms", "nan", "1 GiB", "86401 s", "1e-300 s"]
ODD_SIZES = ["1e30 B", "1e20 B", "-1 MiB", "0 B", "1.5 B", "1e400 B", "2 ms", "4 PiB"]
ODD_COUNTS = ["0", "-1", "1000000", "100000", "99999999999999999999", "1.5", '"x"', "1e400"]


def _mostly(draw, usual: list[str], odd: list[str], one_in: int = 6) -> str:
    return draw(st.sampled_from(odd if draw(st.integers(0, one_in - 1)) == 0 else usual))


# --- pipeline declarations ----------------------------------------------------------------

STAR = """topology star(n = 8) {
    switch sw;
    gpu g[n];
    for i in 0..n { link g[i] <-> sw bw 25 GB/s lat 1 us; }
}
"""


@st.composite
def pipeline_program(draw, schedule: str | None = None, stages: int | None = None,
                     microbatches: int | None = None) -> str:
    """A pipeline declaration on a small star, most settings ordinary, some odd (`stages`
    and `microbatches`, when given, are used most of the time: a schedule file's)."""
    usual_stages = [str(stages)] if stages else ["1", "2", "3", "4"]
    usual_mb = [str(microbatches)] if microbatches else ["1", "4", "8", "12"]
    stages = _mostly(draw, usual_stages, ODD_COUNTS)
    dp = draw(st.sampled_from(["", "", "data_parallel = 2;", "data_parallel = 0;", "data_parallel = 9;"]))
    sched = schedule or _mostly(draw, ['"gpipe"', '"1f1b"', '"interleaved"', '"zb-h1"'],
                                ['"nope"', '"s.csv"', '"/dev/zero.csv"', "3", '"dir.csv"'])
    settings = [f"stages = {stages};", dp, f"microbatches = {_mostly(draw, usual_mb, ODD_COUNTS)};",
                f"schedule = {sched};"]
    if draw(st.booleans()):
        settings.append(f"chunks = {_mostly(draw, ['1', '2'], ODD_COUNTS)};")
    settings.append(f"forward = {_mostly(draw, ['1 ms', '0.4 ms'], ODD_TIMES + ['{1 ms, 2 ms}'])};")
    settings.append(f"backward = {_mostly(draw, ['2 ms', '1 ms'], ODD_TIMES)};")
    if draw(st.booleans()):
        settings.append(f"activations = {_mostly(draw, ['16 MiB', '1 KiB', '0 B'], ODD_SIZES)};")
    if draw(st.booleans()):
        settings.append(f"gradients = {_mostly(draw, ['64 MiB', '1 GiB'], ODD_SIZES)};")
    if draw(st.integers(0, 3)) == 0:
        settings.append(f"device_memory = {_mostly(draw, ['32 GiB', '80 GiB'], ODD_SIZES)};")
        settings.append(f"activation_memory = {_mostly(draw, ['1 GiB', '64 MiB'], ODD_SIZES)};")
    body = "\n    ".join(s for s in settings if s)
    return STAR + f"pipeline p on star(8) {{\n    {body}\n}}\n"


@st.composite
def pipeline_command(draw) -> list[str]:
    argv = ["pipeline", "{dir}/p.coll", "--no-synthesis"]
    outputs = ["{dir}/r.json", "{dir}/t.json", "{dir}/./r.json", "{dir}/d/../t.json", "{dir}/sub/", "", "{dir}/p.coll",
               "{dir}/new/dir/r.json", "{dir}/p.coll/x.json", "/dev/null"]
    for option in ("--report", "--trace", "--schedule-csv"):
        if draw(st.integers(0, 3)) == 0:
            argv += [option, draw(st.sampled_from(outputs))]
    if draw(st.integers(0, 5)) == 0:
        argv += ["--min-bubble-us", draw(st.sampled_from(["0", "10", "nan", "inf", "-1", "x"]))]
    if draw(st.integers(0, 6)) == 0:
        argv.append("--json")
    return argv


# --- schedule CSVs ----------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def seed_csvs() -> tuple[bytes, ...]:
    folder = SHARED / "pipeline"
    return tuple(p.read_bytes() for p in sorted(folder.glob("*.csv"))) if folder.is_dir() else ()


CSV_TOKENS = [b",", b",,", b"\n", b"\r\n", b"(", b")", b";", b"OVERLAP_F_B", b"0F0", b"1B0", b"2W0", b"0I0", b"0BW0",
              b"0SEND_F0", b"1RECV_B0", b"UNSHARD", b'"', b"\xef\xbb\xbf", b"9" * 30, b"," * 5000, b"\x00", b"\xff"]


@st.composite
def schedule_csv(draw) -> bytes:
    """A generated schedule (ranks x cells, some odd) or a mutated real one."""
    seeds = seed_csvs()
    if seeds and draw(st.booleans()):
        data = bytearray(draw(mutated(draw(st.sampled_from(seeds)))))
        if draw(st.booleans()):
            pos = draw(st.integers(0, len(data)))
            data[pos:pos] = draw(st.sampled_from(CSV_TOKENS))
        return bytes(data)
    ranks = draw(st.integers(1, 3))
    mb = draw(st.integers(1, 4))
    rows = []
    for r in range(ranks):
        cells = [f"{r}F{i}" for i in range(mb)] + [f"{r}B{i}" for i in range(mb)]
        if draw(st.integers(0, 3)) == 0:
            i = draw(st.integers(0, len(cells) - 1))
            cells[i] = draw(st.sampled_from(["", "9F0", f"{r}F99999999999", f"{r}X0", "(0F0;0B0)OVERLAP_F_B",
                                             f"{r}SEND_F0", f"{r}F" + "9" * 40, f"{r}W0"]))
        rows.append(",".join(cells))
    return ("\n".join(rows) + "\n").encode()


def csv_shape(data: bytes) -> tuple[int | None, int | None]:
    """(rows, micro-batches) a schedule file seems to have, so that the pipeline naming
    it can match it (None where it cannot be told)."""
    rows = len([line for line in data.splitlines() if line.strip()])
    mbs = [int(m) for m in re.findall(rb"\d{1,4}(?:F|B|W|I|BW)(\d{1,4})", data)]
    return (rows or None), (max(mbs) + 1 if mbs else None)


# --- Chrome / Kineto traces -----------------------------------------------------------

@functools.lru_cache(maxsize=None)
def seed_traces(events: int = 150) -> tuple[bytes, ...]:
    """The first events of each Kineto sample (whole files are megabytes: too slow to
    mutate case after case), with their metadata."""
    out = []
    folder = SHARED / "traces"
    for path in sorted(folder.glob("hta__*.json.gz")) if folder.is_dir() else []:
        data = json.loads(gzip.decompress(path.read_bytes()))
        if isinstance(data, dict) and isinstance(data.get("traceEvents"), list):
            data["traceEvents"] = [e for e in data["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy")
                                   or e.get("name") == "[memory]"][:events] + data["traceEvents"][:20]
            out.append(json.dumps(data, indent=1).encode())
    return tuple(out)


ODD_VALUES = [1e40, -5, 0, float("1e300"), "12", None, [1, 2], {"a": 1}, True, 10 ** 30, -1e18, 1.5]


@st.composite
def kineto_trace(draw) -> bytes:
    """Generated kernels (some with odd fields), or a mutated sample; sometimes gzipped,
    padded with blanks or given a byte-order mark."""
    seeds = seed_traces()
    if seeds and draw(st.booleans()):
        data = bytes(draw(mutated(draw(st.sampled_from(seeds)))))
        data = _replace_numbers(draw, data)
    else:
        events = []
        t = 0
        for _ in range(draw(st.integers(0, 8))):
            t += draw(st.integers(0, 500))
            ev = {"ph": "X", "cat": "kernel", "name": draw(st.sampled_from(["gemm", "ncclKernel_AllReduce", "x"])),
                  "ts": t, "dur": draw(st.integers(1, 200)), "args": {"device": draw(st.integers(0, 1))}}
            if draw(st.integers(0, 4)) == 0:
                ev[draw(st.sampled_from(["ts", "dur", "args", "name", "ph"]))] = draw(st.sampled_from(ODD_VALUES))
            events.append(ev)
        meta = {}
        if draw(st.booleans()):
            meta["deviceProperties"] = draw(st.sampled_from([[{"id": 0, "totalGlobalMem": 85e9}], "x",
                                                             [{"id": "a", "totalGlobalMem": 1e40}], [1]]))
        if draw(st.booleans()):
            meta["distributedInfo"] = draw(st.sampled_from([{"rank": 0}, {"rank": 10 ** 20}, [1], "r"]))
        data = json.dumps({**meta, "traceEvents": events}, allow_nan=True).encode()
    if draw(st.integers(0, 5)) == 0:
        data = b"\xef\xbb\xbf" + data
    if draw(st.integers(0, 5)) == 0:
        pos = draw(st.integers(0, len(data)))
        data = data[:pos] + b" " * draw(st.sampled_from([1, 1000, 1 << 20])) + data[pos:]
    if draw(st.integers(0, 4)) == 0:
        data = gzip.compress(data, compresslevel=1)
    return data


def _replace_numbers(draw, data: bytes) -> bytes:
    numbers = [m.span() for m in re.finditer(rb"-?\d+(\.\d+)?", data[:20000])]
    for _ in range(draw(st.integers(0, 3))):
        if not numbers:
            break
        a, b = draw(st.sampled_from(numbers))
        data = data[:a] + draw(st.sampled_from(WEIRD_NUMBERS)).encode() + data[b:]
        numbers = [m.span() for m in re.finditer(rb"-?\d+(\.\d+)?", data[:20000])]
    return data


@st.composite
def trace_command(draw) -> list[str]:
    if draw(st.booleans()):
        argv = ["bubbles", "{dir}/k.json"]
        if draw(st.booleans()):
            argv += ["--threshold-us", draw(st.sampled_from(["0", "1", "100", "nan", "-1", "1e400"]))]
        for option in ("--report", "--trace"):
            if draw(st.integers(0, 2)) == 0:
                argv += [option, draw(st.sampled_from(["{dir}/r.json", "{dir}/./r.json", "", "{dir}/k.json/x",
                                                       "{dir}/o/t.json"]))]
        if draw(st.booleans()):
            argv.append("--json")
        return argv
    argv = ["profile", "{dir}/k.json", "-q"]
    if draw(st.integers(0, 2)) == 0:
        argv += ["--json", draw(st.sampled_from(["{dir}/out.json", "", "{dir}/k.json/x"]))]
    return argv


# --- NCCL log lines ---------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def seed_nccl_log(lines: int = 120) -> bytes:
    folder = SHARED / "nccl-logs"
    logs = sorted(folder.glob("*.log")) if folder.is_dir() else []
    if not logs:
        return b""
    text = logs[0].read_bytes().splitlines(keepends=True)
    keep = [l for l in text if b"ncclCommInitRank" in l or b"opCount" in l or b"Init COMPLETE" in l]
    return b"".join(keep[:lines])


NCCL_FIELDS = [rb"count \d+", rb"datatype \d+", rb"\[nranks=\d+\]", rb"nranks \d+", rb"rank \d+", rb"root \d+",
               rb"opCount [0-9a-f]+"]
NCCL_ODD = [b"1000000000000", b"9" * 30, b"9" * 5000, b"-1", b"0", b"100000000000000000000", b"x", b""]


@st.composite
def nccl_log(draw) -> bytes:
    seed = seed_nccl_log()
    if not seed:
        seed = (b"h:1:1 [0] NCCL INFO ncclCommInitRank comm 0x1 rank 0 nranks 2 cudaDev 0 busId 1 commId 0x5 - "
                b"Init COMPLETE\nh:1:1 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x1 recvbuff 0x2 count 4 "
                b"datatype 7 op 0 root 0 comm 0x1 [nranks=2] stream 0x3\n")
    lines = seed.splitlines(keepends=True)
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(lines) - 1))
        field = draw(st.sampled_from(NCCL_FIELDS))
        value = draw(st.sampled_from(NCCL_ODD))
        lines[i] = re.sub(field, lambda m: re.sub(rb"[0-9a-f]+(?=\]?$)", lambda _: value, m.group(), count=1),
                          lines[i], count=1)
    data = b"".join(lines)
    if draw(st.integers(0, 3)) == 0:
        data = bytes(draw(mutated(data)))
    return data


@st.composite
def nccl_command(draw) -> list[str]:
    argv = ["profile", "{dir}/n.log", "-q"]
    if draw(st.booleans()):
        argv += ["--topology", draw(st.sampled_from(["dgx1", "ring(4)", "nope"]))]
    if draw(st.integers(0, 3)) == 0:
        argv += ["--time-limit", draw(st.sampled_from(["1", "nan", "inf", "0", "-1"]))]
    return argv


# --- harvest command line ------------------------------------------------------------------

DEVICES = ["cpu:0", "cpu:1", "cpu:99", "cuda:0", "cuda:99", "cpu:0=1GiB", "cpu:1=-5GiB", "cpu:1=0",
           "cpu:1=1e400", "cpu:0=nan", "cpu:x", "tpu:0", "cpu:0=512M", "cpu:" + "9" * 40, ""]
SIZES = ["256M", "2G", "1e400", "0", "-1", "nan", "1.5K", "abc", "9" * 40, "1e9"]
TARGETS = ["collc.harvest.workloads:PageRank", "collc_fuzz_missing:Task", "collc.harvest.tasks:TaskSpec", "nocolon",
           "os:path", ":", "collc.harvest.workloads:"]


@st.composite
def harvest_log(draw) -> bytes:
    log = sample_harvest_log()
    for _ in range(draw(st.integers(0, 3))):
        table = draw(st.sampled_from(["tasks", "bubbles", "runs", "incidents"]))
        record = log[table][0]
        key = draw(st.sampled_from(sorted(record)))
        record[key] = draw(st.sampled_from(ODD_VALUES + ["gpu:7"]))
    if draw(st.integers(0, 5)) == 0:
        log[draw(st.sampled_from(sorted(log)))] = draw(st.sampled_from(ODD_VALUES))
    data = json.dumps(log).encode()
    return bytes(draw(mutated(data))) if draw(st.integers(0, 3)) == 0 else data


@st.composite
def harvest_command(draw) -> list[str]:
    what = draw(st.sampled_from(["serve", "submit", "status", "trace"]))
    if what == "serve":
        argv = ["harvest", "serve", "--dir", draw(st.sampled_from(["{dir}/run", "{dir}/log.json", "{dir}/log.json/x",
                                                                    "/proc/collc-fuzz", ""]))]
        for _ in range(draw(st.integers(1, 2))):
            argv += ["--device", draw(st.sampled_from(DEVICES))]
        if draw(st.integers(0, 3)) == 0:
            argv += [draw(st.sampled_from(["--margin-ms", "--hang-timeout-s"])),
                     draw(st.sampled_from(["1", "nan", "-1", "inf"]))]
        return argv
    if what == "submit":
        argv = ["harvest", "submit", "--dir", "{dir}/run", draw(st.sampled_from(TARGETS))]
        if draw(st.booleans()):
            argv += ["--memory", draw(st.sampled_from(SIZES))]
        if draw(st.integers(0, 3)) == 0:
            argv += ["--device", draw(st.sampled_from(DEVICES))]
        return argv
    if what == "status":
        return ["harvest", "status", "--log", draw(st.sampled_from(["{dir}/log.json", "{dir}", "/dev/zero"]))]
    return ["harvest", "trace", "{dir}/log.json", "-o", draw(st.sampled_from(["{dir}/t.json", "", "{dir}/log.json",
                                                                            "{dir}/x/t.json"]))]
