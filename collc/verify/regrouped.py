"""Re-verification of a schedule that a pass only regrouped, on arrays.

The pass manager verifies the schedule again after every pass that changes it. A
lowering pass such as `msccl-merge` changes how the work is grouped into ops (ops of
one step over consecutive slots joined into one, large ops split) but not the work:
at 1,024 ranks, verifying its 2 million merged ops again symbolically costs about as
much as the first verification (tens of seconds). `same_work` decides instead, with a
few numpy sorts, that the new schedule does exactly the verified one's work:

- the same slot accesses: every op expanded into its one-slot units (step, kind,
  route, source slot, destination slot), the two lists equal as multisets;
- at least the same order: where a verified op a depends on op b, the op that now does
  a's work depends on the op that now does b's (each old op's work in one new op);
- well formed: unique ids, counts of at least one, every dependency listed earlier and
  at an earlier step; the same collective and scratch.

Why that is enough: the verified schedule has no races, so every two accesses of one
slot where one writes are ordered by its dependencies; those orders survive, so the new
schedule runs every slot's accesses in the same order (two units in one new op were of
one step, where nothing conflicts), reads the same values, and ends in the same state.
Its own unit accesses inherit the old ones' range, route and writability checks.

Anything else (a unit more or less, a dependency lost, a step changed, an op split over
several new ops) makes `same_work` return False, and the caller verifies in full: a
wrong rewrite is reported by the verifier's own message, never waved through.
"""

from __future__ import annotations

import numpy as np

from collc.ir.schedule import Schedule
from collc.ir.topology import Topology
from collc.verify.columns import OpColumns, columns_of, forget_columns, sort_order
from collc.verify.symbolic import verify


def verify_rewritten(verified: Schedule | None, after: Schedule, topology: Topology) -> None:
    """Raise ScheduleError unless `after` verifies on `topology`. `verified` is the
    schedule the pass rewrote when it is known to verify there with its race check (else
    None): then `after` is accepted cheaply if it does the same work (see the module
    docstring). Whether a schedule was verified is the caller's to know (the pass
    manager keeps it on the compile unit)."""
    if verified is not None and same_work(verified, after):
        return
    verify(after, topology)


def _self_overlapping(c: OpColumns) -> bool:
    """Some op of several slots reads slots it also writes (its own order would matter)."""
    same = (c.count > 1) & (c.src_rb == c.dst_rb)
    return bool((same & (c.src_idx < c.dst_idx + c.count) & (c.dst_idx < c.src_idx + c.count)).any())


def same_work(before: Schedule, after: Schedule) -> bool:
    """Whether `after` does exactly `before`'s slot accesses, at the same steps, with at
    least its ordering, and is well formed (see the module docstring)."""
    if after.collective is not before.collective and after.collective != before.collective:
        return False
    if after.scratch != before.scratch or after.topology != before.topology:
        return False
    old = columns_of(before)
    forget_columns(before)  # read once more here at most: the columns of millions of ops take hundreds of MB
    routes: dict[tuple[str, ...], int] = {}
    if bool((old.kind_route >= 2).any()):
        old = OpColumns(before.ops, routes)  # route codes from one table for both schedules
        new = OpColumns(after.ops, routes)
    elif old.ids_are_positions():
        new = OpColumns.derived(after.ops, before.ops, old, routes)  # the ops a pass kept are not read again
    else:
        new = OpColumns(after.ops, routes)
    if int(old.count.sum()) != int(new.count.sum()) or bool((new.count < 1).any()) or _self_overlapping(old):
        return False
    # Well formed: ids unique, dependencies listed earlier and at an earlier step.
    new_edges = new.edges()
    if new_edges is None:
        return False
    op_pos, dep_pos = new_edges
    if bool((dep_pos >= op_pos).any()) or bool((new.step[dep_pos] >= new.step[op_pos]).any()):
        return False
    # The same units: sorted the same way, the key columns are equal row by row.
    old_owner, old_keys = old.units()
    new_owner, new_keys = new.units()
    old_order, new_order = sort_order(old_keys), sort_order(new_keys)
    for a, b in zip(old_keys, new_keys):
        if not np.array_equal(a[old_order], b[new_order]):
            return False
    # Each old op's work is in one new op (else verify in full: a split op's pieces
    # would need a finer argument).
    new_of_unit = new_owner[new_order]
    old_of_unit = old_owner[old_order]
    new_of_old = np.full(old.n, -1, dtype=np.int64)
    new_of_old[old_of_unit] = new_of_unit
    if bool((new_of_old[old_of_unit] != new_of_unit).any()):
        return False
    # Every old dependency is a dependency of the ops that now do the work.
    old_edges = old.edges()
    if old_edges is None:
        return False
    o_op, o_dep = old_edges
    wanted = new_of_old[o_op] * new.n + new_of_old[o_dep]
    have = np.sort(op_pos * new.n + dep_pos)  # sorted and searched: np.isin hashes, slower here
    if len(wanted) == 0:
        return True
    if len(have) == 0:
        return False
    found = have[np.minimum(np.searchsorted(have, wanted), len(have) - 1)]
    return bool((found == wanted).all())
