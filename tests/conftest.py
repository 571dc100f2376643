import sys
from pathlib import Path

# Test helpers (tests/schedules.py) are imported as top-level modules.
sys.path.insert(0, str(Path(__file__).resolve().parent))

import atexit
import os
import shutil
import tempfile

# The suite never touches the user's own cache (collc caches parsed standard-library
# files under $XDG_CACHE_HOME/collc): one private cache directory for the whole run,
# inherited by every `collc` the tests start.
_CACHE = tempfile.mkdtemp(prefix="collc-test-cache-")
os.environ["XDG_CACHE_HOME"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, True)
