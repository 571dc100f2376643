"""collc's intermediate representation: immutable data with a JSON form."""

from collc.ir.collective import ChunkId, Collective, CollectiveKind, Value, value_str
from collc.ir.schedule import Buffer, Loc, Op, OpKind, Schedule
from collc.ir.topology import Link, Node, NodeKind, Topology

__all__ = [
    "Buffer", "ChunkId", "Collective", "CollectiveKind", "Link", "Loc", "Node", "NodeKind", "Op", "OpKind",
    "Schedule", "Topology", "Value", "value_str",
]
