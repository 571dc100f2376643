"""`--backend cupy`: a standalone Python executor of the schedule (NumPy on CPUs, CuPy on
GPUs, NCCL between processes); see generate.py."""

from __future__ import annotations

from collc.backends import Backend
from collc.backends.cupy.generate import emit

BACKEND = Backend(
    name="cupy",
    summary="a standalone Python executor: NumPy/CuPy arrays, one process or one per GPU over NCCL",
    lowering=lambda options: "",  # it runs the verified schedule's steps as they are
    emit=emit,
    suffix=".py",
)
