"""The standard library's collectives equal the IR's builders."""

from __future__ import annotations

import pytest

from collc.frontend import resolve_collective
from collc.ir.collective import CollectiveKind, standard

UNROOTED = ["allgather", "reducescatter", "allreduce", "alltoall"]
ROOTED = ["broadcast", "reduce", "gather", "scatter"]


@pytest.mark.parametrize("kind", UNROOTED)
@pytest.mark.parametrize("ranks", [1, 2, 3, 8])
@pytest.mark.parametrize("chunks", [1, 2, 3])
def test_unrooted(kind, ranks, chunks):
    coll = resolve_collective(f"{kind}(chunks={chunks})", ranks)
    assert coll == standard(kind, ranks, chunks)
    assert coll.kind is CollectiveKind(kind) and coll.root is None


@pytest.mark.parametrize("kind", ROOTED)
@pytest.mark.parametrize("ranks, root", [(1, 0), (3, 0), (3, 2), (8, 5)])
@pytest.mark.parametrize("chunks", [1, 2])
def test_rooted(kind, ranks, root, chunks):
    coll = resolve_collective(f"{kind}(chunks={chunks}, root={root})", ranks)
    assert coll == standard(kind, ranks, chunks, root)
    assert coll.root == root


def test_defaults():
    assert resolve_collective("broadcast", 4) == standard("broadcast", 4, 1, 0)
    assert resolve_collective("allreduce", 4) == standard("allreduce", 4, 1)
