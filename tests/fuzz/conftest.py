"""Hypothesis profiles for the property tests, chosen by COLLC_FUZZ_PROFILE:

- `ci` (default): 150 cases per property, 750 in all, well under a minute on two cores;
  derandomized, so that a run of the suite is repeatable (a case it fails, it fails
  every time); new cases are the long run's job;
- `long`: many more cases per run (bench/fuzz_long.py repeats runs for a set time).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = dict(deadline=None,  # the harness's own per-case deadline (SIGALRM) decides hangs
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.filter_too_much],
               database=None, print_blob=True)
settings.register_profile("ci", max_examples=int(os.environ.get("COLLC_FUZZ_EXAMPLES", "150")), derandomize=True,
                          **_COMMON)
settings.register_profile("long", max_examples=int(os.environ.get("COLLC_FUZZ_EXAMPLES", "2000")), **_COMMON)
settings.load_profile(os.environ.get("COLLC_FUZZ_PROFILE", "ci"))
