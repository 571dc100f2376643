"""collc.memory: freed memory kept for reuse, NumPy's huge pages off, in a fresh process each
(the settings are process-wide)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

glibc = pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                           reason="the allocator setting is glibc's")

# Faults of touching 64 MiB that were just freed: with the setting the heap block is
# reused (no page is new), without it the block was unmapped and every page faults again.
REUSE = """
import json, resource, sys
if sys.argv[1] == "on":
    from collc.memory import reuse_freed_memory
    took = reuse_freed_memory()
else:
    took = None
block = b"\\x01" * (64 << 20)
del block
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
block = b"\\x02" * (64 << 20)
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
import numpy
try:
    from numpy._core import multiarray      # NumPy 2
except ImportError:
    from numpy.core import multiarray       # NumPy 1.x, which pyproject allows
print(json.dumps({"took": took, "faults": faults, "hugepage": bool(multiarray._get_madvise_hugepage())}))
"""


def _run(mode: str, **env: str) -> dict:
    environment = {k: v for k, v in os.environ.items()
                   if not k.startswith(("MALLOC_", "NUMPY_MADVISE", "GLIBC_TUNABLES"))}
    out = subprocess.run([sys.executable, "-c", REUSE, mode], capture_output=True, text=True, check=True,
                         env={**environment, **env})
    return json.loads(out.stdout)


@glibc
def test_freed_blocks_are_reused_without_page_faults():
    on, off = _run("on"), _run("off")
    assert on["took"] is True
    pages = (64 << 20) // os.sysconf("SC_PAGE_SIZE")
    assert off["faults"] > pages // 2          # the default: a fresh mapping, every page faults
    assert on["faults"] < pages // 16          # kept and reused


def test_numpy_is_told_not_to_ask_for_huge_pages():
    assert _run("on")["hugepage"] is False


def test_a_value_the_user_set_is_kept():
    assert _run("on", NUMPY_MADVISE_HUGEPAGE="1")["hugepage"] is True


@glibc
@pytest.mark.parametrize("tuning", [{"MALLOC_TRIM_THRESHOLD_": "0"}, {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}])
def test_an_allocator_the_user_tuned_is_left_alone(tuning):
    on = _run("on", **tuning)
    assert on["took"] is False
    assert on["faults"] > (64 << 20) // os.sysconf("SC_PAGE_SIZE") // 2   # freed memory given back, as asked
