"""The executor tests import their helpers (cupy_executor_helpers.py, fake_cupy.py) from
this folder."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
