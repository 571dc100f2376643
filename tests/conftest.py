import sys
from pathlib import Path

# Test helpers (tests/schedules.py) are imported as top-level modules.
sys.path.insert(0, str(Path(__file__).resolve().parent))

import atexit
import os
import shutil
import tempfile

from hypothesis import settings

# Property tests draw the same cases on every run of the suite, so that a failure is
# repeatable and a run cannot fail by chance; drawing new cases is the job of the long
# runs (COLLC_FUZZ_PROFILE=long, bench/fuzz_long.py).
settings.register_profile("suite", derandomize=True, database=None)
settings.load_profile("suite")

# The suite never touches the user's own cache (collc caches parsed standard-library
# files under $XDG_CACHE_HOME/collc): one private cache directory for the whole run,
# inherited by every `collc` the tests start.
_CACHE = tempfile.mkdtemp(prefix="collc-test-cache-")
os.environ["XDG_CACHE_HOME"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, True)


def pytest_collection_modifyitems(config, items):
    """Tests that start a Dask cluster in this process run last: Dask leaves threads
    behind, and the NCCL log reader never forks while other threads run, so its
    parallel-read tests would be skipped after them (tests/traces/nccl_log). With
    worker processes (pytest-xdist) the tests are handed out in this order, so each
    worker runs its Dask tests last."""
    items.sort(key=lambda item: item.get_closest_marker("dask") is not None)


import pytest  # noqa: E402  (after the settings above, as the rest of this file)


@pytest.fixture(autouse=True)
def allocator_calls(monkeypatch) -> list[str]:
    """`collc profile` run in the test process would change that process's C allocator
    for the rest of the suite (`collc.memory`): its call is recorded here instead.
    tests/test_memory.py checks the real one, each case in a fresh process."""
    import collc.memory

    calls: list[str] = []
    monkeypatch.setattr(collc.memory, "reuse_freed_memory", lambda: calls.append("reuse_freed_memory") or False)
    return calls
