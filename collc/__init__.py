"""collc: a compiler for GPU collective communication."""

__version__ = "0.1.0"
