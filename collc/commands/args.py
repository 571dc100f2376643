"""Argument types and exit statuses shared by the commands.

argparse reports a value its type refuses as a usage error (exit 2), naming the option,
before any work is done. `finite_float` refuses `nan` and `inf` (which compare false with
every bound, so a plain `float` lets them through every later check); `output_path` and
`path_text` refuse an empty path, which names no file (`--report ''` would otherwise be
read as the current directory). Every command uses these, the tools' included.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import Callable

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


def int_at_least(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """A whole number in [lo, hi] (no upper limit where hi is None)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
        if value < lo or (hi is not None and value > hi):
            bound = f"at least {lo}" if hi is None else f"between {lo} and {hi:,}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value
    parse.__name__ = "whole number"
    return parse


def finite_float(lo: float, hi: float | None = None, lo_open: bool = False) -> Callable[[str], float]:
    """A finite number at least lo (greater, where lo_open) and at most hi."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
        if not math.isfinite(value) or value < lo or (lo_open and value == lo) or (hi is not None and value > hi):
            bound = f"greater than {lo:g}" if lo_open else f"at least {lo:g}"
            bound += "" if hi is None else f" and at most {hi:g}"
            raise argparse.ArgumentTypeError(f"must be a finite number {bound}, got {text}")
        return value
    parse.__name__ = "number"
    return parse


def path_text(text: str) -> str:
    """A path that names something (not empty or blank)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path names no file")
    return text


def output_path(text: str) -> Path:
    """A path to write: not empty, not only blanks."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path names no file")
    return Path(text)


def same_file_key(path: Path) -> str:
    """What two spellings of one path (`X`, `./X`, `d/../X`, a link to X) have in common:
    the real path of the parent directory joined with the name."""
    return os.path.join(os.path.realpath(path.parent), path.name)


def repeated_output(named: list[tuple[str, Path | None]]) -> tuple[str, str, Path] | None:
    """The first two options naming the same file, or None: (first, second, path)."""
    seen: dict[str, str] = {}
    for option, path in named:
        if path is None:
            continue
        key = same_file_key(path)
        if key in seen:
            return seen[key], option, path
        seen[key] = option
    return None
