"""matplotlib, set up once for every tool that draws (`collc profile --plot`,
`collc pipeline/bubbles --plot`, `collc harvest trace --png/--svg`).

collc draws to files only, so the backend is Agg (no display, the same pixels on every
machine), chosen here before pyplot is first imported and never again. matplotlib is
imported lazily, on the first picture: it is heavy (about half a second of start-up)
and only the commands that draw need it, so neither `collc --help` nor a compile pays
for it.
"""

from __future__ import annotations

import functools
import io
from pathlib import Path
from typing import Any

from collc.io import atomic_write


@functools.cache
def pyplot() -> Any:
    """`matplotlib.pyplot`, with the Agg backend chosen before its first import."""
    # Lazy: matplotlib is a heavy dependency that only drawing needs (see above).
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure_bytes(fig: Any, fmt: str, dpi: float, **savefig: Any) -> bytes:
    """The figure as a `fmt` file ("png", "svg"), in memory."""
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=dpi, **savefig)
    return buf.getvalue()


def save_figure(fig: Any, path: str | Path, dpi: float, **savefig: Any) -> Path:
    """Write the figure all or nothing, in the format its suffix names."""
    return atomic_write(path, figure_bytes(fig, Path(path).suffix.lower().lstrip("."), dpi, **savefig))
