"""Generated and mutated inputs for the property tests, and the harness that runs the
command line on one of them.

The property every case checks: `collc` ends with exit status 0, 1 or 2 (never an
uncaught exception, which in-process is the traceback a user would see), within a
per-case deadline, and a command that fails leaves no file behind (nor does any command
leave a temporary file).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import io
import os
import shutil
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hypothesis import strategies as st

from collc import frontend
from collc.cli import main

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / ".." / "shared" / "data" / "msccl-xml"

# CPU seconds one case may use before it counts as a hang (CPU time, so that a busy
# machine does not make slow cases look hung), and a wall-clock backstop for a case
# that waits without computing.
CASE_DEADLINE_S = int(os.environ.get("COLLC_FUZZ_DEADLINE", "30"))
CASE_WALL_DEADLINE_S = 8 * CASE_DEADLINE_S

# Cases run and their exit statuses, per kind of input (read by bench/fuzz_long.py).
STATS: collections.Counter = collections.Counter()


class CaseTimeout(BaseException):
    """A case ran past the deadline (a BaseException, so no `except Exception` eats it)."""


@dataclass
class Outcome:
    status: int
    out: str
    err: str
    files: list[str]  # what the case's directory holds afterwards, inputs excluded


def run_case(kind: str, inputs: dict[str, bytes], argv: list[str]) -> Outcome:
    """Write `inputs` into a fresh directory, run `collc argv` there in-process ("{dir}"
    in argv is that directory), and check the properties."""
    directory = Path(tempfile.mkdtemp(prefix="collc-fuzz-"))
    try:
        for name, data in inputs.items():
            (directory / name).write_bytes(data)
        args = [a.replace("{dir}", str(directory)) for a in argv]
        out, err = io.StringIO(), io.StringIO()

        def on_alarm(signum, frame):
            clock = "CPU" if signum == signal.SIGPROF else "wall-clock"
            raise CaseTimeout(f"collc {' '.join(args)} ran past its {clock} deadline\n"
                              f"--- {list(inputs)[0]} ---\n" + inputs[list(inputs)[0]].decode("utf-8", "replace"))

        previous = signal.signal(signal.SIGALRM, on_alarm)
        previous_prof = signal.signal(signal.SIGPROF, on_alarm)
        signal.setitimer(signal.ITIMER_PROF, CASE_DEADLINE_S)
        signal.alarm(CASE_WALL_DEADLINE_S)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    status = main(args)
                except SystemExit as exc:  # argparse's usage errors
                    status = exc.code if isinstance(exc.code, int) else 1
        finally:
            signal.alarm(0)
            signal.setitimer(signal.ITIMER_PROF, 0)
            signal.signal(signal.SIGALRM, previous)
            signal.signal(signal.SIGPROF, previous_prof)
        files = sorted(str(p.relative_to(directory)) for p in directory.rglob("*")
                       if p.relative_to(directory).as_posix() not in inputs)
        outcome = Outcome(status, out.getvalue(), err.getvalue(), files)
        STATS[(kind, status)] += 1
        check_outcome(outcome, args)
        return outcome
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        if sum(STATS.values()) % 200 == 0:
            frontend.clear_caches()  # every case has its own paths; keep memory flat


def check_outcome(outcome: Outcome, args: list[str]) -> None:
    assert outcome.status in (0, 1, 2), (outcome.status, args, outcome.err[-2000:])
    assert "Traceback" not in outcome.err, outcome.err[-2000:]
    leftovers = [f for f in outcome.files if Path(f).name.startswith(".collc-")]
    assert not leftovers, f"temporary files left behind: {leftovers}"
    if outcome.status != 0:
        assert not outcome.files, f"collc {' '.join(args)} failed ({outcome.err[-500:]}) but left {outcome.files}"
    if outcome.status == 1:  # said why (`verify --json` says it in its JSON)
        assert "error" in outcome.err or '"ok": false' in outcome.out, (outcome.err, outcome.out[-500:])
    if outcome.status == 2:
        assert "usage" in outcome.err or "error" in outcome.err, outcome.err


# --- .coll programs ------------------------------------------------------------------

# Numbers a program may hold: ordinary ones, and the extremes users have tried.
WEIRD_NUMBERS = ["0", "1", "2", "-1", "0.5", "1e300", "1e400", "1e-300", "99999999999999999999",
                 "9" * 60, "2147483648", "1e9", "100000000"]


def mostly(usual: st.SearchStrategy, odd: st.SearchStrategy, one_in: int = 12) -> st.SearchStrategy:
    """`usual` values, and `odd` ones about once in `one_in` draws (so that most
    generated programs get past their first statement)."""
    return st.integers(1, one_in).flatmap(lambda k: odd if k == 1 else usual)


numbers = mostly(st.integers(1, 12).map(str), st.sampled_from(WEIRD_NUMBERS + ["0"]))
bandwidth_units = mostly(st.sampled_from(["GB/s", "Gbit/s", "MB/s", "TB/s", "Gb/s"]), st.sampled_from(["us", "MiB", ""]))
time_units = mostly(st.sampled_from(["us", "ns", "ms"]), st.sampled_from(["s", "GB/s", ""]))
size_units = mostly(st.sampled_from(["MiB", "KiB", "B", "GB", "GiB"]), st.sampled_from(["us", ""]))


GOOD_UNITS = {"bandwidth": ["GB/s", "Gbit/s", "MB/s"], "time": ["us", "ns"], "size": ["MiB", "KiB", "B", "GiB"]}


@st.composite
def quantity(draw, units, valid: bool = False) -> str:
    if valid:
        kind = {id(bandwidth_units): "bandwidth", id(time_units): "time", id(size_units): "size"}[id(units)]
        return f"{draw(st.integers(1, 64))} {draw(st.sampled_from(GOOD_UNITS[kind]))}"
    value = draw(numbers)
    unit = draw(units)
    text = f"{value} {unit}".strip()
    if draw(st.integers(0, 9)) == 0:  # arithmetic that may overflow or cancel
        op = draw(st.sampled_from(["+", "-", "*", "/", "//", "%"]))
        text = f"{text} {op} {draw(numbers)} {draw(units)}".strip()
    return text


@st.composite
def topology_text(draw, name: str, valid: bool = False) -> str:
    n = draw(mostly(st.integers(2, 6).map(str), st.sampled_from(["1", "0", "-2", "100000", "1e300", "n"]),
                    one_in=10 ** 9 if valid else 12))
    lines = [f"topology {name}(n = {n}) {{"]
    if draw(st.booleans()) and not valid:
        lines.append(f"    let k = {draw(numbers)};")
    if draw(st.booleans()) and not valid:
        lines.append(f"    require n >= {draw(st.integers(-1, 3))}, \"needs GPUs\";")
    lines.append("    gpu g[n];")
    lines.append("    switch sw;")
    kind = draw(st.sampled_from(["star", "ring", "both"]))
    bw, lat = draw(quantity(bandwidth_units, valid)), draw(quantity(time_units, valid))
    mult = f" x {draw(numbers)}" if draw(st.integers(0, 5)) == 0 and not valid else ""
    if kind in ("star", "both"):
        lines.append(f"    for i in 0..n {{ link g[i] <-> sw bw {bw} lat {lat}{mult}; }}")
    if kind in ("ring", "both"):
        lines.append(f"    for i in 0..n {{ if n > 1 {{ link g[i] -> g[(i + 1) % n] bw {bw}; }} }}")
    if draw(st.integers(0, 4)) == 0 and not valid:
        lines.append(f"    for i in 0..{draw(numbers)} {{ for j in 0..{draw(numbers)} {{ }} }}")
    lines.append("}")
    return "\n".join(lines)


COLLECTIVES = ["allgather", "reducescatter", "allreduce", "alltoall", "broadcast", "reduce", "gather", "scatter",
               "broadcast(root = 1)", "allgather(chunks = 2)", "mine"]
VALID_REQUESTS = [("allgather", " using ring"), ("reducescatter", " using ring"), ("allreduce", " using ring"),
                  ("broadcast", " using tree"), ("reduce(root = 1)", " using tree"),
                  ("allgather", ' using synthesize(method = "greedy")'), ("alltoall", ' using synthesize(method = "greedy")'),
                  ("allgather", "")]
USING = ["", " using ring", " using tree", " using direct", ' using synthesize(method = "greedy")',
         ' using synthesize(method = "lp", chunks = 2)']


@st.composite
def coll_program(draw) -> str:
    """A program in the shape users write: topologies, maybe a custom collective and a
    hand-written algorithm, and compile requests. Half are drawn to be valid (so that
    compiles run to the end), the others with odd values anywhere."""
    valid = draw(st.booleans())
    parts = [draw(topology_text("t", valid))]
    if draw(st.booleans()):
        parts.append(draw(topology_text("u", valid)))
    if draw(st.booleans()) and not valid:
        parts.append("collective mine {\n    input 1;\n    deliver chunk(0, 0) to {"
                     + ", ".join(str(draw(st.integers(-1, 5))) for _ in range(draw(st.integers(0, 3)))) + "};\n}")
    if draw(st.booleans()):
        wrong = draw(st.integers(0, 3)) == 0 and not valid
        target = "out[r][(s + 1) % ranks]" if wrong else "out[r][s]"
        parts.append("algorithm direct for allgather {\n    for r in 0..ranks {\n        for s in 0..ranks {\n"
                     f"            copy in[s][0] -> {target};\n        }}\n    }}\n}}")
    for _ in range(draw(st.integers(0, 3))):
        if valid:
            coll, using = draw(st.sampled_from(VALID_REQUESTS))
            topo = draw(st.sampled_from(["t()", "t(2)", "t(4)", "t(n = 3)", "switch(n = 4)", "ring(3)"]))
        else:
            coll, using = draw(st.sampled_from(COLLECTIVES)), draw(st.sampled_from(USING))
            topo = draw(st.sampled_from(["t()", "t(2)", "t(4)", "t(n = 3)", "u()", "switch(n = 4)", "ring(3)", "dgx1"]))
        size = draw(quantity(size_units, valid))
        parts.append(f"compile {coll} on {topo} size {size}{using};")
    imports = 'import topologies.switch;\nimport topologies.ring;\nimport topologies.dgx1;\n'
    return imports + "\n".join(parts) + "\n"


# Fragments spliced into programs by the mutator: the inputs that used to break collc.
TOKENS = [b"{", b"}", b"(", b")", b"[", b"]", b";", b"..", b",", b"=", b"for i in 0..", b"if true {", b"let x = ",
          b"1e400", b"9" * 40, b"pow(10, 100000000)", b"\x1b[31m", b"\xff\xfe", b"\xe9", b"\xef\xbb\xbf",
          b"[/b]", b'"', b"//", b"/*", b"*/", b"\x00", b"\t", b"\r\n", b"part p[32] = t();", b"link g[0] -> sw bw ",
          b"NaN", b"-", b"0", b"GB/s", b"us", b"(" * 150, b"if true { " * 120, b"import \"x.coll\";",
          b"import topologies.nope;", b"compile allgather on t() size 1 MiB;", b"ranks", b"chunk(0, 0)"]


@st.composite
def mutated(draw, seed: bytes) -> bytes:
    data = bytearray(seed)
    for _ in range(draw(st.integers(1, 4))):
        choice = draw(st.integers(0, 5))
        pos = draw(st.integers(0, len(data)))
        if choice == 0 and data:  # delete a slice
            end = min(len(data), pos + draw(st.integers(1, 40)))
            del data[pos:end]
        elif choice == 1:  # insert a token
            data[pos:pos] = draw(st.sampled_from(TOKENS))
        elif choice == 2 and data:  # flip a byte
            i = min(pos, len(data) - 1)
            data[i] = draw(st.integers(0, 255))
        elif choice == 3 and data:  # duplicate a slice
            end = min(len(data), pos + draw(st.integers(1, 80)))
            data[pos:pos] = data[pos:end]
        elif choice == 4:  # replace a number with an extreme one
            digits = [i for i, b in enumerate(data) if chr(b).isdigit()]
            if digits:
                i = draw(st.sampled_from(digits))
                data[i:i + 1] = draw(st.sampled_from(WEIRD_NUMBERS)).encode()
        else:  # truncate
            del data[pos:]
    return bytes(data)


def seed_programs() -> list[bytes]:
    """Real programs to mutate: the README's example and the standard library's files."""
    seeds = []
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    if "```\n// my_cluster.coll\n" in readme:
        seeds.append(("// my_cluster.coll\n" + readme.split("```\n// my_cluster.coll\n", 1)[1].split("```", 1)[0])
                     .encode())
    for path in sorted((ROOT / "stdlib").rglob("*.coll")):
        seeds.append(path.read_bytes())
    return seeds


# --- command lines --------------------------------------------------------------------

@st.composite
def coll_command(draw) -> list[str]:
    """What to run on `{dir}/p.coll`: check, show, or a compile with options (some bad)."""
    what = draw(st.sampled_from(["check", "check", "show", "compile", "compile"]))
    if what != "compile":
        return [what, "{dir}/p.coll"]
    argv = ["compile", "{dir}/p.coll", "-q", "--no-baselines", "--time-limit", "2"]
    argv += ["-o", draw(st.sampled_from(["{dir}/out/", "{dir}/o.json", "{dir}/plain/o.json", "{dir}/d/e/"]))]
    if draw(st.booleans()):
        argv += ["--backend", draw(st.sampled_from(["json", "msccl-xml", "cupy", "nccl"]))]
    if draw(st.integers(0, 3)) == 0:
        argv += ["--report", draw(st.sampled_from(["{dir}/r.json", "{dir}/o.json", "{dir}/plain/r.json"]))]
    if draw(st.integers(0, 3)) == 0:
        argv += ["--size", draw(st.sampled_from(["1M", "64K", "1MiB,2MiB", "0", "1e99", "-1", "abc", "1 GB/s"]))]
    if draw(st.integers(0, 4)) == 0:
        argv += [draw(st.sampled_from(["--chunks", "--threads", "--seed", "--mip-gap", "--instances"])),
                 draw(st.sampled_from(["0", "1", "-1", "nan", "2", "100000000"]))]
    if draw(st.integers(0, 4)) == 0:
        argv += ["--request", draw(st.sampled_from(["1", "5", "allgather", "t", "nope"]))]
    return argv


# --- MSCCL XML --------------------------------------------------------------------------

@st.composite
def xml_program(draw) -> bytes:
    """A small MSCCL XML program: a ring-like AllGather, often valid, with some attribute
    values drawn from the extremes."""
    def num(lo: int, hi: int) -> str:
        if draw(st.integers(0, 12)) == 0:
            return draw(st.sampled_from(["-1", "1000000000", "9" * 30, "007", "x", "", "1e3", "2147483648"]))
        return str(draw(st.integers(lo, hi)))

    n = draw(st.integers(1, 4))
    coll = draw(st.sampled_from(["allgather", "allreduce", "reduce_scatter", "alltoall", "custom", "broadcast"]))
    proto = draw(st.sampled_from(["Simple", "LL", "LL128", "LL256"]))
    lines = [f'<algo name="f" proto="{proto}" nchannels="{num(1, 2)}" nchunksperloop="{num(1, 2 * n)}" '
             f'ngpus="{num(n, n)}" coll="{coll}" inplace="{num(0, 1)}" outofplace="1" minBytes="0" maxBytes="0">']
    for g in range(n):
        lines.append(f'  <gpu id="{num(g, g)}" i_chunks="{num(0, 2)}" o_chunks="{num(0, 2 * n)}" s_chunks="{num(0, 1)}">')
        peer_send, peer_recv = (g + 1) % n, (g - 1) % n
        lines.append(f'    <tb id="0" send="{num(-1, n - 1) if draw(st.booleans()) else peer_send}" '
                     f'recv="{peer_recv}" chan="{num(0, 1)}">')
        for s in range(draw(st.integers(0, 3))):
            kind = draw(st.sampled_from(["s", "r", "rcs", "cpy", "nop", "re", "rrc", "bogus"]))
            lines.append(f'      <step s="{s}" type="{kind}" srcbuf="{draw(st.sampled_from("ios"))}" '
                         f'srcoff="{num(0, n)}" dstbuf="{draw(st.sampled_from("ios"))}" dstoff="{num(0, n)}" '
                         f'cnt="{num(1, 2)}" depid="{num(-1, 0)}" deps="{num(-1, 2)}" hasdep="{num(0, 1)}"/>')
        lines.append("    </tb>")
        lines.append("  </gpu>")
    lines.append("</algo>")
    return ("\n".join(lines) + "\n").encode()


@functools.lru_cache(maxsize=None)
def compiled_xml(collective: str, ranks: int) -> bytes:
    """A valid MSCCL XML program collc writes: the stdlib's ring algorithm on `ring(ranks)`."""
    from collc.backends import BackendOptions, get_backend
    from collc.backends.msccl_xml.writer import algo_to_xml
    from collc.driver import CompileJob, schedule_for_backend

    topology = frontend.resolve_topology(f"ring({ranks})")
    job = CompileJob(topology, frontend.resolve_collective(collective, ranks), 1 << 20, algorithm="ring")
    unit, _ = schedule_for_backend(job, get_backend("msccl-xml"), BackendOptions())
    return algo_to_xml(unit.lowered).encode()


@st.composite
def valid_or_generated_xml(draw) -> bytes:
    """A third of the time a program collc compiled (valid: `verify` passes it), else a
    generated one (`xml_program`)."""
    if draw(st.integers(0, 2)) == 0:
        return compiled_xml(draw(st.sampled_from(["allgather", "reducescatter", "allreduce"])),
                            draw(st.integers(2, 4)))
    return draw(xml_program())


def seed_xml_files(max_bytes: int = 40_000) -> list[bytes]:
    """The real MSCCL XML files small enough to mutate quickly (none if the data is absent)."""
    if not DATA.is_dir():
        return []
    return [p.read_bytes() for p in sorted(DATA.glob("*.xml")) if p.stat().st_size <= max_bytes]


@st.composite
def mutated_xml(draw, seed: bytes) -> bytes:
    """A real file with an attribute value replaced, an element dropped, or bytes changed."""
    import re

    text = seed
    for _ in range(draw(st.integers(1, 3))):
        choice = draw(st.integers(0, 3))
        if choice == 0:
            values = list(re.finditer(rb'="([^"]*)"', text))
            if values:
                m = draw(st.sampled_from(values))
                new = draw(st.sampled_from([b"-1", b"0", b"1000000000", b"9" * 100_000, b"", b"x", b"64", b"007",
                                            b"\x1b[31m", b"\xff"]))
                text = text[:m.start(1)] + new + text[m.end(1):]
        elif choice == 1:
            lines = text.split(b"\n")
            if len(lines) > 2:
                del lines[draw(st.integers(1, len(lines) - 2))]
            text = b"\n".join(lines)
        else:
            text = draw(mutated(text))
    return text
