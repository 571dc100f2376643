"""Profiling: reading the collective traffic real jobs record (NCCL logs, Kineto and
Chakra traces, NCCL profiler-plugin dumps) into one table, and the schedules it calls for."""
