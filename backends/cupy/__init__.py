"""The CuPy/NCCL executor backend (`collc.backends.cupy.backend.BACKEND`)."""
