"""Small MSCCL XML programs as plain data, for tests to mutate and render.

A program is a dict: `{"algo": {attr: value}, "gpus": [{"attrs": {...}, "tbs": [{"attrs":
{...}, "steps": [{attr: value}]}]}]}`. `render` writes one element per line, so a step's
line is predictable (`line_of`).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

from collc.backends.msccl_xml.reader import read_xml_bytes
from collc.backends.msccl_xml.verify import VerifyReport, verify_document

SHARED_XML = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "msccl-xml"

Program = dict[str, Any]


def step(s: int, type: str, srcbuf: str = "i", srcoff: int = 0, dstbuf: str = "o", dstoff: int = 0, cnt: int = 1,
         depid: int = -1, deps: int = -1, hasdep: int = 0) -> dict[str, Any]:
    return dict(s=s, type=type, srcbuf=srcbuf, srcoff=srcoff, dstbuf=dstbuf, dstoff=dstoff, cnt=cnt,
                depid=depid, deps=deps, hasdep=hasdep)


def tb(id: int, send: int, recv: int, chan: int, steps: list[dict[str, Any]]) -> dict[str, Any]:
    return {"attrs": dict(id=id, send=send, recv=recv, chan=chan), "steps": steps}


def gpu(id: int, i: int, o: int, s: int, tbs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"attrs": dict(id=id, i_chunks=i, o_chunks=o, s_chunks=s), "tbs": tbs}


def algo(coll: str, ngpus: int, nchunksperloop: int, gpus: list[dict[str, Any]], *, inplace: int = 0,
         outofplace: int | None = 1, nchannels: int = 1, **extra: Any) -> Program:
    attrs: dict[str, Any] = dict(name=f"test_{coll}", proto="Simple", nchannels=nchannels,
                                 nchunksperloop=nchunksperloop, ngpus=ngpus, coll=coll, inplace=inplace)
    if outofplace is not None:
        attrs["outofplace"] = outofplace
    attrs.update(minBytes=0, maxBytes=0)
    attrs.update(extra)
    return {"algo": attrs, "gpus": gpus}


def _attrs(d: dict[str, Any]) -> str:
    return " ".join(f'{k}="{v}"' for k, v in d.items())


def render(program: Program) -> str:
    lines = [f"<algo {_attrs(program['algo'])}>"]
    for g in program["gpus"]:
        lines.append(f"  <gpu {_attrs(g['attrs'])}>")
        for t in g["tbs"]:
            lines.append(f"    <tb {_attrs(t['attrs'])}>")
            lines.extend(f"      <step {_attrs(s)}/>" for s in t["steps"])
            lines.append("    </tb>")
        lines.append("  </gpu>")
    lines.append("</algo>")
    return "\n".join(lines) + "\n"


def line_of(text: str, gpu_id: int, tb_id: int, s: int) -> int:
    """The line of step `s` of threadblock `tb_id` on GPU `gpu_id` in rendered or real XML."""
    g = t = None
    for n, line in enumerate(text.splitlines(), start=1):
        if m := re.search(r'<gpu id="(\d+)"', line):
            g = int(m.group(1))
        elif m := re.search(r'<tb id="(\d+)"', line):
            t = int(m.group(1))
        elif (m := re.search(r'<step s="(\d+)"', line)) and (g, t, int(m.group(1))) == (gpu_id, tb_id, s):
            return n
    raise LookupError(f"no step {s} in GPU {gpu_id} tb {tb_id}")


def verify_text(text: str, **kw: Any) -> VerifyReport:
    return verify_document(read_xml_bytes(text, "test.xml"), **kw)


def verify_program(program: Program, **kw: Any) -> VerifyReport:
    return verify_text(render(program), **kw)


def clone(program: Program) -> Program:
    return copy.deepcopy(program)


def steps_of(program: Program, gpu_id: int, tb_id: int) -> list[dict[str, Any]]:
    g = next(g for g in program["gpus"] if g["attrs"]["id"] == gpu_id)
    return next(t for t in g["tbs"] if t["attrs"]["id"] == tb_id)["steps"]


def tb_of(program: Program, gpu_id: int, tb_id: int) -> dict[str, Any]:
    g = next(g for g in program["gpus"] if g["attrs"]["id"] == gpu_id)
    return next(t for t in g["tbs"] if t["attrs"]["id"] == tb_id)


def renumber(steps: list[dict[str, Any]]) -> None:
    for k, s in enumerate(steps):
        s["s"] = k


# --- programs ------------------------------------------------------------------------------

def ring_allgather(n: int = 4, *, in_place: bool = False) -> Program:
    """Each rank puts its chunk in place (out-of-place: a local copy), sends it right, and
    forwards what it receives from the left until every rank holds every chunk."""
    gpus = []
    for r in range(n):
        right, left = (r + 1) % n, (r - 1) % n
        steps = []
        if not in_place:
            steps.append(step(0, "cpy", "i", 0, "o", r))
        steps.append(step(len(steps), "s", "o", r, "o", r))
        for k in range(1, n):
            slot = (r - k) % n
            steps.append(step(len(steps), "rcs" if k < n - 1 else "r", "o", slot, "o", slot))
        gpus.append(gpu(r, 0 if in_place else 1, n, 0, [tb(0, right, left, 0, steps)]))
    return algo("allgather", n, n, gpus, inplace=int(in_place), outofplace=int(not in_place))


def pair_allreduce() -> Program:
    """In-place AllReduce of two chunks on two GPUs: tb 0 sends the whole input, tb 1
    receives the peer's into scratch, tb 2 adds scratch into the input once both are done
    (a nop for the send, the `re` steps' own dependency for the receive)."""
    gpus = []
    for r in range(2):
        peer = 1 - r
        gpus.append(gpu(r, 2, 0, 2, [
            tb(0, peer, -1, 0, [step(0, "s", "i", 0, "i", 0, cnt=2, hasdep=1)]),
            tb(1, -1, peer, 0, [step(0, "r", "s", 0, "s", 0, cnt=2, hasdep=1)]),
            tb(2, -1, -1, 0, [
                step(0, "nop", "i", -1, "o", -1, cnt=0, depid=0, deps=0),
                step(1, "re", "s", 0, "i", 0, depid=1, deps=0),
                step(2, "re", "s", 1, "i", 1),
            ]),
        ]))
    return algo("allreduce", 2, 2, gpus, inplace=1, outofplace=0)


def pair_reducescatter_in_place() -> Program:
    """In-place ReduceScatter on two GPUs written the way MSCCLang writes in-place files:
    the result lands in the input slot the output aliases (rank r's output is input[r])."""
    gpus = []
    for r in range(2):
        peer = 1 - r
        gpus.append(gpu(r, 2, 0, 0, [tb(0, peer, peer, 0, [
            step(0, "s", "i", peer, "i", peer),
            step(1, "rrc", "i", r, "i", r),
        ])]))
    return algo("reducescatter", 2, 2, gpus, inplace=1, outofplace=0)


def chain_broadcast(root: int = 1, **extra: Any) -> Program:
    """Broadcast of one chunk over three GPUs along root -> next -> last."""
    n = 3
    order = [root, (root + 1) % n, (root + 2) % n]
    tbs = {
        order[0]: tb(0, order[1], -1, 0, [step(0, "cpy", "i", 0, "o", 0), step(1, "s", "o", 0, "o", 0)]),
        order[1]: tb(0, order[2], order[0], 0, [step(0, "rcs", "o", 0, "o", 0)]),
        order[2]: tb(0, -1, order[1], 0, [step(0, "r", "o", 0, "o", 0)]),
    }
    gpus = [gpu(r, 1, 1, 0, [tbs[r]]) for r in range(n)]
    return algo("broadcast", n, 1, gpus, **extra)
