"""Evaluation of checked definitions into the IR: topologies, collectives, algorithms
(verified schedules), pipelines and `compile` requests. Each module takes a definition's
`Entry` (from `collc.frontend.module`) and evaluated arguments; none loads files."""
