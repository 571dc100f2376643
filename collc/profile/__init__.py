"""Profiling: the collective traffic real jobs record (read by `collc.traces`) as one table,
and the schedules it calls for."""
