"""Trace readers: the collective traffic real jobs record (NCCL debug logs, Kineto and
Chakra traces, NCCL profiler-plugin dumps and Inspector output) read into one table of
`CollectiveCall`s (`sources.read_traces`). What the table means is `collc.profile`'s."""
