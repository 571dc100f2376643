"""Pipeline-parallel training steps on collc's cluster model.

A `PipelineJob` (job.py, built from a `pipeline` declaration by
`collc.frontend.eval.pipeline`) names stages, their GPUs, micro-batches, a schedule and the
costs of one step. `schedules.py` turns a schedule into data (the ordered actions of
every pipeline rank, as PyTorch writes them: csv_format.py), `timeline.py` lays the
actions out in time with activation transfers and the data-parallel gradient collective
timed by `collc.analysis` (network.py), `checks.py` proves the timeline obeys its
rules, `bubbles.py` finds the idle intervals and writes the report, `render.py` draws
it, and `measured.py` finds the same bubbles in Kineto traces of a job that ran.
"""
