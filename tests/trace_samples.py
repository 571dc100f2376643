"""Where the sample traces are, for the trace readers' and the profile's tests."""

from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
TRACES = DATA / "traces"
LOGS = DATA / "nccl-logs"


def sample(name: str, folder: Path = TRACES) -> Path:
    path = folder / name
    if not path.exists():
        pytest.skip(f"sample data not present: {path}")
    return path
