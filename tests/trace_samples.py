"""Where the sample traces are, for the trace readers' and the profile's tests."""

import gzip
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
TRACES = DATA / "traces"
LOGS = DATA / "nccl-logs"
BENCH = Path(__file__).resolve().parents[1] / "bench"


def sample(name: str, folder: Path = TRACES) -> Path:
    path = folder / name
    if not path.exists():
        pytest.skip(f"sample data not present: {path}")
    return path


def per_rank_logs(folder: Path, records: list[int], gzipped: int, name: str = "rank{}.log") -> Path:
    """One log per rank of an HSDP-like job (made by the benchmark's generator from the
    real 2.27.7 sample's format), rank r with records[r] calls; rank `gzipped` is stored
    gzip-compressed, as collectors often leave some files."""
    sample(next(LOGS.glob("*.log")).name, LOGS)
    sys.path.insert(0, str(BENCH))
    try:
        from make_hsdp_log import make_log
    finally:
        sys.path.remove(str(BENCH))
    for rank, count in enumerate(records):
        (folder / name.format(rank)).write_text(make_log(rank, count))
    plain = folder / name.format(gzipped)
    plain.with_name(plain.name + ".gz").write_bytes(gzip.compress(plain.read_bytes()))
    plain.unlink()
    return folder
