"""Verification of schedules against their collective's postcondition.

- `symbolic`: the verifier (`verify`): structure, races and values, op by op, with
  every error worded and located;
- `arrays`: the same checks on numpy arrays for large schedules of the common shape
  (`verify` tries it first; it only ever says "verified" or "ask the op-by-op run");
- `columns`: a schedule's ops as arrays (`columns_of`, `sort_order`), shared by the two
  fast paths;
- `regrouped`: a schedule a pass only regrouped (`msccl-merge`) re-verified cheaply
  from the verified one (`same_work`, `verify_rewritten`).

This module only re-exports the names callers use; the modules above import each
other directly.
"""

from collc.diagnostics import ScheduleError
from collc.verify.symbolic import (
    buffer_size, check_postcondition, check_structure, execute, load_array_form, unreachable_pairs, verify,
    verify_op_by_op,
)

__all__ = [
    "ScheduleError", "buffer_size", "check_postcondition", "check_structure", "execute", "load_array_form",
    "unreachable_pairs", "verify", "verify_op_by_op",
]
