"""Small inputs and file helpers shared by the hardening tests."""

from __future__ import annotations

from pathlib import Path

from collc.cli import main

# A valid topology body's links: two GPUs on one switch.
TWO_GPUS = "gpu g[2]; switch s; link g[0] <-> s bw 1 GB/s lat 1 us; link g[1] <-> s bw 1 GB/s lat 1 us;"


def topology_with(body: str, name: str = "t") -> str:
    """A topology of two GPUs on a switch, with `body` run before its links."""
    return f"topology {name}() {{ gpu g[2]; switch s; {body} link g[0] <-> s bw 1 GB/s lat 1 us; " \
           "link g[1] <-> s bw 1 GB/s lat 1 us; }\n"


RING4 = """topology t(n = 4) {
    gpu g[n];
    switch sw;
    for i in 0..n { link g[i] <-> sw bw 10 GB/s lat 1 us; }
}
"""


def write(path: Path, text: str | bytes) -> Path:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def listing(directory: Path) -> list[str]:
    """Every path under `directory`, relative, sorted (to show nothing was left behind)."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


def run_collc(argv: list[str], capsys) -> tuple[int, str]:
    """`collc ARGV` in this process: (exit status, what it printed on stderr)."""
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code
    return rc, capsys.readouterr().err
