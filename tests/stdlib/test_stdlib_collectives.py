"""The standard library's collectives equal the IR's builders.

The front end builds the stdlib's standard collectives with those builders instead of
interpreting their definitions; these tests interpret the definitions
(`interpret=True`) and compare, so the two cannot drift apart.
"""

from __future__ import annotations

import time

import pytest

from collc.frontend import resolve_collective, stdlib_view
from collc.frontend.eval.collective import instantiate
from collc.ir.collective import CollectiveKind, standard

UNROOTED = ["allgather", "reducescatter", "allreduce", "alltoall"]
ROOTED = ["broadcast", "reduce", "gather", "scatter"]


def interpreted(name: str, ranks: int, **kw: int):
    args = [(k, v, None) for k, v in kw.items()]
    return instantiate(stdlib_view().lookup_collective(name, None), ranks, args, None, interpret=True)


@pytest.mark.parametrize("kind", UNROOTED)
@pytest.mark.parametrize("ranks", [1, 2, 3, 8])
@pytest.mark.parametrize("chunks", [1, 2, 3])
def test_unrooted(kind, ranks, chunks):
    coll = interpreted(kind, ranks, chunks=chunks)
    assert coll == standard(kind, ranks, chunks)
    assert coll.kind is CollectiveKind(kind) and coll.root is None
    assert resolve_collective(f"{kind}(chunks={chunks})", ranks) == coll


@pytest.mark.parametrize("kind", ROOTED)
@pytest.mark.parametrize("ranks, root", [(1, 0), (3, 0), (3, 2), (8, 5)])
@pytest.mark.parametrize("chunks", [1, 2])
def test_rooted(kind, ranks, root, chunks):
    coll = interpreted(kind, ranks, chunks=chunks, root=root)
    assert coll == standard(kind, ranks, chunks, root)
    assert coll.root == root
    assert resolve_collective(f"{kind}(chunks={chunks}, root={root})", ranks) == coll


def test_defaults():
    assert resolve_collective("broadcast", 4) == interpreted("broadcast", 4) == standard("broadcast", 4, 1, 0)
    assert resolve_collective("allreduce", 4) == interpreted("allreduce", 4) == standard("allreduce", 4, 1)


def test_arguments_are_still_checked_when_built():
    from collc.diagnostics import CollcError

    with pytest.raises(CollcError, match="root 9 is out of range"):
        resolve_collective("broadcast(root=9)", 4)
    with pytest.raises(CollcError, match="chunks must be at least 1"):
        resolve_collective("allgather(chunks=0)", 4)


def test_large_collectives_are_built_not_interpreted(monkeypatch):
    # Interpreting AllReduce's postcondition is ranks^3 evaluations (minutes at 1,024
    # ranks); the builder shares one set per slot index across ranks.
    from collc.frontend.eval import collective as front

    def refuse(*args, **kw):
        raise AssertionError("the stdlib's allreduce was interpreted")

    monkeypatch.setattr(front._CollectiveRunner, "run", refuse)
    t0 = time.process_time()
    coll = resolve_collective("allreduce", 512)
    assert time.process_time() - t0 < 20
    assert coll.outputs[0][5] is coll.outputs[511][5]
    assert len(coll.outputs[7][5]) == 512
