"""NCCL debug logs (`NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL`, or INIT,COLL,TUNING), plain or gzip.

One record per COLL line (`AllReduce: opCount ... count N datatype D ... comm 0x.. [nranks=N]
stream 0x..`), NCCL 2.4 to current and RCCL (` task <n> globalrank <r>`, `acc (nil)`), in
whatever prefix the launcher adds (`host:pid:tid [dev]`, `(RayTrainWorker pid=615, ...)`,
`[rank3]:`, timestamps). Many processes may write one file; calls are keyed by (host, pid,
comm pointer). `INIT` lines (`comm 0x.. rank R nranks N ... commId 0x..`) give a comm's rank,
size and job-wide id; TUNING lines (`AllReduce: <bytes> Bytes -> Algo RING proto SIMPLE ...`)
the algorithm and protocol of the calls just logged by the same thread; they are never
counted as calls.

`count` is elements, and its meaning depends on the collective (reference section 5):
AllGather and Gather log the per-rank send count, ReduceScatter and Scatter the per-rank
receive count, AlltoAll the per-peer count; the rest the buffer. `bytes` is nccl-tests' size.

The modules, from the bottom up: `scan` (the line pattern, the scan into events and the
replay into records), `sequential` (a log read in this process, a chunk at a time),
`parallel` (a big log's pieces scanned by several processes, replayed here in order) and
`reader` (`read_nccl_log`: the parallel reader where it pays, else the sequential one).
"""
